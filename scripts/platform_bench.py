#!/usr/bin/env python3
"""Measures the platform (docs/platform.md): scheduling latency (a `send --platform` from its request
to connected, as the sender reports it) and recovery time after a receiver's death (from the kill to
the sender connected to its next receiver, every unconfirmed message sent again), on a 3-member etcd
cluster on loopback with 3 receivers. Prints the median of RUNS [min-max] and one JSON line.

  python3 scripts/platform_bench.py [--runs 3] [--bin build/slotstream]
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "integration"))
from platform_support import EtcdCluster  # noqa: E402  (the tests' cluster, started the same way)


def lines_of(proc, sink):
    for raw in iter(proc.stderr.readline, b""):
        sink.append((time.monotonic(), raw.decode(errors="replace").rstrip()))


def start_receiver(binary, url, out, i):
    p = subprocess.Popen([binary, "recv", "--listen", "127.0.0.1:0", "--out", str(out), "--platform", url,
                          "--platform-name", f"r{i}", "--platform-ttl", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = []
    threading.Thread(target=lines_of, args=(p, log), daemon=True).start()
    while not any("registered on the platform" in line for _, line in log):
        if p.poll() is not None:
            raise SystemExit(f"receiver r{i} exited: {log}")
        time.sleep(0.02)
    return p


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bin", default=str(pathlib.Path(__file__).resolve().parents[1] / "build" / "slotstream"))
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="platform-bench-"))
    cluster = EtcdCluster(tmp / "etcd", 3).start()
    receivers = []
    schedule, recovery = [], []
    try:
        receivers = [start_receiver(a.bin, cluster.url, tmp / "out", i) for i in range(3)]
        for run in range(a.runs):
            r = subprocess.run([a.bin, "send", "--platform", cluster.url, "--name", f"lat{run}", "--synthetic",
                                "0:25:64x64x3", "--duration", "0.2", "--json"], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stderr
            schedule.append(json.loads(r.stdout.splitlines()[-1])["schedule_ms"][0])
        for run in range(a.runs):
            p = subprocess.Popen([a.bin, "send", "--platform", cluster.url, "--name", f"rec{run}", "--platform-ttl",
                                  "2", "--synthetic", "0-3:25:640x480x3", "--duration", "4"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            log = []
            threading.Thread(target=lines_of, args=(p, log), daemon=True).start()
            while not any("using receiver" in line for _, line in log):
                time.sleep(0.01)
            victim = int(re.search(r"using receiver r(\d)", next(l for _, l in log if "using receiver" in l)).group(1))
            time.sleep(1.5)
            killed = time.monotonic()
            receivers[victim].kill()
            receivers[victim].wait()
            while sum("using receiver" in line for _, line in log) < 2:
                if p.poll() is not None:
                    raise SystemExit(f"sender exited before recovering: {log}")
                time.sleep(0.005)
            connected = [t for t, line in log if "using receiver" in line][1]
            recovery.append((connected - killed) * 1000)
            assert p.wait(60) == 0, log
            receivers[victim] = start_receiver(a.bin, cluster.url, tmp / "out", victim) if _wait_gone(
                cluster, f"r{victim}") else None
    finally:
        for r in receivers:
            if r and r.poll() is None:
                r.terminate()
                r.wait()
        cluster.stop()
    result = {"schedule_ms": summary(schedule), "recovery_ms": summary(recovery)}
    for k, v in result.items():
        print(f"{k}: median {v['median']:.1f} [{v['min']:.1f}-{v['max']:.1f}] over {len(v['runs'])} runs")
    print(json.dumps(result))


def _wait_gone(cluster, name, timeout=10):
    """The killed receiver's record expires with its lease (2 s) before one of that name registers again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name not in cluster.receivers():
            return True
        time.sleep(0.1)
    return False


if __name__ == "__main__":
    main()
