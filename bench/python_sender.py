#!/usr/bin/env python3
"""What the Python binding costs a camera sender: examples/python/camera_sender.py against its C++
twin examples/camera_loop.cc (the same loop: one thread, every camera's 640x480x3 frame in turn,
each frame an array in memory copied once into a send block), into one `slotstream recv --discard`.

    flock /work/.bench.lock python3 bench/python_sender.py [--python build/python-venv/bin/python]

Per transport, C++ and Python alternating, the median of the rounds reported:
  unpaced   --fps 0: frames/s as fast as the receiver takes them (the binding's overhead shows)
  25 fps    12 cameras at 25 fps: both keep up; sender CPU per frame is what differs
  receive   the C++ loop unpaced into a Python Receiver that iterates every frame (one copy out of
            the block each) instead of `recv --discard`: frames/s the receiving side sustains
Prints a Markdown table and writes the raw runs to --out (JSON): commit those records before quoting
a figure in docs/benchmarks.md.
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


# A Python receiver that takes every frame and drops it (the counterpart of `recv --discard`).
PY_RECEIVER = """
import sys, slotstream
with slotstream.Receiver("127.0.0.1:0", transport=sys.argv[1]) as rx:
    print("listening on", rx.address, flush=True)
    for sender, device, seq, data in rx:
        pass
"""


def start_receiver(binary, transport, python=None):
    argv = ([python, "-c", PY_RECEIVER, transport] if python else
            [binary, "recv", "--listen", "127.0.0.1:0", "--discard", "--transport", transport])
    rx = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = rx.stdout.readline()
    m = re.fullmatch(r"listening on (\S+)\n", line)
    if not m:
        rx.kill()
        raise SystemExit(f"receiver did not start: {line!r} {rx.stderr.read()}")
    return rx, m.group(1)


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "build" / "slotstream"))
    ap.add_argument("--camera-loop", default=str(REPO / "build" / "examples" / "camera_loop"))
    ap.add_argument("--python", default=str(REPO / "build" / "python-venv" / "bin" / "python"),
                    help="an interpreter with the slotstream package (ctest -R python.install makes this one)")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default="/tmp/python_sender.json")
    a = ap.parse_args()

    cameras = 12
    runs = []
    for transport in a.transports.split(","):
        for mode, fps in (("unpaced", 0), ("25 fps", 25), ("receive", 0)):
            for r in range(a.rounds):
                for lang in ("C++", "Python"):
                    py_rx = a.python if mode == "receive" and lang == "Python" else None
                    rx, addr = start_receiver(a.bin, transport, py_rx)
                    try:
                        if lang == "C++" or mode == "receive":
                            res = run([a.camera_loop, addr, transport, str(cameras), str(fps), str(a.seconds)])
                        else:
                            res = run([a.python, str(REPO / "examples/python/camera_sender.py"), "--to", addr,
                                       "--name", "python", "--transport", transport, "--cameras", str(cameras),
                                       "--fps", str(fps), "--seconds", str(a.seconds)])
                    finally:
                        rx.terminate()
                        rx.wait(10)
                    res.update(transport=transport, mode=mode, lang=lang, round=r)
                    res["cpu_us_per_frame"] = res["cpu_seconds"] / res["frames"] * 1e6
                    runs.append(res)
                    print(f"{transport} {mode:8} round {r} {lang:6}: {res['frames_per_s']:8.1f} frames/s, "
                          f"{res['cpu_us_per_frame']:6.1f} us CPU/frame", flush=True)
                    time.sleep(0.5)
    pathlib.Path(a.out).write_text(json.dumps(runs, indent=1))

    print("\n(receive: the language is the receiver's; CPU is the C++ sender's)")
    print("\n| transport | loop | C++ frames/s | Python frames/s | ratio | C++ CPU/frame | Python CPU/frame |")
    print("|---|---|---|---|---|---|---|")
    for transport in a.transports.split(","):
        for mode in ("unpaced", "25 fps", "receive"):
            med = {lang: {k: statistics.median(x[k] for x in runs if x["transport"] == transport and
                                               x["mode"] == mode and x["lang"] == lang)
                          for k in ("frames_per_s", "cpu_us_per_frame")} for lang in ("C++", "Python")}
            c, p = med["C++"], med["Python"]
            print(f"| {transport} | {mode} | {c['frames_per_s']:.0f} | {p['frames_per_s']:.0f} | "
                  f"**{p['frames_per_s'] / c['frames_per_s']:.2f}x** | {c['cpu_us_per_frame']:.0f} us | "
                  f"{p['cpu_us_per_frame']:.0f} us |")
    print(f"\nraw runs: {a.out}")


if __name__ == "__main__":
    sys.exit(main())
