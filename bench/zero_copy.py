#!/usr/bin/env python3
"""Zero-copy receive against the copy path (issue 22), over one transport: 12 synthetic cameras sent as fast as
the sender can make frames into build/examples/zero_copy_recv, whose consumer thread reads every byte (a word sum)
of each message — a MessageView in place (--mode view) or a copy made by a MessageSink (--mode copy). Modes
alternate within each run so that both see the same machine. Prints one line per run and a min/median/max
summary: receiver frames/s and receiver CPU per frame (the whole receiver process: session thread + consumer).

    python3 bench/zero_copy.py [--transport shm] [--runs 3] [--frames 200] [--sizes 256x256x1,512x512x1,640x480x3]
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("SLOTSTREAM_BIN", str(REPO / "build" / "slotstream"))
RECV = os.environ.get("SLOTSTREAM_ZERO_COPY_RECV", str(REPO / "build" / "examples" / "zero_copy_recv"))


FPS = 100000  # far above what the sender can make: it sends back to back


def one(mode, transport, size, frames):
    rx = subprocess.Popen([RECV, "--transport", transport, "--mode", mode, "--verify", "off"], stdout=subprocess.PIPE,
                          text=True)
    addr = re.fullmatch(r"listening on (\S+)\n", rx.stdout.readline()).group(1)
    tx = subprocess.run([BIN, "send", "--to", addr, "--name", "cams", "--transport", transport, "--synthetic",
                         f"0-11:{FPS}:{size}", "--duration", str(frames / FPS), "--json"], capture_output=True, text=True,
                        timeout=120)
    got = json.loads(rx.stdout.readline())
    rx.wait(30)
    sent = json.loads(tx.stdout)["messages"]
    assert got["messages"] == sent, (got, sent)
    return {"fps": got["messages"] / got["seconds"], "cpu_us": 1e6 * got["cpu_s"] / got["messages"],
            "in_place": got["in_place"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--frames", type=int, default=200, help="frames per camera per run (default 200)")
    ap.add_argument("--sizes", default="256x256x1,512x512x1,640x480x3")
    a = ap.parse_args()
    results = {}
    for run in range(a.runs):
        for size in a.sizes.split(","):
            for mode in ("copy", "view") if run % 2 == 0 else ("view", "copy"):
                r = one(mode, a.transport, size, a.frames)
                results.setdefault((size, mode), []).append(r)
                print(f"run {run + 1}/{a.runs} {size:12} {mode}: {r['fps']:8.0f} frames/s, "
                      f"{r['cpu_us']:7.1f} µs receiver CPU per frame (in place: {r['in_place']})", flush=True)
                time.sleep(0.2)
    print(f"\n{a.transport}, {a.runs} runs, median [min-max]")
    print("| frame | copy frames/s | zero-copy frames/s | ratio | copy CPU µs/frame | zero-copy CPU µs/frame | ratio |")
    print("|---|---|---|---|---|---|---|")

    def fmt(v):
        return f"{statistics.median(v):.0f} [{min(v):.0f}–{max(v):.0f}]"

    def ratio(a_, b_):
        r = [x / y for x, y in zip(a_, b_)]
        return f"{statistics.median(r):.2f}x [{min(r):.2f}–{max(r):.2f}]"

    for size in a.sizes.split(","):
        c, v = results[(size, "copy")], results[(size, "view")]
        cf, vf = [r["fps"] for r in c], [r["fps"] for r in v]
        cc, vc = [r["cpu_us"] for r in c], [r["cpu_us"] for r in v]
        print(f"| {size} | {fmt(cf)} | {fmt(vf)} | {ratio(vf, cf)} | {fmt(cc)} | {fmt(vc)} | {ratio(vc, cc)} |")


if __name__ == "__main__":
    main()
