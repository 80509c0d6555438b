#!/usr/bin/env python3
"""Zero-copy receive against the copy path (issue 22), over one transport: 12 synthetic cameras sent as fast as
the sender can make frames (`send --synthetic` far above its rate for --seconds of wall-clock time) into
build/examples/zero_copy_recv, whose consumer thread reads every byte (a word sum) of each message — a MessageView
in place (--mode view) or a copy made by a MessageSink (--mode copy). Modes alternate within each run so that both
see the same machine. Measures, per run:

  saturation  receiver frames/s, receiver CPU per frame (the whole receiver process: session thread + consumer),
              and the receiver's peak resident memory (VmHWM), copy vs zero-copy;
  pinned      the same with the sender on CPU 0 and the receiver on CPU 1 (`taskset`; hosts with 2+ CPUs): the
              sender's cost no longer shares the receiver's core; and again with the cheapest sender there is
              (`bench-peer send`, a memset per frame) — the receiver's own limit — where the copy path is also
              measured copying into reused buffers (copy-pool: no fresh pages per frame);
  held        zero-copy only: the consumer keeps the first K views to the end (K = 0, 4, 16, half the blocks) and
              the sender's throughput is what it makes around the K held blocks (the paper's status 2, §4.2.7).

Prints one line per measurement and min/median/max tables. Also `slotstream bench zero_copy --out DIR` (records in
DIR/results.json, the tables in DIR/zero_copy.md).

    python3 bench/zero_copy.py [--transport shm] [--runs 3] [--seconds 2] [--sizes 256x256x1,640x480x3]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import time

import harness

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("SLOTSTREAM_BIN", str(REPO / "build" / "slotstream"))
RECV = os.environ.get("SLOTSTREAM_ZERO_COPY_RECV", str(REPO / "build" / "examples" / "zero_copy_recv"))

FPS = 100000  # far above what the sender can make: it sends back to back for --seconds (late frames are skipped)
BLOCKS = 32   # the default geometry: 32 blocks of 1 MiB


def taskset(cpu):
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


def sender_argv(addr, transport, size, seconds, memset):
    """`send --synthetic` (every frame generated: the sender's CPU per frame is several times the zero-copy
    receiver's), or with `memset` `bench-peer send`, whose fill is one memset: the cheapest sender there is, so
    that the receiver's own limit shows."""
    if memset:
        n = 1
        for d in size.split("x"):
            n *= int(d)
        return [BIN, "bench-peer", "send", "--to", addr, "--name", "cams", "--transport", transport, "--devices", "12",
                "--size", str(n), "--block-size", str(1 << 20), "--blocks", str(BLOCKS), "--count", "10000000",
                "--seconds", str(seconds)]
    return [BIN, "send", "--to", addr, "--name", "cams", "--transport", transport, "--blocks", str(BLOCKS),
            "--synthetic", f"0-11:{FPS}:{size}", "--duration", str(seconds), "--json"]


def one(mode, transport, size, seconds, pin=False, hold=0, memset=False):
    """One receiver process and one sender: the receiver's and the sender's figures."""
    rx_argv = [*taskset(1 if pin else None), RECV, "--transport", transport, "--mode", mode, "--verify", "off"]
    if hold:  # K views kept: the limit leaves the others room to flow
        rx_argv += ["--hold", str(hold), "--max-held", str(hold + max(1, (BLOCKS - hold) // 2))]
    rx = subprocess.Popen(rx_argv, stdout=subprocess.PIPE, text=True)
    try:
        line = rx.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the receiver did not start (exit {rx.wait(10)}, said {line!r})")
        addr = line.split()[2]
        tx = subprocess.run([*taskset(0 if pin else None), *sender_argv(addr, transport, size, seconds, memset)],
                            capture_output=True, text=True, timeout=seconds * 10 + 60)
        got = json.loads(rx.stdout.readline())
        rx.wait(30)
    finally:
        if rx.poll() is None:
            rx.kill()
    if tx.returncode != 0:
        raise RuntimeError(f"send failed: {tx.stderr[-500:]}")
    sent = json.loads(tx.stdout.strip().splitlines()[-1])
    if got["messages"] != sent["messages"]:
        raise RuntimeError(f"received {got['messages']} of {sent['messages']} messages")
    return {"fps": got["messages"] / got["seconds"], "cpu_us": 1e6 * got["cpu_s"] / got["messages"],
            "rss_mb": got["rss_hwm_kb"] / 1024, "in_place": got["in_place"], "tx_fps": sent["messages"] / sent["seconds"],
            "tx_mb_s": sent["mb_per_s"], "held_skips": sent.get("held_skips", 0),
            "tx_cpu_us": 1e6 * sent["cpu_seconds"] / max(sent["messages"], 1)}


def measured(say, *args, **kwargs):
    """one(), tried a second time after a failure (a loaded machine: a process that did not start in time)."""
    try:
        return one(*args, **kwargs)
    except (RuntimeError, subprocess.SubprocessError) as e:
        say(f"  (failed, measuring again: {e})")
        return one(*args, **kwargs)


def held_list(tiny=False):
    return [BLOCKS // 2] if tiny else sorted({0, 4, 16, BLOCKS // 2})


def measure_run(transport, sizes, seconds, run, pin, results, say, tiny=False):
    """One run: every size in both modes (order alternating with the run), pinned if asked, then held K."""
    for size in sizes:
        for variant in (["free", "pinned", "memset-pinned"] if pin else ["free"]):
            # The copy path copies into a fresh buffer per message; copy-pool (the cheapest copying application:
            # buffers reused, no fresh pages) beside it where the receiver's own limit is measured.
            modes = ["copy", "view"] + (["copy-pool"] if variant == "memset-pinned" else [])
            for mode in modes if run % 2 == 0 else reversed(modes):
                r = measured(say, mode, transport, size, seconds, pin=variant != "free", memset=variant == "memset-pinned")
                results.setdefault(("saturation", variant, size, mode), []).append(r)
                say(f"run {run + 1} {variant:6} {size:12} {mode}: {r['fps']:7.0f} frames/s, {r['cpu_us']:7.1f} µs "
                    f"receiver CPU/frame ({r['tx_cpu_us']:6.1f} sender), peak RSS {r['rss_mb']:6.1f} MiB "
                    f"(in place: {r['in_place']})")
    size = sizes[-1]
    for k in held_list(tiny) if run % 2 == 0 else reversed(held_list(tiny)):
        r = measured(say, "view", transport, size, seconds, hold=k)
        results.setdefault(("held", k, size), []).append(r)
        say(f"run {run + 1} held K={k:2} {size}: sender {r['tx_fps']:7.0f} frames/s = {r['tx_mb_s']:7.0f} MB/s, "
            f"held-block skips {r['held_skips']}")


def fmt(v, digits=0):
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}–{max(v):.{digits}f}]"


def ratio(a, b):
    r = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(r):.2f}x [{min(r):.2f}–{max(r):.2f}]"


def tables(results, transport, runs):
    """The run's tables as markdown lines (median [min–max] over the runs)."""
    out = [f"{transport}, {runs} runs, median [min–max]", "",
           "| frame | sender/receiver | copy frames/s | zero-copy frames/s | ratio | copy CPU µs/frame | "
           "zero-copy CPU µs/frame | ratio | receiver limit ratio | copy peak RSS MiB | zero-copy peak RSS MiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, c in sorted(results.items(), key=str):
        if key[0] != "saturation" or key[3] == "view":
            continue
        kind, variant, size, copy_mode = key
        v = results[(kind, variant, size, "view")]
        cf, vf = [r["fps"] for r in c], [r["fps"] for r in v]
        cc, vc = [r["cpu_us"] for r in c], [r["cpu_us"] for r in v]
        cm, vm = [r["rss_mb"] for r in c], [r["rss_mb"] for r in v]
        # Receiver limit: what each receiver could take with a core to itself, 1 / (its CPU per frame). Its CPU
        # includes polling while it waits for the sender, so a receiver faster than its sender is overcharged:
        # the zero-copy figure is an upper bound.
        who = {"free": "synthetic, shared CPUs", "pinned": "synthetic, a CPU each", "memset-pinned": "memset, a CPU each"}
        label = size if copy_mode == "copy" else f"{size} (copy-pool)"
        out.append(f"| {label} | {who[variant]} | {fmt(cf)} | {fmt(vf)} | "
                   f"{ratio(vf, cf)} | {fmt(cc, 1)} | {fmt(vc, 1)} | {ratio(vc, cc)} | {ratio(cc, vc)} | {fmt(cm, 1)} | "
                   f"{fmt(vm, 1)} |")
    held = sorted((key[1], key[2]) for key in results if key[0] == "held")
    if held:
        out += ["", "| K views held (of 32 blocks) | frame | sender frames/s | sender MB/s | vs K=0 |", "|---|---|---|---|---|"]
        base = {size: [r["tx_fps"] for r in results[("held", 0, size)]] for _, size in held if ("held", 0, size) in results}
        for k, size in held:
            rs = results[("held", k, size)]
            f = [r["tx_fps"] for r in rs]
            vs = ratio(f, base[size]) if size in base else "-"
            out.append(f"| {k} | {size} | {fmt(f)} | {fmt([r['tx_mb_s'] for r in rs])} | {vs} |")
    return out


def can_pin():
    return shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="sending time per measurement (default 2)")
    ap.add_argument("--sizes", default="256x256x1,640x480x3")
    ap.add_argument("--no-pin", action="store_true", help="leave out the pinned measurement")
    a = ap.parse_args()
    results = {}
    for run in range(a.runs):
        measure_run(a.transport, a.sizes.split(","), a.seconds, run, can_pin() and not a.no_pin, results,
                    lambda s: print(s, flush=True))
        time.sleep(0.2)
    print()
    print("\n".join(tables(results, a.transport, a.runs)))


def exp_zero_copy(res, cfg):
    """`slotstream bench zero_copy`: one run of every measurement per --runs round, on shm and tcp (--tiny: shm,
    K = half only: records, not figures); records under experiment "zero_copy", the tables in OUT/zero_copy.md
    (rewritten after each run from every run's records: median [min–max] over the runs so far)."""
    sizes = ["640x480x3"] if cfg.quick or cfg.tiny else ["256x256x1", "640x480x3"]
    transports = [t for t in cfg.transports if t in (("shm",) if cfg.tiny else ("shm", "tcp"))]

    def measure(t):
        results = {}
        measure_run(t, sizes, cfg.zero_copy_seconds, res.run, can_pin() and not cfg.tiny, results,
                    lambda s: print("  " + s, flush=True), tiny=cfg.tiny)
        record(res, t, results)
        write_tables(res.out / "zero_copy.md", res.records)
        return f"{t}: {len(results)} measurements (tables in zero_copy.md)"

    harness.for_each_point(res, cfg, "zero_copy", [(t,) for t in transports], measure, lambda t: t,
                           errors=(RuntimeError, OSError, subprocess.SubprocessError, ValueError))


def frame_bytes(frame):
    n = 1
    for d in frame.split("x"):
        n *= int(d)
    return n


def record(res, t, results):
    """One record per measurement (the first of each key: a call measures each once); `frame` names the size."""
    for key, rs in results.items():
        r = rs[0]
        n = frame_bytes(key[2])
        if key[0] == "saturation":
            v = f"{key[3]},{key[1]}"
            for metric, value, unit in (("frames_per_s", r["fps"], "frames/s"), ("cpu_per_frame", r["cpu_us"], "µs"),
                                        ("peak_rss", r["rss_mb"], "MiB")):
                res.add("zero_copy", "status_byte", t, n, BLOCKS, metric, value, unit, variant=v, frame=key[2])
        else:
            res.add("zero_copy", "status_byte", t, n, BLOCKS, "sender_frames_per_s", r["tx_fps"], "frames/s",
                    variant=f"held={key[1]}", frame=key[2])


# Records written before they carried `frame`: the frame sizes bench zero_copy measures.
KNOWN_FRAMES = {frame_bytes(f): f for f in ("256x256x1", "640x480x3")}


def results_from_records(records, transport):
    """tables()'s input rebuilt from the records of every run: {key: [one dict per run]}."""
    by_run = {}
    for r in records:
        if r["experiment"] != "zero_copy" or r["transport"] != transport:
            continue
        frame = r.get("frame") or KNOWN_FRAMES.get(r["size_bytes"], f"{r['size_bytes']} B")
        if r["variant"].startswith("held="):
            key = ("held", int(r["variant"].split("=", 1)[1]), frame)
            by_run.setdefault((key, r["run"]), {}).update(
                tx_fps=r["value"], tx_mb_s=r["value"] * r["size_bytes"] / 1e6)
        else:
            mode, variant = r["variant"].split(",", 1)
            key = ("saturation", variant, frame, mode)
            name = {"frames_per_s": "fps", "cpu_per_frame": "cpu_us", "peak_rss": "rss_mb"}[r["metric"]]
            by_run.setdefault((key, r["run"]), {})[name] = r["value"]
    results = {}
    for (key, _), values in sorted(by_run.items(), key=lambda kv: kv[0][1]):
        results.setdefault(key, []).append(values)
    return results


def write_tables(path, records):
    """zero_copy.md: per transport, the tables over every run in `records`."""
    parts = []
    for t in ("shm", "tcp"):
        results = results_from_records(records, t)
        if results:  # each key holds one measurement per run
            parts.append("\n".join(tables(results, t, max(len(rs) for rs in results.values()))))
    path.write_text("\n\n".join(parts) + "\n")


EXPERIMENTS = {
    "zero_copy": harness.Experiment(
        "issue 22", "12 cameras into an in-process consumer, copy vs zero-copy: frames/s, CPU/frame, peak memory; "
                    "sender throughput around K held blocks (zero_copy.py)", exp_zero_copy,
        {"zero_copy_seconds": (2.0, 1.0, 0.2)}),
}


if __name__ == "__main__":
    main()
