#!/usr/bin/env python3
"""Soak run: 12 synthetic cameras (25 fps, 640x480x3) into one receiver for a long time.

Every --interval seconds it records, for the receiver and the sender process: resident memory,
threads, open file descriptors and CPU (% of one core over the interval), plus what the receiver
has stored (its /metrics), what the cameras should have produced by then, the backlog between the
two and the gaps and duplicates the receiver counted. Rows go to OUT/soak.csv as they are taken
(a cut-short run keeps its data), a plot to OUT/soak.png, and a summary to OUT/summary.json.

Expected: flat memory, threads and fds after the first minute, zero gaps, and at the end the
receiver's message count equal to the sender's. Not a CI test: `scripts/soak.sh --duration 60` is
a quick check of the script itself.
"""
import argparse
import csv
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_sample(pid):
    """RSS bytes, threads, fds, CPU seconds of one live process (None when it has gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
        threads = int(fields[17])
        rss = int(fields[21]) * PAGE
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, threads, fds, cpu
    except (OSError, ValueError, IndexError):
        return None


def scrape(url, timeout=5):
    """{(name, frozenset(labels)): value} from a Prometheus text page ({} when unreachable)."""
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^([a-z_]+)(?:\{(.*)\})? ([0-9.e+-]+)$', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def total(metrics, name, sender):
    return sum(v for (n, labels), v in metrics.items() if n == name and ("sender", sender) in labels)


class Lines:
    """Collects a process's output lines in the background; wait(pattern) returns the first match."""

    def __init__(self, stream, echo_prefix=None):
        self.lines, self.cond = [], threading.Condition()
        self.echo = echo_prefix
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
            if self.echo:
                print(self.echo + line.rstrip("\n"), file=sys.stderr, flush=True)

    def wait(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    m = re.search(pattern, line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line matching {pattern!r} within {timeout} s: {self.lines[-5:]}")
                self.cond.wait(left)


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [r["t_s"] / 60 for r in rows]
    fig, ax = plt.subplots(5, 1, figsize=(9, 12), sharex=True)
    panels = [
        ("resident memory (MiB)", "rss", 1 / 2**20),
        ("threads", "threads", 1),
        ("open file descriptors", "fds", 1),
        ("CPU (% of one core)", "cpu_pct", 1),
    ]
    for a, (label, key, scale) in zip(ax, panels):
        for side, style in (("recv", "-"), ("send", "--")):
            a.plot(t, [r[f"{side}_{key}"] * scale if r[f"{side}_{key}"] != "" else None for r in rows],
                   style, label=side)
        a.set_ylabel(label)
        a.grid(alpha=0.3)
        a.legend(loc="upper right")
    ax[4].plot(t, [r["lag_frames"] for r in rows], label="frames due but not yet stored")
    ax[4].plot(t, [r["gaps"] for r in rows], label="gaps (lost packets)")
    ax[4].plot(t, [r["duplicates"] for r in rows], label="duplicates")
    ax[4].set_ylabel("frames")
    ax[4].set_xlabel("minutes")
    ax[4].grid(alpha=0.3)
    ax[4].legend(loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600, help="seconds of camera frames (default 3600)")
    ap.add_argument("--interval", type=float, default=10, help="seconds between samples (default 10)")
    ap.add_argument("--out", default="/tmp/slotstream-soak", help="directory for soak.csv, soak.png, summary.json")
    ap.add_argument("--bin", default=os.environ.get("SLOTSTREAM_BIN", str(REPO / "build" / "slotstream")))
    ap.add_argument("--cameras", default="0-11:25:640x480x3", help="send --synthetic spec")
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--protocol", default="status_byte")
    args = ap.parse_args()

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first, last = map(int, args.cameras.split(":")[0].split("-"))
    fps = float(args.cameras.split(":")[1])
    cameras = last - first + 1

    rx = subprocess.Popen([args.bin, "recv", "--listen", "127.0.0.1:0", "--discard", "--transport", args.transport,
                           "--metrics", "127.0.0.1:0", "--exit-after-senders", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rx_out, rx_err = Lines(rx.stdout), Lines(rx.stderr, echo_prefix="recv: ")
    tx = None
    try:
        addr = rx_out.wait(r"listening on (\S+)", 20).group(1)
        murl = rx_err.wait(r"metrics on (http://\S+)", 20).group(1)
        tx = subprocess.Popen([args.bin, "send", "--to", addr, "--name", "soak", "--synthetic", args.cameras,
                               "--duration", str(args.duration), "--transport", args.transport,
                               "--protocol", args.protocol, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tx_out, _ = Lines(tx.stdout), Lines(tx.stderr, echo_prefix="send: ")
        t0 = time.monotonic()
        print(f"soak: {cameras} cameras at {fps:g} fps for {args.duration:g} s; receiver {addr}, "
              f"metrics {murl}; samples every {args.interval:g} s into {out / 'soak.csv'}", file=sys.stderr)
        fields = ["t_s", "expected_frames", "stored_frames", "lag_frames", "gaps", "duplicates",
                  "recv_rss", "recv_threads", "recv_fds", "recv_cpu_pct",
                  "send_rss", "send_threads", "send_fds", "send_cpu_pct"]
        rows, prev_cpu, prev_t = [], {}, t0
        with open(out / "soak.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            k = 0
            while True:
                k += 1
                time.sleep(max(0.0, t0 + k * args.interval - time.monotonic()))
                if tx.poll() is not None:
                    break  # the final counts come from both processes' last words
                now = time.monotonic()
                m = scrape(murl)
                if not m:
                    print("soak: the receiver's /metrics did not answer; sample skipped", file=sys.stderr)
                    continue
                row = {"t_s": round(now - t0, 1)}
                row["expected_frames"] = int(min(now - t0, args.duration) * fps) * cameras
                row["stored_frames"] = int(total(m, "slotstream_messages_total", "soak"))
                row["lag_frames"] = max(0, row["expected_frames"] - row["stored_frames"])
                row["gaps"] = int(total(m, "slotstream_gaps_total", "soak"))
                row["duplicates"] = int(total(m, "slotstream_duplicates_total", "soak"))
                for side, p in (("recv", rx), ("send", tx)):
                    s = proc_sample(p.pid) if p.poll() is None else None
                    if s is None:
                        for key in ("rss", "threads", "fds", "cpu_pct"):
                            row[f"{side}_{key}"] = ""
                        continue
                    rss, threads, fds, cpu = s
                    row[f"{side}_rss"], row[f"{side}_threads"], row[f"{side}_fds"] = rss, threads, fds
                    row[f"{side}_cpu_pct"] = round(100 * (cpu - prev_cpu.get(side, cpu)) / (now - prev_t), 1) \
                        if side in prev_cpu else 0.0
                    prev_cpu[side] = cpu
                prev_t = now
                rows.append(row)
                w.writerow(row)
                f.flush()
                print(f"soak: {row['t_s']:7.0f} s  stored {row['stored_frames']}/{row['expected_frames']}  "
                      f"gaps {row['gaps']}  recv {row['recv_rss'] and row['recv_rss'] >> 20} MiB "
                      f"{row['recv_threads']} thr {row['recv_fds']} fds {row['recv_cpu_pct']}%  "
                      f"send {row['send_rss'] and row['send_rss'] >> 20} MiB {row['send_threads']} thr "
                      f"{row['send_fds']} fds {row['send_cpu_pct']}%", file=sys.stderr, flush=True)
        tx.wait()
        try:
            rx.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rx.send_signal(signal.SIGTERM)
            rx.wait(timeout=30)
        time.sleep(0.2)
        sent = json.loads(tx_out.lines[-1]) if tx.returncode == 0 and tx_out.lines else {}
        final = rx_out.wait(r"sender soak (finished|lost): .*", 5).group(0)
        stored = int(re.search(r"messages=(\d+)|kept (\d+)", final).group(1) or 0)
        warm_up = min(60.0, args.duration / 4)  # first frames, UCX and thread start-up
        steady = [r for r in rows if r["t_s"] >= warm_up and r["recv_rss"] != "" and r["send_rss"] != ""]

        def spread(key):
            vals = [r[key] for r in steady]
            return [min(vals), max(vals)] if vals else None

        summary = {
            "command": " ".join(sys.argv),
            "duration_s": args.duration, "cameras": cameras, "fps": fps, "transport": args.transport,
            "protocol": args.protocol,
            "sender_exit": tx.returncode, "sender_messages": sent.get("messages"),
            # Every wait and synchronisation operation keeps a latency sample (up to 2^20 of each,
            # protocol.h kMaxSamples): the sender's memory grows by 8 bytes per sample until then.
            "sender_waits": sent.get("waits"), "sender_sync_operations": sent.get("sync_operations"),
            "receiver_final_line": final, "receiver_messages": stored,
            "frames_scheduled": int(args.duration * fps) * cameras,
            "lost_frames": (int(args.duration * fps) * cameras - stored),
            "gaps": rows[-1]["gaps"] if rows else None,
            "duplicates": rows[-1]["duplicates"] if rows else None,
            "max_lag_frames": max((r["lag_frames"] for r in rows), default=None),
            "after_warm_up": {k: spread(k) for k in
                                   ("recv_rss", "recv_threads", "recv_fds", "send_rss", "send_threads", "send_fds")},
            "mean_cpu_pct": {side: round(sum(r[f"{side}_cpu_pct"] for r in steady) / len(steady), 1) if steady else None
                             for side in ("recv", "send")},
            "samples": len(rows),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot(rows, out / "soak.png",
             f"soak: {cameras} x {fps:g} fps 640x480x3, {args.protocol} over {args.transport}, "
             f"{args.duration / 60:.4g} min")
        print(json.dumps(summary, indent=2))
        ok = tx.returncode == 0 and summary["lost_frames"] == 0 and summary["gaps"] == 0
        return 0 if ok else 1
    finally:
        for p in (tx, rx):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    sys.exit(main())
