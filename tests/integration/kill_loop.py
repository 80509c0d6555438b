"""Sender deaths against one live receiver (docs/hardening.md, "Kill loop").

For each protocol: a live sender streams for the whole batch while `kills` other senders are started
and SIGKILLed at a random moment of their first `max_delay` seconds (half of them within the first
80 ms: connection set-up, where UCX 1.13 aborted the receiver). After every kill the receiver must
still run; at the end of the batch the live sender must have finished with everything stored
(exit 0, and the receiver's `finished` line for it).

Used by tests/integration/test_kill_loop.py (a few kills per protocol, in CI) and by
`bash scripts/kill_soak.sh` (200 per protocol and transport, recorded in docs/hardening.md):
    python3 tests/integration/kill_loop.py --kills 200 [--transport shm|tcp ...] [--protocol P ...]
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

KILL_DEVICES = 4
EARLY = 0.08  # seconds: half of the kills land in a sender's first 80 ms


class Receiver:
    def __init__(self, binary, transport):
        self.proc = subprocess.Popen([binary, "recv", "--listen", "127.0.0.1:0", "--discard", "--transport", transport],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"receiver did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.addr = m.group(1)
        self.lines, self.errors = [], []
        self._threads = [threading.Thread(target=self._collect, args=(self.proc.stdout, self.lines), daemon=True),
                         threading.Thread(target=self._collect, args=(self.proc.stderr, self.errors), daemon=True)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _collect(pipe, into):
        for line in pipe:
            into.append(line.rstrip("\n"))

    def alive(self):
        return self.proc.poll() is None

    def finished_line(self, name, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith(f"sender {name} "):
                    return line
            time.sleep(0.05)
        return None

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(5)


def send_argv(binary, addr, name, transport, protocol, devices, duration):
    return [binary, "send", "--to", addr, "--name", name, "--transport", transport, "--protocol", protocol,
            "--blocks", "8", "--block-size", "65536", "--synthetic", f"0-{devices - 1}:25:160x120x3",
            "--duration", str(duration)]


def batch(binary, rx, transport, protocol, kills, max_delay, rng):
    """One protocol's batch; returns (deaths survived, problems)."""
    problems = []
    tag = re.sub(r"[^A-Za-z0-9._-]", "-", protocol)  # a sender name: sliding_window:ack=thread -> ...-ack-thread
    live_seconds = max(2.0, kills * (max_delay / 2 + 0.15) + 1.0)
    live = subprocess.Popen(send_argv(binary, rx.addr, f"live-{tag}", transport, protocol, 2, live_seconds),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    survived = 0
    for k in range(kills):
        delay = rng.uniform(0, EARLY if k % 2 == 0 else max_delay)
        tx = subprocess.Popen(send_argv(binary, rx.addr, f"kill-{tag}-{k}", transport, protocol, KILL_DEVICES, 30),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        tx.kill()
        tx.wait()
        time.sleep(0.02)
        if not rx.alive():
            problems.append(f"{protocol}/{transport}: the receiver died (exit {rx.proc.returncode}) after "
                            f"kill {k} at {delay * 1000:.0f} ms:\n" + "\n".join(rx.errors[-40:]))
            break
        survived += 1
    try:
        err = live.communicate(timeout=live_seconds + 60)[1]
    except subprocess.TimeoutExpired:
        live.kill()
        err = live.communicate()[1]
    if live.returncode != 0:
        problems.append(f"{protocol}/{transport}: the live sender failed (exit {live.returncode}): {err.strip()[-500:]}")
    elif rx.alive():
        line = rx.finished_line(f"live-{tag}")
        if not line or " finished: " not in line:
            problems.append(f"{protocol}/{transport}: no `finished` report for the live sender: {line!r}")
    return survived, problems


def run(binary, transports, protocols, kills, max_delay=0.3, seed=None):
    """{"deaths": {transport/protocol: survived}, "problems": [...], "seed": seed}."""
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    result = {"seed": seed, "kills": kills, "deaths": {}, "problems": []}
    for transport in transports:
        rx = Receiver(binary, transport)
        try:
            for protocol in protocols:
                if not rx.alive():
                    rx = Receiver(binary, transport)
                survived, problems = batch(binary, rx, transport, protocol, kills, max_delay, rng)
                result["deaths"][f"{transport}/{protocol}"] = survived
                result["problems"] += problems
        finally:
            rx.stop()
    return result


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("SLOTSTREAM_BIN", os.path.join(repo, "build", "slotstream")))
    ap.add_argument("--kills", type=int, default=200, help="sender deaths per protocol and transport")
    ap.add_argument("--transport", action="append", choices=["shm", "tcp"])
    ap.add_argument("--protocol", action="append")
    ap.add_argument("--max-delay", type=float, default=0.3)
    ap.add_argument("--seed", type=int)
    args = ap.parse_args()
    protocols = args.protocol or [p["name"] for p in json.loads(
        subprocess.run([args.bin, "protocols", "--json"], capture_output=True, text=True, check=True).stdout)
        if not p["reference"] and p["engine"] == "ucx"]
    started = time.monotonic()
    result = run(args.bin, args.transport or ["shm", "tcp"], protocols, args.kills, args.max_delay, args.seed)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
