"""Fixtures for integration tests: real `slotstream` processes over real UCX transports."""
import hashlib
import os
import pathlib
import select
import signal
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLOTSTREAM_BIN", str(REPO / "build" / "slotstream"))
TRANSPORTS = ["shm", "tcp"]


def pytest_configure(config):
    if not os.access(BIN, os.X_OK):
        raise pytest.UsageError(f"slotstream binary not found at {BIN}: build first (bash scripts/build.sh)")


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def read_line(proc, timeout=10.0):
    """One line of a process's stdout, or '' on timeout/EOF."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            continue
        c = os.read(fd, 1)
        if not c:
            break
        if c == b"\n":
            return buf.decode()
        buf += c
    return buf.decode()


class Receiver:
    def __init__(self, args):
        self.proc = subprocess.Popen([BIN, "recv", "--listen", "127.0.0.1:0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = read_line(self.proc, 15)
        assert line.startswith("listening on "), f"receiver did not start: {line!r}"
        self.addr = line.split()[-1]

    def lines(self, n, timeout=20.0):
        """The next n stdout lines (session reports)."""
        return [read_line(self.proc, timeout) for _ in range(n)]

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.decode(), err.decode()

    def kill(self):
        """Stops the receiver (gracefully first, so that it stops its workers too)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)  # stopping a dozen worker containers takes a few seconds
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def receiver():
    started = []

    def start(*args):
        r = Receiver([str(a) for a in args])
        started.append(r)
        return r

    yield start
    for r in started:
        r.kill()


def send(addr, *args, timeout=60, check=True):
    """Runs `slotstream send` to completion; returns the CompletedProcess."""
    p = subprocess.run([BIN, "send", "--to", addr, *[str(a) for a in args]], capture_output=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"send failed ({p.returncode}): {p.stderr.decode()}"
    return p


def seq_name(i):
    return f"{i:010d}.bin"
