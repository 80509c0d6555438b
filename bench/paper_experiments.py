"""The status-byte paper's evaluation (section 4) for `slotstream bench`, side by side with the
sliding-window baseline, the raw UCX put ceiling and plain TCP sockets, on every transport:
sync_latency (Fig. 10-11), latency (Fig. 12), throughput and cpu (Fig. 13-15), resources (Fig. 16-17),
held_block (Fig. 18), cameras (Fig. 19) and issue 11's idle.

Every measurement starts two real processes (`slotstream bench-peer recv` and `... send`,
docs/bench-peer.md, through harness.run_pair) and records what they report; bench/plot.py draws the
figures and the report from the records.
"""
import statistics

import paper_variants  # the paper's configurations of status_byte and sliding_window (issue 22)
from harness import (DEFAULT_BLOCKS, PAPER_BLOCKS, RDMA, Experiment, PeerError, Progress, add_cpu, cpu_percent,
                     for_each_point, pct, perftest_bandwidth, perftest_latency, run_pair)

# References outside the C++ registry (the registry's own, e.g. ucx_raw_put, carry `reference`):
# the transports each is measured on. tcp_socket is plain TCP, so it has no shm variant.
OUTSIDE_REFERENCES = {"tcp_socket": ["tcp"]}
SYNC_BLOCKS = [3, 8, 16, 32, 64, 128]
CAMERA_FRAME = 640 * 480 * 3


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


# ---------------------------------------------------------------------------- throughput and cpu

