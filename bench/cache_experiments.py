"""The `cache` experiment (CARC slides, issue 8): does keeping the receiver's unprocessed data within its
cache pay, and does carc's budget do it?

The receiver peer processes every byte before it releases the block (`bench-peer recv
--process-ns-per-byte X`: a read of every byte, then X ns/byte of compute). Whatever a protocol lets
the sender put in flight beyond what the receiver has processed piles up unprocessed; if that is more
than the cache holds, the receiver reads its data from DRAM. These VMs have no hardware counters, so the
cache-miss proxy is the measured time per byte of that read.

The dimension the slides vary is the in-flight data. Here it is W bytes, from half the L2 to 4x the
receiving core's share of the last-level cache (C, read from sysfs like carc's default budget; at most
CACHE_CAP = 64 MiB, so that buffers for 4C fit a connection's 4,096 blocks of 64 KiB: a VM may report
its host's whole L3 — 260 or 300 MiB — shared by its 2 CPUs; --tiny: at most 16 MiB):
- carc: budget=W on buffers for 4C (so that only the budget limits it);
- credit, status_byte, sliding_window: buffers for W (N = W / block; for sliding_window, one
  connection per device, N / devices each), the only way they limit what is in flight.
credit with buffers for 4C is the "uncontrolled" case the slides compare with (HostCC there): the
claim (up to 1.35x throughput, 1.40x lower tail) is read as carc with its default budget (W = C)
against credit at W = 4C, and against carc's best W.

Records: experiment "cache", size_bytes = message payload, blocks = receiver blocks per connection,
plus the dimensions devices, process_ns_per_byte, window_bytes and window_of_cache; metrics
throughput (MB/s), latency_p99 (ms: send stamp to message processed), read_ns_per_byte,
max_unprocessed_bytes (receiver counter, credit/carc) and sender_waits.
"""
import pathlib
import statistics

from harness import Experiment, for_each_point, run_pair
from report_cells import grouped, spread_text

HEADER = 16                    # block header bytes (src/wire/block_header.h: kBlockHeaderSize)
MESSAGE = 65536 - HEADER       # payload: one 64 KiB block per message
PROTOCOLS = ["carc", "credit", "status_byte", "sliding_window"]
ALWAYS = ("carc", "credit")    # the experiment is about these two; the others only when asked for
FALLBACK_CACHE = 2 << 20       # as carc's receiver, when sysfs says nothing
BLOCK = MESSAGE + HEADER
MAX_BLOCKS = 4096              # a connection's most blocks (include/slotstream/slotstream.h: kMaxBlocks)
# The largest geometry is 4C of buffers (carc always; credit at W = 4C): C beyond this asks the sender for more
# than MAX_BLOCKS blocks ("--blocks: Value 9600 not in range 1 to 4096" on a VM reporting a 300 MiB L3).
CACHE_CAP = MAX_BLOCKS * BLOCK // 4
TINY_CACHE_CAP = 16 << 20      # --tiny checks the path, not the cache: the same seconds on any host
CACHE_FLOOR = 4 * BLOCK        # W = C/4 is at least one block


def cache_levels(cache_dir="/sys/devices/system/cpu/cpu0/cache"):
    """{level: (size, cpus sharing it)} of the data/unified caches of cpu0."""
    out = {}
    for d in pathlib.Path(cache_dir).glob("index*"):
        try:
            if (d / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            level = int((d / "level").read_text())
            text = (d / "size").read_text().strip()
            size = int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]] if text[-1] in "KMG" else int(text)
            cpus = 0
            for part in (d / "shared_cpu_list").read_text().strip().split(","):
                lo, _, hi = part.partition("-")
                cpus += int(hi or lo) - int(lo) + 1
        except (OSError, ValueError, KeyError, IndexError):
            continue
        out[level] = (size, max(cpus, 1))
    return out


def cache_share(cache_dir="/sys/devices/system/cpu/cpu0/cache"):
    """The receiving core's share of its last-level cache, as carc's receiver computes its default
    budget (src/engine/ucx/protocol/carc.cc: cache_share_bytes); 0 when sysfs says nothing."""
    levels = cache_levels(cache_dir)
    if not levels:
        return 0
    size, cpus = levels[max(levels)]
    return size // cpus


