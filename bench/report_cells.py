"""What every report section is made of (bench/plot.py, dgram_plot.py and the experiment modules' own
sections): a protocol's order, the values of a point over runs, a cell (median [min–max] (n=N)), a markdown
table, the targets table. Imports no other bench module and no matplotlib, so that the measuring side may
import it too."""
import statistics


ORDER = ["status_byte", "status_byte:pack=off", "sliding_window", "credit", "carc", "packed_ring",
         "packed_ring:flush=idle", "nic_assisted", "buffered_read", "ucx_raw_put", "ucx_perftest_put_bw", "tcp_socket"]


def proto_key(p):
    return (ORDER.index(p) if p in ORDER else len(ORDER), p)


def loss_of(variant):
    """The loss level of a loss experiment's variant ("loss 5%" -> 5.0); None for another variant."""
    try:
        return float(variant.split()[1].rstrip("%"))
    except (IndexError, ValueError):
        return None


def per_run(records, experiment, metric, **where):
    """{(protocol, transport, blocks, size): [value of run 0, run 1, ...]}: within a run the median
    over its rounds (throughput), across runs one value each."""
    out = {}
    for r in records:
        if r["experiment"] != experiment or r["metric"] != metric:
            continue
        if any(r.get(k, "") != v for k, v in where.items()):
            continue
        key = (r["protocol"], r["transport"], r["blocks"], r["size_bytes"])
        out.setdefault(key, {}).setdefault(r.get("run", 0), []).append(r["value"])
    return {k: [statistics.median(v) for _, v in sorted(runs.items())] for k, runs in out.items()}


def grouped(records, experiment, metric, key, **where):
    """{key(record): [values]} of one metric of an experiment, over the records whose fields match `where`
    (one value per run and repeat: for experiments with axes of their own, e.g. cache's window_bytes)."""
    out = {}
    for r in records:
        if r["experiment"] != experiment or r["metric"] != metric:
            continue
        if any(r.get(k) != v for k, v in where.items()):
            continue
        out.setdefault(key(r), []).append(r["value"])
    return out


def pick(records, experiment, metric, **where):
    """The median over runs of each point (what the figures draw)."""
    return {k: statistics.median(v) for k, v in per_run(records, experiment, metric, **where).items()}


def spread_text(values, fmt):
    """'median [min–max] (n=N)' over the N runs; 'value (n=1)' for one run, which has no spread."""
    if len(values) == 1:
        return f"{fmt.format(values[0])} (n=1)"
    return (f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}] "
            f"(n={len(values)})")


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


def table(records, experiment, metric, unit_fmt="{:.1f}", blocks=None, by_blocks=True, **where):
    """Rows: (blocks, size) — or size alone when by_blocks is False, for tables whose columns ran
    with different block counts (the latency ceiling uses one buffer); columns: protocol (transport),
    grouped by transport. A cell is the median over runs, with [min–max] when there were several."""
    vals = per_run(records, experiment, metric, **where)
    if blocks is not None:
        vals = {k: v for k, v in vals.items() if k[2] == blocks}
    if not vals:
        return ""
    if not by_blocks:
        vals = {(p, t, "", s): v for (p, t, b, s), v in vals.items()}
    cols = sorted({(p, t) for p, t, _, _ in vals}, key=lambda c: (c[1], proto_key(c[0])))
    rows = sorted({(b, s) for _, _, b, s in vals}, key=lambda r: (str(r[0]).zfill(6), r[1]))
    head = "| size | blocks | " if by_blocks else "| size | "
    lines = [head + " | ".join(f"{p} ({t})" for p, t in cols) + " |",
             "|---|" + ("---|" if by_blocks else "") + "---|" * len(cols)]
    for b, s in rows:
        cells = [spread_text(vals[(p, t, b, s)], unit_fmt) if (p, t, b, s) in vals else "–" for p, t in cols]
        lines.append(f"| {human(s)} | " + (f"{b} | " if by_blocks else "") + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def runs_of(records, experiment, metric, **where):
    """One value per run for the single point `where` selects (median over its rounds)."""
    by_run = {}
    for r in records:
        if r["experiment"] == experiment and r["metric"] == metric and all(r.get(k) == x for k, x in where.items()):
            by_run.setdefault(r.get("run", 0), []).append(r["value"])
    return [statistics.median(v) for _, v in sorted(by_run.items())]


def ratio_runs(num, den):
    """Per-run ratios of two points measured in the same runs."""
    return [a / b for a, b in zip(num, den) if b]


class Targets:
    """Each target judged on the median over runs; a target whose min–max range crosses its
    threshold says so."""

    def __init__(self):
        self.lines = ["| target | transport | median [min–max] over runs | met (median)? |", "|---|---|---|---|"]

    def row(self, name, t, values, fmt, threshold=None, lower_is_better=False, detail=""):
        if not values:
            return
        med = statistics.median(values)
        text = spread_text(values, fmt) + (f" {detail}" if detail else "")
        if threshold is None:
            verdict = "n/a"
        else:
            ok = (med <= threshold) if lower_is_better else (med >= threshold)
            crosses = (min(values) <= threshold <= max(values)) and len(values) > 1
            verdict = ("yes" if ok else "no") + (" (the spread crosses the target)" if crosses else "")
        self.lines.append(f"| {name} | {t} | {text} | {verdict} |")

    def text(self):
        return "\n".join(self.lines) + "\n"
