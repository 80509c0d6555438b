"""The datagram transport's experiments for `slotstream bench` — the datagram-iWARP patent's evaluation
("Experimental Results and Analysis") on this machine:

  datagram  latency and throughput of write_record, dgram_send, dgram_rd, dgram_rc (and status_byte and
            sliding_window over UCX tcp) — patent: UD Write-Record -24 % latency vs RC write below 2 KB,
            +256 % bandwidth at 512 KB
  loss      goodput and the fraction of valid bytes delivered at 0 / 0.1 / 0.5 / 1 / 5 % real loss (an
            nftables rule in a network namespace of the experiment's own), 1 KiB to 512 KiB
  apps      ffmpeg (first-frame time, frames lost or damaged) over the preload shim, plain UDP, TCP and HTTP,
            and SIPp (INVITE -> 200 OK response time) over the first three

Each experiment function measures every point once with fresh processes; the orchestrator's --runs calls it
again for independent runs (records carry `run`). Measuring processes: `slotstream dgram-peer recv|send`
(tools/dgram_peer.cc), ffmpeg and sipp from Debian. EXPERIMENTS is this module's table, which the entry
script (slotstream_bench.py) lists beside the others.
"""
import json
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time

from harness import (BIN, DEFAULT_BLOCKS, PAPER_BLOCKS, Experiment, PeerError, Progress, cpu_percent,
                     for_each_point, free_port, log, pct, run_pair, run_peers, wait_or_kill)

DGRAM = ["write_record", "dgram_send", "dgram_rd", "dgram_rc"]
LLP = {"write_record": "udp", "dgram_send": "udp", "dgram_rd": "udp", "dgram_rc": "tcp"}
UCX_COMPARED = ["status_byte", "sliding_window"]
LOSS_LEVELS = [0, 0.1, 0.5, 1, 5]
SEGMENT = 8192        # the CLI's default segment (one datagram); loopback's MTU is 64 KiB
MTU_SEGMENT = 1408    # an Ethernet-sized segment for the loss experiment (the patent's 1.5 KB MTU)
MESSAGE_TIMEOUT_MS = 100
# The loss experiment sends back to back: a ring of 32 STags comes round again within milliseconds, before a
# 100 ms timer has given up on an incomplete message, and the newer MSN retires it (patent: discarded, not
# delivered). So that the figure shows partial placement rather than ring reuse, it runs with the largest
# ring a receiver grants and a 20 ms timer (loopback reorders nothing for that long); retirement is recorded.
LOSS_RING = 256
LOSS_TIMEOUT_MS = 20

def mode(cfg):
    return "tiny" if cfg.tiny else "quick" if cfg.quick else "full"


def chosen_protocols(cfg):
    """The datagram protocols named in --protocols, or all four."""
    return [p for p in cfg.protocols if p in DGRAM] or list(DGRAM)


def in_ns(ns, argv):
    return (["ip", "netns", "exec", ns] if ns else []) + [str(a) for a in argv]


# ----------------------------------------------------------------------------- measuring


def run_dgram_pair(protocol, size, count, *, gap_us=0, partial="drop", segment=SEGMENT, ns=None, max_seconds=60,
                   timeout=180, ring=32, message_timeout_ms=MESSAGE_TIMEOUT_MS):
    """One measurement: `slotstream dgram-peer recv` and `... send`; returns (sender, receiver) JSON."""
    rx_cmd = in_ns(ns, [BIN, "dgram-peer", "recv", "--listen", "127.0.0.1:0", "--partial", partial,
                        "--message-timeout", message_timeout_ms])

    def tx_cmd(addr):
        return in_ns(ns, [BIN, "dgram-peer", "send", "--to", addr, "--protocol", protocol, "--size", size,
                          "--count", count, "--segment-size", segment, "--gap-us", gap_us,
                          "--max-seconds", max_seconds, "--blocks", ring])

    return run_peers(rx_cmd, tx_cmd, timeout, kind="dgram ")