def sweep_cache(share, tiny=False):
    """The C the sweep is built on, from the receiving core's LLC share (0: unknown): clamped to
    [CACHE_FLOOR, CACHE_CAP] (TINY_CACHE_CAP for --tiny) and rounded down to whole blocks."""
    c = min(share or FALLBACK_CACHE, TINY_CACHE_CAP if tiny else CACHE_CAP)
    return max(CACHE_FLOOR, c // BLOCK * BLOCK)


def settings(cfg, quick, tiny, cache_dir="/sys/devices/system/cpu/cpu0/cache"):
    """The sweep: points (transport, processing ns/B, devices, in-flight bytes), each measured once per
    run of the orchestrator (`--runs`). Full: ~120 measurements a run, about 2 minutes here; quick: shm
    only, ~24 (a minute); tiny: seconds. `cache_share`: what sysfs says; `cache`: the C used."""
    share = cache_share(cache_dir)
    c = sweep_cache(share, tiny)
    l2 = cache_levels(cache_dir).get(2, (1 << 20, 1))[0]
    block = BLOCK
    within_l2 = max(l2 // 2, 2 * block)

    def grid(transports, process, devices, windows):
        return [(t, x, d, w) for t in transports for x in process for d in devices for w in windows]

    if tiny:
        points, run_bytes = grid(cfg.transports, [1.0], [2], [c // 4, c]), 8 << 20
    elif quick:
        points, run_bytes = grid(cfg.transports[:1], [2.0], [1, 12], [c // 4, c, 4 * c]), 96 << 20
    else:
        # shm is where the receiver's cache decides (the sender's CPU writes into it); over tcp the
        # transport is usually the slower side, so fewer points.
        points = grid([t for t in cfg.transports if t == "shm"], [0.0, 2.0], [1, 4, 12],
                      [within_l2, c // 4, c, 4 * c])
        points += grid([t for t in cfg.transports if t != "shm"], [2.0], [1, 12], [c // 4, c, 4 * c])
        run_bytes = 128 << 20
    return dict(cache=c, cache_share=share, l2=l2, points=points, run_bytes=run_bytes)


def geometry(protocol, window, devices, cache, per_device):
    """(protocol spec, blocks per connection) for in-flight data `window`; `per_device`: the protocol
    opens a connection per device (`connection_per_device` in `slotstream protocols --json`)."""
    if protocol == "carc":
        spec, blocks = f"carc:budget={window}", max(1, 4 * cache // BLOCK)
    else:
        spec, blocks = protocol, max(1, window // BLOCK)
        if per_device:
            blocks = max(1, blocks // devices)
    if blocks > MAX_BLOCKS:  # sweep_cache keeps every point within; a sweep that does not is a bug here
        raise ValueError(f"cache experiment: {blocks} blocks for W = {window} B, more than a sender may ask "
                         f"({MAX_BLOCKS})")
    return spec, blocks


def cache_point(res, s, t, x, d, w, p, per_device):
    spec, blocks = geometry(p, w, d, s["cache"], per_device)
    # Enough to pass through the in-flight window several times, split over the devices.
    count = max(4, max(s["run_bytes"], 4 * w) // (d * MESSAGE))
    snd, rcv = run_pair(t, spec, MESSAGE, count, blocks, devices=d, rx_extra=["--process-ns-per-byte", str(x)])
    arrivals = rcv["arrivals_ns"]
    span = (max(arrivals) - min(snd["send_times_ns"])) / 1e9 if arrivals else 0
    mbps = rcv["bytes"] / 1e6 / span if span > 0 else 0.0
    lat_ms = sorted(v / 1e6 for v in rcv["latencies_ns"] if v > 0)
    p99 = lat_ms[min(len(lat_ms) - 1, int(0.99 * (len(lat_ms) - 1) + 0.5))] if lat_ms else 0.0
    proc = rcv.get("process") or {}
    extra = dict(devices=d, process_ns_per_byte=x, window_bytes=w, window_of_cache=w / s["cache"])
    metrics = [("throughput", mbps, "MB/s"), ("latency_p99", p99, "ms"),
               ("read_ns_per_byte", proc.get("read_ns_per_byte", 0.0), "ns/B"),
               ("sender_waits", snd.get("waits", 0), "count")]
    counters = rcv.get("protocol_counters") or {}
    if "max_unreleased_bytes" in counters:
        metrics.append(("max_unprocessed_bytes", counters["max_unreleased_bytes"], "B"))
    for metric, value, unit in metrics:
        res.add("cache", p, t, MESSAGE, blocks, metric, value, unit, **extra)
    return f"{point_name(res, t, x, d, w, p)}: {mbps:7.1f} MB/s p99 {p99:7.2f} ms read " \
           f"{proc.get('read_ns_per_byte', 0):.3f} ns/B"


def point_name(res, t, x, d, w, p):
    return f"{t} {p:14} X={x:g} ns/B d={d:<2} W={w >> 10:>6} KiB run {res.run}"


def exp_cache(res, cfg):
    """CARC slides: receiver processing cost x devices x in-flight data, for carc, credit and the
    status_byte/sliding_window references (those of them in --protocols)."""
    s = settings(cfg, cfg.quick, cfg.tiny)
    res.config.setdefault("cache_experiment", {}).update(
        {k: s[k] for k in ("cache", "cache_share", "l2", "run_bytes")}, points=len(s["points"]))
    protocols = [p for p in PROTOCOLS if p in ALWAYS or p in cfg.protocols]
    points = [(t, x, d, w, p) for t, x, d, w in s["points"] for p in protocols]

    def measure(t, x, d, w, p):
        return cache_point(res, s, t, x, d, w, p, cfg.registry.get(p, {}).get("connection_per_device", False))
    for_each_point(res, cfg, "cache", points, measure, lambda *pt: point_name(res, *pt), run_tag=False)


EXPERIMENTS = {
    "cache": Experiment("CARC slides", "receiver processing x devices x in-flight data: carc, credit "
                                       "(cache_experiments.py)", exp_cache),
}


# ------------------------------------------------------------------------------------ plots and report

def _values(records, metric, **where):
    """{(protocol, transport, x, devices, window): [values over runs]}."""
    return grouped(records, "cache", metric, lambda r: (r["protocol"], r["transport"], r["process_ns_per_byte"],
                                                        r["devices"], r["window_bytes"]), **where)


def plot(records, out, style, proto_key, human, plt):
    """One figure per (transport, devices): rows = processing cost, columns = throughput, p99 latency
    and the read's ns/byte, x = in-flight data. Returns the file names made."""
    rows = [r for r in records if r["experiment"] == "cache"]
    if not rows:
        return []
    cache = next((r["window_bytes"] / r["window_of_cache"] for r in rows if r["window_of_cache"]), None)
    made = []
    for t in sorted({r["transport"] for r in rows}):
        for d in sorted({r["devices"] for r in rows if r["transport"] == t}):
            xs_all = sorted({r["process_ns_per_byte"] for r in rows if r["transport"] == t and r["devices"] == d})
            cols = [("throughput", "MB/s", False), ("latency_p99", "p99 latency (ms)", True),
                    ("read_ns_per_byte", "read ns/byte (cache-miss proxy)", False)]
            fig, axes = plt.subplots(len(xs_all), len(cols), figsize=(14, 3.6 * len(xs_all)), squeeze=False)
            for i, x in enumerate(xs_all):
                for j, (metric, label, logy) in enumerate(cols):
                    ax = axes[i][j]
                    vals = _values(records, metric, transport=t, devices=d, process_ns_per_byte=x)
                    windows = set()
                    for p in sorted({k[0] for k in vals}, key=proto_key):
                        pts = sorted((k[4], statistics.median(v)) for k, v in vals.items() if k[0] == p)
                        if not pts:
                            continue
                        ws, ys = zip(*pts)
                        windows |= set(ws)
                        ax.plot(ws, ys, label=p, markersize=4, **style(p))
                    ax.set_xscale("log", base=2)
                    if logy:
                        ax.set_yscale("log")
                    ax.set_xticks(sorted(windows))
                    ax.set_xticklabels([human(w).replace(" ", "") for w in sorted(windows)], rotation=45, fontsize=7)
                    ax.minorticks_off()
                    if cache:
                        ax.axvline(cache, color="grey", ls="--", lw=1, label="cache share C")
                    ax.set_title(f"{t}, {d} device{'s' if d > 1 else ''}, processing {x:g} ns/B", fontsize=9)
                    ax.set_xlabel("in-flight data W (carc: budget; others: buffers)", fontsize=8)
                    ax.set_ylabel(label, fontsize=8)
                    ax.grid(True, alpha=0.3)
                    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
            fig.suptitle("Cache-aware rate control: in-flight data vs receiver processing (CARC slides)")
            fig.tight_layout()
            name = f"fig_cache_{t}_{d}_devices.png"
            fig.savefig(out / name, dpi=100, bbox_inches="tight")
            plt.close(fig)
            made.append(name)
    return made


def claims(records):
    """Rows (transport, processing, devices) -> carc at W = C and at its best W against credit at W = 4C:
    throughput and p99 ratios, min/median/max over runs (run r against run r)."""
    thr, p99 = _values(records, "throughput"), _values(records, "latency_p99")
    rows = [r for r in records if r["experiment"] == "cache"]
    if not rows:
        return ""
    ratio = {r["window_bytes"]: r["window_of_cache"] for r in rows}
    at_c = [w for w, f in ratio.items() if abs(f - 1) < 1e-9]
    at_4c = [w for w, f in ratio.items() if abs(f - 4) < 1e-9]
    if not at_c or not at_4c:
        return ""
    c, c4 = at_c[0], at_4c[0]
    lines = ["| transport | processing ns/B | devices | carc (W = C) / credit (W = 4C) throughput | credit / carc p99 "
             "| carc's best W: throughput ratio | its p99 ratio |", "|---|---|---|---|---|---|---|"]
    for t, x, d in sorted({(k[1], k[2], k[3]) for k in thr}):
        base_t, base_l = thr.get(("credit", t, x, d, c4)), p99.get(("credit", t, x, d, c4))
        mine_t, mine_l = thr.get(("carc", t, x, d, c)), p99.get(("carc", t, x, d, c))
        if not (base_t and mine_t and base_l and mine_l):
            continue
        tr = [a / b for a, b in zip(mine_t, base_t) if b > 0]
        lr = [b / a for a, b in zip(mine_l, base_l) if a > 0]
        best = max((w for (p, tt, xx, dd, w) in thr if (p, tt, xx, dd) == ("carc", t, x, d)),
                   key=lambda w: statistics.median(thr[("carc", t, x, d, w)]))
        btr = [a / b for a, b in zip(thr[("carc", t, x, d, best)], base_t) if b > 0]
        blr = [b / a for a, b in zip(p99[("carc", t, x, d, best)], base_l) if a > 0]
        lines.append(f"| {t} | {x:g} | {d} | {spread_text(tr, '{:.2f}x')} | {spread_text(lr, '{:.2f}x')} | "
                     f"{spread_text(btr, '{:.2f}x')} (W = {ratio[best]:g}C) | {spread_text(blr, '{:.2f}x')} |")
    return "\n".join(lines) + "\n"


def report(records, human):
    """The report.md section: the claim table, then one table per metric and setting."""
    rows = [r for r in records if r["experiment"] == "cache"]
    if not rows:
        return []
    cache = next((r["window_bytes"] / r["window_of_cache"] for r in rows if r["window_of_cache"]), 0)
    md = ["## Cache-aware rate control (CARC slides)\n",
          f"The receiver processes every byte before releasing its block: it reads every byte (the read's ns/byte "
          f"is the cache-miss proxy; no hardware counters here), then spins X ns/byte. W = in-flight data: carc's "
          f"budget (on buffers for 4C), or the buffers of the others. C = the receiving core's share of the "
          f"last-level cache, at most {human(CACHE_CAP)} (buffers for 4C fit {MAX_BLOCKS} blocks) = {human(cache)}. Shared memory has no DDIO: the sender's CPU writes the data, so it "
          f"sits in the sending core's L2 and the shared L3, not in an I/O slice of the LLC. Values: median over "
          f"runs (min–max).\n",
          "Against the slides' claim (carc up to 1.35x throughput, 1.40x lower tail than an uncontrolled sender):\n\n",
          claims(records)]
    for metric, title, fmt in (("throughput", "Throughput, MB/s", "{:.0f}"), ("latency_p99", "p99 latency, ms", "{:.1f}"),
                               ("read_ns_per_byte", "Read ns/byte", "{:.3f}"),
                               ("max_unprocessed_bytes", "Most unprocessed bytes at the receiver, MiB", "{:.1f}")):
        vals = _values(records, metric)
        if not vals:
            continue
        md.append(f"### {title}\n")
        protos = sorted({k[0] for k in vals}, key=lambda p: PROTOCOLS.index(p) if p in PROTOCOLS else 99)
        for t, x, d in sorted({(k[1], k[2], k[3]) for k in vals}):
            md.append(f"{t}, processing {x:g} ns/B, {d} device{'s' if d > 1 else ''}:\n")
            md.append("| W | W / C | " + " | ".join(protos) + " |")
            md.append("|---|---|" + "---|" * len(protos))
            for w in sorted({k[4] for k in vals if k[1:4] == (t, x, d)}):
                cells = []
                for p in protos:
                    v = vals.get((p, t, x, d, w))
                    if v and metric == "max_unprocessed_bytes":
                        v = [b / 2**20 for b in v]
                    cells.append(spread_text(v, fmt) if v else "–")
                md.append(f"| {human(w)} | {w / cache:.2f} | " + " | ".join(cells) + " |")
            md.append("")
    return md
