"""Figure and report sections of `slotstream bench shimloss` and `shimperf` (bench/shim_experiments.py), drawn
from results.json; bench/dgram_plot.py calls them (helpers: plot_common's and report_cells')."""
from plot_common import plt
from report_cells import loss_of, per_run, pick, spread_text

PATENT = ("a 64 KB datagram is many MTU-sized packets, and \"the loss of any one of these individual packets then "
          "will cause the loss of the entire UDP message\"; the design stage's theory (whole messages need every "
          "segment) matched the measured send/recv bandwidth under 0.1-5 % loss; partial placement delivers the "
          "rest")


def _series(records, metric):
    """{size: [(loss %, median over runs)]}"""
    out = {}
    for v in {r.get("variant", "") for r in records if r["experiment"] == "shimloss"}:
        level = loss_of(v)
        for (p, t, b, s), x in pick(records, "shimloss", metric, variant=v).items():
            out.setdefault(s, []).append((level, x))
    return {s: sorted(xs) for s, xs in out.items()}


def figure(records, out):
    whole = _series(records, "whole_fraction")
    if not whole:
        return None
    partial, theory = _series(records, "partial_fraction"), _series(records, "whole_theory_measured")
    sizes = sorted(whole)
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.6), squeeze=False)
    for ax, s in zip(axes[0], sizes):
        for data, label, style in ((whole, "whole (measured)", dict(color="tab:green", marker="o")),
                                   (theory, "whole: (1-p)^k, p measured", dict(color="black", ls="--")),
                                   (partial, "partial, zero-filled", dict(color="tab:orange", marker="s"))):
            if s in data:
                ax.plot([x for x, _ in data[s]], [y for _, y in data[s]], label=label, **style)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{s:,} B datagrams")
        ax.set_xlabel("packet loss, %")
        ax.set_ylabel("share of datagrams sent")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # one for all
    fig.suptitle("Large datagrams through the socket shim under loss (Write-Record segments)")
    fig.tight_layout()
    fig.savefig(out / "fig_shim_loss.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "fig_shim_loss.png"


def report_section(records):
    return _loss_section(records) + _perf_section(records)


def _perf_section(records):
    if not any(r["experiment"] == "shimperf" for r in records):
        return []
    md = ["### What the socket shim costs (issue 25)\n",
          "Patent: \"a very minimal approximate 2 % increase in overall pre-buffering time when using our socket "
          "interface\".\n\n",
          "In a namespace whose lo has a 1,500-byte MTU, no loss. iperf3 -u -b 0 (as fast as it can), with and without "
          "libslotstream_udp.so on both ends: Mbit/s that arrived (sent x (1 - lost)); 1,400 B datagrams are one UD "
          "Send each through the shim, 8,000 and 32,000 B ones Write-Record segments (plain UDP: IP fragments). "
          "iperf3_sender_cpu / iperf3_receiver_cpu: CPU seconds per Gbit sent / received (iperf3's own CPU "
          "accounting; the loopback receive runs in the sender's system time). ffmpeg: ms from the sender's start to the first decoded frame of a real-time MPEG-TS stream over udp://. "
          "With and without alternate within each run; ratios are per run.\n\n",
          "| program | size | metric | udp+shim | udp | shim / plain |", "|---|---|---|---|---|---|"]
    for prog, metric, fmt in (("iperf3", "iperf3_received", "{:.0f}"), ("iperf3", "iperf3_lost", "{:.2f}"),
                              ("iperf3", "iperf3_sender_cpu", "{:.2f}"), ("iperf3", "iperf3_receiver_cpu", "{:.2f}"),
                              ("ffmpeg", "first_frame_ms", "{:.0f}")):
        vals = per_run(records, "shimperf", metric)
        ratios = per_run(records, "shimperf", f"{metric}_vs_plain")
        for s in sorted({k[3] for k in vals if k[0] == prog}):
            cell = lambda t: spread_text(vals[(prog, t, 1, s)], fmt) if (prog, t, 1, s) in vals else "–"
            ratio = ratios.get((prog, "udp+shim", 1, s))
            md.append(f"| {prog} | {f'{s:,} B' if s else '–'} | {metric} | {cell('udp+shim')} | {cell('udp')} | "
                      f"{spread_text(ratio, '{:.3f}') if ratio else '–'} |")
    md.append("")
    return md


def _loss_section(records):
    rows = [r for r in records if r["experiment"] == "shimloss"]
    if not rows:
        return []
    md = ["### Large datagrams through the socket shim under loss (issue 25)\n", f"Patent: {PATENT}.\n\n",
          "python3's socket module under LD_PRELOAD=libslotstream_udp.so on both ends, in a network namespace whose "
          "nftables rule drops that share of the UDP packets; each datagram is one Write-Record message of 1,440-byte "
          "segments (k per datagram), recombined by the receiving shim, incomplete ones delivered zero-filled "
          "(SLOTSTREAM_UDP_PARTIAL=deliver; the default, drop, hands over only the whole ones). Theory for "
          "independent loss p: P(whole) = (1-p)^k, P(lost) = p^k.\n\n",
          "| size | k | loss (nominal / measured) | whole | (1-p)^k, p measured | partial | lost |", "|---|---|---|---|---|---|---|"]
    variants = sorted({r["variant"] for r in rows}, key=lambda v: loss_of(v) or 0)
    sizes = sorted({r["size_bytes"] for r in rows})
    for s in sizes:
        for v in variants:
            def cell(metric, fmt):
                vals = per_run(records, "shimloss", metric, variant=v).get(("shim", "udp+shim", 1, s))
                return spread_text(vals, fmt) if vals else "–"
            k = pick(records, "shimloss", "segments_per_datagram", variant=v).get(("shim", "udp+shim", 1, s))
            if k is None:
                continue
            md.append(f"| {s:,} B | {k:.0f} | {v.split()[1]} / {cell('loss_measured', '{:.2%}')} | "
                      f"{cell('whole_fraction', '{:.3f}')} | {cell('whole_theory_measured', '{:.3f}')} | "
                      f"{cell('partial_fraction', '{:.3f}')} | {cell('lost_fraction', '{:.3f}')} |")
    md.append("")
    return md
