"""`slotstream bench shimloss`: large datagrams through the preload shim under real loss (issue 25, item 5).

An unmodified program (python3's socket module, under LD_PRELOAD=libslotstream_udp.so) sends datagrams of 4 KiB
to 64 KiB; the shim turns each into one UD Write-Record message of MTU-sized segments (1,440 B of payload at the
1,500 B MTU) and the receiving shim recombines them, delivering incomplete ones with their holes zero-filled
(SLOTSTREAM_UDP_PARTIAL=deliver; the default, drop, hands over only the whole ones). Both run in a network
namespace of the experiment's own whose nftables rule drops 0.1 / 0.5 / 1 / 5 % of the UDP packets (the
patent's rates; dgram_experiments.LossNamespace). Recorded per size and loss: the fractions of datagrams
delivered whole, partial, and lost entirely (every segment dropped), from the receiving shim's counters, beside
the patent's theory for independent loss p and k segments: P(whole) = (1-p)^k, P(lost) = p^k, P(partial) the
rest — at the nominal rate and at the rate the rule measured.
"""
import os
import pathlib
import re
import subprocess
import sys

import dgram_experiments as dx

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

sb = None


def register(experiments, orchestrator):
    global sb
    sb = orchestrator
    experiments["shimloss"] = ("patent 16-17", "large datagrams through the socket shim under 0.1-5 % loss: whole, "
                               "partial, lost vs (1-p)^segments", exp_shimloss)


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
            raise sb.PeerError(f"shimmed receiver did not start: {rx.stderr.read()[-300:]}")
        tx = subprocess.run(dx.in_ns(ns, [sys.executable, "-c", TX, port, size, count]), env=env,
                            capture_output=True, text=True, timeout=120)
        if tx.returncode != 0:
            raise sb.PeerError(f"shimmed sender failed: {tx.stderr[-300:]}")
        got = rx.stdout.readline().strip()
        rx.wait(15)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait(10)
    if not got.isdigit():
        raise sb.PeerError(f"shimmed receiver gave no count: {rx.stderr.read()[-300:]}")
    return counters(log), int(got)


def exp_shimloss(res, cfg):
    if not dx.shim_path().exists():
        res.error("shimloss", f"needs {dx.shim_path()} (scripts/build.sh)")
        return
    sizes, levels, count = settings(cfg)
    prog = sb.Progress(len(levels) * len(sizes), "shimloss", res.run, cfg.runs)
    work = pathlib.Path(res.out) / "shimloss-work"
    work.mkdir(parents=True, exist_ok=True)
    for level in levels:
        variant = f"loss {level:g}%"
        try:
            ns = dx.LossNamespace(level).__enter__()
        except sb.PeerError as e:
            if cfg.tiny:
                sb.log(f"  (shimloss skipped in this tiny run: {e})")
                return
            res.error(f"shimloss {level}%", e)
            for _ in sizes:
                prog.step(f"{level}%: FAILED")
            continue
        try:
            for size in sizes:
                log = work / f"r{res.run}-{level}-{size}.log"
                log.unlink(missing_ok=True)
                seen0, dropped0 = ns.counters()
                try:
                    c, received = once(ns.name, size, count, log)
                except (sb.PeerError, subprocess.TimeoutExpired) as e:
                    res.error(f"shimloss {size} B {level}%", e)
                    prog.step(f"{level}% {size} B: FAILED")
                    continue
                seen, dropped = ns.counters()
                record(res, variant, level, size, count, c, received, (dropped - dropped0) / max(seen - seen0, 1))
                prog.step(f"{level:>4g}% {size:>6} B: whole {c.get('reassembled', 0)}, partial "
                          f"{c.get('partial_delivered', 0)} of {c.get('large', 0)}")
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
