#!/usr/bin/env python3
"""Draws every figure of a `slotstream bench` run from its results.json alone (PNG files next
to it); with --report also writes report.md with every table, plot and the targets."""
import argparse
import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"status_byte": "-o", "sliding_window": "-s", "ucx_raw_put": "--", "tcp_socket": ":"}


def load(path):
    doc = json.loads(pathlib.Path(path).read_text())
    return doc, doc["records"]


def pick(records, experiment, metric):
    out = {}
    for r in records:
        if r["experiment"] == experiment and r["metric"] == metric:
            out.setdefault((r["protocol"], r["transport"], r["blocks"], r["size_bytes"]), []).append(r["value"])
    return {k: statistics.median(v) for k, v in out.items()}


def series(values, fixed_blocks=None, x="size"):
    """{(protocol, transport[, blocks]): [(x, y)...]} from pick()."""
    out = {}
    for (p, t, b, s), v in values.items():
        if fixed_blocks is not None and b != fixed_blocks:
            continue
        key = (p, t) if x == "size" else (p, t)
        out.setdefault(key, []).append((s if x == "size" else b, v))
    return {k: sorted(v) for k, v in out.items()}


def human(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"


def line_plot(path, title, data, xlabel, ylabel, logx=True, logy=True):
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (p, t), pts in sorted(data.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, STYLE.get(p, "-"), label=f"{p} ({t})", markersize=4)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def figures(doc, records, out):
    made = {}
    sync = pick(records, "sync_latency", "sync_latency_p50")
    made["fig10_sync_latency.png"] = line_plot(
        out / "fig10_sync_latency.png", "Synchronisation-control latency (median) vs blocks",
        series(sync, x="blocks") if False else {k: v for k, v in _by_blocks(sync).items()},
        "blocks", "latency (µs)", logx=True, logy=True)
    samples = doc.get("samples", {}).get("sync_latency", {})
    if samples:
        fig, axes = plt.subplots(1, len(samples), figsize=(4 * len(samples), 3.4), squeeze=False)
        for ax, (key, vals) in zip(axes[0], sorted(samples.items())):
            ax.hist(vals, bins=50, color="tab:blue" if key.startswith("status") else "tab:orange")
            ax.set_title(key.replace("/", ", ") + " blocks", fontsize=9)
            ax.set_xlabel("µs")
        fig.suptitle("Synchronisation latency distribution, 3 blocks (Fig. 11)")
        fig.tight_layout()
        fig.savefig(out / "fig11_sync_histogram.png", dpi=110)
        plt.close(fig)
        made["fig11_sync_histogram.png"] = "fig11_sync_histogram.png"
    lat = pick(records, "latency", "latency_mean")
    made["fig12_latency.png"] = line_plot(out / "fig12_latency.png", "One-block transmission latency (mean)",
                                          series(lat), "message size (bytes)", "latency (µs)")
    thr = pick(records, "throughput", "throughput")
    blocks = sorted({k[2] for k in thr})
    for i, b in enumerate(blocks):
        name = f"fig{13 + min(i, 1)}_throughput_{b}_blocks.png"
        made[name] = line_plot(out / name, f"Throughput, {b} blocks", series(thr, fixed_blocks=b),
                               "message size (bytes)", "MB/s")
    for side in ("sender", "receiver"):
        cpu = pick(records, "cpu", f"cpu_{side}")
        if cpu:
            b = min(k[2] for k in cpu)
            made[f"fig15_cpu_{side}.png"] = line_plot(out / f"fig15_cpu_{side}.png",
                                                      f"{side.capitalize()} CPU during throughput, {b} blocks",
                                                      series(cpu, fixed_blocks=b), "message size (bytes)",
                                                      "% of one core", logy=False)
    res = [r for r in records if r["experiment"] == "resources"]
    if res:
        metrics = sorted({r["metric"] for r in res})
        keys = sorted({(r["protocol"], r["transport"], r["size_bytes"]) for r in res})
        fig, ax = plt.subplots(figsize=(max(8, len(metrics) * 0.6), 4.5))
        width = 0.8 / max(len(keys), 1)
        for i, key in enumerate(keys):
            vals = []
            for m in metrics:
                v = [r["value"] for r in res if (r["protocol"], r["transport"], r["size_bytes"]) == key and r["metric"] == m]
                vals.append(max(v[0], 0.5) if v else 0.5)
            ax.bar([j + i * width for j in range(len(metrics))], vals, width,
                   label=f"{key[0]} ({key[1]}, {'12 cameras' if key[2] == 921600 else human(key[2])})")
        ax.set_xticks([j + 0.4 for j in range(len(metrics))])
        ax.set_xticklabels(metrics, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title("Transport resources per side (Fig. 16-17)")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "fig16_resources.png", dpi=110)
        plt.close(fig)
        made["fig16_resources.png"] = "fig16_resources.png"
    for exp, fig_no, title in (("held_block", 18, "Block 3 held 100-200 ms"), ("cameras", 19, "12 cameras, 25 fps")):
        s = doc.get("samples", {}).get(exp, {})
        if not s:
            continue
        fig, ax = plt.subplots(figsize=(8, 4))
        for key, d in sorted(s.items()):
            xs = [i * d["bin_ms"] for i in range(len(d["mb_per_s"]))]
            ax.plot(xs, d["mb_per_s"], STYLE.get(key.split("/")[0], "-"), label=key.replace("/", ", "), markersize=2)
        if exp == "held_block":
            ax.axvspan(100, 200, color="grey", alpha=0.2, label="block 3 held")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel(f"MB/s per {s[next(iter(s))]['bin_ms']} ms bin")
        ax.set_title(f"{title} (Fig. {fig_no})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"fig{fig_no}_{exp}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made[name] = name
    return {k: v for k, v in made.items() if v}


def _by_blocks(values):
    out = {}
    for (p, t, b, s), v in values.items():
        out.setdefault((p, t), []).append((b, v))
    return {k: sorted(v) for k, v in out.items()}


def table(records, experiment, metric, unit_fmt="{:.1f}", blocks=None):
    vals = pick(records, experiment, metric)
    if blocks is not None:
        vals = {k: v for k, v in vals.items() if k[2] == blocks}
    if not vals:
        return ""
    cols = sorted({(p, t) for p, t, _, _ in vals})
    rows = sorted({(b, s) for _, _, b, s in vals})
    lines = ["| size | blocks | " + " | ".join(f"{p} ({t})" for p, t in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for b, s in rows:
        cells = [unit_fmt.format(vals[(p, t, b, s)]) if (p, t, b, s) in vals else "–" for p, t in cols]
        lines.append(f"| {human(s)} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def median_of(records, experiment, metric, **where):
    v = [r["value"] for r in records if r["experiment"] == experiment and r["metric"] == metric
         and all(r[k] == x for k, x in where.items())]
    return statistics.median(v) if v else None


def targets(records):
    lines = ["| target (issue 3) | transport | measured | met? |", "|---|---|---|---|"]
    transports = sorted({r["transport"] for r in records})

    def row(name, t, text, ok):
        lines.append(f"| {name} | {t} | {text} | {'yes' if ok else 'no' if ok is not None else 'n/a'} |")

    for t in transports:
        sb = median_of(records, "throughput", "throughput", protocol="status_byte", transport=t, size_bytes=256, blocks=3)
        sw = median_of(records, "throughput", "throughput", protocol="sliding_window", transport=t, size_bytes=256, blocks=3)
        if sb and sw:
            row("status_byte / sliding_window throughput at 256 B ≥ 4.6x", t, f"{sb / sw:.2f}x ({sb:.1f} vs {sw:.1f} MB/s)", sb / sw >= 4.6)
        ratios = [r for r in records if r["experiment"] == "throughput" and r["metric"] == "throughput_ratio_to_ucx"
                  and r["protocol"] == "status_byte" and r["transport"] == t and r["size_bytes"] >= 65536]
        if ratios:
            worst = min(r["value"] for r in ratios)
            row("status_byte ≥ 90% of ucx_raw_put at ≥ 64 KiB", t,
                f"worst {worst:.0%} (of {len(ratios)} size/block settings)", worst >= 0.9)
        a = median_of(records, "sync_latency", "sync_latency_p50", protocol="status_byte", transport=t, blocks=3)
        b = median_of(records, "sync_latency", "sync_latency_p50", protocol="sliding_window", transport=t, blocks=3)
        if a and b:
            row("sync latency, 3 blocks: status_byte ≥ 10x lower", t, f"{b / a:.1f}x ({a:.2f} vs {b:.2f} µs)", b / a >= 10)
        cs = [median_of(records, "cpu", "cpu_sender", protocol=p, transport=t, blocks=3) for p in ("status_byte", "sliding_window")]
        if all(cs):
            row("sender CPU: status_byte ≤ 0.8x sliding_window (3 blocks, % of a core, median over sizes)", t,
                f"{cs[0] / cs[1]:.2f}x ({cs[0]:.0f}% vs {cs[1]:.0f}%)", cs[0] / cs[1] <= 0.8)
        cm = [median_of(records, "cpu", "cpu_sender_per_mb", protocol=p, transport=t, blocks=3) for p in ("status_byte", "sliding_window")]
        if all(cm):
            row("sender CPU per MB moved: status_byte ≤ 0.8x sliding_window (3 blocks, median over sizes)", t,
                f"{cm[0] / cm[1]:.2f}x ({cm[0]:.2f} vs {cm[1]:.2f} ms/MB)", cm[0] / cm[1] <= 0.8)
        cams = {p: (median_of(records, "cameras", "throughput_cov", protocol=p, transport=t),
                    median_of(records, "cameras", "frames_lost", protocol=p, transport=t)) for p in ("status_byte", "sliding_window")}
        if all(v[0] is not None for v in cams.values()):
            (c1, l1), (c2, l2) = cams["status_byte"], cams["sliding_window"]
            row("cameras: zero loss, status_byte CoV lower", t, f"CoV {c1:.3f} vs {c2:.3f}; lost {l1:.0f} / {l2:.0f}",
                c1 < c2 and l1 == 0 and l2 == 0)
            rx = median_of(records, "cameras", "cpu_receiver", protocol="status_byte", transport=t)
            row("status_byte receiver CPU during 12 cameras (passive receiver)", t, f"{rx:.1f}% of one core", None)
    return "\n".join(lines) + "\n"


def report(doc, records, out, made):
    c = doc["config"]
    md = [f"# slotstream bench report\n",
          f"`{c['command']}` on {c['host']} ({c['cpus']} CPUs, kernel {c['kernel']}), {c['slotstream']}, "
          f"UCX {c['ucx']}, {c['date']}.\n",
          "Every number comes from two real processes over real UCX (or plain TCP for `tcp_socket`); "
          "records are in `results.json`, figures are drawn from it by `bench/plot.py`.\n",
          "## Targets\n", targets(records),
          "## Synchronisation-control latency (Fig. 10-11)\n",
          "status_byte: the time of one status-array read (RDMA get of all N status bytes, from issue to "
          "completion) when the sender ran out of free blocks. sliding_window: from the receiver generating an "
          "ACK (after processing a block) until the sender's ACK handler sees it (CLOCK_MONOTONIC on both "
          "sides, one host). 4 KiB messages.\n",
          table(records, "sync_latency", "sync_latency_p50", "{:.2f}"), "p99:\n\n",
          table(records, "sync_latency", "sync_latency_p99", "{:.2f}"),
          "## One-block transmission latency, µs (Fig. 12)\n",
          "Mean of one-way times: sender's stamp before filling the block until the message is complete at a "
          "busy-polling receiver; one message in flight at a time.\n",
          table(records, "latency", "latency_mean", "{:.1f}"), "p99:\n\n", table(records, "latency", "latency_p99", "{:.1f}"),
          "## Throughput, MB/s (Fig. 13-14)\n",
          "Median over rounds; a round is `count` consecutive transfers (1,000; for large messages fewer, so "
          "that a round moves a bounded number of bytes, but at least two passes over every block), timed "
          "from its first send to its last arrival. A first round per run warms the blocks up and is not "
          "counted. ucx_raw_put delivers nothing: its rounds are timed by the sender (flush included).\n"]
    for b in sorted({r["blocks"] for r in records if r["experiment"] == "throughput"}):
        md += [f"### {b} blocks\n", table(records, "throughput", "throughput", blocks=b),
               "Ratio to ucx_raw_put:\n\n", table(records, "throughput", "throughput_ratio_to_ucx", "{:.2f}", blocks=b)]
    md += ["## CPU, % of one core (Fig. 15)\n", "Per process, user+system time from getrusage over the run.\n",
           "Sender:\n\n", table(records, "cpu", "cpu_sender", "{:.0f}"),
           "Receiver:\n\n", table(records, "cpu", "cpu_receiver", "{:.0f}"),
           "Sender CPU per MB moved (ms/MB):\n\n", table(records, "cpu", "cpu_sender_per_mb", "{:.2f}"),
           "Receiver CPU per MB moved (ms/MB):\n\n", table(records, "cpu", "cpu_receiver_per_mb", "{:.2f}"),
           "## Resources (Fig. 16-17)\n",
           "Counted where slotstream calls UCX (src/fabric): endpoints, registered bytes, puts, gets, active messages "
           "sent and received, most operations in flight, completions polled, control connections.\n"]
    res = [r for r in records if r["experiment"] == "resources"]
    if res:
        keys = sorted({(r["protocol"], r["transport"], r["size_bytes"]) for r in res})
        metrics = sorted({r["metric"] for r in res})
        md.append("| metric | " + " | ".join(f"{p} ({t}, {'12 cameras' if s == 921600 else '1 device'})" for p, t, s in keys) + " |")
        md.append("|---|" + "---|" * len(keys))
        for m in metrics:
            cells = []
            for k in keys:
                v = [r["value"] for r in res if (r["protocol"], r["transport"], r["size_bytes"]) == k and r["metric"] == m]
                cells.append(f"{v[0]:.0f}" if v else "–")
            md.append(f"| {m} | " + " | ".join(cells) + " |")
        md.append("")
    md += ["## Held block (Fig. 18)\n", table(records, "held_block", "throughput_before_hold"),
           "During the hold:\n\n", table(records, "held_block", "throughput_during_hold"),
           "## Twelve cameras (Fig. 19)\n"]
    for m in ("throughput_mean", "throughput_cov", "frames_lost", "cpu_sender", "cpu_receiver", "peak_rss_sender", "peak_rss_receiver"):
        md += [f"{m}:\n\n", table(records, "cameras", m, "{:.3f}" if m == "throughput_cov" else "{:.1f}")]
    md.append("## Figures\n")
    md += [f"![{n}]({n})\n" for n in sorted(made)]
    if doc.get("errors"):
        md.append("## Errors\n")
        md += [f"- {e['what']}: {e['error']}" for e in doc["errors"]]
    (out / "report.md").write_text("\n".join(md) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results")
    ap.add_argument("--report", action="store_true", help="also write report.md")
    a = ap.parse_args()
    path = pathlib.Path(a.results)
    doc, records = load(path)
    made = figures(doc, records, path.parent)
    if a.report:
        report(doc, records, path.parent, made)
    print(f"plots: {', '.join(sorted(made))}" + (f"; report: {path.parent / 'report.md'}" if a.report else ""))


if __name__ == "__main__":
    main()
