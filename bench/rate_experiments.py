"""The `message_rate` experiment (issue 21): how many small messages a second each protocol moves,
beside UCX's own put rate on the same transport in the same run.

Sizes 16 B to 1 KiB on 1, 4 and 12 devices (one filler thread each, back to back), every protocol of
the run at its default packing, plus `status_byte:pack=off` — one message per block, the paper's
figures and slotstream before issue 21. Geometry: 32 blocks of 64 KiB for every protocol (per
connection: the sliding window opens one per device). The peers run in rate mode (`bench-peer
--rate`): the sender sends one prepared payload with DeviceStream::send, no time stamp per message;
the receiver counts, and keeps only the first and last arrival — what a message costs without the
bench's own per-message record. A point runs for `rate_seconds` and its rate is messages received /
(last arrival - first message handed over). `ucx_perftest -t ucp_put_bw` of the same size is the
ceiling: puts into one cache-hot buffer, no flow control, no receiver.

Records: experiment "message_rate", size_bytes = payload, blocks = 32, dimension devices; metrics
message_rate (msg/s), records_per_unit (how densely the busy lane packed: messages per block sent),
cpu_sender_ns / cpu_receiver_ns (CPU per message, both processes), sender_waits; and for
ucx_perftest_put_bw (devices = 1) message_rate; ratio_to_put_bw per protocol point.
"""
import statistics

from harness import Experiment, PeerError, Progress, for_each_point, perftest_bandwidth, run_pair
from report_cells import grouped

SIZES = [16, 64, 256, 1024]
DEVICES = [1, 4, 12]
BLOCKS = 32
BLOCK_SIZE = 64 << 10
UNPACKED = "status_byte:pack=off"  # the paper's one message per block, beside status_byte's default
CEILING = "ucx_perftest_put_bw"


def settings(cfg):
    """(sizes, device counts, seconds per point) for the run's mode."""
    if cfg.tiny:
        return [256], [1], 0.1
    sizes = [int(s) for s in cfg.sizes] if cfg.sizes_given else ([64, 256, 1024] if cfg.quick else SIZES)
    return sizes, ([1, 12] if cfg.quick else DEVICES), (0.4 if cfg.quick else 1.0)


TINY = ("status_byte", "sliding_window")  # --tiny (the bench test): the records and figures, in seconds


def protocols(cfg):
    """Every data protocol of the run at its default packing, status_byte also without packing (when
    the binary packs at all: a binary from before issue 21 neither lists `packs` nor takes `pack=`)."""
    out = [p for p in cfg.protocols if not cfg.registry.get(p.split(":")[0], {}).get("reference")]
    if cfg.tiny:
        out = [p for p in out if p in TINY]
    packs = cfg.registry.get("status_byte", {}).get("packs", False)
    if "status_byte" in out and UNPACKED not in out and packs:
        out.insert(out.index("status_byte") + 1, UNPACKED)
    return out


def rate_point(res, seconds, t, s, d, p):
    snd, rcv = run_pair(t, p, s, 10**12, BLOCKS, devices=d, seconds=seconds, rx_extra=["--rate"],
                        tx_extra=["--rate", "--block-size", str(BLOCK_SIZE)], timeout=seconds * 20 + 60)
    n = rcv.get("counted", 0)
    span = (rcv.get("last_arrival_ns", 0) - snd.get("start_ns", 0)) / 1e9
    rate = n / span if n and span > 0 else 0.0
    for metric, value, unit in (("message_rate", rate, "msg/s"),
                                ("records_per_unit", snd["records"] / max(1, snd["units"]), "records"),
                                ("cpu_sender_ns", 1e9 * snd["cpu_seconds"] / max(1, n), "ns/message"),
                                ("cpu_receiver_ns", 1e9 * rcv["cpu_seconds"] / max(1, n), "ns/message"),
                                ("sender_waits", snd.get("waits", 0), "count")):
        res.add("message_rate", p, t, s, BLOCKS, metric, value, unit, devices=d)
    return f"{rate_name(t, s, d, p)} {rate / 1e6:7.2f} M msg/s, {snd['records'] / max(1, snd['units']):6.1f} per block"


def rate_name(t, s, d, p):
    return f"{t} {p:20} {s:>5} B x{d:<2}"


def ceiling_point(res, seconds, ceiling, t, s):
    _, rate = perftest_bandwidth(t, s, max(10_000, int(seconds * 2e6)))
    ceiling[(t, s)] = rate
    res.add("message_rate", CEILING, t, s, 1, "message_rate", rate, "msg/s", devices=1)
    return f"{t} {CEILING:20} {s:>5} B     {rate / 1e6:7.2f} M msg/s"


def exp_message_rate(res, cfg):
    """Issue 21: small messages per second, sizes x devices x protocols, with UCX's put rate beside."""
    sizes, devices, seconds = settings(cfg)
    points = [(t, s, d, p) for t in cfg.transports for s in sizes for d in devices for p in protocols(cfg)]
    prog = Progress(len(points) + len(cfg.transports) * len(sizes), "message_rate", res.run, cfg.runs)
    for_each_point(res, cfg, "message_rate", points, lambda *pt: rate_point(res, seconds, *pt), rate_name, prog=prog)
    ceiling = {}
    for_each_point(res, cfg, "message_rate", [(t, s) for t in cfg.transports for s in sizes],
                   lambda t, s: ceiling_point(res, seconds, ceiling, t, s), lambda t, s: f"{t} {CEILING} {s} B",
                   errors=(PeerError, OSError), prog=prog)
    for rec in [r for r in res.records if r["experiment"] == "message_rate" and r["run"] == res.run
                and r["metric"] == "message_rate" and r["protocol"] != CEILING]:
        c = ceiling.get((rec["transport"], rec["size_bytes"]))
        if c:
            res.add("message_rate", rec["protocol"], rec["transport"], rec["size_bytes"], BLOCKS, "ratio_to_put_bw",
                    rec["value"] / c, "ratio", devices=rec["devices"])