def window_seconds(snd, rcv):
    """From the first send to the last message finished at the receiver."""
    arrivals = rcv.get("arrivals_ns") or []
    if not snd["send_times_ns"] or not arrivals:
        return 0.0
    return max(max(arrivals) - snd["send_times_ns"][0], 1) / 1e9


def add_latency(res, experiment, p, t, s, lat_us, variant, blocks=1):
    for metric, v in (("latency_mean", statistics.mean(lat_us)), ("latency_p50", pct(lat_us, 50)),
                      ("latency_p99", pct(lat_us, 99))):
        res.add(experiment, p, t, s, blocks, metric, v, "us", variant=variant)


# ----------------------------------------------------------------------------- datagram


def datagram_settings(cfg):
    m = mode(cfg)
    sizes = {"tiny": [1024], "quick": [64, 1024, 65536, 524288],
             "full": [64, 256, 1024, 2048, 8192, 65536, 262144, 524288, 1 << 20]}[m]
    if cfg.sizes_given:
        sizes = cfg.sizes
    budget = {"tiny": 1 << 20, "quick": 16 << 20, "full": 64 << 20}[m]
    latency_n = {"tiny": 20, "quick": 100, "full": 300}[m]
    return sizes, budget, latency_n


def datagram_variant(protocol):
    return f"segment {SEGMENT} B" if protocol in DGRAM else "UCX tcp"


def datagram_latency(res, latency_n, p, s):
    """One message in flight at a time: send stamp to the message finished at the receiver."""
    gap = int(200 + s / 100)  # each message finished before the next one starts
    if p in DGRAM:
        snd, rcv = run_dgram_pair(p, max(s, 8), latency_n, gap_us=gap)
        lat = [x / 1000 for x in rcv["latencies_ns"]]
    else:
        snd, rcv = run_pair("tcp", p, s, latency_n, PAPER_BLOCKS, gap_us=gap, busy_poll=True)
        lat = [x / 1000 for x in rcv["latencies_ns"] if x > 0]
    if not lat:
        raise PeerError("no latency samples")
    add_latency(res, "datagram", p, LLP.get(p, "tcp"), s, lat, datagram_variant(p))
    return f"{p:14} {s:>8} B latency p50 {pct(lat, 50):8.1f} us"


