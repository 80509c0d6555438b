"""Fixtures and helpers for integration tests: real `slotstream` processes over real UCX transports.

Helpers (import them with `from conftest import ...`):
  BIN, REPO, TRANSPORTS, HEADER     where the binary is; the transports every data test runs on
  SEND_SUMMARY_KEYS                 the keys of every `send --json` summary
  PROTOCOLS                         every protocol of this build for data (`slotstream protocols --json`)
  OTHER_PACKING                     each of them with the packing it does not have by default (NAME:pack=on|off)
  start_receiver (fixture)          start_receiver(out, transport=None, *extra) -> Receiver (killed at test end)
  receiver (fixture)                receiver(*args) -> Receiver, the raw-argument form
  spawn (fixture)                   spawn(argv) -> Proc, a background process killed at test end
  run_send(addr, *args, ...)        `slotstream send` to completion (text CompletedProcess)
  send(addr, *args, ...)            the same with bytes output (kept for older tests)
  wait_for_line(reader, pattern)    next line on a LineReader matching a regex
  metrics_address(rx)               HOST:PORT of a receiver's --metrics 127.0.0.1:0
  sha256(path), seq_name(i), tree(dir), make_files(dir, sizes, tag)
"""
import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLOTSTREAM_BIN", str(REPO / "build" / "slotstream"))
TRANSPORTS = ["shm", "tcp"]
HEADER = 16  # bytes of block header per block (docs: block_size - 16 is the largest one-block payload)
START_TIMEOUT = 10.0  # seconds for `listening on HOST:PORT`
# Every `send --json` summary has these keys, whichever transport carried it, --platform too (docs/cli-contract.md).
SEND_SUMMARY_KEYS = {"ok", "exit_code", "error", "code", "interrupted", "messages", "bytes", "seconds", "mb_per_s",
                     "devices", "cpu_seconds", "transport", "transport_reason", "protocol", "blocks", "block_size",
                     "late_frames"}


def _registry():
    """The block protocols the binary registers (UCX's engine; benchmark references excluded); [] without a
    binary. The datagram transport's protocols (engine "dgram") have tests of their own (test_dgram_*.py)."""
    try:
        out = subprocess.run([BIN, "protocols", "--json"], capture_output=True, text=True, timeout=20).stdout
        return [p for p in json.loads(out) if not p["reference"] and p["engine"] == "ucx"]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


PROTOCOLS = [p["name"] for p in _registry()]
# Each protocol with the packing it does not have by default (issue 21: pack=on|off is the stream
# layer's, so every protocol carries both): status_byte:pack=off, sliding_window:pack=on, ...
OTHER_PACKING = [f"{p['name']}:pack={'off' if p.get('packs') else 'on'}" for p in _registry()]


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): fail the test if it runs longer (default 120 s)")
    if not os.access(BIN, os.X_OK) and not config.option.collectonly:
        raise pytest.UsageError(
            f"slotstream binary not found or not executable at {BIN}: build it first (bash scripts/build.sh) "
            f"or point SLOTSTREAM_BIN at it")


# ------------------------------------------------------------------ a watchdog: no test may hang

class TestDeadline(Exception):
    pass


