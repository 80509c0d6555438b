"""fan_in: many senders into one receiver (buffered-read thesis, "Multithreading" and "Single
Receiver"): 1-12 senders, each one connection with one device, streaming back to back into one
receiver that serves them either with a thread per sender (slotstream's default) or with one
consumer thread that passes over every sender in turn (`bench-peer recv --round-robin`).

The thesis reports near-linear scaling with receiving threads and about one connection's worth with
a single round-robin receiver. Every point is one receiver peer and N sender peers started at once;
the aggregate rate (`throughput`) counts the messages that arrived while every sender was streaming
(from the last sender's first send to the first sender's last arrival) over that window;
`throughput_overall` is all payload bytes over first send to last arrival (start-up skew included).
"""
import json
import statistics
import subprocess
import time

from harness import BIN, Experiment, PeerError, cpu_percent, for_each_point, rdma_args, read_line, stop
from report_cells import spread_text

FULL_SENDERS = [1, 2, 4, 8, 12]
QUICK_SENDERS = [1, 4, 12]
FULL_SIZES = [48, 512, 8192]        # the thesis: 16, 512, 8192 B; 48 B is the smallest with a 64-byte block
QUICK_SIZES = [512]
MODES = ["threads", "round_robin"]
PROTOCOLS = ["buffered_read", "status_byte"]
ALWAYS = ("buffered_read",)         # the thesis's protocol; the others only when in --protocols
SENDER_BYTES = 8 << 20              # payload per sender per point (quick: a quarter)
MAX_MESSAGES = 100_000              # per sender: bounds the small-message points
RING_BYTES = 256 << 10              # receiver memory per sender: blocks = RING_BYTES / block size
# (each sender streams several times its receiver memory, so that the point measures streaming,
# not one fill of the ring)


def _add(res, experiment, protocol, transport, size, blocks, metric, value, unit, senders):
    """A result record with the number of senders as a dimension of its own."""
    res.add(experiment, protocol, transport, size, blocks, metric, value, unit, senders=int(senders))


