"""What one `slotstream edge` move costs while other devices stay offloaded (docs/benchmarks.md, "The
platform"): a 1-member etcd, one receiver, an edge with DEVICES synthetic cameras; the load file first
offloads all but device 0 (OFFLOADED devices), then moves device 0 out and back MOVES times. Prints the
edge's --json numbers that matter: each toggle move's duration (move_ms), connections made, and how many
messages of the devices that stayed offloaded were held during the moves.

    python3 bench/edge_moves.py [--bin build/slotstream] [--moves 6] [--devices 5]
"""
import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
from conftest import Proc, Receiver  # noqa: E402
from platform_support import start_cluster  # noqa: E402


def run(binary, devices, moves, fps, frame, duration):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        cluster = start_cluster(tmp / "etcd", 1)
        procs = []
        try:
            rx = Receiver(["--out", tmp / "rx", "--platform", cluster.url, "--platform-name", "r0",
                           "--capacity-cpu", 64], binary=binary)
            procs.append(rx)
            rx.stderr.wait_for(r"registered on the platform as r0 ", 10)
            load = tmp / "load"
            load.write_text("0")
            edge = Proc([binary, "edge", "--platform", cluster.url, "--name", "edge-m", "--out", tmp / "edge",
                         "--synthetic", f"0-{devices - 1}:{fps}:{frame}", "--duration", duration,
                         "--load", f"file:{load}", "--offload-above", 70, "--take-back-below", 30,
                         "--settle", 0.2, "--need-cpu", 0.5, "--json"])
            procs.append(edge)
            at = 0
            load.write_text("90")
            for d in range(devices - 1, 0, -1):
                at, _ = edge.stderr.wait_for(rf"offloading device {d}\b", 30, at)
            load.write_text("50")
            time.sleep(1)
            for _ in range(moves):
                load.write_text("90")
                at, _ = edge.stderr.wait_for(r"offloading device 0\b", 30, at)
                load.write_text("50")
                time.sleep(0.6)
                load.write_text("10")
                at, _ = edge.stderr.wait_for(r"taking device 0 back", 30, at)
                load.write_text("50")
                time.sleep(0.6)
            rc = edge.wait(duration + 60)  # the frames run out at --duration
            assert rc == 0, edge.stderr.text
            s = json.loads(edge.stdout.lines[-1])
            toggles = s["move_ms"][devices - 1:]
            # Messages the devices that stay offloaded kept in the edge during moves (their own offload too),
            # and how many moves held them (their own offload is one; a binary from before `holds` was counted
            # leaves it out).
            held = {d: c["held"] for d, c in s["devices"].items() if d != "0"}
            holds = {d: c["holds"] for d, c in s["devices"].items() if d != "0" and "holds" in c}
            return {"move_ms": toggles, "connections": s["connections"], "held_by_others": held,
                    "holds_of_others": holds, "late_frames": s["late_frames"]}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate(10)
            cluster.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", action="append", default=None, help="slotstream binaries to alternate (repeatable)")
    ap.add_argument("--moves", type=int, default=6, help="times device 0 goes out and comes back")
    ap.add_argument("--devices", type=int, default=5)
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--frame", default="320x240x3")
    ap.add_argument("--duration", type=int, default=45, help="seconds of frames: longer than all the moves take")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the binaries")
    a = ap.parse_args()
    for r in range(a.rounds):
        for b in a.bin or ["build/slotstream"]:
            res = run(b, a.devices, a.moves, a.fps, a.frame, a.duration)
            ms = res["move_ms"]
            print(json.dumps({"bin": b, "round": r, "moves": len(ms), "min_ms": round(min(ms), 1),
                              "median_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1),
                              **res}), flush=True)


if __name__ == "__main__":
    main()
