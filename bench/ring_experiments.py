"""The SDP paper's experiments (sdp-rdma-flow-control-paper, §5.2), for `slotstream bench`:

  small_messages  Fig. 4b and 6: throughput 1 B - 64 KiB and buffer utilisation on 8 KiB and 32 KiB
                  buffers (8 of them, the paper's 64 KiB and 256 KiB SDP buffers)
  progress        Fig. 5: 4 KiB messages in bursts of 100 with computation between the bursts

Each runs over a list of protocols; whatever of it the run has (every registered protocol, or
--protocols) is measured, so credit appears as soon as it is built. Records use the harness's
schema (harness.Results); the buffer geometry and the computation are the record's `variant` (`buffers=8192`,
`compute_us=500`). The orchestrator repeats each experiment --runs times with fresh processes.
"""
import statistics
import subprocess

from harness import BIN, Experiment, PeerError, for_each_point, run_pair

# The paper's designs (credit §2, packed_ring §3 and its fix, nic_assisted §4) and this
# project's block protocols, in plot order.
# status_byte packs small messages into its blocks by default (issue 21); `status_byte:pack=off` is
# the paper's block protocol, one message per block, beside it (a binary from before issue 21 has
# only the latter, under the plain name).
SMALL_PROTOCOLS = ["credit", "packed_ring", "nic_assisted", "status_byte", "status_byte:pack=off", "sliding_window"]
PROGRESS_PROTOCOLS = ["credit", "packed_ring", "packed_ring:flush=idle", "nic_assisted", "status_byte",
                      "sliding_window"]

SDP_BUFFERS = 8                   # Fig. 6: 64 KiB = 8 x 8 KiB, 256 KiB = 8 x 32 KiB
GEOMETRIES = [8192, 32768]        # buffer (block) sizes
SMALL_SIZES = {"full": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536],
               "quick": [1, 64, 256, 1024, 4096, 65536],
               "tiny": [256]}
# Messages per point: the byte budget, within [lo, hi] messages (1 B messages are bounded by
# count, 64 KiB ones by bytes).
SMALL_BUDGET = {"full": (32 << 20, 500, 20000), "quick": (8 << 20, 200, 5000), "tiny": (1 << 20, 100, 1000)}
# Before those messages, bench throughput's warm-up, which is not counted (cfg.throughput_warm_bytes, at most
# 20 x hi messages here), and its time bound: the sender stops after cfg.throughput_seconds whatever it has sent
# (bench/paper_experiments.py THROUGHPUT_DEFAULTS: a run of a few milliseconds can end before the scheduler has
# settled the peers' threads on a small machine).

PROGRESS_SIZE = 4096
PROGRESS_BURST = 100
PROGRESS_COMPUTE_US = {"full": [0, 100, 250, 500, 750, 1000, 1500, 2000], "quick": [0, 250, 1000, 2000],
                       "tiny": [1000]}
PROGRESS_BURSTS = {"full": 30, "quick": 10, "tiny": 2}
# The receiver's own work per byte (bench-peer recv --process-ns-per-byte: it reads every byte, then
# computes). The paper's coalesced tail exists only if the receiver drains slower than the sender
# bursts — SDP's recv() copies every message out of its buffer and sends an ACK; here a receiver
# that only counts messages drains a burst faster than the sender fills it. None: no processing;
# 1.0 ns/byte: a receiver at ~1 GB/s, slower than a 4 KiB burst leaves the sender on this machine.
PROGRESS_RECEIVERS = [None, 1.0]


def mode(cfg):
    """full, quick or tiny (the orchestrator's --quick / --tiny)."""
    return getattr(cfg, "mode", "full")


def available(wanted, cfg):
    """The protocols of `wanted` (names, or NAME:options) whose name the run has (cfg.protocols:
    every registered one, or the user's --protocols); `pack=` variants only from a binary that packs."""
    have = {p.split(":")[0] for p in cfg.protocols}
    packs = any("packs" in e for e in cfg.registry.values())
    return [p for p in wanted if p.split(":")[0] in have and (packs or "pack=" not in p)]