@pytest.fixture(autouse=True)
def _deadline(request):
    """Fails a test that runs longer than its `deadline` marker (120 s unless given); needs the main thread."""
    marker = request.node.get_closest_marker("deadline")
    seconds = marker.args[0] if marker else 120
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TestDeadline(f"test exceeded its {seconds} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------ small helpers

def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def seq_name(i):
    return f"{i:010d}.bin"


def tree(root):
    """Every file below root as a sorted list of paths relative to root ([] if root is missing)."""
    root = pathlib.Path(root)
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def hidden(root):
    """Every file or directory below root whose name starts with '.' (temp files)."""
    root = pathlib.Path(root)
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


def make_files(directory, sizes, tag):
    """Random files of the given sizes: directory/<tag>-<i>.bin."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, size in enumerate(sizes):
        p = directory / f"{tag}-{i}.bin"
        p.write_bytes(os.urandom(size))
        paths.append(p)
    return paths


def wait_until(pred, timeout, what, interval=0.05, detail=None):
    """Polls pred until it holds; a timeout fails with `what`, and with detail() (say, the peers' stderr) if given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"\n{detail()}" if detail else ""))


def all_threads_stopped(pid):
    """True when every thread of `pid` is in the stopped state (T) — or gone."""
    try:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return True
    return all(s in ("T", "t", "Z", "X") for s in states)


# Workers (docs/workers.md): the example that checksums every message, and one slower than any sender
# (50 ms a message); done_of reads how far a worker got (-1: not started).
CHECKSUM = f"sh {REPO / 'workers' / 'checksum.sh'}"
SLOW_WORKER = """
seq=$(cat "$SLOTSTREAM_WORKER_DIR/done" 2>/dev/null || echo -1)
while :; do
  n=$(printf %010d $((seq+1)))
  [ -f "$SLOTSTREAM_DEVICE_DIR/$n.bin" ] || { sleep 0.02; continue; }
  sleep 0.05
  seq=$((seq+1)); echo $seq > "$SLOTSTREAM_WORKER_DIR/done.tmp"; mv "$SLOTSTREAM_WORKER_DIR/done.tmp" "$SLOTSTREAM_WORKER_DIR/done"
done
"""


def done_of(worker_dir):
    try:
        return int((worker_dir / "done").read_text())
    except (FileNotFoundError, ValueError):
        return -1


FINISHED_RE = re.compile(r"^sender (?P<name>\S*) finished: messages=(?P<messages>\d+) bytes=(?P<bytes>\d+) "
                         r"gaps=(?P<gaps>\d+) duplicates=(?P<duplicates>\d+) "
                         r"unknown_device=(?P<unknown_device>\d+) out_of_window=(?P<out_of_window>\d+)"
                         r"(?P<extra>( \S+=\S*)*)$")  # later fields (e.g. transport=, seconds=) are tolerated
LOST_RE = re.compile(r"^sender (?P<name>\S*) lost: kept (?P<kept>\d+) complete messages, "
                     r"discarded (?P<discarded>\d+) partial\b")  # a reason/counters may follow


def parse_finished(line):
    m = FINISHED_RE.match(line)
    assert m, f"not a `sender NAME finished: ...` line as in docs/cli-contract.md: {line!r}"
    d = m.groupdict()
    d.pop("extra")
    return {k: (v if k == "name" else int(v)) for k, v in d.items()}


# ------------------------------------------------------------------ reading a process's output

class LineReader:
    """Collects the lines of one pipe in a background thread (so a chatty process never blocks on a full pipe)."""

    def __init__(self, pipe, name):
        self.name = name
        self._lines = []
        self._cond = threading.Condition()
        self.closed = False
        self.cursor = 0  # for next_line(): lines before it were handed out
        self._thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self._thread.start()

    def _run(self, pipe):
        try:
            for raw in iter(pipe.readline, b""):
                with self._cond:
                    self._lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
                    self._cond.notify_all()
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()

    @property
    def lines(self):
        with self._cond:
            return list(self._lines)

    @property
    def text(self):
        return "\n".join(self.lines)

    def wait_for(self, pattern, timeout, start=0):
        """(index, line) of the first line at or after `start` matching regex `pattern`; AssertionError on timeout/EOF."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self._lines):
                    if rx.search(self._lines[i]):
                        return i, self._lines[i]
                    i += 1
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    why = "EOF" if self.closed else f"{timeout} s"
                    raise AssertionError(f"no line matching {pattern!r} on {self.name} ({why}); got:\n"
                                         + "\n".join(self._lines[start:]))
                self._cond.wait(min(left, 0.2))

    def next_line(self, timeout=20.0):
        """The next line not handed out before, or '' on timeout/EOF."""
        try:
            i, line = self.wait_for("", timeout, self.cursor)
        except AssertionError:
            return ""
        self.cursor = i + 1
        return line

    def join(self, timeout=5.0):
        self._thread.join(timeout)


def metrics_address(rx, timeout=10.0):
    """HOST:PORT of a receiver started with `--metrics 127.0.0.1:0` (from its start-up line on stderr). A port picked
    in advance can be taken by another process before the receiver binds it."""
    _, line = rx.stderr.wait_for(r"metrics on http://", timeout)
    return re.search(r"http://([^/\s]+)/metrics", line).group(1)


def wait_for_line(reader, pattern, timeout=10.0, start=0):
    """The first line of `reader` (a LineReader) matching regex `pattern`."""
    return reader.wait_for(pattern, timeout, start)[1]


class Proc:
    """A background process whose stdout and stderr are collected line by line."""

    def __init__(self, argv, **kw):
        self.argv = [str(a) for a in argv]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, **kw)
        self.stdout = LineReader(self.proc.stdout, f"stdout of {self.argv[1] if len(self.argv) > 1 else argv[0]}")
        self.stderr = LineReader(self.proc.stderr, f"stderr of {self.argv[1] if len(self.argv) > 1 else argv[0]}")

    @property
    def pid(self):
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout):
        rc = self.proc.wait(timeout=timeout)
        self.stdout.join()
        self.stderr.join()
        return rc

    def signal(self, sig):
        """Sends `sig`; SIGSTOP returns once every thread of the process is stopped (kill() only queues the
        signal: a thread running on the other core may still finish a write after it returns)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGSTOP:
                wait_until(lambda: self.proc.poll() is not None or all_threads_stopped(self.proc.pid), 5,
                           f"process {self.proc.pid} to stop")

    def sigkill(self):
        self.signal(signal.SIGKILL)

    def terminate(self, grace=10.0):
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.stdout.join()
        self.stderr.join()
        return self.proc.returncode


class Receiver(Proc):
    """`slotstream recv --listen 127.0.0.1:0 ARGS`, started and ready (its `listening on` line read)."""

    def __init__(self, args, start_timeout=START_TIMEOUT, listen="127.0.0.1:0", binary=None):
        super().__init__([binary or BIN, "recv", "--listen", listen, *args])
        try:
            _, line = self.stdout.wait_for(r"", start_timeout)
        except AssertionError:
            self.terminate(2)
            raise AssertionError(f"receiver did not print `listening on HOST:PORT` within {start_timeout} s "
                                 f"(exit {self.proc.returncode}); stderr:\n{self.stderr.text}") from None
        self.stdout.cursor = 1
        m = re.fullmatch(r"listening on (\S+):(\d+)", line)
        if not m:
            self.terminate(2)
            raise AssertionError(f"first receiver line is not `listening on HOST:PORT`: {line!r}")
        self.host, self.port = m.group(1), int(m.group(2))
        assert self.port != 0, "receiver reported port 0 instead of the real port"
        self.addr = f"{self.host}:{self.port}"

    # Older tests' interface.
    def lines(self, n, timeout=20.0):
        """The next n stdout lines (session reports) not read before."""
        return [self.stdout.next_line(timeout) for _ in range(n)]

    def stop(self, timeout=10):
        """SIGTERM and wait; returns (exit code, all stdout, all stderr)."""
        rc = self.terminate(timeout)
        return rc, self.stdout.text, self.stderr.text

    def kill(self):
        """Stops the receiver (gracefully first, so that it stops its workers too)."""
        self.terminate(30)  # stopping a dozen worker containers takes a few seconds


@pytest.fixture
def receiver():
    """receiver(*args, listen="127.0.0.1:0") -> Receiver; every receiver is stopped at test end."""
    started = []

    def start(*args, listen="127.0.0.1:0"):
        r = Receiver([str(a) for a in args], listen=listen)
        started.append(r)
        return r

    yield start
    for r in started:
        r.kill()


@pytest.fixture
def start_receiver(receiver):
    """start_receiver(out, transport=None, *extra) -> Receiver; stopped at test end."""

    def start(out, transport=None, *extra):
        args = ["--out", out]
        if transport:
            args += ["--transport", transport]
        return receiver(*args, *extra)

    return start


@pytest.fixture
def spawn():
    """spawn(argv, env=None) -> Proc running in the background; killed at test end."""
    procs = []

    def start(argv, env=None):
        p = Proc(argv, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.sigkill()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def send_argv(addr, *args):
    return [BIN, "send", "--to", addr, *[str(a) for a in args]]


def run_send(addr, *args, timeout=60, check=True):
    """Runs `slotstream send --to addr ARGS` to completion; returns the CompletedProcess (text)."""
    argv = send_argv(addr, *args)
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"send did not finish within {timeout} s: {' '.join(argv)}\n"
                             f"stderr: {e.stderr!r}") from None
    if check:
        assert p.returncode == 0, f"send failed (exit {p.returncode}): {' '.join(argv)}\n{p.stderr}"
    return p


def run_send_json(addr, *args, timeout=60):
    """Runs `slotstream send --json ARGS` to completion and returns its summary (a dict) with "sent": {device:
    messages}. A synthetic sender's `--duration` is wall-clock time and it skips the frames it could not produce in
    time (late_frames), so under load it sends fewer than rate x duration: a test compares what arrived with what
    the sender says it sent, and checks that sent + late is every frame slot."""
    p = run_send(addr, *args, "--json", timeout=timeout)
    summary = json.loads(p.stdout)
    summary["sent"] = {int(d): n for d, n in summary["devices"].items()}
    return summary


def synthetic_slots(summary, devices, fps, seconds):
    """Asserts the sender accounted for every frame slot of its synthetic cameras (sent or counted late) and sent
    at least one message per device; returns the per-device counts sent."""
    slots = int(seconds * fps)
    sent = [summary["sent"].get(d, 0) for d in devices]
    assert summary["messages"] + summary["late_frames"] == slots * len(devices), summary
    assert all(n > 0 for n in sent), f"a device sent nothing: {summary}"
    return dict(zip(devices, sent))


def send(addr, *args, timeout=60, check=True):
    """Runs `slotstream send` to completion; returns the CompletedProcess (bytes)."""
    p = subprocess.run(send_argv(addr, *args), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check:
        assert p.returncode == 0, f"send failed ({p.returncode}): {p.stderr.decode()}"
    return p


def run_verify(directory, timeout=60):
    return subprocess.run([BIN, "verify", str(directory)], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_device(out, sender, device, sources):
    """out/sender/device-D holds exactly SEQ 0..n-1, each equal to the sources in order."""
    d = pathlib.Path(out) / sender / f"device-{device}"
    names = sorted(os.listdir(d))
    assert names == [seq_name(i) for i in range(len(sources))], f"unexpected files in {d}: {names}"
    for i, src in enumerate(sources):
        got = d / seq_name(i)
        assert got.stat().st_size == pathlib.Path(src).stat().st_size, f"{got} has the wrong size (source {src})"
        assert sha256(got) == sha256(src), f"{got} differs from {src}"


def read_line(proc, timeout=10.0):
    """One stdout line of a Proc (or Receiver), or '' on timeout/EOF (older tests' interface)."""
    return proc.stdout.next_line(timeout)
