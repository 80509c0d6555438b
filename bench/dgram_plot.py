"""Figures and report sections of the datagram experiments (bench/dgram_experiments.py), drawn from
results.json like everything in bench/plot.py, which calls figures() and report_sections(); the style and
figure helpers are plot_common's, the tables and cells report_cells'."""
import statistics

import plot_common
from plot_common import line_plot, plt
from report_cells import human, loss_of, per_run, pick, spread_text, table

import shim_plot  # bench/shim_plot.py: `bench shimloss` and `shimperf`
import sip_plot  # bench/sip_plot.py: `bench sipscale`

PROTOCOL_ORDER = ["write_record", "dgram_send", "dgram_rd", "dgram_rc", "status_byte", "sliding_window"]
STYLE = {"write_record": dict(color="tab:green", ls="-", marker="o"),
         "dgram_send": dict(color="tab:purple", ls="-", marker="s"),
         "dgram_rd": dict(color="tab:brown", ls="-", marker="D"),
         "dgram_rc": dict(color="tab:red", ls="--", marker="^"),
         "status_byte": dict(color="tab:blue", ls=":", marker="."),
         "sliding_window": dict(color="tab:orange", ls=":", marker=".")}
# The patent's figures beside ours (docs/benchmarks.md has the context).
PATENT = {
    "latency": "UD Write-Record 24.4 % lower latency than RC RDMA Write for messages up to 2 KB (UD send/recv: "
               "18.1 % lower than RC send/recv); 27-28 µs vs ~33 µs below 128 B",
    "throughput": "UD Write-Record +256 % bandwidth over RC RDMA Write at 512 KB (UD send/recv +33.4 % over RC "
                  "send/recv at 256 KB)",
    "loss": "send/recv bandwidth collapses for large messages even at 0.1 % loss; Write-Record's partial "
            "placement keeps delivering",
    "apps": "VLC over UD: 74.1 % less initial buffering than HTTP over RC; SIPp: 43.1 % lower response time (UD vs "
            "RC); the socket interface adds ~2 % to pre-buffering",
}


def _key(p):
    return PROTOCOL_ORDER.index(p) if p in PROTOCOL_ORDER else len(PROTOCOL_ORDER)


def _by_loss(records, metric):
    """{size: {protocol: [(loss %, median over runs)]}} of the loss experiment."""
    out = {}
    for variant in sorted({r.get("variant", "") for r in records if r["experiment"] == "loss"}, key=lambda v: loss_of(v) or 0):
        level = loss_of(variant)
        if level is None:
            continue
        for (p, t, b, s), v in pick(records, "loss", metric, variant=variant).items():
            if p == "nftables":
                continue
            out.setdefault(s, {}).setdefault(p, []).append((level, v))
    return out


