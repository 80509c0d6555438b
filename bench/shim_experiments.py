"""The preload socket shim's experiments (issue 25): `slotstream bench shimloss` and `shimperf`.

shimloss — large datagrams through the shim under real loss (item 5).

An unmodified program (python3's socket module, under LD_PRELOAD=libslotstream_udp.so) sends datagrams of 4 KiB
to 64 KiB; the shim turns each into one UD Write-Record message of MTU-sized segments (1,440 B of payload at the
1,500 B MTU) and the receiving shim recombines them, delivering incomplete ones with their holes zero-filled
(SLOTSTREAM_UDP_PARTIAL=deliver; the default, drop, hands over only the whole ones). Both run in a network
namespace of the experiment's own whose nftables rule drops 0.1 / 0.5 / 1 / 5 % of the UDP packets (the
patent's rates; dgram_experiments.LossNamespace). Recorded per size and loss: the fractions of datagrams
delivered whole, partial, and lost entirely (every segment dropped), from the receiving shim's counters, beside
the patent's theory for independent loss p and k segments: P(whole) = (1-p)^k, P(lost) = p^k, P(partial) the
rest — at the nominal rate and at the rate the rule measured.

shimperf — what the shim costs an unmodified program (item 4; the patent: "a very minimal approximate 2 %
increase in overall pre-buffering time when using our socket interface"): iperf3 UDP throughput with and without
the shim, 1,400 B datagrams (one UD Send each) and 8,000 / 32,000 B ones (Write-Record segments through the
shim, IP fragments without it), and ffmpeg's time to the first decoded frame of a real-time MPEG-TS stream over
udp://, with and without; beside iperf3's throughput, its sender's and receiver's CPU seconds per Gbit (what the
shared machine distorts least). Everything in a namespace whose lo has an Ethernet MTU (1,500 B, no offload), no loss;
with and without alternate within each run.
"""
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time

import dgram_experiments as dx
from harness import Experiment, PeerError, Progress, for_each_point, log, wait_or_kill

SEGMENT = 1500 - 20 - 8 - 28 - 4  # a Write-Record segment's payload at the default MTU over IPv4
LEVELS = [0.1, 0.5, 1, 5]
TIMER_MS = 50  # the receiving shim's reassembly timer; the sender paces well below it

RX = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: no drop in the socket queue
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
s.settimeout(10)
n = 0
try:
    while True:
        s.recv(70000)
        n += 1
        s.settimeout(1)
except socket.timeout:
    print(n, flush=True)
