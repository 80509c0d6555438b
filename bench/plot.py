#!/usr/bin/env python3
"""Draws every figure of a `slotstream bench` run from its results.json alone (PNG files next
to it); with --report also writes report.md with every table, plot and the targets."""
import argparse
import json
import re
import pathlib
import statistics

import cache_experiments
import dgram_plot  # the datagram experiments' figures and report sections
import paper_variants  # the paper's configurations beside ours (issue 22)
import rate_experiments
from fan_in_experiments import fan_in_table, plot_fan_in
from plot_common import legend_outside, line_plot, plt, style
from report_cells import Targets, human, per_run, pick, proto_key, ratio_runs, runs_of, series, spread_text, table


def load(path):
    doc = json.loads(pathlib.Path(path).read_text())
    return doc, doc["records"]


def _has_data(lines):
    """A table row below a table's header, a figure, or a list item (errors)."""
    in_table = False
    for line in lines:
        if line.startswith("|"):
            if in_table and not line.startswith("|---"):
                return True
            in_table = True
        else:
            in_table = False
            if line.startswith("![") or line.startswith("- "):
                return True
    return False


def drop_empty(text):
    """report.md without the sections that hold no data (a heading and everything up to the next
    heading of its level or above: an experiment that was not run leaves nothing behind), and without
    a caption ("...:") whose table is empty."""
    lines = text.split("\n")
    heads = [(i, len(l) - len(l.lstrip("#"))) for i, l in enumerate(lines) if l.startswith("#") and " " in l[:7]]
    drop = set()
    for n, (i, level) in enumerate(heads):
        if level == 1:
            continue
        end = next((j for j, lv in heads[n + 1:] if lv <= level), len(lines))
        if not _has_data(lines[i + 1:end]):
            drop.update(range(i, end))
    kept = [l for i, l in enumerate(lines) if i not in drop]
    out = []
    for i, line in enumerate(kept):
        nxt = next((l for l in kept[i + 1:] if l.strip()), "")
        if line.rstrip().endswith(":") and not line.startswith(("|", "#")) and not nxt.startswith("|"):
            continue  # a caption whose table is empty
        out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out))


CAMERA_FRAME = 640 * 480 * 3


def figures(doc, records, out):
    made = {}
    samples = doc.get("samples", {})
    sync = pick(records, "sync_latency", "sync_wait_p50")
    made["fig10_sync_latency.png"] = line_plot(
        out / "fig10_sync_latency.png", "Sender wait for a free block, median per wait, vs blocks (Fig. 10)",
        _by_blocks(sync), "blocks", "wait (µs)", sizes=False)
    if samples.get("sync_latency"):
        made["fig11_sync_distribution.png"] = sync_distribution(out / "fig11_sync_distribution.png",
                                                                samples["sync_latency"])
    for metric, name, what in (("latency_mean", "fig12_latency.png", "mean"),
                               ("latency_p50", "fig12_latency_median.png", "median")):
        made[name] = line_plot(out / name, f"One-block transmission latency ({what}) (Fig. 12)",
                               series(pick(records, "latency", metric)), "message size", "latency (µs)")
    thr = pick(records, "throughput", "throughput")
    for i, b in enumerate(sorted({k[2] for k in thr})):
        name = f"fig{13 + min(i, 1)}_throughput_{b}_blocks.png"
        made[name] = line_plot(out / name, f"Throughput, {b} blocks (Fig. 13-14)", series(thr, fixed_blocks=b),
                               "message size", "MB/s")
    per_read = pick(records, "throughput", "bytes_per_read")
    for b in sorted({k[2] for k in per_read}):
        name = f"fig13_bytes_per_read_{b}_blocks.png"
        made[name] = line_plot(out / name, f"Mean bytes per read (receiver-driven protocols), {b} blocks",
                               series(per_read, fixed_blocks=b), "message size", "bytes per read")
    made["fig_fan_in.png"] = plot_fan_in(records, out, plt, style)
    for side in ("sender", "receiver"):
        cpu = pick(records, "cpu", f"cpu_{side}")
        for b in sorted({k[2] for k in cpu}):
            name = f"fig15_cpu_{side}_{b}_blocks.png"
            made[name] = line_plot(out / name, f"{side.capitalize()} CPU during throughput, {b} blocks (Fig. 15)",
                                   series(cpu, fixed_blocks=b), "message size", "% of one core", logy=False)
    res = [r for r in records if r["experiment"] == "resources" and r.get("run", 0) == 0]
    for fig_no, side in ((16, "sender"), (17, "receiver")):
        rows = [r for r in res if r["metric"].startswith(side + "_")]
        if rows:
            name = f"fig{fig_no}_resources_{side}.png"
            made[name] = resources_plot(out / name, f"Transport resources, {side} (Fig. {fig_no})", rows, side)
    made.update(sdp_figures(records, out))
    for exp, name, title in (("held_block", "fig18_held_block.png", "3 blocks, saturated; block 3 held 100-200 ms"),
                             ("cameras_per_connection", "fig19_cameras.png",
                              "12 cameras x 25 fps x 640x480x3, 32 blocks per connection"),
                             ("cameras_equal_memory", "fig19_cameras_equal_memory.png",
                              "12 cameras, the same memory for every protocol (36 frame blocks)")):
        if samples.get(exp):
            fig_no = name[3:5]
            made[name] = over_time(out / name, f"{title} (Fig. {fig_no})", samples[exp], hold=exp == "held_block")
    for name in cache_experiments.plot(records, out, style, proto_key, human, plt):
        made[name] = name
    for name in rate_experiments.plot(records, out, style, proto_key, plt):
        made[name] = name
    made.update(dgram_plot.figures(records, out))
    return {k: v for k, v in made.items() if v}