def throughput_count(size, blocks, cfg):
    """Transfers per round: the paper's 1,000, fewer for large sizes to bound the run time, but
    always enough to cycle through every block twice."""
    return max(2 * blocks, min(1000, cfg.round_bytes // size))


def throughput_transfers(size, count, cfg):
    """How many transfers a point's sender is asked for: the counted rounds, one more round, and
    `throughput_warm_bytes` more. The sender also stops after `throughput_seconds`, whichever comes
    first, so a slow point (tcp at 64 B) costs no more than that."""
    return count * (cfg.repeats + 1) + -(-cfg.throughput_warm_bytes // size)


def counted_rounds(cfg, count, sent):
    """(first transfer counted, rounds): the last `repeats` whole rounds of the `sent` transfers, or as
    many as fit after one uncounted round when the time bound stopped the sender early."""
    rounds = min(cfg.repeats, sent // count - 1)
    if rounds < 1:
        raise PeerError(f"the sender stopped after {sent} transfers, fewer than two rounds of {count}")
    return sent - rounds * count, rounds


def round_rates(cfg, protocol, size, count, snd, rcv):
    """MB/s of each counted round of `count` consecutive transfers: from its first send to its last
    arrival. The counted rounds are the stream's last ones; what came before them warmed up.
    A registry reference delivers nothing, so its rounds are timed by its own sends: a round ends when
    the next one starts (the put loop never waits but for its periodic flushes), and the transfer
    after the last counted round only marks that end. (Its last round used to end when the sender's
    finish() returned, end handshake included: at 256 B one round in three fell to a tenth.)"""
    sends = snd["send_times_ns"]
    arrivals = rcv["arrivals_ns"]
    by_sends = delivers_nothing(cfg, protocol)
    first, rounds = counted_rounds(cfg, count, len(sends) - 1 if by_sends else len(sends))
    rates = []
    for r in range(rounds):
        start = first + r * count
        end = sends[start + count] if by_sends else arrivals[min(len(arrivals), start + count) - 1]
        rates.append(count * size / (max(end - sends[start], 1) / 1e9) / 1e6)
    return rates


def throughput_point(res, cfg, ceiling, t, p, s, b):
    count = throughput_count(s, b, cfg)
    # The counted rounds come after a warm-up of at least one round and throughput_warm_bytes: the first
    # round pays for first-touch page faults in freshly allocated blocks, and on a small machine the
    # scheduler settles where the peers' threads run within tens of milliseconds. Before the warm-up
    # grew past one round, a run of 4,000 x 256 B lasted a few milliseconds and some ran entirely in
    # the first placement (docs/benchmarks.md, "Throughput: rounds after a warm-up").
    snd, rcv = run_pair(t, p, s, throughput_transfers(s, count, cfg), b, seconds=cfg.throughput_seconds)
    rates = round_rates(cfg, p, s, count, snd, rcv)
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
    return f"{t} {p:14} {s:>8} B x{b:<3} {median:9.1f} MB/s"


def put_bw_point(res, cfg, t, sz):
    mbps, rate = perftest_bandwidth(t, sz, max(100, min(200_000, cfg.round_bytes * cfg.repeats // sz)))
    res.add("put_bw", "ucx_perftest_put_bw", t, sz, 1, "throughput", mbps, "MB/s")
    res.add("put_bw", "ucx_perftest_put_bw", t, sz, 1, "message_rate", rate, "msg/s")
    return f"{t} {'ucx_perftest_put_bw':14} {sz:>8} B {mbps:9.1f} MB/s, {rate / 1e6:6.2f} M msg/s"


def exp_throughput(res, cfg):
    """Fig. 13-14 (throughput) and Fig. 15 (CPU) from the same runs; the paper's configurations of
    status_byte and sliding_window beside ours (bench/paper_variants.py)."""
    protocols = paper_variants.with_variants(cfg.protocols, cfg, res.run, "throughput") + references(cfg)
    points = [(t, p, s, b) for t in cfg.transports for b in cfg.block_sets for s in cfg.sizes for p in protocols
              if runs_on(p, t)]
    ceiling = {}
    for_each_point(res, cfg, "throughput", points, lambda *pt: throughput_point(res, cfg, ceiling, *pt),
                   lambda t, p, s, b: f"{t} {p} {s} B x{b}")
    # UCX's own put_bw beside them (issue 11: the fabric's limit, one buffer, no flow control).
    points = [(t, sz) for t in cfg.transports for sz in cfg.sizes]
    for_each_point(res, cfg, "throughput", points, lambda t, sz: put_bw_point(res, cfg, t, sz),
                   lambda t, sz: f"{t} ucx_perftest_put_bw {sz} B", errors=(PeerError, OSError),
                   prog=Progress(len(points), "throughput (ucx_perftest put_bw)", res.run, cfg.runs))
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


# ---------------------------------------------------------------------------- latency

# Where one message's latency goes (bench-peer --trace, src/engine/ucx/stream/trace.h): each stage runs from
# the first event to the second; "fill" starts at the stamp the sender peer puts in the message.
LATENCY_STAGES = (("fill", "stamp", "committed"), ("post", "committed", "posted"),
                  ("fabric_poll", "posted", "polled"), ("deliver", "polled", "delivered"))
STAGE_EVENTS = ("stamp", "committed", "posted", "polled", "delivered")


def message_stages(e):
    """One message's stages in µs from its events (ns), or None without all of them. A trace event is stamped
    after what it marks (`committed` after the record is published, `posted` after the transmit call returned), so
    a later event can carry an earlier stamp: the sending thread may transmit a packed record, or the receiver
    poll it, before its filler or transmitter stamped the step before. The step happened no later than the next
    one: each event counts at the earliest of its own and the later events' stamps (never before `stamp`, taken
    before the fill). No stage is negative, and the stages add up to the message's stamp-to-delivered time."""
    if any(k not in e for k in STAGE_EVENTS):
        return None
    t = [e[k] for k in STAGE_EVENTS]
    for i in range(len(t) - 2, 0, -1):
        t[i] = max(t[0], min(t[i], t[i + 1]))
    at = dict(zip(STAGE_EVENTS, t))
    return {name: (at[second] - at[first]) / 1000 for name, first, second in LATENCY_STAGES}


def latency_stages(snd, rcv, warm=0):
    """Mean µs of each stage, and of their sum ("total"), over the messages both peers traced with every event
    (one block per message, one device: packet i is message i), leaving out the first `warm`. Means over the same
    messages, so the stages add up to the total (medians of stages do not add up to any one message's time).
    Empty without a trace."""
    events = {}
    for side in (snd.get("trace") or [], rcv.get("trace") or []):
        for stage, device, packet, ns in side:
            if device == 0 and packet >= warm:
                events.setdefault(packet, {})[stage] = ns
    for i, stamp in enumerate(snd.get("send_times_ns") or []):
        if i in events:
            events[i]["stamp"] = stamp
    per_message = [m for m in map(message_stages, events.values()) if m]
    if not per_message:
        return {}
    out = {name: statistics.fmean(m[name] for m in per_message) for name, _, _ in LATENCY_STAGES}
    out["total"] = sum(out[name] for name, _, _ in LATENCY_STAGES)
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


def perftest_latency_point(res, t, p, s, n, warm):
    """A reference that delivers nothing: UCX's own put latency stands for it. ucx_perftest reports one
    percentile per run (its -R rank, over the run's samples): the median and mean come from one run, and
    no p99 is recorded — one from a second run is another sample of the machine's noise (it came out
    below the first run's median)."""
    p50, mean = perftest_latency(t, s, n, warm, 50)
    # ucx_perftest puts into one buffer: blocks = 1.
    for metric, v in (("latency_mean", mean), ("latency_p50", p50), ("latency_samples", n)):
        res.add("latency", p, t, s, 1, metric, v, "us" if metric != "latency_samples" else "count")
    return f"{t} {p:14} {s:>8} B mean {mean:9.1f} us (ucx_perftest ucp_put_lat)"


def latency_point(res, cfg, t, p, s):
    n = latency_samples(cfg, t, s)
    warm = latency_warmup(cfg, n)
    if delivers_nothing(cfg, p):  # no arrival to time
        return perftest_latency_point(res, t, p, s, n, warm)
    trace = ["--trace", str(8 * (warm + n))] if p not in OUTSIDE_REFERENCES else []
    snd, rcv = run_pair(t, p, s, warm + n, PAPER_BLOCKS, gap_us=latency_gap_us(t, s), busy_poll=True,
                        rx_extra=trace, tx_extra=trace)
    # One device, in order: sample i is message i; the first `warm` are the warm-up.
    lat = [x / 1000 for x in rcv["latencies_ns"][warm:] if x > 0]
    if not lat:
        raise PeerError("no samples")
    for metric, v in (("latency_mean", statistics.mean(lat)), ("latency_p50", pct(lat, 50)),
                      ("latency_p99", pct(lat, 99))):
        res.add("latency", p, t, s, PAPER_BLOCKS, metric, v, "us")
    res.add("latency", p, t, s, PAPER_BLOCKS, "latency_samples", len(lat), "count")
    res.sample("latency", f"{p}/{t}/{s}", [round(x, 3) for x in lat])
    for stage, v in latency_stages(snd, rcv, warm).items():
        res.add("latency", p, t, s, PAPER_BLOCKS, f"stage_{stage}_mean", v, "us")
    return f"{t} {p:14} {s:>8} B mean {statistics.mean(lat):9.1f} us, median {pct(lat, 50):9.1f} us"


def exp_latency(res, cfg):
    """Fig. 12: one block in flight at a time; one-way time from the sender's stamp to the
    message being complete at a busy-polling receiver. The UCX ceiling is ucx_perftest's put
    latency (see perftest_latency)."""
    protocols = cfg.protocols + references(cfg)
    points = [(t, p, s) for t in cfg.transports for s in cfg.sizes for p in protocols if runs_on(p, t)]
    for_each_point(res, cfg, "latency", points, lambda *pt: latency_point(res, cfg, *pt),
                   lambda t, p, s: f"{t} {p} {s} B", errors=(PeerError, OSError))
    # Every figure as a multiple of the UCX ceiling measured in the same run (1.0 = the ceiling).
    for metric in ("latency_mean", "latency_p50"):
        vals = group(res, "latency", metric, run=res.run)
        for (t, p, s, b), v in vals.items():
            c = vals.get((t, ucx_ceiling(cfg), s, 1))
            if c and p != ucx_ceiling(cfg) and c[0] > 0:
                res.add("latency", p, t, s, b, f"{metric}_ratio_to_ucx", v[0] / c[0], "ratio")


# ---------------------------------------------------------------------------- sync_latency

def sync_point(res, cfg, t, p, b):
    size = 4096
    snd, _ = run_pair(t, p, size, cfg.sync_count, b)
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
    return (f"{t} {p:14} {b:>3} blocks wait p50 {pct(waits, 50):8.2f} us, p99 {pct(waits, 99):8.2f} us "
            f"({len(waits)} waits, {snd['sync_operations']} sync operations)")


def exp_sync_latency(res, cfg):
    """Fig. 10-11: synchronisation-control latency vs number of blocks, measured the same way for
    every protocol: each time the sender finds no free receiver block it is blocked until one is
    free — one sample per such wait, from the moment it found none until it has one (status reads
    or ACK polling, fences, back-off all included). What one synchronisation operation costs (a
    status-array read, an ACK's delivery) is recorded beside it as sync_op_*."""
    points = [(t, p, b) for t in cfg.transports for b in cfg.sync_blocks
              for p in paper_variants.with_variants(cfg.protocols, cfg, res.run)
              if not paper_variants.tiny_skips(cfg, p, t, blocks=b)]
    for_each_point(res, cfg, "sync_latency", points, lambda *pt: sync_point(res, cfg, *pt),
                   lambda t, p, b: f"{t} {p} {b} blocks")


# ---------------------------------------------------------------------------- held_block

def time_bins(times_ns, sizes, t0, bin_ms, span_ms):
    bins = [0.0] * int(span_ms / bin_ms)
    for t, s in zip(times_ns, sizes):
        i = int((t - t0) / 1e6 / bin_ms)
        if 0 <= i < len(bins):
            bins[i] += s
    return [b / (bin_ms / 1000) / 1e6 for b in bins]  # MB/s


HELD = 2  # the paper's "block 3": receiver block index 2 of three


def held_block_point(res, t, p):
    size, blocks = 65536, PAPER_BLOCKS
    snd, rcv = run_pair(t, p, size, 10_000_000, blocks, seconds=0.5, hold=f"{HELD}:100:200")
    # The receiver's hold clock starts at the sender's first data (recv --hold-block), so do the bins:
    # counted from the session's start they were off by the connection's set-up, tens of ms on a
    # loaded machine (the hold then fell partly outside the "during" bins).
    t0 = min(rcv["arrivals_ns"], default=rcv["session_start_ns"])
    mbps = time_bins(rcv["arrivals_ns"], [size] * len(rcv["arrivals_ns"]), t0, 10, 500)
    res.sample("held_block", f"{p}/{t}", {"bin_ms": 10, "mb_per_s": mbps, "held": HELD})
    during = statistics.mean(mbps[11:20])
    before = statistics.mean(mbps[3:10])
    res.add("held_block", p, t, size, blocks, "throughput_during_hold", during, "MB/s")
    res.add("held_block", p, t, size, blocks, "throughput_before_hold", before, "MB/s")
    res.add("held_block", p, t, size, blocks, "during_over_before", during / before if before else 0, "ratio")
    res.add("held_block", p, t, size, blocks, "messages_lost", snd["messages"] - rcv["messages"], "count")
    return f"{t} {p:14} before {before:7.1f} MB/s, during hold {during:7.1f} MB/s"


def exp_held_block(res, cfg):
    """Fig. 18: three blocks, a saturating sender (back to back), and the receiver holds block 3
    (index 2) from 100 ms to 200 ms after the sender's first data; throughput in 10 ms bins. With one
    of three blocks unavailable, a protocol that can skip it keeps two thirds of its blocks; one
    that must release in order stops. status_byte and sliding_window also run as the paper ran them
    (status_byte:policy=paper: blocks in order, waiting for a full one, skipping only the held one;
    sliding_window:ack=thread), beside slotstream's defaults (bench/paper_variants.py)."""
    protocols = paper_variants.with_variants(cfg.protocols, cfg, res.run)
    points = [(t, p) for t in cfg.transports for p in protocols if not paper_variants.tiny_skips(cfg, p, t)]
    for_each_point(res, cfg, "held_block", points, lambda t, p: held_block_point(res, t, p),
                   lambda t, p: f"{t} {p}")


# ---------------------------------------------------------------------------- cameras

CAMERAS, CAMERA_FPS = 12, 25
EQUAL_MEMORY_BLOCKS = 36  # about 3 frame blocks per camera, in total


def camera_settings(cfg, run=0):
    """(variant, blocks per connection) per protocol: slotstream's default of 32 blocks per
    connection (a baseline with one connection per camera then holds 12 times the memory), and
    the same total memory for every protocol (36 frame blocks, 3 per camera); the paper's
    configurations of status_byte and sliding_window beside ours (bench/paper_variants.py)."""
    out = []
    for p in paper_variants.with_variants(cfg.protocols, cfg, run):
        per_device = paper_variants.registry_entry(cfg.registry, p)["connection_per_device"]
        out.append(("per_connection", p, DEFAULT_BLOCKS))
        out.append(("equal_memory", p, EQUAL_MEMORY_BLOCKS // CAMERAS if per_device else EQUAL_MEMORY_BLOCKS))
    return out


def host_memory_kib():
    """The host's RAM (MemTotal), for memory as % of it (the paper's Fig. 19 figure), or 0."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return 0


def camera_stream(cfg, snd, rcv):
    """(MB/s per 200 ms bin until the last frame arrived, mean and CoV over the cameras' running time,
    seconds the last frame came after the cameras stopped)."""
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
    mean = statistics.mean(steady)
    cov = statistics.pstdev(steady) / mean if mean else 0.0
    backlog_s = max(0.0, (max(arr, default=t0) - t0) / 1e6 - span) / 1000
    return mbps, mean, cov, backlog_s


def frame_jitter_ms(rcv):
    """The frames' delivery jitter: population standard deviation of each frame's send-stamp-to-complete time, ms
    (0.0 without samples). The 200 ms bins' CoV cannot show jitter from a paced source: every bin holds the same 5
    frames per camera however late within it each one lands; a frame's own time does show it."""
    frame_ms = [x / 1e6 for x in rcv["latencies_ns"] if x > 0]
    return statistics.pstdev(frame_ms) if len(frame_ms) > 1 else 0.0


def camera_point(res, cfg, t, variant, p, blocks):
    count = int(cfg.camera_seconds * CAMERA_FPS)
    snd, rcv = run_pair(t, p, CAMERA_FRAME, count, blocks, devices=CAMERAS, fps=CAMERA_FPS,
                        timeout=cfg.camera_seconds * 10 + 60)
    mbps, mean, cov, backlog_s = camera_stream(cfg, snd, rcv)
    frame_ms = sorted(x / 1e6 for x in rcv["latencies_ns"] if x > 0)
    res.sample(f"cameras_{variant}", f"{p}/{t}",
               {"bin_ms": 200, "mb_per_s": mbps, "stop_ms": cfg.camera_seconds * 1000})
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
            ("frame_jitter", frame_jitter_ms(rcv), "ms"),
            ("receiver_blocks_total", blocks * connections, "count"),
            ("peak_rss_sender", snd["peak_rss_kb"] / 1024, "MiB"),
            ("peak_rss_receiver", rcv["peak_rss_kb"] / 1024, "MiB")):
        res.add("cameras", p, t, CAMERA_FRAME, blocks, metric, v, unit, variant=variant)
    host_kib = host_memory_kib()
    if host_kib:  # Fig. 19 gives memory as a share of the host's (1.3 % vs 2.4 %)
        for side, peer in (("sender", snd), ("receiver", rcv)):
            res.add("cameras", p, t, CAMERA_FRAME, blocks, f"memory_{side}", 100 * peer["peak_rss_kb"] / host_kib,
                    "% of host memory", variant=variant)
    add_cpu(res, "cameras", p, t, CAMERA_FRAME, blocks, snd, rcv, variant=variant)
    if variant == "per_connection":
        for side, peer in (("sender", snd), ("receiver", rcv)):
            for k, v in peer["resources"].items():
                res.add("resources", p, t, CAMERA_FRAME, blocks, f"{side}_{k}", v, "count")
    return (f"{t} {p:14} {variant:14} {blocks * connections:>4} blocks: {mean:7.1f} MB/s, jitter "
            f"{frame_jitter_ms(rcv):.3f} ms, "
            f"lost {CAMERAS * count - rcv['messages']}")


def exp_cameras(res, cfg):
    """Fig. 19: 12 cameras, 25 fps, 640x480x3, one connection (status byte) vs one per camera; the
    paper's configurations of status_byte and sliding_window beside ours."""
    points = [(t, variant, p, blocks) for t in cfg.transports for variant, p, blocks in camera_settings(cfg, res.run)
              if not paper_variants.tiny_skips(cfg, p, t, variant=variant)]
    for_each_point(res, cfg, "cameras", points, lambda *pt: camera_point(res, cfg, *pt),
                   lambda t, variant, p, blocks: f"{t} {p} {variant}")


# ---------------------------------------------------------------------------- resources and idle

def progress_key(transport):
    """The key of `receiver_progress_on` (`slotstream protocols --json`) for a transport of this run."""
    return f"rdma:{RDMA['transport'] or 'rc'}" if transport == "rdma" else transport


def resources_point(res, cfg, t, p):
    size = 65536
    snd, rcv = run_pair(t, p, size, 1000, PAPER_BLOCKS)
    for side, peer in (("sender", snd), ("receiver", rcv)):
        for k, v in peer["resources"].items():
            res.add("resources", p, t, size, PAPER_BLOCKS, f"{side}_{k}", v, "count")
    takes_part = cfg.registry.get(p, {}).get("receiver_progress_on", {}).get(progress_key(t))
    if takes_part is not None:
        res.add("resources", p, t, size, PAPER_BLOCKS, "receiver_takes_part_by_design", int(takes_part), "bool")
    return (f"{t} {p:14} receiver progress calls {rcv['resources']['progress_calls']}"
            f"{'' if takes_part is None else ' (takes part)' if takes_part else ' (passive by design)'}, "
            f"puts {snd['resources']['puts']}, gets {snd['resources']['gets']}")


def exp_resources(res, cfg):
    """Fig. 16-17: what each protocol asks of the transport, counted in the code paths, for one
    device at the paper's 3 blocks (the 12-camera case is recorded by `cameras`). Beside the
    receiver's progress calls: whether the protocol and transport let it stay passive by design
    (`receiver_progress_on`: 1 = it takes part), so that a passive receiver that progressed shows."""
    points = [(t, p) for t in cfg.transports for p in cfg.protocols]
    for_each_point(res, cfg, "resources", points, lambda t, p: resources_point(res, cfg, t, p),
                   lambda t, p: f"{t} {p}")


def idle_point(res, cfg, t, p):
    count = int(cfg.idle_seconds * cfg.idle_fps) + 1  # the first message starts the clock
    snd, rcv = run_pair(t, p, 64, count, PAPER_BLOCKS, fps=cfg.idle_fps, timeout=count * 10 + 60)
    for side, peer in (("sender", snd), ("receiver", rcv)):
        res.add("idle", p, t, 64, PAPER_BLOCKS, f"cpu_{side}", cpu_percent(peer), "% of one core")
    return f"{t} {p:14} idle CPU: sender {cpu_percent(snd):5.2f} %, receiver {cpu_percent(rcv):5.2f} %"


def exp_idle(res, cfg):
    """Issue 11's guard on the CPU story: a connected sender with almost nothing to send (one 64 B
    message a second) and its receiver, in the default (not busy-polling) mode. Both must sleep:
    their CPU, as % of one core over the session, is what an idle connection costs."""
    points = [(t, p) for t in cfg.transports for p in cfg.protocols]
    for_each_point(res, cfg, "idle", points, lambda t, p: idle_point(res, cfg, t, p), lambda t, p: f"{t} {p}")


# Each experiment's own settings by mode (full, quick, tiny); the shared ones (sizes, blocks, repeats,
# round_bytes) are the entry script's, since its options set them.
THROUGHPUT_DEFAULTS = {
    # (full, quick, tiny). The warm-up before the counted rounds, in bytes beyond one round, and the
    # time after which a point's sender stops even if it has not sent them all (tiny: no bound).
    "throughput_warm_bytes": (32 << 20, 8 << 20, 0), "throughput_seconds": (1.5, 0.5, 0.0)}

LATENCY_DEFAULTS = {
    # A warm-up the figures leave out (first touches of blocks and code, the receiver's first passes;
    # ucx_perftest gets the same), then a time-budgeted number of timed messages.
    "latency_warmup": (100, 100, 5), "latency_min": (100, 100, 20), "latency_max": (2000, 2000, 20),
    "latency_budget_s": (1.0, 1.0, 0.0)}

EXPERIMENTS = {
    "sync_latency": Experiment("Fig. 10-11", "time the sender waits for a free block, per wait, vs number of blocks",
                               exp_sync_latency, {"sync_blocks": (SYNC_BLOCKS, [3, 16, 128], [3, 32]),
                                                  "sync_count": (5000, 5000, 500)}),
    "latency": Experiment("Fig. 12", "one-block transmission latency, 64 B to 8 MiB", exp_latency, LATENCY_DEFAULTS),
    "throughput": Experiment("Fig. 13-14", "throughput 64 B to 8 MiB, 3 blocks and the default 32", exp_throughput,
                             THROUGHPUT_DEFAULTS),
    "cpu": Experiment("Fig. 15", "sender and receiver CPU during the throughput runs", exp_throughput,
                      THROUGHPUT_DEFAULTS),
    "resources": Experiment("Fig. 16-17", "endpoints, registered memory, operations, completions, progress calls "
                                          "per side", exp_resources),
    "held_block": Experiment("Fig. 18", "3 blocks, saturated; block 3 held from 100 to 200 ms: throughput over time",
                             exp_held_block),
    "idle": Experiment("issue 11", "a sender sending one 64 B message a second and its receiver: CPU of each "
                                   "(must sleep)", exp_idle,
                       {"idle_seconds": (10, 3, 0.5), "idle_fps": (1.0, 1.0, 4.0)}),
    "cameras": Experiment("Fig. 19", "12 cameras x 25 fps x 640x480x3, default and equal memory: stability, CPU, "
                                     "memory", exp_cameras, {"camera_seconds": (10, 3, 0.4)}),
}