"""

TX = r"""
import socket, sys, time
port, size, count = (int(x) for x in sys.argv[1:4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("127.0.0.1", port))
d = bytes(range(1, 256)) * (size // 255 + 1)
for i in range(count):
    s.send(d[:size])
    time.sleep(0.001)
"""

def settings(cfg):
    m = dx.mode(cfg)
    sizes = {"tiny": [16384], "quick": [4096, 16384, 65507], "full": [4096, 16384, 32768, 65507]}[m]
    if cfg.sizes_given:
        sizes = [s for s in cfg.sizes if 0 < s <= 65507] or sizes
    levels = {"tiny": [5], "quick": LEVELS, "full": LEVELS}[m]
    count = {"tiny": 100, "quick": 400, "full": 1500}[m]
    return sizes, levels, count


def counters(log):
    total = {}
    if log.exists():
        for line in log.read_text().splitlines():
            for k, v in re.findall(r"(\w+)=(\d+)", line):
                total[k] = total.get(k, 0) + int(v)
    return total


def once(ns, size, count, log):
    """One sender and one receiver through the shim in `ns`: the shims' summed counters and the datagrams the
    receiving program counted."""
    env = dict(os.environ, LD_PRELOAD=str(dx.shim_path()), SLOTSTREAM_UDP_PARTIAL="deliver",
               SLOTSTREAM_UDP_REASSEMBLY_MS=str(TIMER_MS), SLOTSTREAM_UDP_LOG=str(log))
    rx = subprocess.Popen(dx.in_ns(ns, [sys.executable, "-c", RX]), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        port = rx.stdout.readline().strip()
        if not port.isdigit():
            raise PeerError(f"shimmed receiver did not start: {rx.stderr.read()[-300:]}")
        tx = subprocess.run(dx.in_ns(ns, [sys.executable, "-c", TX, port, size, count]), env=env,
                            capture_output=True, text=True, timeout=120)
        if tx.returncode != 0:
            raise PeerError(f"shimmed sender failed: {tx.stderr[-300:]}")
        got = rx.stdout.readline().strip()
    finally:
        wait_or_kill(rx, 15)
    if not got.isdigit():
        raise PeerError(f"shimmed receiver gave no count: {rx.stderr.read()[-300:]}")
    return counters(log), int(got)


def enter_namespace(res, cfg, name, level):
    """The experiment's lossy namespace, or None (an error record; in a tiny run without root, a log line)."""
    try:
        return dx.LossNamespace(level).__enter__()
    except PeerError as e:
        if cfg.tiny:
            log(f"  ({name} skipped in this tiny run: {e})")
        else:
            res.error(f"{name} {level}%", e)
        return None


def shimloss_point(res, ns, work, level, size, count):
    counts = work / f"r{res.run}-{level}-{size}.log"
    counts.unlink(missing_ok=True)
    seen0, dropped0 = ns.counters()
    try:
        c, received = once(ns.name, size, count, counts)
    except subprocess.TimeoutExpired as e:
        raise PeerError(str(e)) from None
    seen, dropped = ns.counters()
    record(res, f"loss {level:g}%", level, size, count, c, received, (dropped - dropped0) / max(seen - seen0, 1))
    return (f"{level:>4g}% {size:>6} B: whole {c.get('reassembled', 0)}, partial {c.get('partial_delivered', 0)} of "
            f"{c.get('large', 0)}")


def exp_shimloss(res, cfg):
    if not dx.shim_path().exists():
        res.error("shimloss", f"needs {dx.shim_path()} (scripts/build.sh)")
        return
    sizes, levels, count = settings(cfg)
    prog = Progress(len(levels) * len(sizes), "shimloss", res.run, cfg.runs)
    work = pathlib.Path(res.out) / "shimloss-work"
    work.mkdir(parents=True, exist_ok=True)
    for level in levels:
        ns = enter_namespace(res, cfg, "shimloss", level)
        if ns is None:
            if cfg.tiny:
                return
            for _ in sizes:
                prog.step(f"{level}%: FAILED")
            continue
        try:
            for_each_point(res, cfg, "shimloss", [(s,) for s in sizes],
                           lambda s: shimloss_point(res, ns, work, level, s, count), lambda s: f"{level}% {s} B",
                           prog=prog)
        finally:
            ns.__exit__(None, None, None)


def record(res, variant, level, size, count, c, received, measured):
    sent = max(c.get("large", 0), 1)
    k = -(-size // SEGMENT)
    whole, partial = c.get("reassembled", 0), c.get("partial_delivered", 0)
    if received != whole + partial:
        res.error(f"shimloss {size} B {variant}", f"the program read {received} datagrams, the shim delivered "
                  f"{whole + partial}")
    p = level / 100
    for metric, v, unit in (("whole_fraction", whole / sent, "ratio"), ("partial_fraction", partial / sent, "ratio"),
                            ("lost_fraction", (sent - whole - partial) / sent, "ratio"),
                            ("whole_theory", (1 - p) ** k, "ratio"), ("lost_theory", p ** k, "ratio"),
                            ("whole_theory_measured", (1 - measured) ** k, "ratio"),
                            ("segments_per_datagram", k, "count"), ("loss_measured", measured, "ratio"),
                            ("datagrams_sent", c.get("large", 0), "count")):
        res.add("shimloss", "shim", "udp+shim", size, 1, metric, v, unit, variant=variant)


# ----------------------------------------------------------------------------- shimperf

IPERF_SIZES = [1400, 8000, 32000]


def shimperf_settings(cfg):
    m = dx.mode(cfg)
    return {"tiny": (1, [1400], 0), "quick": (2, IPERF_SIZES, 2), "full": (4, IPERF_SIZES, 5)}[m]


def iperf3_once(ns, shim, size, seconds, log):
    """iperf3 -u at an unlimited rate, `size`-byte datagrams: (sender Mbit/s, loss %, receiver Mbit/s, sender and
    receiver CPU seconds per Gbit they moved). The CPU cost is what a shared machine distorts least: throughput
    follows whatever CPU the other tenants leave, the work per bit does not."""
    port = 5201
    env = dict(os.environ)
    if shim:
        env.update(LD_PRELOAD=str(dx.shim_path()), SLOTSTREAM_UDP_PORTS=str(port), SLOTSTREAM_UDP_LOG=str(log))
    srv = subprocess.Popen(dx.in_ns(ns, ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", port]), env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        cli = subprocess.run(dx.in_ns(ns, ["iperf3", "-c", "127.0.0.1", "-p", port, "-u", "-b", "0", "-l", size,
                                           "-w", "8M", "-t", seconds, "--json"]), env=env, capture_output=True,
                             text=True, timeout=seconds + 60)
    finally:
        wait_or_kill(srv, 15)
    try:
        end = json.loads(cli.stdout)["end"]["sum"]
    except (ValueError, KeyError) as e:
        raise PeerError(f"iperf3 gave no result ({cli.returncode}): {cli.stdout[-300:]} {cli.stderr[-200:]}") from e
    sent = end["bits_per_second"] / 1e6
    got = sent * (1 - end["lost_percent"] / 100)
    cpu = json.loads(cli.stdout)["end"].get("cpu_utilization_percent", {})
    # iperf3's CPU % is (user + system) / wall time of its process; per Gbit: seconds of CPU per second / Gbit/s.
    per_gbit = lambda pct, mbit: pct / 100 / (mbit / 1000) if mbit > 0 and pct is not None else float("nan")
    return sent, end["lost_percent"], got, per_gbit(cpu.get("host_total"), sent), per_gbit(cpu.get("remote_total"), got)


def iperf3_point(res, ns, work, seconds, size, shim):
    t = "udp+shim" if shim else "udp"
    try:
        sent, lost, got, cpu_tx, cpu_rx = iperf3_once(ns.name, shim, size, seconds, work / f"iperf-{size}.log")
    except subprocess.TimeoutExpired as e:
        raise PeerError(str(e)) from None
    for metric, v, unit in (("iperf3_sent", sent, "Mbit/s"), ("iperf3_lost", lost, "%"),
                            ("iperf3_received", got, "Mbit/s"), ("iperf3_sender_cpu", cpu_tx, "s/Gbit"),
                            ("iperf3_receiver_cpu", cpu_rx, "s/Gbit")):
        res.add("shimperf", "iperf3", t, size, 1, metric, v, unit)
    return (f"iperf3 {t:9} {size:>6} B: sent {sent:8.1f} Mbit/s, lost {lost:5.2f} %, received {got:8.1f} Mbit/s; CPU "
            f"s/Gbit sender {cpu_tx:.2f}, receiver {cpu_rx:.2f}")


def ffmpeg_point(res, ns, mode):
    t = dx.APP_TRANSPORT[mode]
    try:
        first_ms, decoded, _ = dx.ffmpeg_once(mode, 2, [], ns=ns.name)
    except subprocess.TimeoutExpired as e:
        raise PeerError(str(e)) from None
    res.add("shimperf", "ffmpeg", t, 0, 1, "first_frame_ms", first_ms, "ms")
    res.add("shimperf", "ffmpeg", t, 0, 1, "frames_decoded", decoded, "count")
    return f"ffmpeg {t:9} first frame {first_ms:7.1f} ms, {decoded} frames"


def exp_shimperf(res, cfg):
    missing = [t for t in ("iperf3", "ffmpeg") if not shutil.which(t)]
    if missing or not dx.shim_path().exists():
        res.error("shimperf", f"needs {', '.join(missing) or dx.shim_path()} (scripts/setup.sh, scripts/build.sh)")
        return
    seconds, sizes, ffmpeg_rounds = shimperf_settings(cfg)
    work = pathlib.Path(res.out) / "shimperf-work"
    work.mkdir(parents=True, exist_ok=True)
    ns = enter_namespace(res, cfg, "shimperf", 0)
    if ns is None:
        return
    # With and without alternate, so that both see the same moments of a shared machine.
    iperf = [(s, shim) for s in sizes for shim in (True, False)]
    ffmpeg = [(m,) for _ in range(ffmpeg_rounds) for m in ("shim", "udp")]
    prog = Progress(len(iperf) + len(ffmpeg), "shimperf", res.run, cfg.runs)
    try:
        for_each_point(res, cfg, "shimperf", iperf, lambda s, shim: iperf3_point(res, ns, work, seconds, s, shim),
                       lambda s, shim: f"iperf3 {'udp+shim' if shim else 'udp'} {s} B", prog=prog)
        for_each_point(res, cfg, "shimperf", ffmpeg, lambda m: ffmpeg_point(res, ns, m),
                       lambda m: f"ffmpeg {dx.APP_TRANSPORT[m]}", prog=prog)
    finally:
        ns.__exit__(None, None, None)
    add_ratios(res)


def add_ratios(res):
    """With the shim as a multiple of without, within this run (medians of its rounds)."""
    for metric in ("iperf3_received", "iperf3_sender_cpu", "iperf3_receiver_cpu", "first_frame_ms"):
        vals = {}
        for r in res.records:
            if r["experiment"] == "shimperf" and r["metric"] == metric and r["run"] == res.run:
                vals.setdefault((r["protocol"], r["transport"], r["size_bytes"]), []).append(r["value"])
        for (p, t, s), v in vals.items():
            base = vals.get((p, "udp", s))
            if t == "udp+shim" and base and statistics.median(base) > 0:
                res.add("shimperf", p, t, s, 1, f"{metric}_vs_plain", statistics.median(v) / statistics.median(base),
                        "ratio")


EXPERIMENTS = {
    "shimloss": Experiment("patent 16-17", "large datagrams through the socket shim under 0.1-5 % loss: whole, "
                                           "partial, lost vs (1-p)^segments", exp_shimloss),
    "shimperf": Experiment("patent 19", "the socket shim's cost: iperf3 UDP throughput and ffmpeg first frame, with "
                                        "and without", exp_shimperf),
}