def _loss_figure(records, out, metric, ylabel, name, title):
    data = _by_loss(records, metric)
    if not data:
        return None
    sizes = sorted(data)
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.4 * len(sizes), 3.8), squeeze=False)
    for ax, s in zip(axes[0], sizes):
        for p in sorted(data[s], key=_key):
            xs, ys = zip(*sorted(data[s][p]))
            # Loss 0 sits at the left edge of a log axis as a small stand-in value.
            ax.plot([x if x > 0 else 0.03 for x in xs], ys, label=p, markersize=4, **STYLE.get(p, {}))
        ax.set_xscale("log")
        levels = sorted({x for p in data[s] for x, _ in data[s][p]})
        ax.set_xticks([x if x > 0 else 0.03 for x in levels])
        ax.set_xticklabels([f"{x:g}%" for x in levels], fontsize=7)
        ax.minorticks_off()
        ax.set_title(human(s), fontsize=10)
        ax.set_xlabel("packets dropped (nftables)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return name


def _apps_figure(records, out):
    rows = [r for r in records if r["experiment"] == "apps"]
    if not rows:
        return None
    panels = [("ffmpeg", "first_frame_ms", "first frame (ms)"), ("ffmpeg", "frames_damaged", "frames lost or damaged"),
              ("sipp", "sip_response_p50", "INVITE -> 200 OK, median (ms)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.8), squeeze=False)
    transports = ["udp+shim", "udp", "tcp", "http"]
    variants = sorted({r.get("variant", "") for r in rows}, key=lambda v: loss_of(v) or 0)
    for ax, (prog, metric, label) in zip(axes[0], panels):
        width = 0.8 / max(len(variants), 1)
        for i, v in enumerate(variants):
            vals = []
            for t in transports:
                x = pick(records, "apps", metric, variant=v).get((prog, t, 1, 0))
                if metric == "frames_damaged":
                    lost = pick(records, "apps", "frames_lost", variant=v).get((prog, t, 1, 0))
                    x = (x or 0) + (lost or 0) if x is not None or lost is not None else None
                vals.append(x if x is not None else 0)
            ax.bar([j + i * width for j in range(len(transports))], vals, width, label=v)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(transports))])
        ax.set_xticklabels(transports)
        ax.set_title(f"{prog}: {label}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.suptitle("Unmodified programs over the preload shim, plain UDP, TCP and HTTP (patent Fig. 18-19)")
    fig.tight_layout()
    fig.savefig(out / "fig_dgram_apps.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "fig_dgram_apps.png"


def figures(records, out):
    for p, st in STYLE.items():
        plot_common.STYLE.setdefault(p, st)  # the orchestrator's protocols keep their own colours
    made = {}
    for metric, name, what, unit in (("latency_p50", "fig_dgram_latency.png", "one-way latency, median", "µs"),
                                     ("throughput", "fig_dgram_throughput.png", "throughput (complete messages)", "MB/s")):
        vals = pick(records, "datagram", metric)
        data = {}
        for (p, t, b, s), v in vals.items():
            data.setdefault((p, "loopback"), []).append((s, v))
        if data:
            made[name] = line_plot(out / name, f"Datagram RDMA: {what} (patent Fig. {14 if 'lat' in metric else 15})",
                                      {k: sorted(v) for k, v in data.items()}, "message size", unit)
    made["fig_dgram_loss_goodput.png"] = _loss_figure(records, out, "goodput", "valid MB/s",
                                                      "fig_dgram_loss_goodput.png",
                                                      "Goodput under real loss (patent Fig. 16-17)")
    made["fig_dgram_loss_valid.png"] = _loss_figure(records, out, "valid_fraction", "valid bytes / bytes sent",
                                                    "fig_dgram_loss_valid.png",
                                                    "Fraction of the bytes delivered usable (complete, or valid in a partial)")
    made["fig_dgram_apps.png"] = _apps_figure(records, out)
    made["fig_shim_loss.png"] = shim_plot.figure(records, out)
    made["fig_sip_memory.png"] = sip_plot.figure(records, out)
    return {k: v for k, v in made.items() if v}


def _ratio_line(records, metric, protocol, sizes_ok, label, fmt="{:.2f}"):
    vals = {s: v for (p, t, b, s), v in per_run(records, "datagram", metric).items() if p == protocol and sizes_ok(s)}
    if not vals:
        return ""
    parts = [f"{human(s)}: {spread_text(v, fmt)}" for s, v in sorted(vals.items())]
    return f"- {label}: " + "; ".join(parts) + "\n"


def report_sections(records):
    if not any(r["experiment"] in ("datagram", "loss", "apps", "shimloss", "shimperf", "sipscale") for r in records):
        return []
    md = ["## Datagram RDMA over UDP (issue 10; the datagram-iWARP patent)\n",
          "The four datagram protocols (`--transport udp`: write_record, dgram_send, dgram_rd; `--transport tcp`: "
          "dgram_rc) run through `slotstream dgram-peer` processes on loopback; status_byte and sliding_window are UCX "
          "over tcp, measured the same way as in the latency and throughput sections. Latency: one message in flight, "
          "from the sender's stamp to the message finished at the receiver (its network thread sleeps in poll(), it "
          "does not busy-poll). Throughput: complete messages only, first send to last arrival. Segments of 8 KiB.\n"]
    return (md + _datagram_section(records) + _loss_section(records) + _apps_section(records) +
            shim_plot.report_section(records) + sip_plot.report_section(records))


def _datagram_section(records):
    if not any(r["experiment"] == "datagram" for r in records):
        return []
    return ["### Latency, median µs (patent Fig. 14)\n", f"Patent: {PATENT['latency']}.\n\n",
            table(records, "datagram", "latency_p50", "{:.1f}", by_blocks=False),
            "p99:\n\n", table(records, "datagram", "latency_p99", "{:.1f}", by_blocks=False),
            "Median as a multiple of dgram_rc's (below 1: faster than RC):\n\n",
            _ratio_line(records, "latency_p50_vs_dgram_rc", "write_record", lambda s: s <= 2048,
                        "write_record / dgram_rc, up to 2 KiB"),
            _ratio_line(records, "latency_p50_vs_dgram_rc", "dgram_send", lambda s: s <= 2048,
                        "dgram_send / dgram_rc, up to 2 KiB"), "\n",
            "### Throughput, MB/s (patent Fig. 15)\n", f"Patent: {PATENT['throughput']}.\n\n",
            table(records, "datagram", "throughput", "{:.1f}", by_blocks=False),
            "Share of the messages delivered complete (UD: what the receiver kept up with):\n\n",
            table(records, "datagram", "delivered_fraction", "{:.3f}", by_blocks=False),
            "As a multiple of dgram_rc's:\n\n",
            _ratio_line(records, "throughput_vs_dgram_rc", "write_record", lambda s: s >= 262144,
                        "write_record / dgram_rc, 256 KiB and up"), "\n"]


def _loss_section(records):
    loss_variants = sorted({r.get("variant", "") for r in records if r["experiment"] == "loss" and r["protocol"] != "nftables"},
                           key=lambda v: loss_of(v) or 0)
    if not loss_variants:
        return []
    md = ["### Under real loss (patent Fig. 16-17)\n", f"Patent: {PATENT['loss']}.\n\n",
          "An nftables rule in a network namespace of the experiment's own drops that share of the UDP and TCP "
          "packets arriving (lo with a 1500-byte MTU and no segmentation offload, so TCP's packets are what a "
          "wire carries); 1408-byte segments; write_record keeps partial messages (--partial keep), dgram_send "
          "delivers whole messages only, dgram_rd and dgram_rc retransmit. Goodput: valid bytes (complete "
          "messages and the valid ranges of partial ones) per second. Messages go back to back, so the receiver "
          "grants 256 STags per device and gives a message 20 ms: with the CLI's 32 and 200 ms a ring comes "
          "round before the timer and retires incomplete messages instead (retired_fraction shows what is "
          "left of that).\n\n"]
    measured = per_run(records, "loss", "loss_measured")
    if measured:
        md.append("Loss the rule actually applied: " + ", ".join(
            f"{v}: {spread_text(vals, '{:.2%}')}" for v in loss_variants
            for (p, t, b, s), vals in per_run(records, "loss", "loss_measured", variant=v).items()) + ".\n\n")
    for v in loss_variants:
        md += [f"#### {v}\n", "Goodput, MB/s:\n\n", table(records, "loss", "goodput", "{:.1f}", by_blocks=False,
                                                               variant=v),
               "Valid bytes / bytes sent:\n\n", table(records, "loss", "valid_fraction", "{:.3f}",
                                                          by_blocks=False, variant=v),
               "Messages complete / sent:\n\n", table(records, "loss", "complete_fraction", "{:.3f}",
                                                            by_blocks=False, variant=v),
               "Messages retired (write_record) / sent:\n\n", table(records, "loss", "retired_fraction",
                                                                         "{:.3f}", by_blocks=False, variant=v)]
    return md


def _apps_section(records):
    apps = [r for r in records if r["experiment"] == "apps"]
    if not apps:
        return []
    md = ["### Unmodified programs (patent Fig. 18-19)\n", f"Patent: {PATENT['apps']}.\n\n",
          "ffmpeg streams a 640x480 mpeg2 test pattern in real time (-re) as MPEG-TS over udp:// (through "
          "libslotstream_udp.so on both ends, or plain), tcp:// or http:// (the sender serves it, `-listen 1`, as "
          "the patent's HTTP streaming); the receiver decodes it (probe 32 KiB / 0.1 s so that the first frame "
          "measures the stream, not ffmpeg's default 5 s of probing). First frame: ms from the start of the side "
          "that starts the stream — the sender's (udp, tcp: the receiver already waits) or the receiver's request "
          "(http: the server already waits). SIPp: the "
          "built-in uac/uas scenarios at 50 calls/s; response time = INVITE sent to 200 OK received, from the "
          "client's message trace (µs stamps; SIPp's own scheduling runs on a 1 ms tick, which dominates on "
          "loopback).\n\n"]
    variants = sorted({r.get("variant", "") for r in apps}, key=lambda v: loss_of(v) or 0)
    metrics = [("ffmpeg", "first_frame_ms", "{:.0f}"), ("ffmpeg", "frames_lost", "{:.0f}"),
               ("ffmpeg", "frames_damaged", "{:.0f}"), ("ffmpeg", "first_frame_vs_http", "{:.3f}"),
               ("sipp", "sip_response_p50", "{:.3f}"),
               ("sipp", "sip_response_p99", "{:.3f}"), ("sipp", "sip_calls_failed", "{:.0f}")]
    md.append("| program | metric | loss | udp+shim | udp | tcp | http |")
    md.append("|---|---|---|---|---|---|---|")
    for prog, metric, fmt in metrics:
        for v in variants:
            vals = per_run(records, "apps", metric, variant=v)
            cells = [spread_text(vals[(prog, t, 1, 0)], fmt) if (prog, t, 1, 0) in vals else "–"
                     for t in ("udp+shim", "udp", "tcp", "http")]
            if any(c != "–" for c in cells):
                md.append(f"| {prog} | {metric} | {v} | " + " | ".join(cells) + " |")
    md.append("")
    return md