EXPERIMENTS = {
    "message_rate": Experiment("issue 21", "small messages per second, 16 B-1 KiB x 1-12 devices, beside ucx_perftest "
                                           "put_bw (rate_experiments.py)", exp_message_rate),
}


def _values(records, metric, **where):
    """{(protocol, transport, size, devices): [value per run]}."""
    return grouped(records, "message_rate", metric,
                   lambda r: (r["protocol"], r["transport"], r["size_bytes"], r.get("devices", 1)), **where)


def _cell(values, fmt):
    if not values:
        return "–"
    med = fmt.format(statistics.median(values))
    return med if len(values) == 1 else f"{med} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def _order(protocols, proto_key):
    return sorted(protocols, key=lambda p: (p == CEILING, proto_key(p.split(":")[0]), p))


def plot(records, out, style, proto_key, plt):
    """Per transport: messages/s vs size (1 device, the put_bw ceiling dashed), and vs devices at each
    size. Returns the file names made."""
    rates = _values(records, "message_rate")
    if not rates:
        return []
    made = []
    for t in sorted({k[1] for k in rates}):
        sizes = sorted({k[2] for k in rates if k[1] == t})
        devs = sorted({k[3] for k in rates if k[1] == t and k[0] != CEILING})
        fig, axes = plt.subplots(1, 1 + len(sizes), figsize=(5 * (1 + len(sizes)), 4.2), squeeze=False)
        ax = axes[0][0]
        for p in _order({k[0] for k in rates if k[1] == t}, proto_key):
            pts = sorted((k[2], statistics.median(v) / 1e6) for k, v in rates.items() if k[0] == p and k[1] == t
                         and k[3] == 1)
            if pts:
                ax.plot(*zip(*pts), label=p, markersize=4, **style(p))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{s} B" for s in sizes])
        ax.set_xlabel("message size (1 device)")
        ax.set_ylabel("million messages / s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        for j, s in enumerate(sizes):
            ax = axes[0][j + 1]
            for p in _order({k[0] for k in rates if k[1] == t and k[0] != CEILING}, proto_key):
                pts = sorted((k[3], statistics.median(v) / 1e6) for k, v in rates.items()
                             if k[0] == p and k[1] == t and k[2] == s)
                if pts:
                    ax.plot(*zip(*pts), label=p, markersize=4, **style(p))
            ax.set_xticks(devs)
            ax.set_yscale("log")
            ax.set_xlabel(f"devices ({s} B)")
            ax.grid(alpha=0.3)
        fig.suptitle(f"Small messages per second, {t} (issue 21): 32 x 64 KiB blocks, median over runs")
        fig.tight_layout()
        name = f"fig_message_rate_{t}.png"
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(name)
    return made


def report(records, proto_key):
    """The report.md section: rates, packing, CPU per message, ratio to put_bw."""
    rates = _values(records, "message_rate")
    if not rates:
        return []
    md = ["## Small messages per second (issue 21)\n",
          "Back to back on 1-12 devices (a filler thread each), 32 blocks of 64 KiB, every protocol at its "
          f"default packing and `{UNPACKED}` (one message per block: the paper's figures, and slotstream "
          "before packing). Rate = messages received / (last arrival - first message handed over), peers in rate "
          f"mode (no per-message stamp or record). `{CEILING}`: `ucx_perftest -t ucp_put_bw` of the same size on "
          "the same transport in the same run (one cache-hot buffer, no flow control, no receiver). Million "
          "messages per second, median [min–max] over runs:\n"]
    for t in sorted({k[1] for k in rates}):
        md += [f"### {t}\n", _table(rates, t, lambda v: v / 1e6, "{:.2f}", proto_key)]
        for metric, title, fmt in (("ratio_to_put_bw", f"Ratio to {CEILING}", "{:.2f}"),
                                   ("records_per_unit", "Messages per block sent (how densely the busy lane packed)",
                                    "{:.1f}"),
                                   ("cpu_sender_ns", "Sender CPU per message, ns (all threads)", "{:.0f}"),
                                   ("cpu_receiver_ns", "Receiver CPU per message, ns", "{:.0f}")):
            vals = _values(records, metric, transport=t)
            if vals:
                md += [f"{title}:\n", _table(vals, t, lambda v: v, fmt, proto_key)]
    return md


def _table(vals, transport, scale, fmt, proto_key):
    keys = [k for k in vals if k[1] == transport]
    protos = _order({k[0] for k in keys}, proto_key)
    cols = sorted({(k[2], k[3]) for k in keys})
    lines = ["| protocol | " + " | ".join(f"{s} B x{d}" for s, d in cols) + " |", "|---|" + "---|" * len(cols)]
    for p in protos:
        cells = [_cell([scale(v) for v in vals.get((p, transport, s, d), [])], fmt) for s, d in cols]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