def blocks_for(size):
    """The same receiver memory per sender for every size (the thesis's rings are large; 32 blocks
    of 32 bytes would starve the batching this experiment is about)."""
    return max(32, min(4096, RING_BYTES // (size + 16)))


def run_fan_in(transport, protocol, size, senders, mode, count, timeout=120):
    """One point: a receiver peer serving `senders` sender peers started together. Returns
    (sender reports, receiver session reports)."""
    rx_cmd = [BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", transport,
              *rdma_args(transport), "--sessions", str(senders)]
    if mode == "round_robin":
        rx_cmd.append("--round-robin")
    rx = subprocess.Popen(rx_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    txs = []
    try:
        line = read_line(rx, 20)
        if not line.startswith("listening on "):
            raise PeerError(f"receiver peer did not start: {line!r}")
        addr = line.split()[-1]
        for i in range(senders):
            txs.append(subprocess.Popen(
                [BIN, "bench-peer", "send", "--to", addr, "--name", f"fan{i}", "--transport", transport,
                 *rdma_args(transport), "--protocol", protocol, "--blocks", str(blocks_for(size)), "--size", str(size),
                 "--count", str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        reports = []
        deadline = time.monotonic() + timeout
        for tx in txs:
            try:
                out, err = tx.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise PeerError(f"a sender peer did not finish within {timeout} s")
            if tx.returncode != 0:
                raise PeerError(f"sender peer failed ({tx.returncode}): {err.decode()[:300]}")
            reports.append(json.loads(out))
        # The receiver peer exits after `senders` sessions; its reports (one JSON line each, megabytes
        # with every arrival time) are read whole, not a byte at a time.
        try:
            out, _ = rx.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise PeerError("receiver peer did not end after its senders") from None
        sessions = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
        if len(sessions) != senders:
            raise PeerError(f"receiver peer reported {len(sessions)} of {senders} sessions")
        return reports, sessions
    except ValueError as e:
        raise PeerError(f"a peer printed malformed JSON: {e}") from None
    finally:
        for tx in txs:
            if tx.poll() is None:
                tx.kill()
                tx.wait(10)
        stop(rx)


def fan_in_settings(cfg):
    """(sender counts, sizes, payload bytes per sender) of the run's mode."""
    quick = getattr(cfg, "quick", False)
    counts = getattr(cfg, "fan_in_senders", None) or (QUICK_SENDERS if quick else FULL_SENDERS)
    sizes = getattr(cfg, "fan_in_sizes", None) or (QUICK_SIZES if quick else FULL_SIZES)
    per_sender = SENDER_BYTES // (4 if quick else 1) // (16 if getattr(cfg, "fan_in_sizes", None) else 1)
    return counts, sizes, per_sender


def fan_in_point(res, per_sender, t, p, s, n, m):
    count = max(100, min(MAX_MESSAGES, per_sender // s))
    snd, rcv = run_fan_in(t, p, s, n, m, count)
    first = min(x["send_times_ns"][0] for x in snd if x["send_times_ns"])
    last = max(max(x["arrivals_ns"], default=first) for x in rcv)
    total = sum(x["bytes"] for x in rcv)
    messages = sum(x["messages"] for x in rcv)
    span = max(last - first, 1) / 1e9
    # The senders are separate processes started one after the other: count only the window in
    # which all of them were streaming (from the last one's first send to the first one's last
    # arrival), so that start-up skew does not pass for low throughput.
    lo = max(x["send_times_ns"][0] for x in snd if x["send_times_ns"])
    hi = min(max(x["arrivals_ns"], default=lo) for x in rcv)
    if hi - lo > 0.05 * (last - first):
        steady = sum(1 for x in rcv for a in x["arrivals_ns"] if lo <= a <= hi)
        window = (hi - lo) / 1e9
    else:  # too short to say: over the whole span
        steady, window = messages, span
    b = blocks_for(s)
    experiment = f"fan_in_{m}"
    _add(res, experiment, p, t, s, b, "throughput", steady * s / window / 1e6, "MB/s", n)
    _add(res, experiment, p, t, s, b, "throughput_overall", total / span / 1e6, "MB/s", n)
    _add(res, experiment, p, t, s, b, "message_rate", steady / window / 1e6, "Mmsg/s", n)
    _add(res, experiment, p, t, s, b, "messages_lost", n * count - messages, "count", n)
    # The receiver process's CPU: every session reports the whole process over its own lifetime
    # (hand-shake to report, which a short point's streaming span does not cover); the busiest.
    _add(res, experiment, p, t, s, b, "cpu_receiver", max(cpu_percent(x) for x in rcv), "% of one core", n)
    reads = sum(x.get("protocol_counters", {}).get("reads", 0) for x in rcv)
    if reads:
        read_bytes = sum(x["protocol_counters"].get("bytes_read", 0) for x in rcv)
        _add(res, experiment, p, t, s, b, "bytes_per_read", read_bytes / reads, "bytes", n)
    return (f"{t} {p:14} {s:>5} B x{n:<2} {m:11} {steady * s / window / 1e6:9.1f} MB/s (all running; "
            f"{total / span / 1e6:.1f} first send to last arrival)")


def exp_fan_in(res, cfg):
    """1-12 senders into one receiver: a thread per sender vs one round-robin thread."""
    counts, sizes, per_sender = fan_in_settings(cfg)
    protocols = [p for p in PROTOCOLS if p in ALWAYS or p in cfg.protocols]
    points = [(t, p, s, n, m) for t in cfg.transports for p in protocols for s in sizes for n in counts
              for m in MODES]
    for_each_point(res, cfg, "fan_in", points, lambda *pt: fan_in_point(res, per_sender, *pt),
                   lambda t, p, s, n, m: f"{t} {p} {s} B x{n} {m}")
    # The thesis's comparison in one number per point (this run): round robin as a fraction of threads.
    thr = {}
    for rec in res.records:
        if rec["experiment"].startswith("fan_in_") and rec["metric"] == "throughput" and rec["run"] == res.run:
            thr[(rec["experiment"], rec["protocol"], rec["transport"], rec["size_bytes"], rec["senders"])] = rec["value"]
    for (e, p, t, s, n), v in thr.items():
        base = thr.get(("fan_in_threads", p, t, s, n))
        if e == "fan_in_round_robin" and base:
            _add(res, "fan_in_round_robin", p, t, s, blocks_for(s), "ratio_to_threads", v / base, "ratio", n)


EXPERIMENTS = {
    "fan_in": Experiment("thesis", "1-12 senders into one receiver: a thread per sender vs one round-robin thread "
                                   "(fan_in_experiments.py)", exp_fan_in,
                         {"fan_in_senders": (None, None, [2]), "fan_in_sizes": (None, None, [512])}),
}


def plot_fan_in(records, out, plt, style):
    """One panel per (transport, mode), aggregate MB/s vs senders, one line per (protocol, size)."""
    rows = [r for r in records if r["experiment"].startswith("fan_in_") and r["metric"] == "throughput"]
    if not rows:
        return None
    panels = sorted({(r["transport"], r["experiment"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), squeeze=False)
    for ax, (t, e) in zip(axes[0], panels):
        series = {}
        for r in rows:
            if (r["transport"], r["experiment"]) == (t, e):
                series.setdefault((r["protocol"], r["size_bytes"]), {}).setdefault(r["senders"], []).append(r["value"])
        for (p, s), pts in sorted(series.items()):
            xs = sorted(pts)
            st = dict(style(p))
            st["ls"] = {16: ":", 512: "--"}.get(s, "-")
            ax.plot(xs, [statistics.median(pts[x]) for x in xs], label=f"{p} {s} B", markersize=4, **st)
        ax.set_title(f"{t}: {e.replace('fan_in_', '').replace('_', ' ')}", fontsize=10)
        ax.set_xlabel("senders")
        ax.set_ylabel("aggregate MB/s")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.suptitle("Fan-in: N senders into one receiver (thesis: threads scale, round robin ~ one connection)")
    fig.tight_layout()
    path = out / "fig_fan_in.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def fan_in_table(records):
    """Markdown: aggregate MB/s per (transport, size, senders) and (protocol, mode), median over runs."""
    rows = [r for r in records if r["experiment"] in ("fan_in_threads", "fan_in_round_robin")
            and r["metric"] == "throughput"]
    if not rows:
        return ""
    vals = {}
    for r in rows:
        key = (r["transport"], r["size_bytes"], r["senders"], r["protocol"], r["experiment"][len("fan_in_"):])
        vals.setdefault(key, []).append(r["value"])
    cols = sorted({(k[3], k[4]) for k in vals})
    lines = ["Aggregate MB/s while every sender was streaming; `threads`: a consumer thread "
             "per sender, `round_robin`: one consumer thread for all.\n",
             "| transport | size | senders | " + " | ".join(f"{p} {m}" for p, m in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for t, s, n in sorted({k[:3] for k in vals}):
        cells = [spread_text(vals[(t, s, n, p, m)], "{:.1f}") if (t, s, n, p, m) in vals else "–" for p, m in cols]
        lines.append(f"| {t} | {s} B | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
