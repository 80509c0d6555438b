#!/usr/bin/env python3
"""slotstream bench: the status-byte paper's evaluation (section 4), side by side with the
sliding-window baseline, the raw UCX put ceiling and plain TCP sockets, on every transport.

Every measurement starts two real processes (`slotstream bench-peer recv` and `... send`,
docs/bench-peer.md) and records what they report. Results are tidy records in
OUT/results.json; plots are drawn from that file alone (bench/plot.py).
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import select
import socket
import statistics
import subprocess
import sys
import time

import cache_experiments
import fan_in_experiments
import rate_experiments
import ring_experiments  # bench/ is the script's directory, first on sys.path

HERE = pathlib.Path(__file__).resolve().parent
BIN = os.environ.get("SLOTSTREAM_BIN", str(HERE.parent / "build" / "slotstream"))

TRANSPORTS = ["shm", "tcp", "rdma"]
# References outside the C++ registry (the registry's own, e.g. ucx_raw_put, carry `reference`):
# the transports each is measured on. tcp_socket is plain TCP, so it has no shm variant.
OUTSIDE_REFERENCES = {"tcp_socket": ["tcp"]}
FULL_SIZES = [64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 8 << 20]
QUICK_SIZES = [64, 256, 4096, 65536, 1 << 20]
SYNC_BLOCKS = [3, 8, 16, 32, 64, 128]
PAPER_BLOCKS = 3       # paper section 4.2: three blocks per side
DEFAULT_BLOCKS = 32    # slotstream's default (`slotstream send --help`)
CAMERA_FRAME = 640 * 480 * 3


# What slotstream asks UCX for on each transport (src/fabric/transports.cc); ucx_perftest gets the same.
# rdma: UCX's rc alias (rc_mlx5 or rc_verbs, with ud for wire-up), or dc/ud with --rdma-transport.
UCX_TLS = {"shm": "posix,sysv,self", "tcp": "tcp,self", "rdma": "rc,self"}
# --rdma-transport / --rdma-device: passed to every peer of the rdma transport (set by main()).
RDMA = {"transport": None, "device": None}


def rdma_args(transport):
    """The peers' extra arguments on `transport` (the RDMA transport and device, on rdma)."""
    if transport != "rdma":
        return []
    return ([f"--rdma-transport={RDMA['transport']}"] if RDMA["transport"] else []) + \
        ([f"--rdma-device={RDMA['device']}"] if RDMA["device"] else [])


def ucx_env(transport):
    """ucx_perftest's environment on `transport`: the UCX transports (and device) slotstream uses there."""
    env = dict(os.environ, UCX_TLS=UCX_TLS[transport])
    if transport == "rdma":
        env["UCX_TLS"] = f"{RDMA['transport'] or 'rc'},self"
        if RDMA["device"]:
            env["UCX_NET_DEVICES"] = RDMA["device"]
    return env


class PeerError(RuntimeError):
    pass


def registry():
    """Every protocol of this build (`slotstream protocols --json`): name -> its entry."""
    try:
        out = subprocess.run([BIN, "protocols", "--json"], capture_output=True, text=True, timeout=30).stdout
        return {p["name"]: p for p in json.loads(out)}
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"slotstream bench: cannot list the protocols of {BIN}: {e}")


def references(cfg):
    """The references measured beside the protocols: the registry's (`reference`: they move bytes
    but deliver no messages) and OUTSIDE_REFERENCES."""
    return [n for n, p in cfg.registry.items() if p["reference"]] + list(OUTSIDE_REFERENCES)


def delivers_nothing(cfg, protocol):
    """A registry reference: its receiver counts no messages, so arrivals cannot time it."""
    return cfg.registry.get(protocol, {}).get("reference", False)


def runs_on(protocol, transport):
    return transport in OUTSIDE_REFERENCES.get(protocol, [transport])


def ucx_ceiling(cfg):
    """The registry reference the figures are given as ratios to (ucx_raw_put), or None."""
    return next((n for n, p in cfg.registry.items() if p["reference"]), None)


def host_transports():
    """The transports of TRANSPORTS this host offers, as `slotstream transports --json` says (asked of UCX's
    own resource lists); shm and tcp when it cannot say, so that a missing one fails loudly in a peer."""
    try:
        out = subprocess.run([BIN, "transports", "--json"], capture_output=True, text=True, timeout=30).stdout
        have = {t["name"] for t in json.loads(out) if t["available"]}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ["shm", "tcp"]
    return [t for t in TRANSPORTS if t in have] or ["shm", "tcp"]