def datagram_throughput(res, budget, p, s):
    """Back to back: complete bytes over first send to last arrival."""
    t, variant = LLP.get(p, "tcp"), datagram_variant(p)
    count = max(20, min(2000, budget // s))
    if p in DGRAM:
        snd, rcv = run_dgram_pair(p, max(s, 8), count)
        good = rcv["complete"] * s
        secs = window_seconds(snd, rcv)
        res.add("datagram", p, t, s, 1, "delivered_fraction", rcv["complete"] / max(rcv["sent"], 1), "ratio",
                variant=variant)
    else:
        snd, rcv = run_pair("tcp", p, s, count, DEFAULT_BLOCKS)
        good = rcv["messages"] * s
        secs = max(max(rcv["arrivals_ns"]) - snd["send_times_ns"][0], 1) / 1e9
    if secs <= 0:
        raise PeerError("nothing arrived")
    res.add("datagram", p, t, s, 1, "throughput", good / secs / 1e6, "MB/s", variant=variant)
    res.add("datagram", p, t, s, 1, "cpu_sender", cpu_percent(snd), "% of one core", variant=variant)
    return f"{p:14} {s:>8} B throughput {good / secs / 1e6:8.1f} MB/s"


def exp_datagram(res, cfg):
    """Patent Fig. 14-15 ("UD iWARP vs RC iWARP verbs latency", "unidirectional verbs bandwidth"): one message in
    flight at a time for latency (send stamp to the message finished at the receiver), back to back for
    throughput (complete bytes over first send to last arrival). UCX protocols over tcp for comparison."""
    sizes, budget, latency_n = datagram_settings(cfg)
    protocols = chosen_protocols(cfg)
    ucx = [p for p in UCX_COMPARED if p in cfg.protocols] if "tcp" in cfg.transports else []
    points = [(p, s, kind) for s in sizes for p in protocols + ucx for kind in ("latency", "throughput")]

    def measure(p, s, kind):
        return datagram_latency(res, latency_n, p, s) if kind == "latency" else datagram_throughput(res, budget, p, s)
    for_each_point(res, cfg, "datagram", points, measure, lambda p, s, kind: f"{kind} {p} {s} B", run_tag=False)
    # The patent's two headline comparisons, as ratios within this run.
    for metric, ratio in (("latency_p50", "latency_p50_vs_dgram_rc"), ("throughput", "throughput_vs_dgram_rc")):
        vals = {(r["protocol"], r["size_bytes"]): r["value"] for r in res.records
                if r["experiment"] == "datagram" and r["metric"] == metric and r["run"] == res.run}
        for (p, s), v in list(vals.items()):
            base = vals.get(("dgram_rc", s))
            if base and p != "dgram_rc":
                res.add("datagram", p, LLP.get(p, "tcp"), s, 1, ratio, v / base, "ratio", variant=datagram_variant(p))


# ----------------------------------------------------------------------------- loss


class LossNamespace:
    """A network namespace of the experiment's own whose lo behaves like an Ethernet link (1500-byte MTU, no
    segmentation offload, so TCP's packets are what a wire would carry) and drops `percent` % of the UDP and
    TCP packets that arrive (nftables, input hook: the sender sees no error, as with loss on a wire)."""

    def __init__(self, percent):
        self.name = f"ssbench{os.getpid() % 100000}x{int(percent * 1000)}x{int(time.monotonic() * 1000) % 100000}"
        self.percent = percent

    def __enter__(self):
        def ip(*args):
            r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
            if r.returncode != 0:
                raise PeerError(f"`ip {' '.join(args)}` failed (the loss experiment needs root): {r.stderr.strip()}")
        ip("netns", "add", self.name)
        try:
            ip("-n", self.name, "link", "set", "lo", "up", "mtu", "1500", "gso_max_size", "1500", "gso_max_segs", "1")
            rules = ("table inet slotstream_loss {\n  chain input { type filter hook input priority 0; policy accept;\n"
                     "    meta l4proto { udp, tcp } counter\n"
                     f"    meta l4proto {{ udp, tcp }} numgen random mod 100000 < {int(round(self.percent * 1000))} "
                     "counter drop\n  }\n}\n")
            r = subprocess.run(["ip", "netns", "exec", self.name, "nft", "-f", "-"], input=rules, capture_output=True,
                               text=True, timeout=20)
            if r.returncode != 0:
                raise PeerError(f"nft failed: {r.stderr.strip()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def counters(self):
        """(packets seen, packets dropped) by the rule so far."""
        out = subprocess.run(["ip", "netns", "exec", self.name, "nft", "list", "table", "inet", "slotstream_loss"],
                             capture_output=True, text=True, timeout=20).stdout
        n = [int(x) for x in re.findall(r"counter packets (\d+)", out)]
        return (n[0], n[1]) if len(n) >= 2 else (0, 0)

    def __exit__(self, *exc):
        for pid in subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)


def loss_settings(cfg):
    m = mode(cfg)
    sizes = {"tiny": [65536], "quick": [1024, 65536, 524288], "full": [1024, 8192, 65536, 262144, 524288]}[m]
    if cfg.sizes_given:
        sizes = cfg.sizes
    levels = {"tiny": [0, 5], "quick": LOSS_LEVELS, "full": LOSS_LEVELS}[m]
    budget = {"tiny": 1 << 20, "quick": 4 << 20, "full": 16 << 20}[m]
    seconds = {"tiny": 3, "quick": 5, "full": 10}[m]
    return sizes, levels, budget, seconds


def loss_point(res, ns, seconds, budget, level, s, p):
    count = max(10, budget // s)
    snd, rcv = run_dgram_pair(p, s, count, partial="keep", segment=MTU_SEGMENT, ns=ns.name, max_seconds=seconds,
                              timeout=seconds + 120, ring=LOSS_RING, message_timeout_ms=LOSS_TIMEOUT_MS)
    secs = window_seconds(snd, rcv)
    sent_bytes = max(rcv["bytes_sent"], 1)
    goodput = rcv["valid_bytes"] / secs / 1e6 if secs > 0 else 0.0
    for metric, v, unit in (("goodput", goodput, "MB/s"),
                            ("valid_fraction", rcv["valid_bytes"] / sent_bytes, "ratio"),
                            ("complete_fraction", rcv["complete"] / max(rcv["sent"], 1), "ratio"),
                            ("partial_fraction", rcv["partial"] / max(rcv["sent"], 1), "ratio"),
                            ("retired_fraction", rcv["retired"] / max(rcv["sent"], 1), "ratio")):
        res.add("loss", p, LLP[p], s, 1, metric, v, unit, variant=f"loss {level:g}%")
    return (f"{level:>4g}% {p:13} {s:>7} B goodput {goodput:8.1f} MB/s, valid "
            f"{rcv['valid_bytes'] / sent_bytes:6.1%}, complete {rcv['complete']}/{rcv['sent']}")


def exp_loss(res, cfg):
    """Patent Fig. 16-17 ("UD send/recv bandwidth under packet loss", "UD RDMA Write-Record bandwidth under packet
    loss"): the same messages through a lossy namespace; write_record keeps partial messages (--partial keep),
    dgram_send delivers whole messages only, dgram_rd and dgram_rc retransmit. Goodput counts valid bytes
    delivered (complete messages and the valid ranges of partial ones) per second."""
    sizes, levels, budget, seconds = loss_settings(cfg)
    points = [(s, p) for s in sizes for p in chosen_protocols(cfg)]
    prog = Progress(len(levels) * len(points), "loss", res.run, cfg.runs)
    for level in levels:
        try:
            ns = LossNamespace(level).__enter__()
        except PeerError as e:
            if cfg.tiny:
                log(f"  (loss experiment skipped in this tiny run: {e})")
                return
            res.error(f"loss {level}%", e)
            for _ in points:
                prog.step(f"{level}%: FAILED")
            continue
        try:
            seen0, dropped0 = ns.counters()
            for_each_point(res, cfg, "loss", points, lambda s, p: loss_point(res, ns, seconds, budget, level, s, p),
                           lambda s, p: f"{level}% {p} {s} B", prog=prog, run_tag=False)
            seen, dropped = ns.counters()
            if seen > seen0:
                res.add("loss", "nftables", "namespace", 0, 1, "loss_measured", (dropped - dropped0) / (seen - seen0),
                        "ratio", variant=f"loss {level:g}%")
        finally:
            ns.__exit__(None, None, None)


# ----------------------------------------------------------------------------- apps


def shim_path():
    """libslotstream_udp.so: next to the binary in a build tree, in ../lib of an installed one."""
    bindir = pathlib.Path(BIN).resolve().parent
    for p in (bindir / "libslotstream_udp.so", bindir.parent / "lib" / "libslotstream_udp.so"):
        if p.exists():
            return p
    return bindir / "libslotstream_udp.so"


def app_env(mode_, port):
    env = dict(os.environ)
    if mode_ == "shim":
        env.update(LD_PRELOAD=str(shim_path()), SLOTSTREAM_UDP_PORTS=str(port))
    return env


APP_TRANSPORT = {"shim": "udp+shim", "udp": "udp", "tcp": "tcp", "http": "http"}


def ffmpeg_encode(seconds):
    return ["-f", "lavfi", "-i", f"testsrc=size=640x480:rate=25:duration={seconds}", "-c:v", "mpeg2video", "-q:v",
            "4", "-g", "25", "-bf", "0", "-flags", "+bitexact", "-fflags", "+bitexact"]


def ffmpeg_urls(mode_, port):
    """(the receiver's input, the sender's output) of a mode. udp and tcp: the receiver waits (binds, listens)
    and the sender starts the stream; http: the sender serves it (-listen 1, patent Fig. 18's HTTP streaming) and
    the receiver starts it by asking for it."""
    if mode_ == "tcp":
        return f"tcp://127.0.0.1:{port}?listen=1", f"tcp://127.0.0.1:{port}"
    if mode_ == "http":
        return f"http://127.0.0.1:{port}/stream.ts", f"http://127.0.0.1:{port}/stream.ts"
    return (f"udp://127.0.0.1:{port}?timeout=1000000&fifo_size=1000000&overrun_nonfatal=1",
            f"udp://127.0.0.1:{port}?pkt_size=1316")


def wait_listening(port, proc, ns, seconds=20):
    """Until a TCP socket listens on port (state 0A in /proc/net/tcp of the namespace), without connecting to it
    (ffmpeg's HTTP server takes one client: a probe would be it)."""
    deadline, want = time.monotonic() + seconds, f":{port:04X} 00000000:0000 0A"
    while time.monotonic() < deadline and proc.poll() is None:
        table = subprocess.run(in_ns(ns, ["cat", "/proc/net/tcp"]), capture_output=True, text=True).stdout if ns \
            else pathlib.Path("/proc/net/tcp").read_text()
        if want in table:
            return
        time.sleep(0.005)
    raise PeerError(f"the ffmpeg HTTP server did not listen on port {port} within {seconds} s")


def ffmpeg_once(mode_, seconds, reference, ns=None):
    """Streams a test pattern with ffmpeg -re over udp:// (with or without the shim), tcp:// or http:// and
    decodes it with a second ffmpeg. Returns (first frame ms after the stream was started, frames decoded,
    frames identical to a direct decode). The side that waits (udp, tcp: the receiver; http: the serving
    sender) is up first; the stream starts when the other side's process starts, and the clock with it."""
    port = free_port(socket.SOCK_STREAM if mode_ in ("tcp", "http") else socket.SOCK_DGRAM)
    src, dst = ffmpeg_urls(mode_, port)
    # A small probe: the first frame then measures the transport and the stream's start, not ffmpeg's default
    # five seconds of probing (which dominate otherwise: ~7 s over UDP, ~4 s over TCP for a 4 s stream).
    rx_cmd = in_ns(ns, ["ffmpeg", "-v", "error", "-nostdin", "-probesize", "32768", "-analyzeduration", "100000",
                        "-i", src, "-f", "framemd5", "-flush_packets", "1", "-"])
    tx_cmd = in_ns(ns, ["ffmpeg", "-v", "error", "-nostdin", "-re", *ffmpeg_encode(seconds), "-f", "mpegts",
                        *(["-listen", "1"] if mode_ == "http" else []), dst])
    env = app_env(mode_, port)
    frames, first = [], []

    def start_rx():
        rx = subprocess.Popen(rx_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def reader():
            for line in rx.stdout:
                if line.strip() and not line.startswith("#"):
                    if not first:
                        first.append(time.monotonic())
                    frames.append(line.rsplit(",", 1)[-1].strip())
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        return rx, th

    start_tx = lambda: subprocess.Popen(tx_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if mode_ == "http":
        tx = start_tx()
        try:
            wait_listening(port, tx, ns)
        except PeerError:
            tx.kill()
            raise
        t0 = time.monotonic()
        rx, th = start_rx()
    else:
        rx, th = start_rx()
        time.sleep(0.5)
        t0 = time.monotonic()
        tx = start_tx()
    try:
        _, tx_err = tx.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        tx.kill()
        rx.kill()
        raise
    finally:
        wait_or_kill(rx, 15)
        th.join(5)
    if tx.returncode != 0:
        raise PeerError(f"ffmpeg sender failed: {tx_err[-300:]}")
    identical = sum(1 for a, b in zip(frames, reference) if a == b)
    return (1000 * (first[0] - t0) if first else float("nan")), len(frames), identical


def sipp_once(mode_, calls, rate, workdir, ns=None):
    """`sipp -sn uas` and `-sn uac` (-m calls -r rate); response time = INVITE sent to 200 OK received, per call,
    from the client's message trace (µs timestamps). Returns (response times in ms, failed calls)."""
    uas_port, uac_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    transport = ["-t", "t1"] if mode_ == "tcp" else []
    env = app_env(mode_, f"{uas_port},{uac_port}")
    workdir.mkdir(parents=True, exist_ok=True)
    for f in workdir.glob("uac_*"):
        f.unlink()
    uas = subprocess.Popen(in_ns(ns, ["sipp", "-nostdin", "-sn", "uas", "-i", "127.0.0.1", "-p", uas_port, *transport,
                                      "-m", calls, "-timeout", f"{calls // rate + 30}s"]),
                           env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        uac = subprocess.run(in_ns(ns, ["sipp", "-nostdin", "-sn", "uac", f"127.0.0.1:{uas_port}", "-i", "127.0.0.1",
                                        "-p", uac_port, *transport, "-m", calls, "-r", rate, "-trace_msg",
                                        "-timeout", f"{calls // rate + 20}s"]),
                             env=env, cwd=workdir, capture_output=True, text=True, timeout=calls // rate + 60)
    finally:
        wait_or_kill(uas, 10)
    logs = list(workdir.glob("uac_*_messages.log"))
    if not logs:
        raise PeerError(f"sipp uac left no message trace (exit {uac.returncode}): {uac.stdout[-300:]}")
    sent, answered = {}, {}
    stamp = None
    direction = None
    for line in logs[0].read_text(errors="replace").splitlines():
        m = re.match(r"^-{20,} (\S+ \S+)$", line)
        if m:
            stamp = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + float("0" + m.group(1)[19:])
            direction = None
            continue
        if line.startswith(("UDP message sent", "TCP message sent")):
            direction = "out"
        elif "message received" in line:
            direction = "in"
        elif line.startswith("INVITE ") and direction == "out":
            direction = "invite"
        elif line.startswith("SIP/2.0 200") and direction == "in":
            direction = "ok"
        elif line.lower().startswith("call-id:"):
            cid = line.split(":", 1)[1].strip()
            if direction == "invite":
                sent.setdefault(cid, stamp)
            elif direction == "ok" and cid in sent:
                answered.setdefault(cid, stamp)
    times = [1000 * (answered[c] - sent[c]) for c in answered]
    return times, calls - len(times)


def ffmpeg_reference(seconds):
    """The test pattern's frame checksums decoded directly, without a network: what every frame should be."""
    ref = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", *ffmpeg_encode(seconds), "-f", "mpegts", "-"],
                         capture_output=True, timeout=120).stdout
    return [line.rsplit(",", 1)[-1].strip() for line in subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-i", "-", "-f", "framemd5", "-"], input=ref, capture_output=True,
        timeout=120).stdout.decode().splitlines() if line and not line.startswith("#")]


def ffmpeg_point(res, m, seconds, reference, level, ns):
    t, variant = APP_TRANSPORT[m], f"loss {level:g}%"
    first_ms, decoded, identical = ffmpeg_once(m, seconds, reference, ns=ns)
    res.add("apps", "ffmpeg", t, 0, 1, "first_frame_ms", first_ms, "ms", variant=variant)
    res.add("apps", "ffmpeg", t, 0, 1, "frames_lost", len(reference) - decoded, "count", variant=variant)
    res.add("apps", "ffmpeg", t, 0, 1, "frames_damaged", decoded - identical, "count", variant=variant)
    return (f"{level:g}% ffmpeg {t:9} first frame {first_ms:7.1f} ms, {decoded}/{len(reference)} "
            f"frames, {identical} identical")


def sipp_point(res, m, calls, workdir, level, ns):
    t, variant = APP_TRANSPORT[m], f"loss {level:g}%"
    times, failed = sipp_once(m, calls, 50, workdir, ns=ns)
    if not times:
        raise PeerError("no call was answered")
    for metric, v in (("sip_response_mean", statistics.mean(times)),
                      ("sip_response_p50", pct(times, 50)), ("sip_response_p99", pct(times, 99))):
        res.add("apps", "sipp", t, 0, 1, metric, v, "ms", variant=variant)
    res.add("apps", "sipp", t, 0, 1, "sip_calls_failed", failed, "count", variant=variant)
    return (f"{level:g}% sipp   {t:9} INVITE->200 median {pct(times, 50):7.3f} ms, "
            f"{failed} of {calls} calls failed")


def apps_settings(cfg):
    return {"quick": (3, [0, 1], 100), "full": (6, [0, 1, 5], 300)}[mode(cfg)]


def exp_apps(res, cfg):
    """Patent Fig. 18-19 ("VLC UD streaming vs RC-based HTTP streaming", "SIP response times"): unmodified
    programs over the preload shim, plain UDP and TCP, and ffmpeg over HTTP (the patent's RC-based streaming: the
    sender serves, the receiver asks). ffmpeg stands in for VLC (which refuses to run as root): time to the first
    decoded frame, frames lost and frames that differ from a direct decode, at 0 % loss on loopback and under
    nftables loss in a namespace; first_frame_vs_http is UDP's first frame over HTTP's in the same run (the
    patent: 74.1 % less initial buffering, i.e. 0.259). SIPp: INVITE -> 200 OK per call, 50 calls/s."""
    if cfg.tiny:
        # Real programs take seconds to start and stream; a tiny run (the test suite's) leaves them out.
        log("  (apps is not part of tiny runs: `slotstream bench apps --quick` takes about a minute)")
        return
    seconds, levels, calls = apps_settings(cfg)
    missing = [t for t in ("ffmpeg", "sipp") if not shutil.which(t)]
    if missing or not shim_path().exists():
        res.error("apps", f"needs {', '.join(missing) or shim_path()} (scripts/setup.sh, scripts/build.sh)")
        return
    reference = ffmpeg_reference(seconds)
    # http: ffmpeg only (SIP has no HTTP transport).
    points = [(m, app) for m in ("shim", "udp", "tcp", "http") for app in ("ffmpeg", "sipp") if (m, app) != ("http", "sipp")]
    prog = Progress(len(levels) * len(points), "apps", res.run, cfg.runs)
    workdir = pathlib.Path(res.out) / "apps-work"
    for level in levels:
        ns = None
        try:
            if level > 0:
                ns = LossNamespace(level).__enter__()
        except PeerError as e:
            res.error(f"apps {level}%", e)
            for _ in points:
                prog.step(f"{level}%: FAILED")
            continue
        try:
            def measure(m, app):
                where = dict(level=level, ns=ns.name if ns else None)
                if app == "ffmpeg":
                    return ffmpeg_point(res, m, seconds, reference, **where)
                return sipp_point(res, m, calls, workdir, **where)
            for_each_point(res, cfg, "apps", points, measure, lambda m, app: f"{app} {APP_TRANSPORT[m]} {level}%",
                           errors=(PeerError, subprocess.TimeoutExpired), prog=prog, run_tag=False)
        finally:
            if ns:
                ns.__exit__(None, None, None)
    add_first_frame_ratios(res)
    shutil.rmtree(workdir, ignore_errors=True)


def add_first_frame_ratios(res):
    """UDP's (and the shim's) first frame as a multiple of HTTP's, per loss level, within this run."""
    first = {(r["transport"], r["variant"]): r["value"] for r in res.records
             if r["experiment"] == "apps" and r["metric"] == "first_frame_ms" and r["run"] == res.run}
    for (t, variant), v in first.items():
        base = first.get(("http", variant))
        if t in ("udp", "udp+shim") and base:
            res.add("apps", "ffmpeg", t, 0, 1, "first_frame_vs_http", v / base, "ratio", variant=variant)


EXPERIMENTS = {
    "datagram": Experiment("patent 14-15", "datagram RDMA latency and throughput: UD Write-Record, UD/RD send, RC "
                                           "over TCP", exp_datagram),
    "loss": Experiment("patent 16-17", "goodput and valid bytes under 0-5 % nftables loss, 1 KiB-512 KiB", exp_loss),
    "apps": Experiment("patent 18-19", "ffmpeg first frame and frame loss, SIPp response time: shim vs UDP vs TCP "
                                       "(and HTTP for ffmpeg)",
                       exp_apps),
}