def sync_distribution(path, samples):
    """Fig. 11: each sample in the order taken (the paper's 'latency vs number of transmissions'),
    and its histogram on log-spaced bins (the tails span four decades)."""
    keys = sorted(samples, key=lambda k: (k.split("/")[1], proto_key(k.split("/")[0])))
    fig, axes = plt.subplots(2, len(keys), figsize=(3.6 * len(keys), 6), squeeze=False)
    for col, key in enumerate(keys):
        p, t, b = key.split("/")
        vals = [max(v, 1e-3) for v in samples[key]]
        colour = style(p).get("color")
        top, bottom = axes[0][col], axes[1][col]
        top.plot(range(len(vals)), vals, ".", markersize=1.5, color=colour)
        top.set_yscale("log")
        top.set_title(f"{p}, {t}, {b} blocks", fontsize=9)
        top.set_xlabel("sample (in order)", fontsize=8)
        top.set_ylabel("µs", fontsize=8)
        lo, hi = min(vals), max(vals)
        bins = [lo * (hi / lo) ** (i / 40) for i in range(41)] if hi > lo else 10
        bottom.hist(vals, bins=bins, color=colour)
        bottom.set_xscale("log")
        bottom.set_xlabel("µs", fontsize=8)
        bottom.set_ylabel("samples", fontsize=8)
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=7)
    fig.suptitle("Synchronisation-control latency distribution (Fig. 11)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def resources_plot(path, title, rows, side):
    """Bars per counter, one panel per transport; registered memory in MiB so it shares the axis."""
    transports = sorted({r["transport"] for r in rows})
    fig, axes = plt.subplots(len(transports), 1, figsize=(12, 3.6 * len(transports)), squeeze=False)
    for ax, t in zip(axes[:, 0], transports):
        rt = [r for r in rows if r["transport"] == t]
        metrics = sorted({r["metric"] for r in rt})
        keys = sorted({(r["protocol"], r["size_bytes"]) for r in rt}, key=lambda k: (proto_key(k[0]), k[1]))
        width = 0.8 / max(len(keys), 1)
        for i, (p, s) in enumerate(keys):
            vals = []
            for m in metrics:
                v = [r["value"] for r in rt if (r["protocol"], r["size_bytes"], r["metric"]) == (p, s, m)]
                v = v[0] if v else 0
                vals.append(v / 2**20 if m.endswith("registered_bytes") else v)
            bars = ax.bar([j + i * width for j in range(len(metrics))], [v if v > 0 else 0.05 for v in vals], width,
                          color=style(p).get("color"), alpha=1.0 if s != CAMERA_FRAME else 0.5,
                          hatch=None if s != CAMERA_FRAME else "//",
                          label=f"{p}, {'12 cameras' if s == CAMERA_FRAME else '1 device, ' + human(s)}")
            for bar, v in zip(bars, vals):
                if v == 0:  # a log axis has no zero: a stub at its floor, labelled 0
                    ax.text(bar.get_x() + bar.get_width() / 2, 0.055, "0", ha="center", va="bottom", fontsize=6)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))])
        ax.set_xticklabels([m[len(side) + 1:].replace("registered_bytes", "registered MiB") for m in metrics],
                           rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(0.04, None)
        ax.set_title(t, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        legend_outside(ax, fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def over_time(path, title, samples, hold=False):
    """Throughput per time bin, one panel per transport."""
    transports = sorted({k.split("/")[1] for k in samples})
    fig, axes = plt.subplots(len(transports), 1, figsize=(8.5, 3.3 * len(transports)), squeeze=False, sharex=True)
    for ax, t in zip(axes[:, 0], transports):
        for key in sorted((k for k in samples if k.split("/")[1] == t), key=lambda k: proto_key(k.split("/")[0])):
            d = samples[key]
            p = key.split("/")[0]
            xs = [i * d["bin_ms"] for i in range(len(d["mb_per_s"]))]
            st = dict(style(p), marker=None)
            # Wider status_byte line: where both protocols deliver the same rate they overlap exactly.
            ax.step(xs, d["mb_per_s"], where="post", label=p, color=st.get("color"), ls=st["ls"],
                    lw=3 if p == "status_byte" else 1.3, alpha=0.8 if p == "status_byte" else 1.0)
        ax.set_ylim(bottom=0)
        if hold:
            ax.axvspan(100, 200, color="grey", alpha=0.2, label="block 3 (index 2) held")
        stops = {samples[k].get("stop_ms") for k in samples if k.split("/")[1] == t} - {None}
        if stops:
            ax.axvline(max(stops), color="grey", ls="--", lw=1, label="cameras stop")
        bin_ms = samples[next(iter(samples))]["bin_ms"]
        ax.set_ylabel(f"MB/s ({bin_ms} ms bins)")
        ax.set_title(t, fontsize=10)
        ax.grid(True, alpha=0.3)
        legend_outside(ax)
    axes[-1][0].set_xlabel("time (ms)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def _by_blocks(values):
    out = {}
    for (p, t, b, s), v in values.items():
        out.setdefault((p, t), []).append((b, v))
    return {k: sorted(v) for k, v in out.items()}


def _throughput_targets(tg, records, t, sb, sw):
    a = runs_of(records, "throughput", "throughput", protocol=sb, transport=t, size_bytes=256, blocks=3)
    b = runs_of(records, "throughput", "throughput", protocol=sw, transport=t, size_bytes=256, blocks=3)
    tg.row("status_byte / sliding_window throughput at 256 B, 3 blocks ≥ 4.6x", t, ratio_runs(a, b), "{:.2f}x", 4.6)
    sizes = sorted({r["size_bytes"] for r in records if r["experiment"] == "throughput" and r["size_bytes"] >= 65536})
    for bl in sorted({r["blocks"] for r in records if r["experiment"] == "throughput"}):
        worst = []
        for run in sorted({r.get("run", 0) for r in records}):
            vals = [r["value"] for r in records if r["experiment"] == "throughput"
                    and r["metric"] == "throughput_ratio_to_ucx" and r["protocol"] == sb and r["transport"] == t
                    and r["size_bytes"] in sizes and r["blocks"] == bl and r.get("run", 0) == run]
            if vals:
                worst.append(min(vals))
        tg.row(f"status_byte ≥ 90% of ucx_raw_put at every size ≥ 64 KiB ({bl} blocks; worst size per run)", t,
               [100 * w for w in worst], "{:.0f}%", 90)


def _sync_targets(tg, records, t, sb, sw):
    a = runs_of(records, "sync_latency", "sync_wait_p50", protocol=sb, transport=t, blocks=3)
    b = runs_of(records, "sync_latency", "sync_wait_p50", protocol=sw, transport=t, blocks=3)
    tg.row("sync latency (sender wait per full window, median), 3 blocks: status_byte ≥ 10x lower (the paper's "
           "Fig. 10 is per operation: 5.1 vs 70 µs; see its section)", t,
           ratio_runs(b, a), "{:.1f}x", 10)
    b128 = runs_of(records, "sync_latency", "sync_wait_p99", protocol=sw, transport=t, blocks=128)
    tg.row("sliding_window sync wait p99 at 128 blocks < 10 ms (the ACK stall)", t, [v / 1000 for v in b128],
           "{:.2f} ms", 10, lower_is_better=True)


def _cpu_targets(tg, records, t, sb, sw):
    for metric, label in (("cpu_sender", "% of a core"), ("cpu_sender_per_mb", "per MB moved")):
        ratios = []
        for run in sorted({r.get("run", 0) for r in records}):
            med = {}
            for p in (sb, sw):
                vals = [r["value"] for r in records if (r["experiment"], r["metric"], r["protocol"], r["transport"],
                                                        r["blocks"], r.get("run", 0)) == ("cpu", metric, p, t, 3, run)]
                if vals:
                    med[p] = statistics.median(vals)
            if len(med) == 2 and med[sw]:
                ratios.append(med[sb] / med[sw])
        tg.row(f"sender CPU {label}: status_byte ≤ 0.8x sliding_window (3 blocks, median over sizes)", t,
               ratios, "{:.2f}x", 0.8, lower_is_better=True)


def _camera_targets(tg, records, t, sb, sw):
    for variant in ("per_connection", "equal_memory"):
        c1 = runs_of(records, "cameras", "frame_jitter", protocol=sb, transport=t, variant=variant)
        c2 = runs_of(records, "cameras", "frame_jitter", protocol=sw, transport=t, variant=variant)
        l1 = runs_of(records, "cameras", "frames_lost", protocol=sb, transport=t, variant=variant)
        l2 = runs_of(records, "cameras", "frames_lost", protocol=sw, transport=t, variant=variant)
        if c1 and c2:
            tg.row(f"cameras ({variant.replace('_', ' ')}): status_byte frame jitter, ms (lower is better)", t, c1,
                   "{:.3f}", None, detail=f"vs sliding_window {spread_text(c2, '{:.3f}')}; frames lost "
                                f"{spread_text(l1, '{:.0f}')} vs {spread_text(l2, '{:.0f}')}")
        rx = runs_of(records, "cameras", "cpu_receiver", protocol=sb, transport=t, variant=variant)
        tg.row(f"status_byte receiver CPU, 12 cameras ({variant.replace('_', ' ')})", t, rx, "{:.1f}%")


def _hot_path_targets(tg, records, t, sb, sw):
    """Issue 11: the hot path against the fabric's own limits, in the same run."""
    lat = runs_of(records, "latency", "latency_p50_ratio_to_ucx", protocol=sb, transport=t, size_bytes=64)
    tg.row("latency, 64 B, one message in flight: status_byte median ≤ 5x ucx_perftest put_lat", t, lat,
           "{:.1f}x", 5, lower_is_better=True)
    p99 = runs_of(records, "latency", "latency_p99", protocol=sb, transport=t, size_bytes=64)
    tg.row("latency, 64 B: status_byte p99 ≤ 20 µs", t, p99, "{:.1f} µs", 20, lower_is_better=True)
    a = runs_of(records, "throughput", "throughput", protocol=sb, transport=t, size_bytes=256, blocks=32)
    b = runs_of(records, "put_bw", "throughput", protocol="ucx_perftest_put_bw", transport=t, size_bytes=256)
    tg.row("messages/s at 256 B, 32 blocks: status_byte ≥ 0.5x ucx_perftest put_bw", t, ratio_runs(a, b),
           "{:.2f}x", 0.5)
    if t == "tcp":  # issue 32 item 4: at 64 KiB and 1 MiB, with either block count the throughput runs use
        blocks = sorted({r["blocks"] for r in records if r["experiment"] == "throughput" and r["transport"] == t})
        for size in (65536, 1048576):
            for bl in blocks:
                a = runs_of(records, "throughput", "throughput", protocol=sb, transport=t, size_bytes=size, blocks=bl)
                b = runs_of(records, "throughput", "throughput", protocol="tcp_socket", transport=t,
                            size_bytes=size, blocks=bl)
                tg.row(f"throughput at {human(size)}, {bl} blocks: status_byte ≥ 0.9x tcp_socket", t,
                       ratio_runs(a, b), "{:.2f}x", 0.9)


def _rate_and_hold_targets(tg, records, t, sb, sw):
    # Issue 21: small messages at memory speed (bench message_rate).
    for size, least in ((256, 10e6), (64, 15e6)):
        r = runs_of(records, "message_rate", "message_rate", protocol=sb, transport=t, size_bytes=size, devices=1)
        tg.row(f"message rate, {size} B, 1 device: status_byte ≥ {least / 1e6:.0f} M msg/s", t,
               [v / 1e6 for v in r], "{:.2f} M/s", least / 1e6 if t == "shm" else None)
    r = runs_of(records, "message_rate", "ratio_to_put_bw", protocol=sb, transport=t, size_bytes=256, devices=1)
    tg.row("message rate, 256 B: status_byte ≥ 0.6x ucx_perftest put_bw (same run; issue 32 item 4)", t, r,
           "{:.2f}x", 0.6 if t == "shm" else None)
    hb = runs_of(records, "held_block", "during_over_before", protocol=sb, transport=t)
    hw = runs_of(records, "held_block", "during_over_before", protocol=sw, transport=t)
    tg.row("held block (3 blocks, saturated): status_byte throughput during / before the hold", t, hb, "{:.2f}",
           None, detail=f"(sliding_window {spread_text(hw, '{:.2f}')})" if hw else "")


# The targets table's groups of rows, in order, for each transport.
TARGET_GROUPS = (_throughput_targets, _sync_targets, _cpu_targets, _camera_targets, _hot_path_targets,
                 _rate_and_hold_targets)


def targets(records):
    tg = Targets()
    for t in sorted({r["transport"] for r in records}):
        for group in TARGET_GROUPS:
            group(tg, records, t, "status_byte", "sliding_window")
    return tg.text()


def stage_table(records):
    """Latency stages (stage_*_mean records) of each protocol, transport and size: one row each. A cell is the mean
    over the runs with [min–max] (means, unlike medians, add up: the stages' cells add up to the total's)."""
    stages = ("fill", "post", "fabric_poll", "deliver", "total")
    rows = {}
    for r in records:
        m = r["metric"]
        if r["experiment"] == "latency" and m.startswith("stage_") and m.endswith("_mean"):
            rows.setdefault((r["transport"], r["protocol"], r["size_bytes"]), {}).setdefault(m[6:-5], []).append(
                r["value"])
    if not rows:
        return "(no traced runs)\n"
    lines = ["| transport | protocol | size | " + " | ".join(stages) + " |",
             "|---|---|---:|" + "---:|" * len(stages)]
    for (t, p, s) in sorted(rows):
        cells = [mean_text(v, "{:.2f}") if (v := rows[(t, p, s)].get(st)) else "–" for st in stages]
        lines.append(f"| {t} | {p} | {human(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mean_text(values, fmt):
    """'mean [min–max] (n=N)' over the N runs; 'value (n=1)' for one run."""
    if len(values) == 1:
        return f"{fmt.format(values[0])} (n=1)"
    return (f"{fmt.format(statistics.fmean(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}] "
            f"(n={len(values)})")


def source_line(source):
    """Which sources the measured binary came from: its checkout's commit when the run started."""
    if not source:
        return "Source: not recorded (a run older than the record of it).\n"
    if not source.get("commit"):
        return f"Source: `{source['binary']}`, outside a git checkout (an installed slotstream: see its version).\n"
    changed = " with uncommitted changes to src/, include/, tools/ or CMakeLists.txt" if source.get("changed") else ""
    return (f"Source: `{source['binary']}`, as built in a checkout at commit {source['commit']}{changed} when the "
            "run started.\n")


def load_line(load):
    """The machine's load around the run (the 1-minute load average; the run's own processes raise it as it goes)."""
    if not load:
        return "Load average: not recorded (a run older than the load gate).\n"
    end = f", {load['end']:.2f} at the end (the run's own processes count)" if "end" in load else ""
    if load["start"] <= load["limit"]:
        forced = f" The run refuses to start above {load['limit']} unless forced."
    elif load.get("forced"):
        forced = f" **Forced** (`--force`) above the limit of {load['limit']}: other work shared the cores."
    else:
        forced = f" Above the limit of {load['limit']}: a `--tiny` run (a test; its figures mean nothing)."

    return f"Load average (1 min): {load['start']:.2f} at the start{end}.{forced}\n"


def report_header(doc):
    """The title: the command, the machine, the versions, the settings, and how to read a cell."""
    c = doc["config"]
    settings = c.get("settings", {})
    md = [f"# slotstream bench report\n",
          f"`{c['command']}` on {c['host']} ({c['cpus']} CPUs{', ' + c['cpu_model'] if c.get('cpu_model') else ''}, "
          f"kernel {c['kernel']}), {c['slotstream']}, "
          f"UCX {c['ucx']}, {c['date']}.\n",
          ("Settings: " + "; ".join(f"{k} = {v}" for k, v in settings.items()) + ".\n") if settings else "",
          load_line(c.get("load")),
          source_line(c.get("source")),
          "`tcp_socket` (plain TCP over loopback) has no shared-memory variant: it is measured once, "
          "listed under the tcp transport, and is the TCP/IP reference for both.\n",
          "Every number comes from two real processes over real UCX (or plain TCP for `tcp_socket`); "
          "records are in `results.json`, figures are drawn from it by `bench/plot.py`.\n",
          f"Runs: {c.get('settings', {}).get('runs', 1)} independent runs (fresh processes each); every cell is "
          "the median over its runs with [min–max] and n, the number of runs (a cell of one run has no spread: "
          "`(n=1)`); a target is met when its median meets it.\n"]
    return md


def sync_section(records):
    return ["## Synchronisation-control latency (Fig. 10-11)\n",
            "The same quantity for every protocol: each time the sender finds no free receiver block it is "
            "blocked until one is free; one sample per such wait, from the moment it found none until it has one "
            "(status_byte: fences, status-array reads and back-off; sliding_window: polling for ACKs). 4 KiB "
            "messages, back to back.\n",
            "Median wait (µs):\n\n", table(records, "sync_latency", "sync_wait_p50", "{:.2f}"),
            "p99 wait (µs):\n\n", table(records, "sync_latency", "sync_wait_p99", "{:.2f}"),
            "Waits per run:\n\n", table(records, "sync_latency", "sync_waits", "{:.0f}"),
            "What one synchronisation operation costs, median (µs) — status_byte: one status-array read (RDMA get "
            "of all N bytes, issue to completion); sliding_window: one ACK from its generation at the receiver to "
            "its handling by the sender, which polls only while its window is full (so this includes time the ACK "
            "waits to be picked up):\n\n",
            table(records, "sync_latency", "sync_op_p50", "{:.2f}"),
            "Synchronisation operations per run:\n\n", table(records, "sync_latency", "sync_operations", "{:.0f}")]


def latency_section(records):
    return ["## One-block transmission latency, µs (Fig. 12)\n",
            "One-way times: the sender's stamp before filling the block until the message is complete at a "
            "busy-polling receiver; one message in flight at a time (the sender waits 200 µs plus the size's "
            "wire time after each). Each point times as many messages as fit in about a second of gaps, 100 to "
            "2,000 (the count is the `latency_samples` record), after untimed warm-up messages (100, or a tenth "
            "of the timed ones for large messages, at least 5), so a p99 at small sizes rests on ~20 samples, "
            "not on the slowest one or two of a cold start. Within a run a point's mean, median and p99 come from the "
            "same samples. ucx_raw_put is `ucx_perftest -t ucp_put_lat` on the same transport and size, with the same "
            "warm-up and count (half a put ping-pong round trip, both sides polling memory; one buffer, so blocks = 1); "
            "ucx_perftest reports one percentile per run, so its median and mean come from one run and it has no p99 "
            "(a p99 from a second run is not comparable: it once fell below the first run's median); the "
            "bench-peer's raw put loop delivers nothing a receiver could time. A scheduler stall of either "
            "process lands in these numbers in full, so read the mean next to the median.\n",
            "Mean:\n\n", table(records, "latency", "latency_mean", "{:.1f}", by_blocks=False),
            "Median:\n\n", table(records, "latency", "latency_p50", "{:.1f}", by_blocks=False),
            "p99:\n\n", table(records, "latency", "latency_p99", "{:.1f}", by_blocks=False),
            "Mean as a multiple of ucx_raw_put's mean (1.0 = the ceiling):\n\n",
            table(records, "latency", "latency_mean_ratio_to_ucx", "{:.1f}", by_blocks=False),
            "Median as a multiple of ucx_raw_put's median:\n\n",
            table(records, "latency", "latency_p50_ratio_to_ucx", "{:.1f}", by_blocks=False),
            "Where the time goes, mean µs per stage over the messages traced with every event (both peers' "
            "`--trace`, src/engine/ucx/stream/trace.h): **fill** from the stamp until the block is committed "
            "(claim, copy, header); **post** until the protocol's transmit returned (a hand-off to the sending thread shows "
            "here); **fabric_poll** until the receiver's poll found the block; **deliver** until the sink committed "
            "the message; **total** their sum, each message's stamp-to-delivered time. An event is stamped after "
            "what it marks, so one can carry a later stamp than the next (the receiver found a packed record "
            "before its transmitter stamped `posted`): it counts at the next one's, so no stage is negative. Means, "
            "not medians, so that the stages add up to the total; a cell is the mean over the runs [min–max]:\n\n",
            stage_table(records)]


def throughput_section(records):
    md = ["## Throughput, MB/s (Fig. 13-14)\n",
          "Median over rounds; a round is `count` consecutive transfers (1,000; for large messages fewer, so "
          "that a round moves a bounded number of bytes, but at least two passes over every block), timed "
          "from its first send to its last arrival. The counted rounds are the last of each run's stream; "
          "before them one round and `throughput_warm_bytes` more warm up (first touches, and where the "
          "scheduler settles the peers' threads) and are not counted. A sender also stops after "
          "`throughput_seconds`, with fewer rounds then. ucx_raw_put delivers nothing: its rounds are timed by "
          "the sender's own sends (its periodic flushes included, its final one not).\n"]
    for b in sorted({r["blocks"] for r in records if r["experiment"] == "throughput"}):
        md += [f"### {b} blocks\n", table(records, "throughput", "throughput", blocks=b),
               "Ratio to ucx_raw_put:\n\n", table(records, "throughput", "throughput_ratio_to_ucx", "{:.2f}", blocks=b)]
    if any(r["experiment"] == "put_bw" for r in records):
        md += ["### UCX's own put bandwidth (`ucx_perftest -t ucp_put_bw`)\n",
               "Puts back to back into one cache-hot buffer, no flow control, no delivery: the fabric's limit "
               "that issue 11 compares the hot path with (ucx_raw_put above rotates over the receiver's blocks "
               "and flushes like a protocol). MB/s:\n\n", table(records, "put_bw", "throughput", by_blocks=False),
               "Millions of messages per second:\n\n",
               table([dict(r, value=r["value"] / 1e6) for r in records if r["metric"] == "message_rate"], "put_bw",
                     "message_rate", "{:.2f}", by_blocks=False)]
    return md


def cpu_section(records):
    return ["## CPU, % of one core (Fig. 15)\n",
            "Per process, user+system time (getrusage, all threads) over the measured window: for the sender from "
            "the first message after the connection was set up until everything was confirmed stored; for the "
            "receiver over its session. At most 100% x CPUs.\n",
            "Sender:\n\n", table(records, "cpu", "cpu_sender", "{:.0f}"),
            "Receiver:\n\n", table(records, "cpu", "cpu_receiver", "{:.0f}"),
            "Time inside UCX progress (ucp_worker_progress), summed over the process's threads, as % of the "
            "run's wall time (a thread preempted inside a call counts too: not CPU), sender:\n\n",
            table(records, "cpu", "progress_sender", "{:.1f}"),
            "Receiver (0: the receiver took no part in the transfers):\n\n",
            table(records, "cpu", "progress_receiver", "{:.1f}"),
            "Sender CPU per MB moved (ms/MB):\n\n", table(records, "cpu", "cpu_sender_per_mb", "{:.2f}"),
            "Receiver CPU per MB moved (ms/MB):\n\n", table(records, "cpu", "cpu_receiver_per_mb", "{:.2f}")]


def resources_section(records):
    md = ["## Resources (Fig. 16-17)\n",
          "Counted where slotstream calls UCX (src/engine/ucx/fabric): endpoints, registered bytes, puts, gets, "
          "active messages sent and received, most operations in flight, completions polled, progress calls (all, and those that "
          "found work) and the time in them, control connections. First run.\n"]
    res = [r for r in records if r["experiment"] == "resources" and r.get("run", 0) == 0]
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
    return md


def bytes_per_read_section(records):
    return ["## Mean bytes per read (buffered_read)\n",
            "The receiver's data gets and their bytes (protocol counters): reads batch everything the sender "
            "wrote since the last one.\n", table(records, "throughput", "bytes_per_read", "{:.0f}")]


def fan_in_section(records):
    return ["## Fan-in: N senders into one receiver\n", fan_in_table(records)]


def held_block_section(records):
    return ["## Held block (Fig. 18)\n",
            "Three receiver blocks (the paper's §4.2 setting), 64 KiB messages sent back to back (saturated: the "
            "paper's Fig. 18 gives neither load nor size, and a drop of 12 %), the receiver holds block 3 (index 2) "
            "from 100 to 200 ms after the sender's first data (the bins count from the first arrival). A protocol "
            "that can skip a held block keeps going on the other two; one that frees in order stops at the held "
            "one.\n",
            "Before the hold (MB/s):\n\n", table(records, "held_block", "throughput_before_hold"),
            "During the hold (MB/s):\n\n", table(records, "held_block", "throughput_during_hold"),
            "During / before:\n\n", table(records, "held_block", "during_over_before", "{:.2f}")]


def cameras_section(records):
    md = ["## Twelve cameras (Fig. 19)\n"]
    md.append("Throughput in 200 ms bins (5 frame periods of every camera) over the cameras' running time, "
              "first and last bin left out; CoV = population standard deviation / mean of those bins (a paced "
              "source fills every bin alike however late within it a frame lands: a CoV of 0 says the rate held, "
              "not that delivery was steady). frame_jitter = population standard deviation of the frames' send-stamp-to-"
              "complete times, ms: the jitter measure. "
              "frames_lost = frames sent - frames complete at the receiver; last_frame_after_stop = seconds from the "
              "cameras' last frame period to the last frame complete (a backlog; the figure shows it after the "
              "dashed line). frame_latency = send stamp to frame complete at the receiver. Two settings: "
              "slotstream's default of 32 blocks per connection (a protocol with one connection per camera then "
              "holds 12 times the memory), and equal memory (36 frame blocks in total: 3 per camera's "
              "connection, or 36 on one shared connection).\n")
    for variant in ("per_connection", "equal_memory"):
        md.append(f"### {variant.replace('_', ' ')}\n")
        for m in ("receiver_blocks_total", "throughput_mean", "throughput_cov", "frames_lost", "last_frame_after_stop",
                  "frame_latency_p50", "frame_latency_p99", "frame_jitter", "cpu_sender", "cpu_receiver",
                  "progress_receiver", "peak_rss_sender", "peak_rss_receiver"):
            fmt = "{:.3f}" if m in ("throughput_cov", "frame_jitter") else "{:.1f}"
            md += [f"{m}:\n\n", table(records, "cameras", m, fmt, by_blocks=False, variant=variant)]
    return md


def closing_section(doc, made):
    """The figures, then the errors of the run."""
    md = ["## Figures\n"] + [f"![{n}]({n})\n" for n in sorted(made)]
    if doc.get("errors"):
        md.append("## Errors\n")
        md += [f"- {e['what']}: {e['error']}" for e in doc["errors"]]
    return md


# ------------------------------------------------------------ the SDP paper (bench/ring_experiments.py)

def _settings(variant):
    """'compute_us=500;rx_ns_per_byte=1' -> {'compute_us': '500', 'rx_ns_per_byte': '1'}."""
    return dict(kv.split("=", 1) for kv in variant.split(";") if "=" in kv)


def _variants(records, experiment, prefix):
    """The numeric values of an experiment's `prefix=N` variants, sorted."""
    return sorted({int(r["variant"].split("=", 1)[1]) for r in records
                   if r["experiment"] == experiment and r.get("variant", "").startswith(prefix + "=")
                   and ";" not in r["variant"]})


def _receivers(records):
    """The progress experiment's receiver settings: None (counts only) or its ns per byte."""
    return sorted({_settings(r["variant"]).get("rx_ns_per_byte") for r in records if r["experiment"] == "progress"},
                  key=lambda x: (x is not None, float(x or 0)))


def _receiver_text(rx):
    return "receiver counts messages" if rx is None else f"receiver processes every byte ({rx} ns/byte)"


def _by_compute(records, metric, rx=None):
    """{(protocol, transport): [(compute µs, [value per run])...]} for one receiver setting."""
    variants = sorted({r["variant"] for r in records if r["experiment"] == "progress"
                       and _settings(r["variant"]).get("rx_ns_per_byte") == rx},
                      key=lambda v: int(_settings(v)["compute_us"]))
    out = {}
    for variant in variants:
        c = int(_settings(variant)["compute_us"])
        for (p, t, _, _), v in per_run(records, "progress", metric, variant=variant).items():
            out.setdefault((p, t), []).append((c, v))
    return out


def sdp_figures(records, out):
    """SDP Fig. 4b (throughput) and 6 (buffer utilisation) per buffer size, and Fig. 5 (progress)."""
    made = {}
    for bs in _variants(records, "small_messages", "buffers"):
        where = {"variant": f"buffers={bs}"}
        name = f"sdp_fig4b_throughput_{bs // 1024}k_buffers.png"
        made[name] = line_plot(out / name, f"Small messages: throughput, 8 x {human(bs)} buffers (SDP Fig. 4b)",
                               series(pick(records, "small_messages", "throughput", **where)), "message size", "MB/s")
        name = f"sdp_fig6_utilisation_{bs // 1024}k_buffers.png"
        made[name] = line_plot(out / name, f"Buffer utilisation, 8 x {human(bs)} buffers (SDP Fig. 6)",
                               series(pick(records, "small_messages", "buffer_utilisation", **where)),
                               "message size", "useful bytes / buffer held (%)", logy=False)
    for rx in _receivers(records):
        prog = {k: [(c, statistics.median(v)) for c, v in pts]
                for k, pts in _by_compute(records, "iteration_time", rx).items()}
        name = "sdp_fig5_progress.png" if rx is None else "sdp_fig5_progress_processing_receiver.png"
        made[name] = line_plot(
            out / name, f"Communication progress: 100 x 4 KiB per burst, {_receiver_text(rx)} (SDP Fig. 5)",
            prog, "computation between bursts (µs)", "iteration time (µs)", logx=False, logy=False, sizes=False)
    return {k: v for k, v in made.items() if v}


def _compute_table(records, metric, fmt, rx=None):
    """Rows: computation; columns: protocol (transport); cells: median [min–max] over runs."""
    data = _by_compute(records, metric, rx)
    if not data:
        return ""
    cols = sorted(data, key=lambda c: (c[1], proto_key(c[0])))
    rows = sorted({c for pts in data.values() for c, _ in pts})
    lines = ["| compute | " + " | ".join(f"{p} ({t})" for p, t in cols) + " |", "|---|" + "---|" * len(cols)]
    for c in rows:
        cells = [spread_text(dict(data[k]).get(c), fmt) if c in dict(data[k]) else "–" for k in cols]
        lines.append(f"| {c} µs | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sdp_claims(records):
    """The SDP paper's claims next to this run (median [min–max] over runs of per-run ratios)."""
    tg = Targets()
    transports = sorted({r["transport"] for r in records if r["experiment"] in ("small_messages", "progress")})
    small = {"experiment": "small_messages", "metric": "throughput", "variant": "buffers=8192"}
    for t in transports:
        for p in ("packed_ring", "nic_assisted"):
            for s in (256, 1024, 4096):
                num = runs_of(records, protocol=p, transport=t, size_bytes=s, **small)
                den = runs_of(records, protocol="credit", transport=t, size_bytes=s, **small)
                tg.row(f"{p} ≈ 10x credit's throughput, {human(s)} (Fig. 4b; 8 x 8 KiB)", t, ratio_runs(num, den),
                       "{:.1f}x", threshold=10)
        util = per_run(records, "small_messages", "buffer_utilisation", variant="buffers=32768")
        mine = {s: v for (p, tt, _, s), v in util.items() if p == "credit" and tt == t and s <= 8192}
        if mine:
            worst = max(mine, key=lambda s: statistics.median(mine[s]))
            tg.row("credit at most 25 % utilisation with 32 KiB buffers (Fig. 6b; messages up to 8 KiB)", t,
                   mine[worst], "{:.1f} %", threshold=25, lower_is_better=True, detail=f"(highest: {human(worst)})")
        for rx in _receivers(records):
            comp = sorted({c for pts in _by_compute(records, "iteration_time", rx).values() for c, _ in pts})
            if not comp:
                continue
            last = [r["variant"] for r in records if r["experiment"] == "progress"
                    and _settings(r["variant"]).get("rx_ns_per_byte") == rx
                    and int(_settings(r["variant"])["compute_us"]) == comp[-1]][0]
            for p, claim in (("packed_ring", "packed_ring slower than credit"), ("nic_assisted", "nic_assisted not "
                             "slower than credit"), ("packed_ring:flush=idle", "packed_ring:flush=idle (the fix) vs credit")):
                num = runs_of(records, "progress", "iteration_time", protocol=p, transport=t, variant=last)
                den = runs_of(records, "progress", "iteration_time", protocol="credit", transport=t, variant=last)
                tg.row(f"{claim} at {comp[-1]} µs of computation, {_receiver_text(rx)} (Fig. 5)", t,
                       ratio_runs(num, den), "{:.2f}x credit's time",
                       threshold=None if p.endswith("idle") else 1.0, lower_is_better=p != "packed_ring")
    return tg.text() if len(tg.lines) > 2 else "(credit is not in this run: the paper's claims compare with it.)\n"


def sdp_report(records):
    if not any(r["experiment"] in ("small_messages", "progress") for r in records):
        return []
    md = ["## The SDP paper: small messages and progress (SDP Fig. 4b, 5, 6)\n",
          "Protocols: credit (SDP §2), packed_ring (§3; `:flush=idle` is the fix for §3.2's flaw), nic_assisted "
          "(§4), and this project's status_byte and sliding_window — those of the run. 8 buffers (blocks) as in "
          "the paper's 64 KiB and 256 KiB SDP buffers. Cells: median [min–max] over runs.\n",
          sdp_claims(records)]
    for bs in _variants(records, "small_messages", "buffers"):
        where = {"variant": f"buffers={bs}"}
        md += [f"### Throughput, MB/s, 8 x {human(bs)} buffers (Fig. 4b)\n",
               "One device sends messages of one size back to back; counted over the run's last messages, from "
               "the first counted send to the last arrival, after an uncounted warm-up (8 MiB with --quick, or "
               "0.5 s, whichever ends first, and a tenth of the counted budget).\n",
               table(records, "small_messages", "throughput", "{:.2f}", by_blocks=False, **where),
               f"### Buffer utilisation, %, 8 x {human(bs)} buffers (Fig. 6)\n",
               "Payload bytes held in the receiver's buffer / the buffer's size (8 buffers), time-averaged over "
               "the session — the paper's \"percentage usage of the buffer space\": it grows with how much data "
               "waits in the buffer (a receiver slower than the sender) and with how densely it is packed.\n",
               table(records, "small_messages", "buffer_utilisation", "{:.1f}", by_blocks=False, **where),
               "Packing, %: payload bytes / buffer memory held by records (a whole buffer per message for block "
               "protocols, the record itself in a ring) — what the design wastes, whatever the occupancy:\n\n",
               table(records, "small_messages", "packing", "{:.1f}", by_blocks=False, **where)]
        share = table(records, "small_messages", "coalesced_share", "{:.0f}", by_blocks=False, **where)
        if share:
            md += ["Share of messages that were coalesced (ring protocols), %:\n\n", share]
    if any(r["experiment"] == "progress" for r in records):
        md += ["### Communication progress (Fig. 5)\n",
               "Bursts of 100 x 4 KiB, C µs of computation after each (the application calls nothing; emulated by "
               "a sleep, since a busy loop on this 2-core machine takes the CPU the sender's library and the "
               "receiver need), 8 x 8 KiB buffers. The paper's test is a "
               "ping-pong; slotstream streams one way, so the reply is computed from measured times: iteration = "
               "max(end of sends + C, last arrival + C) - first send (the peer replies once it has the whole burst "
               "and has computed too). Tail delay: from a burst's last send returning to its last message "
               "arriving — the data a design holds back while the application computes.\n",
               "Two receivers: one that only counts messages (it drains a burst faster than the sender fills the "
               "ring here), and one that processes every byte at ~1 GB/s, slower than the burst — the paper's "
               "precondition for the flaw of §3.2 (SDP's recv() copies every message out and ACKs).\n"]
        for rx in _receivers(records):
            md += [f"#### {_receiver_text(rx).capitalize()}\n",
                   "Iteration time, µs:\n\n", _compute_table(records, "iteration_time", "{:.0f}", rx),
                   "Burst tail delay (median over bursts), µs:\n\n",
                   _compute_table(records, "burst_tail_delay_p50", "{:.0f}", rx)]
    return md


# report.md's sections in order; each takes the records and returns its lines (none without data: drop_empty).
SECTIONS = (lambda records: ["## Targets\n", targets(records)], sync_section, latency_section, throughput_section,
            cpu_section, resources_section, bytes_per_read_section, fan_in_section, held_block_section,
            cameras_section, lambda records: paper_variants.report_section(records, spread_text),
            lambda records: rate_experiments.report(records, proto_key),
            lambda records: cache_experiments.report(records, human), sdp_report,
            dgram_plot.report_sections)


def report(doc, records, out, made):
    md = report_header(doc)
    for section in SECTIONS:
        md += section(records)
    md += closing_section(doc, made)
    (out / "report.md").write_text(drop_empty("\n".join(md)) + "\n")


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