def log(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------- measuring

_pending = {}  # pid -> bytes read past the last line handed out


def read_line(proc, timeout):
    """The next stdout line of a peer (a report can be megabytes: read in chunks), or what came
    before the timeout or EOF."""
    deadline = time.monotonic() + timeout
    buf = _pending.pop(proc.pid, b"")
    fd = proc.stdout.fileno()
    while b"\n" not in buf and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        buf += chunk
    line, sep, rest = buf.partition(b"\n")
    if rest:
        _pending[proc.pid] = rest
    return line.decode()


def run_pair(transport, protocol, size, count, blocks, devices=1, fps=0.0, gap_us=0, busy_poll=False,
             hold=None, timeout=300, seconds=0.0, rx_extra=(), tx_extra=()):
    """One measurement: a receiver peer and a sender peer; returns (sender, receiver) JSON."""
    tcp_socket = protocol == "tcp_socket"
    rx_cmd = [BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", transport, *rdma_args(transport)]
    if busy_poll:
        rx_cmd.append("--busy-poll")
    if hold:
        rx_cmd += ["--hold-block", hold]
    if tcp_socket:
        rx_cmd.append("--tcp-socket")
    rx_cmd += list(rx_extra)
    rx = subprocess.Popen(rx_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = read_line(rx, 20)
        if not line.startswith("listening on "):
            raise PeerError(f"receiver peer did not start: {line!r} {rx.stderr.read().decode()[:500]}")
        addr = line.split()[-1]
        tx_cmd = [BIN, "bench-peer", "send", "--to", addr, "--transport", transport, *rdma_args(transport),
                  "--protocol", protocol, "--blocks", str(blocks), "--size", str(size), "--count", str(count), "--devices", str(devices)]
        if fps:
            tx_cmd += ["--fps", str(fps)]
        if gap_us:
            tx_cmd += ["--gap-us", str(gap_us)]
        if seconds:
            tx_cmd += ["--seconds", str(seconds)]
        tx_cmd += list(tx_extra)
        if tcp_socket:
            tx_cmd = [c for c in tx_cmd if c not in ("--protocol", protocol)] + ["--tcp-socket"]
        try:
            tx = subprocess.run(tx_cmd, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PeerError(f"sender peer timed out after {timeout} s: {' '.join(tx_cmd)}")
        if tx.returncode != 0:
            raise PeerError(f"sender peer failed ({tx.returncode}): {tx.stderr.decode()[:500]}")
        sender = json.loads(tx.stdout)
        line = read_line(rx, 30)
        if not line.startswith("{"):
            raise PeerError(f"receiver peer gave no report within 30 s: {line!r}")
        return sender, json.loads(line)
    except PeerError as e:
        # The receiver's side of the story often names the cause (e.g. out of shared memory).
        stop(rx)
        err = rx.stderr.read().decode(errors="replace").strip()[-500:]
        raise PeerError(f"{e}; receiver peer stderr: {err!r}" if err else str(e)) from None
    except ValueError as e:  # JSON
        raise PeerError(f"a peer printed malformed JSON: {e}") from None
    finally:
        stop(rx)


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(transport, test, size, iters, extra=(), timeout=120, warmup=10):
    """One `ucx_perftest -t TEST` pair over the transport slotstream uses (same UCX_TLS): the numbers
    of its "Final:" line, i.e. [iterations, overhead p(R) / avg / overall µs, bandwidth avg / overall
    MiB/s, message rate avg / overall msg/s]."""
    env = ucx_env(transport)
    args = ["-t", test, "-s", str(size), "-n", str(iters), "-w", str(warmup), *extra]
    last = ""
    for _ in range(3):  # the port can be taken between free_port() and the server's bind
        port = str(free_port())
        srv = subprocess.Popen(["ucx_perftest", "-p", port, *args], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            out = ""
            for _ in range(40):  # the server listens a moment after it starts
                time.sleep(0.1)
                try:
                    cli = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port, *args], env=env,
                                         capture_output=True, text=True, timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise PeerError(f"ucx_perftest timed out after {timeout} s ({transport}, {test}, {size} B)")
                out = cli.stdout + cli.stderr
                if cli.returncode == 0 or srv.poll() is not None:
                    break
            m = re.search(r"^Final:((?:\s+[\d.]+)+)\s*$", out, re.M)
            if m:
                return [float(x) for x in m.group(1).split()]
            last = out[-500:]
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait(timeout=10)
    raise PeerError(f"ucx_perftest gave no result ({transport}, {test}, {size} B): {last!r}")


def perftest_latency(transport, size, iters, warmup, rank):
    """The UCX one-way put latency ceiling for one size: `ucx_perftest -t ucp_put_lat` (a put
    ping-pong, both sides polling the last byte of the buffer; it reports half the round trip),
    `iters` timed after `warmup` untimed, as the protocols' points are. Returns (percentile at
    `rank`, mean) in µs. The bench-peer's ucx_raw_put delivers nothing the receiver could time, so
    the latency reference is UCX's own tool, same transport and size."""
    final = perftest(transport, "ucp_put_lat", size, iters, ["-R", str(rank)], warmup=warmup)
    return final[1], final[2]


def perftest_bandwidth(transport, size, count):
    """UCX's put bandwidth ceiling for one size: `ucx_perftest -t ucp_put_bw`, `count` puts back to
    back into one cache-hot buffer with no flow control (issue 11's fabric limit). Returns (MB/s in
    10^6 bytes like every slotstream figure, messages/s)."""
    final = perftest(transport, "ucp_put_bw", size, count)
    rate = final[7]
    return rate * size / 1e6, rate


def pct(values, q):
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class Results:
    def __init__(self, out, argv):
        self.out = out
        self.records = []
        self.samples = {}
        self.errors = []
        self.config = {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "slotstream": subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip(),
            "ucx": self._ucx_version(),
            "command": " ".join(["slotstream", "bench", *argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }

    @staticmethod
    def _ucx_version():
        try:
            out = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True, timeout=10).stdout
            return out.splitlines()[0].strip("# ").strip() if out else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"

    run = 0  # the independent run (process pairs started afresh) being measured

    def add(self, experiment, protocol, transport, size, blocks, metric, value, unit, repeat=0, variant="",
            **dimensions):
        """One tidy record. `run`: which independent run; `repeat`: a round within that run's process pair
        (throughput); `variant`: a setting of the experiment beyond protocol/transport/size/blocks;
        `dimensions`: an experiment's own axes (e.g. cache: devices, window_bytes)."""
        self.records.append({"experiment": experiment, "protocol": protocol, "transport": transport,
                             "size_bytes": int(size), "blocks": int(blocks), "metric": metric,
                             "value": float(value), "unit": unit, "run": self.run, "repeat": int(repeat),
                             "variant": variant, **dimensions})

    def sample(self, experiment, key, data):
        """Raw samples for the figures, from the first run only (the records carry every run)."""
        if self.run == 0:
            self.samples.setdefault(experiment, {})[key] = data

    def error(self, what, err):
        log(f"  ! {what}: {err}")
        self.errors.append({"what": what, "error": str(err)})

    def save(self):
        doc = {"config": self.config, "records": self.records, "samples": self.samples, "errors": self.errors}
        (self.out / "results.json").write_text(json.dumps(doc, indent=1))


class Progress:
    def __init__(self, total, name, run, runs):
        self.total, self.done, self.t0, self.name = max(total, 1), 0, time.monotonic(), name
        self.tag = f"{name} run {run + 1}/{runs}" if runs > 1 else name

    def step(self, what):
        self.done += 1
        el = time.monotonic() - self.t0
        eta = el / self.done * (self.total - self.done)
        log(f"[{self.tag} {self.done}/{self.total} {el:5.0f}s, ~{eta:4.0f}s left] {what}")


def cpu_percent(peer):
    """A peer's CPU (user + system, all threads) over its measured window, in % of one core."""
    return 100 * peer["cpu_seconds"] / max(peer["seconds"], 1e-9)


def add_cpu(res, experiment, p, t, s, b, snd, rcv, variant=""):
    """CPU of both sides, per second and per MB moved, and the part spent progressing UCX."""
    mb = max(snd["bytes"], 1) / 1e6
    for side, peer in (("sender", snd), ("receiver", rcv)):
        res.add(experiment, p, t, s, b, f"cpu_{side}", cpu_percent(peer), "% of one core", variant=variant)
        res.add(experiment, p, t, s, b, f"cpu_{side}_per_mb", 1e3 * peer["cpu_seconds"] / mb, "ms/MB",
                variant=variant)
        # Time inside ucp_worker_progress summed over threads (a thread preempted inside counts
        # too, so this is not CPU and may pass 100% with many threads).
        prog = peer.get("resources", {}).get("progress_seconds")
        if prog is not None:
            res.add(experiment, p, t, s, b, f"progress_{side}", 100 * prog / max(peer["seconds"], 1e-9),
                    "% of wall time, summed over threads", variant=variant)


# ---------------------------------------------------------------------------- experiments

def throughput_count(size, blocks, cfg):
    """Transfers per round: the paper's 1,000, fewer for large sizes to bound the run time, but
    always enough to cycle through every block twice."""
    return max(2 * blocks, min(1000, cfg.round_bytes // size))


def exp_throughput(res, cfg):
    """Fig. 13-14 (throughput) and Fig. 15 (CPU) from the same runs."""
    protocols = cfg.protocols + references(cfg)
    runs = [(t, p, s, b) for t in cfg.transports for b in cfg.block_sets for s in cfg.sizes for p in protocols
            if runs_on(p, t)]
    prog = Progress(len(runs), "throughput", res.run, cfg.runs)
    ceiling = {}
    for t, p, s, b in runs:
        count = throughput_count(s, b, cfg)
        try:
            # One extra round first, not counted: it pays for first-touch page faults in freshly
            # allocated blocks, the same for every protocol.
            snd, rcv = run_pair(t, p, s, count * (cfg.repeats + 1), b)
        except PeerError as e:
            res.error(f"throughput {p} {t} {s} B {b} blocks (run {res.run})", e)
            prog.step(f"{t} {p} {s} B x{b}: FAILED")
            continue
        # Each round of `count` consecutive transfers: from its first send to its last arrival
        # (a registry reference delivers nothing, so its rounds are timed by the sender's own sends).
        sends = snd["send_times_ns"]
        arrivals = rcv["arrivals_ns"]
        rates = []
        if delivers_nothing(cfg, p):
            # Nothing arrives: a round ends when the next one starts (the put loop never waits),
            # the last one when the final flush returned.
            end = sends[0] + snd["seconds"] * 1e9
            for r in range(1, cfg.repeats + 1):
                first = sends[r * count]
                last = sends[(r + 1) * count] if (r + 1) * count < len(sends) else end
                rates.append(count * s / (max(last - first, 1) / 1e9) / 1e6)
        else:
            for r in range(1, cfg.repeats + 1):
                first = sends[r * count]
                last = arrivals[min(len(arrivals), (r + 1) * count) - 1]
                rates.append(count * s / (max(last - first, 1) / 1e9) / 1e6)
        for r, rate in enumerate(rates):
            res.add("throughput", p, t, s, b, "throughput", rate, "MB/s", r)
        add_cpu(res, "cpu", p, t, s, b, snd, rcv)
        # Receiver-driven protocols (buffered_read) batch by themselves: the mean bytes per read.
        counters = rcv.get("protocol_counters", {})
        if counters.get("reads"):
            res.add("throughput", p, t, s, b, "bytes_per_read", counters["bytes_read"] / counters["reads"], "bytes")
        median = statistics.median(rates)
        if p == ucx_ceiling(cfg):
            ceiling[(t, s, b)] = median
        prog.step(f"{t} {p:14} {s:>8} B x{b:<3} {median:9.1f} MB/s")
    # UCX's own put_bw beside them (issue 11: the fabric's limit, one buffer, no flow control).
    points = [(t, sz) for t in cfg.transports for sz in cfg.sizes]
    prog = Progress(len(points), "throughput (ucx_perftest put_bw)", res.run, cfg.runs)
    for t, sz in points:
        try:
            mbps, rate = perftest_bandwidth(t, sz, max(100, min(200_000, cfg.round_bytes * cfg.repeats // sz)))
        except (PeerError, OSError) as e:
            res.error(f"throughput ucx_perftest_put_bw {t} {sz} B (run {res.run})", e)
            prog.step(f"{t} ucx_perftest_put_bw {sz} B: FAILED")
            continue
        res.add("put_bw", "ucx_perftest_put_bw", t, sz, 1, "throughput", mbps, "MB/s")
        res.add("put_bw", "ucx_perftest_put_bw", t, sz, 1, "message_rate", rate, "msg/s")
        prog.step(f"{t} {'ucx_perftest_put_bw':14} {sz:>8} B {mbps:9.1f} MB/s, {rate / 1e6:6.2f} M msg/s")
    # Every figure as a ratio to the UCX ceiling measured in the same run.
    for (t, p, s, b), vals in group(res, "throughput", "throughput", run=res.run).items():
        c = ceiling.get((t, s, b))
        if c and p != ucx_ceiling(cfg):
            res.add("throughput", p, t, s, b, "throughput_ratio_to_ucx", statistics.median(vals) / c, "ratio")


def group(res, experiment, metric, run=None):
    out = {}
    for rec in res.records:
        if rec["experiment"] == experiment and rec["metric"] == metric and (run is None or rec["run"] == run):
            out.setdefault((rec["transport"], rec["protocol"], rec["size_bytes"], rec["blocks"]), []).append(rec["value"])
    return out


# Where one message's latency goes (bench-peer --trace, src/stream/trace.h): each stage runs from
# the first event to the second; "fill" starts at the stamp the sender peer puts in the message.
LATENCY_STAGES = (("fill", "stamp", "committed"), ("post", "committed", "posted"),
                  ("fabric_poll", "posted", "polled"), ("deliver", "polled", "delivered"))


def latency_stages(snd, rcv, warm=0):
    """Median µs of each stage over the messages both peers traced (one block per message, one
    device: packet i is message i), leaving out the first `warm`. Empty without a trace."""
    events = {}
    for side in (snd.get("trace") or [], rcv.get("trace") or []):
        for stage, device, packet, ns in side:
            if device == 0 and packet >= warm:
                events.setdefault(packet, {})[stage] = ns
    for i, stamp in enumerate(snd.get("send_times_ns") or []):
        if i in events:
            events[i]["stamp"] = stamp
    out = {}
    for name, first, second in LATENCY_STAGES:
        d = [e[second] - e[first] for e in events.values() if first in e and second in e]
        if d:
            out[name] = statistics.median(d) / 1000
    return out


def latency_gap_us(transport, size):
    """The sender's pause after each latency message: each one arrives before the next is sent
    (no queueing): 200 µs plus the size's time on the wire at ~1 GB/s (shm, rdma) or ~100 MB/s (tcp)."""
    return int(200 + size / (100 if transport == "tcp" else 1000))


def latency_samples(cfg, transport, size):
    """Messages timed per latency point: as many as fit in cfg.latency_budget_s of gaps, between
    cfg.latency_min and cfg.latency_max, so that a p99 rests on tens of samples where that is cheap
    (64 B: 2,000 messages in 0.4 s) and a large message's point stays bounded (tcp 8 MiB: 100)."""
    fit = int(cfg.latency_budget_s * 1e6 / latency_gap_us(transport, size))
    return max(cfg.latency_min, min(cfg.latency_max, fit))


def latency_warmup(cfg, samples):
    """Untimed messages before a latency point's `samples`: cfg.latency_warmup, but no more than a
    tenth of the samples (at least 5), so that a point of large messages (100 timed over tcp at
    8 MiB, 84 ms apart) is not doubled by its warm-up; every block is still written several times."""
    return max(min(5, cfg.latency_warmup), min(cfg.latency_warmup, samples // 10))


def exp_latency(res, cfg):
    """Fig. 12: one block in flight at a time; one-way time from the sender's stamp to the
    message being complete at a busy-polling receiver. The UCX ceiling is ucx_perftest's put
    latency (see perftest_latency)."""
    protocols = cfg.protocols + references(cfg)
    runs = [(t, p, s) for t in cfg.transports for s in cfg.sizes for p in protocols if runs_on(p, t)]
    prog = Progress(len(runs), "latency", res.run, cfg.runs)
    for t, p, s in runs:
        n = latency_samples(cfg, t, s)
        warm = latency_warmup(cfg, n)
        if delivers_nothing(cfg, p):  # no arrival to time: UCX's own put latency stands for it
            # ucx_perftest reports one percentile per run (its -R rank, over the run's samples): the
            # median and mean come from one run, and no p99 is recorded — one from a second run is
            # another sample of the machine's noise (it came out below the first run's median).
            try:
                p50, mean = perftest_latency(t, s, n, warm, 50)
            except (PeerError, OSError) as e:
                res.error(f"latency {p} {t} {s} B (ucx_perftest, run {res.run})", e)
                prog.step(f"{t} {p} {s} B: FAILED")
                continue
            # ucx_perftest puts into one buffer: blocks = 1.
            for metric, v in (("latency_mean", mean), ("latency_p50", p50), ("latency_samples", n)):
                res.add("latency", p, t, s, 1, metric, v, "us" if metric != "latency_samples" else "count")
            prog.step(f"{t} {p:14} {s:>8} B mean {mean:9.1f} us (ucx_perftest ucp_put_lat)")
            continue
        trace = ["--trace", str(8 * (warm + n))] if p not in OUTSIDE_REFERENCES else []
        try:
            snd, rcv = run_pair(t, p, s, warm + n, PAPER_BLOCKS, gap_us=latency_gap_us(t, s), busy_poll=True,
                                rx_extra=trace, tx_extra=trace)
        except PeerError as e:
            res.error(f"latency {p} {t} {s} B (run {res.run})", e)
            prog.step(f"{t} {p} {s} B: FAILED")
            continue
        # One device, in order: sample i is message i; the first `warm` are the warm-up.
        lat = [x / 1000 for x in rcv["latencies_ns"][warm:] if x > 0]
        if not lat:
            res.error(f"latency {p} {t} {s} B (run {res.run})", "no samples")
            prog.step(f"{t} {p} {s} B: no samples")
            continue
        for metric, v in (("latency_mean", statistics.mean(lat)), ("latency_p50", pct(lat, 50)),
                          ("latency_p99", pct(lat, 99))):
            res.add("latency", p, t, s, PAPER_BLOCKS, metric, v, "us")
        res.add("latency", p, t, s, PAPER_BLOCKS, "latency_samples", len(lat), "count")
        res.sample("latency", f"{p}/{t}/{s}", [round(x, 3) for x in lat])
        for stage, v in latency_stages(snd, rcv, warm).items():
            res.add("latency", p, t, s, PAPER_BLOCKS, f"stage_{stage}_p50", v, "us")
        prog.step(f"{t} {p:14} {s:>8} B mean {statistics.mean(lat):9.1f} us, median {pct(lat, 50):9.1f} us")
    # Every figure as a multiple of the UCX ceiling measured in the same run (1.0 = the ceiling).
    for metric in ("latency_mean", "latency_p50"):
        vals = group(res, "latency", metric, run=res.run)
        for (t, p, s, b), v in vals.items():
            c = vals.get((t, ucx_ceiling(cfg), s, 1))
            if c and p != ucx_ceiling(cfg) and c[0] > 0:
                res.add("latency", p, t, s, b, f"{metric}_ratio_to_ucx", v[0] / c[0], "ratio")


def exp_sync_latency(res, cfg):
    """Fig. 10-11: synchronisation-control latency vs number of blocks, measured the same way for
    every protocol: each time the sender finds no free receiver block it is blocked until one is
    free — one sample per such wait, from the moment it found none until it has one (status reads
    or ACK polling, fences, back-off all included). What one synchronisation operation costs (a
    status-array read, an ACK's delivery) is recorded beside it as sync_op_*."""
    runs = [(t, p, b) for t in cfg.transports for b in cfg.sync_blocks for p in cfg.protocols]
    prog = Progress(len(runs), "sync_latency", res.run, cfg.runs)
    size = 4096
    for t, p, b in runs:
        try:
            snd, _ = run_pair(t, p, size, cfg.sync_count, b)
        except PeerError as e:
            res.error(f"sync_latency {p} {t} {b} blocks (run {res.run})", e)
            prog.step(f"{t} {p} {b} blocks: FAILED")
            continue
        waits = [x / 1000 for x in snd["wait_samples_ns"]]
        ops = [x / 1000 for x in snd["sync_op_samples_ns"]]
        res.add("sync_latency", p, t, size, b, "sync_waits", len(waits), "count")
        res.add("sync_latency", p, t, size, b, "sync_operations", snd["sync_operations"], "count")
        for name, vals in (("sync_wait", waits), ("sync_op", ops)):
            if vals:
                for q, v in (("p50", pct(vals, 50)), ("p99", pct(vals, 99)), ("mean", statistics.mean(vals)),
                             ("max", max(vals))):
                    res.add("sync_latency", p, t, size, b, f"{name}_{q}", v, "us")
        if b == PAPER_BLOCKS and waits:
            res.sample("sync_latency", f"{p}/{t}/{b}", waits[:5000])
        prog.step(f"{t} {p:14} {b:>3} blocks wait p50 {pct(waits, 50):8.2f} us, p99 {pct(waits, 99):8.2f} us "
                  f"({len(waits)} waits, {snd['sync_operations']} sync operations)")


def time_bins(times_ns, sizes, t0, bin_ms, span_ms):
    bins = [0.0] * int(span_ms / bin_ms)
    for t, s in zip(times_ns, sizes):
        i = int((t - t0) / 1e6 / bin_ms)
        if 0 <= i < len(bins):
            bins[i] += s
    return [b / (bin_ms / 1000) / 1e6 for b in bins]  # MB/s


HELD = 2  # the paper's "block 3": receiver block index 2 of three
PAPER_PICK = "status_byte:pick=in_order"  # the paper's sender walk (docs/design.md)


def exp_held_block(res, cfg):
    """Fig. 18: three blocks, a saturating sender (back to back), and the receiver holds block 3
    (index 2) from 100 ms to 200 ms after the sender connected; throughput in 10 ms bins. With one
    of three blocks unavailable, a protocol that can skip it keeps two thirds of its blocks; one
    that must release in order stops. status_byte also runs with the paper's own pick
    (status_byte:pick=in_order: blocks in order, waiting for a full one, skipping only the held one)
    beside slotstream's default (pick=any)."""
    protocols = list(cfg.protocols)
    if "status_byte" in protocols and PAPER_PICK not in protocols:
        protocols.insert(protocols.index("status_byte") + 1, PAPER_PICK)
    prog = Progress(len(cfg.transports) * len(protocols), "held_block", res.run, cfg.runs)
    size, blocks = 65536, PAPER_BLOCKS
    for t in cfg.transports:
        for p in protocols:
            try:
                snd, rcv = run_pair(t, p, size, 10_000_000, blocks, seconds=0.5, hold=f"{HELD}:100:200")
            except PeerError as e:
                res.error(f"held_block {p} {t} (run {res.run})", e)
                prog.step(f"{t} {p}: FAILED")
                continue
            t0 = rcv["session_start_ns"]
            mbps = time_bins(rcv["arrivals_ns"], [size] * len(rcv["arrivals_ns"]), t0, 10, 500)
            res.sample("held_block", f"{p}/{t}", {"bin_ms": 10, "mb_per_s": mbps, "held": HELD})
            during = statistics.mean(mbps[11:20])
            before = statistics.mean(mbps[3:10])
            res.add("held_block", p, t, size, blocks, "throughput_during_hold", during, "MB/s")
            res.add("held_block", p, t, size, blocks, "throughput_before_hold", before, "MB/s")
            res.add("held_block", p, t, size, blocks, "during_over_before", during / before if before else 0, "ratio")
            res.add("held_block", p, t, size, blocks, "messages_lost", snd["messages"] - rcv["messages"], "count")
            prog.step(f"{t} {p:14} before {before:7.1f} MB/s, during hold {during:7.1f} MB/s")


CAMERAS, CAMERA_FPS = 12, 25
EQUAL_MEMORY_BLOCKS = 36  # about 3 frame blocks per camera, in total


def camera_settings(cfg):
    """(variant, blocks per connection) per protocol: slotstream's default of 32 blocks per
    connection (a baseline with one connection per camera then holds 12 times the memory), and
    the same total memory for every protocol (36 frame blocks, 3 per camera)."""
    out = []
    for p in cfg.protocols:
        per_device = cfg.registry[p]["connection_per_device"]
        out.append(("per_connection", p, DEFAULT_BLOCKS))
        out.append(("equal_memory", p, EQUAL_MEMORY_BLOCKS // CAMERAS if per_device else EQUAL_MEMORY_BLOCKS))
    return out


def exp_cameras(res, cfg):
    """Fig. 19: 12 cameras, 25 fps, 640x480x3, one connection (status byte) vs one per camera."""
    settings = camera_settings(cfg)
    prog = Progress(len(cfg.transports) * len(settings), "cameras", res.run, cfg.runs)
    count = int(cfg.camera_seconds * CAMERA_FPS)
    for t in cfg.transports:
        for variant, p, blocks in settings:
            try:
                snd, rcv = run_pair(t, p, CAMERA_FRAME, count, blocks, devices=CAMERAS, fps=CAMERA_FPS,
                                    timeout=cfg.camera_seconds * 10 + 60)
            except PeerError as e:
                res.error(f"cameras {p} {t} {variant} (run {res.run})", e)
                prog.step(f"{t} {p} {variant}: FAILED")
                continue
            arr = rcv["arrivals_ns"]
            t0 = min(snd["send_times_ns"])
            span = cfg.camera_seconds * 1000
            # 200 ms bins hold exactly 5 frame periods of every camera: what varies from bin to bin
            # is delivery, not the cameras' own 40 ms rhythm.
            # Statistics over the cameras' running time; the plotted series goes on until the last
            # frame arrived, so that a backlog drained after the cameras stopped is visible.
            nbins = int(span / 200)
            plotted = max(span, (max(arr, default=t0) - t0) / 1e6 + 200)
            mbps = time_bins(arr, [CAMERA_FRAME] * len(arr), t0, 200, plotted)
            steady = mbps[1:nbins - 1] or mbps[:nbins]
            frame_ms = sorted(x / 1e6 for x in rcv["latencies_ns"] if x > 0)
            mean = statistics.mean(steady)
            cov = statistics.pstdev(steady) / mean if mean else 0.0
            res.sample(f"cameras_{variant}", f"{p}/{t}", {"bin_ms": 200, "mb_per_s": mbps, "stop_ms": span})
            backlog_s = max(0.0, (max(arr, default=t0) - t0) / 1e6 - span) / 1000
            connections = snd["resources"]["connections"]
            for metric, v, unit in (
                    ("throughput_mean", mean, "MB/s"), ("throughput_cov", cov, "ratio"),
                    ("frames_lost", CAMERAS * count - rcv["messages"], "count"),
                    # How long after the cameras stopped the last frame arrived (a backlog drained).
                    ("last_frame_after_stop", backlog_s, "s"),
                    # A frame's time from its send stamp to complete at the receiver: bins can hide
                    # late frames that still land in the right 200 ms; these do not.
                    ("frame_latency_p50", pct(frame_ms, 50), "ms"),
                    ("frame_latency_p99", pct(frame_ms, 99), "ms"),
                    ("receiver_blocks_total", blocks * connections, "count"),
                    ("peak_rss_sender", snd["peak_rss_kb"] / 1024, "MiB"),
                    ("peak_rss_receiver", rcv["peak_rss_kb"] / 1024, "MiB")):
                res.add("cameras", p, t, CAMERA_FRAME, blocks, metric, v, unit, variant=variant)
            add_cpu(res, "cameras", p, t, CAMERA_FRAME, blocks, snd, rcv, variant=variant)
            if variant == "per_connection":
                for side, peer in (("sender", snd), ("receiver", rcv)):
                    for k, v in peer["resources"].items():
                        res.add("resources", p, t, CAMERA_FRAME, blocks, f"{side}_{k}", v, "count")
            prog.step(f"{t} {p:14} {variant:14} {blocks * connections:>4} blocks: {mean:7.1f} MB/s, CoV {cov:.3f}, "
                      f"lost {CAMERAS * count - rcv['messages']}")


def progress_key(transport):
    """The key of `receiver_progress_on` (`slotstream protocols --json`) for a transport of this run."""
    return f"rdma:{RDMA['transport'] or 'rc'}" if transport == "rdma" else transport


def exp_resources(res, cfg):
    """Fig. 16-17: what each protocol asks of the transport, counted in the code paths, for one
    device at the paper's 3 blocks (the 12-camera case is recorded by `cameras`). Beside the
    receiver's progress calls: whether the protocol and transport let it stay passive by design
    (`receiver_progress_on`: 1 = it takes part), so that a passive receiver that progressed shows."""
    prog = Progress(len(cfg.transports) * len(cfg.protocols), "resources", res.run, cfg.runs)
    size = 65536
    for t in cfg.transports:
        for p in cfg.protocols:
            try:
                snd, rcv = run_pair(t, p, size, 1000, PAPER_BLOCKS)
            except PeerError as e:
                res.error(f"resources {p} {t} (run {res.run})", e)
                prog.step(f"{t} {p}: FAILED")
                continue
            for side, peer in (("sender", snd), ("receiver", rcv)):
                for k, v in peer["resources"].items():
                    res.add("resources", p, t, size, PAPER_BLOCKS, f"{side}_{k}", v, "count")
            takes_part = cfg.registry.get(p, {}).get("receiver_progress_on", {}).get(progress_key(t))
            if takes_part is not None:
                res.add("resources", p, t, size, PAPER_BLOCKS, "receiver_takes_part_by_design", int(takes_part), "bool")
            prog.step(f"{t} {p:14} receiver progress calls {rcv['resources']['progress_calls']}"
                      f"{'' if takes_part is None else ' (takes part)' if takes_part else ' (passive by design)'}, "
                      f"puts {snd['resources']['puts']}, gets {snd['resources']['gets']}")


def exp_idle(res, cfg):
    """Issue 11's guard on the CPU story: a connected sender with almost nothing to send (one 64 B
    message a second) and its receiver, in the default (not busy-polling) mode. Both must sleep:
    their CPU, as % of one core over the session, is what an idle connection costs."""
    prog = Progress(len(cfg.transports) * len(cfg.protocols), "idle", res.run, cfg.runs)
    count = int(cfg.idle_seconds * cfg.idle_fps) + 1  # the first message starts the clock
    for t in cfg.transports:
        for p in cfg.protocols:
            try:
                snd, rcv = run_pair(t, p, 64, count, PAPER_BLOCKS, fps=cfg.idle_fps, timeout=count * 10 + 60)
            except PeerError as e:
                res.error(f"idle {p} {t} (run {res.run})", e)
                prog.step(f"{t} {p}: FAILED")
                continue
            for side, peer in (("sender", snd), ("receiver", rcv)):
                res.add("idle", p, t, 64, PAPER_BLOCKS, f"cpu_{side}", cpu_percent(peer), "% of one core")
            prog.step(f"{t} {p:14} idle CPU: sender {cpu_percent(snd):5.2f} %, receiver {cpu_percent(rcv):5.2f} %")


from fan_in_experiments import exp_fan_in  # noqa: E402  (bench/fan_in_experiments.py)

EXPERIMENTS = {
    # name: (paper figures, what it measures, function)
    "sync_latency": ("Fig. 10-11", "time the sender waits for a free block, per wait, vs number of blocks",
                     exp_sync_latency),
    "latency": ("Fig. 12", "one-block transmission latency, 64 B to 8 MiB", exp_latency),
    "throughput": ("Fig. 13-14", "throughput 64 B to 8 MiB, 3 blocks and the default 32", exp_throughput),
    "cpu": ("Fig. 15", "sender and receiver CPU during the throughput runs", exp_throughput),
    "resources": ("Fig. 16-17", "endpoints, registered memory, operations, completions, progress calls per side",
                  exp_resources),
    "held_block": ("Fig. 18", "3 blocks, saturated; block 3 held from 100 to 200 ms: throughput over time",
                   exp_held_block),
    "idle": ("issue 11", "a sender sending one 64 B message a second and its receiver: CPU of each (must sleep)",
             exp_idle),
    "cameras": ("Fig. 19", "12 cameras x 25 fps x 640x480x3, default and equal memory: stability, CPU, memory",
                exp_cameras),
    "cache": ("CARC slides", "receiver processing x devices x in-flight data: carc, credit (cache_experiments.py)",
              cache_experiments.exp_cache),
    "fan_in": ("thesis", "1-12 senders into one receiver: a thread per sender vs one round-robin thread "
                         "(fan_in_experiments.py)", fan_in_experiments.exp_fan_in),
    "message_rate": ("issue 21", "small messages per second, 16 B-1 KiB x 1-12 devices, beside ucx_perftest put_bw "
                                 "(rate_experiments.py)", rate_experiments.exp_message_rate),
}
EXPERIMENTS.update(ring_experiments.experiments(run_pair, Progress, PeerError, BIN))  # the SDP paper's


import dgram_experiments  # noqa: E402  (bench/dgram_experiments.py: the datagram transport's experiments)
dgram_experiments.register(EXPERIMENTS, sys.modules[__name__])
import zero_copy  # noqa: E402  (bench/zero_copy.py: issue 22's zero-copy receive against the copy path)
zero_copy.register(EXPERIMENTS)


def check_cpu(res, cpus):
    """No process can use more than all the machine's cores: a figure above that is a measuring bug."""
    for rec in res.records:
        if rec["unit"] == "% of one core" and rec["value"] > 100 * cpus * 1.02:
            res.error(f"{rec['experiment']} {rec['protocol']} {rec['transport']} {rec['metric']} (run {rec['run']})",
                      f"{rec['value']:.0f}% of one core on a {cpus}-CPU host: impossible, a measuring window is wrong")


def main(argv):
    epilog = "experiments:\n" + "\n".join(f"  {n:15} {f:14} {d}" for n, (f, d, _) in EXPERIMENTS.items())
    epilog += "\n  all             everything above, on every transport, plus OUT/report.md"
    ap = argparse.ArgumentParser(prog="slotstream bench", description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    ap.add_argument("--protocols", help="comma-separated (default: every protocol of `slotstream protocols`)")
    ap.add_argument("--transport", choices=TRANSPORTS, help="one transport (default: every one this host has, "
                                                            "`slotstream transports`)")
    ap.add_argument("--rdma-transport", choices=["rc", "dc", "ud"], help="rdma over UCX's rc (default), dc or ud")
    ap.add_argument("--rdma-device", help="NAME:PORT of the RDMA device (e.g. mlx5_0:1; default: any)")
    ap.add_argument("--sizes", help="comma-separated message sizes in bytes")
    ap.add_argument("--blocks", type=int, help="block count for throughput (default: 3 and 32)")
    ap.add_argument("--repeats", type=int, help="rounds of consecutive transfers per run (default 10; quick 3)")
    ap.add_argument("--runs", type=int, help="independent runs, each with fresh processes (default 3; quick 1); "
                                             "the report gives min / median / max over them")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, rounds, seconds and one run")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: seconds, not minutes
    ap.add_argument("--out", required=True, help="directory for results.json, plots and report.md")
    a = ap.parse_args(argv)
    if a.runs is not None and a.runs < 1:
        ap.error("--runs must be at least 1")

    cfg = argparse.Namespace()
    RDMA.update(transport=a.rdma_transport, device=a.rdma_device)
    cfg.registry = registry()
    data_protocols = [n for n, p in cfg.registry.items() if not p["reference"]]
    cfg.protocols = [p for p in a.protocols.split(",") if p] if a.protocols else data_protocols
    for p in cfg.protocols:  # an unknown one fails in its peer and is reported as an error record
        cfg.registry.setdefault(p, {"connection_per_device": False, "reference": False})
    cfg.transports = [a.transport] if a.transport else host_transports()
    quick = a.quick or a.tiny
    cfg.mode = "tiny" if a.tiny else "quick" if a.quick else "full"
    cfg.runs = a.runs or (1 if quick else 3)
    cfg.quick, cfg.tiny = quick, a.tiny
    cfg.sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else (QUICK_SIZES if quick else FULL_SIZES)
    cfg.quick, cfg.tiny, cfg.sizes_given = a.quick, a.tiny, bool(a.sizes)
    cfg.block_sets = [a.blocks] if a.blocks else [PAPER_BLOCKS, DEFAULT_BLOCKS]
    cfg.repeats = a.repeats or (2 if a.tiny else 3 if quick else 10)
    cfg.round_bytes = (1 << 20) if a.tiny else (8 << 20) if quick else (32 << 20)
    # Latency: a warm-up the figures leave out (first touches of blocks and code, the receiver's
    # first passes; ucx_perftest gets the same), then a time-budgeted number of timed messages.
    cfg.latency_warmup = 5 if a.tiny else 100
    cfg.latency_min, cfg.latency_max = (20, 20) if a.tiny else (100, 2000)
    cfg.latency_budget_s = 0.0 if a.tiny else 1.0
    cfg.sync_blocks = [3, 32] if a.tiny else [3, 16, 128] if quick else SYNC_BLOCKS
    cfg.sync_count = 500 if a.tiny else 5000
    cfg.camera_seconds = 0.4 if a.tiny else 3 if a.quick else 10
    cfg.idle_seconds, cfg.idle_fps = (0.5, 4.0) if a.tiny else (3, 1.0) if a.quick else (10, 1.0)
    cfg.fan_in_senders, cfg.fan_in_sizes = ([2], [512]) if a.tiny else (None, None)
    if a.tiny:
        # One size (the 256 B target point): the test checks records and plots, not curves,
        # and must stay well under a minute on every transport of a 2-core machine.
        cfg.sizes = [256] if not a.sizes else cfg.sizes
        cfg.block_sets = cfg.block_sets[:1]

    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = Results(out, argv)
    res.config["settings"] = {k: v for k, v in vars(cfg).items() if k != "registry"}
    res.config["settings"]["rdma"] = dict(RDMA)
    names = list(EXPERIMENTS) if a.experiment == "all" else [a.experiment]
    t0 = time.monotonic()
    # Runs outermost: each run measures every experiment once, so that a slow phase of the machine
    # spreads over all protocols instead of landing on one.
    for run in range(cfg.runs):
        res.run = run
        done_funcs = set()
        for name in names:
            fn = EXPERIMENTS[name][2]
            if fn in done_funcs:
                continue  # throughput and cpu come from the same runs
            done_funcs.add(fn)
            log(f"== {name}{f' (run {run + 1} of {cfg.runs})' if cfg.runs > 1 else ''}: {EXPERIMENTS[name][1]}")
            fn(res, cfg)
            res.save()
    check_cpu(res, os.cpu_count() or 1)
    res.save()
    log(f"== measured in {time.monotonic() - t0:.0f} s; results in {out / 'results.json'}")
    # Every run writes its report, whatever it measured (plot.py leaves out the sections without data).
    plot = subprocess.run([sys.executable, str(HERE / "plot.py"), str(out / "results.json"), "--report"])
    if plot.returncode != 0:
        log("plotting failed (is python3-matplotlib installed? scripts/setup.sh installs it)")
        return 1
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