def buffers(block_size):
    """The record variant of a buffer geometry."""
    return f"buffers={block_size}"


def compute(us, rx_ns_per_byte=None):
    """The record variant of a computation between bursts (and of the receiver's processing)."""
    return f"compute_us={us}" + (f";rx_ns_per_byte={rx_ns_per_byte:g}" if rx_ns_per_byte is not None else "")


def receiver_processing(binary):
    """Whether this build's receiver peer can process what it gets (--process-ns-per-byte)."""
    try:
        out = subprocess.run([binary, "bench-peer", "recv", "--help"], capture_output=True, text=True, timeout=20)
        return "--process-ns-per-byte" in out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        return False


# --------------------------------------------------------------------------- small_messages

def small_point(res, cfg, budget, lo, hi, t, bs, s, p):
    count = max(lo, min(hi, budget // s))
    extra = min(-(-cfg.throughput_warm_bytes // s), 20 * hi)
    snd, rcv = run_pair(t, p, s, count + extra, SDP_BUFFERS, seconds=cfg.throughput_seconds,
                        tx_extra=["--block-size", str(bs)])
    sends, arrivals = snd["send_times_ns"], rcv["arrivals_ns"]
    # The last count - count / 10 messages are counted (all but a tenth when the time bound came first).
    first = len(sends) - (count - count // 10) if len(sends) >= count else len(sends) // 10
    if len(arrivals) != len(sends) or len(sends) - first < 2:
        raise PeerError(f"{len(arrivals)} of {len(sends)} messages arrived")
    rate = (len(sends) - first) * s / (max(arrivals[-1] - sends[first], 1) / 1e9) / 1e6
    # SDP Fig. 6: the share of the whole buffer (8 x its size) that holds useful data, on
    # average; packing: the useful share of the buffer memory that is held at all.
    held, useful = rcv.get("buffer_held_avg", 0.0), rcv.get("buffer_useful_avg", 0.0)
    util = 100 * useful / (SDP_BUFFERS * bs)
    v = buffers(bs)
    res.add("small_messages", p, t, s, SDP_BUFFERS, "throughput", rate, "MB/s", variant=v)
    res.add("small_messages", p, t, s, SDP_BUFFERS, "buffer_utilisation", util, "%", variant=v)
    if held > 0:
        res.add("small_messages", p, t, s, SDP_BUFFERS, "packing", 100 * useful / held, "%", variant=v)
    c = snd.get("protocol_counters", {})
    if "coalesced_records" in c:
        records = sum(c.get(k, 0) for k in ("direct_writes", "queued_records", "coalesced_records"))
        res.add("small_messages", p, t, s, SDP_BUFFERS, "coalesced_share",
                100 * c["coalesced_records"] / max(1, records), "%", variant=v)
    return f"{t} {p:22} {s:>6} B {v:14} {rate:9.2f} MB/s, utilisation {util:5.1f} %"


def exp_small_messages(res, cfg):
    """Fig. 4b (throughput) and Fig. 6 (buffer utilisation): one device streams messages of one
    size back to back into 8 buffers of 8 KiB or 32 KiB; throughput over the run's last messages (bench
    throughput's warm-up and a tenth of the budget before them are not counted), from the first counted
    send to the last arrival; utilisation = payload bytes held in the receiver's buffer / the buffer's
    size, time-averaged over the session (the paper's "percentage usage of the buffer space");
    packing = payload bytes / buffer memory held by records."""
    m = mode(cfg)
    protocols = available(SMALL_PROTOCOLS, cfg)
    geometries = GEOMETRIES[:1] if m == "tiny" else GEOMETRIES
    budget, lo, hi = SMALL_BUDGET[m]
    points = [(t, bs, s, p) for t in cfg.transports for bs in geometries for s in SMALL_SIZES[m] for p in protocols]
    for_each_point(res, cfg, "small_messages", points, lambda *pt: small_point(res, cfg, budget, lo, hi, *pt),
                   lambda t, bs, s, p: f"{t} {p} {s} B {buffers(bs)}", run_tag=False)


# --------------------------------------------------------------------------------- progress

def progress_model(snd, rcv, compute_us):
    """Per burst i: s = its first send, e = when its last send returned (the application starts to
    compute), d = when its last message arrived. The paper's benchmark is a ping-pong: after its
    computation the application waits for the peer's reply, which the peer sends once it has the
    whole burst and has done the same computation. slotstream streams one way, so that reply is
    computed: iteration = max(e + C, d + C) - s. d is measured under the protocol's real
    behaviour; the next burst starts when the computation ends — which is also when SDP's recv()
    would have flushed what the packed ring held back. Returns (iteration times µs, tail delays µs)."""
    sends, arrivals, ends = snd["send_times_ns"], rcv["arrivals_ns"], snd["burst_ends_ns"]
    c = compute_us * 1000
    iterations, tails = [], []
    for i, e in enumerate(ends):
        last = (i + 1) * PROGRESS_BURST - 1
        if last >= len(arrivals):
            break
        s, d = sends[i * PROGRESS_BURST], arrivals[last]
        iterations.append((max(e + c, d + c) - s) / 1000)
        tails.append(max(0, d - e) / 1000)
    return iterations, tails


def progress_point(res, bursts, t, r, c, p):
    snd, rcv = run_pair(t, p, PROGRESS_SIZE, PROGRESS_BURST * bursts, SDP_BUFFERS,
                        rx_extra=[] if r is None else ["--process-ns-per-byte", str(r)],
                        tx_extra=["--block-size", "8192", "--burst", str(PROGRESS_BURST), "--compute-us", str(c)])
    iterations, tails = progress_model(snd, rcv, c)
    if len(iterations) < bursts:
        raise PeerError(f"{rcv['messages']} messages arrived")
    v = compute(c, r)
    res.add("progress", p, t, PROGRESS_SIZE, SDP_BUFFERS, "iteration_time", statistics.mean(iterations), "us",
            variant=v)
    res.add("progress", p, t, PROGRESS_SIZE, SDP_BUFFERS, "total_time", sum(iterations) / 1000, "ms", variant=v)
    res.add("progress", p, t, PROGRESS_SIZE, SDP_BUFFERS, "burst_tail_delay_p50", statistics.median(tails), "us",
            variant=v)
    res.add("progress", p, t, PROGRESS_SIZE, SDP_BUFFERS, "stream_seconds", snd["seconds"], "s", variant=v)
    return (f"{t} {p:22} {v:32}: iteration {statistics.mean(iterations):8.0f} us, "
            f"tail delay {statistics.median(tails):8.0f} us")


def exp_progress(res, cfg):
    """Fig. 5: bursts of 100 x 4 KiB, C µs of computation after each (the application makes no
    library call; the sender peer sleeps, see docs/bench-peer.md), 8 buffers of 8 KiB; with a
    receiver that only counts, and (where the build has it) one that processes ~1 GB/s."""
    m = mode(cfg)
    protocols = available(PROGRESS_PROTOCOLS, cfg)
    bursts = PROGRESS_BURSTS[m]
    receivers = PROGRESS_RECEIVERS if receiver_processing(BIN) else PROGRESS_RECEIVERS[:1]
    if m == "tiny":
        receivers = receivers[-1:]
    points = [(t, r, c, p) for t in cfg.transports for r in receivers for c in PROGRESS_COMPUTE_US[m]
              for p in protocols]
    for_each_point(res, cfg, "progress", points, lambda *pt: progress_point(res, bursts, *pt),
                   lambda t, r, c, p: f"{t} {p} {compute(c, r)}", run_tag=False)


EXPERIMENTS = {
    "small_messages": Experiment("SDP Fig. 4b, 6", "throughput and buffer utilisation 1 B-64 KiB on 8 KiB / 32 KiB "
                                                   "buffers", exp_small_messages),
    "progress": Experiment("SDP Fig. 5", "bursts of 100 x 4 KiB with computation between: communication progress",
                           exp_progress),
}
