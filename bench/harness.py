"""What every `slotstream bench` experiment measures with: the peers (`slotstream bench-peer`,
docs/bench-peer.md, and `ucx_perftest`), the records they become (Results), progress lines, errors
(PeerError), percentiles, and for_each_point — the loop over an experiment's points that turns a
point that failed into an error record and a progress line instead of ending the run.

The experiment modules import this one; it imports none of them, and nothing imports the entry script
(bench/slotstream_bench.py), which only composes the experiments' tables (tests/integration/
test_bench_layout.py checks both).
"""
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import select
import socket
import subprocess
import time
from typing import Callable

HERE = pathlib.Path(__file__).resolve().parent
BIN = os.environ.get("SLOTSTREAM_BIN", str(HERE.parent / "build" / "slotstream"))

TRANSPORTS = ["shm", "tcp", "rdma"]
PAPER_BLOCKS = 3       # paper section 4.2: three blocks per side
DEFAULT_BLOCKS = 32    # slotstream's default (`slotstream send --help`)
MODES = ("full", "quick", "tiny")  # --quick, --tiny (the tests' runs: seconds, not minutes)

# What slotstream asks UCX for on each transport (src/engine/ucx/fabric/transports.cc); ucx_perftest gets the same.
# rdma: UCX's rc alias (rc_mlx5 or rc_verbs, with ud for wire-up), or dc/ud with --rdma-transport.
UCX_TLS = {"shm": "posix,sysv,self", "tcp": "tcp,self", "rdma": "rc,self"}
# --rdma-transport / --rdma-device: passed to every peer of the rdma transport (set by the entry script).
RDMA = {"transport": None, "device": None}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One row of an experiment module's EXPERIMENTS table (the entry script composes the tables).
    figures: where the experiment comes from (a paper's figures, an issue); what: one line for --help;
    run(res, cfg): measures every point once (the entry script calls it once per --runs); defaults: the
    experiment's own settings, each {setting: (full, quick, tiny)}, put into cfg and results.json."""
    figures: str
    what: str
    run: Callable
    defaults: dict = dataclasses.field(default_factory=dict)


def by_mode(defaults, mode):
    """{setting: value} of an Experiment's defaults for mode (full, quick or tiny)."""
    return {k: v[MODES.index(mode)] for k, v in defaults.items()}


class PeerError(RuntimeError):
    """A measuring process failed or said nothing usable: the point becomes an error record."""


def log(msg):
    print(msg, flush=True)


def rdma_args(transport):
    """The peers' extra arguments on `transport` (the RDMA transport and device, on rdma)."""
    if transport != "rdma":
        return []
    return ([f"--rdma-transport={RDMA['transport']}"] if RDMA["transport"] else []) + \
        ([f"--rdma-device={RDMA['device']}"] if RDMA["device"] else [])


# `slotstream bench --pin`: the CPUs the receiving and the sending side of every peer pair (and ucx_perftest's
# server and client) run on; None: unpinned, wherever the scheduler puts them.
PIN = {"receiver": None, "sender": None}


def pin_halves(cpus):
    """--pin's layout over `cpus` (those this process may use): the receiving side on the upper half, the sending
    side on the lower half — on 2 CPUs the receiver on the second, the sender on the first. ValueError below 2."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        raise ValueError(f"--pin needs at least 2 CPUs to give each side its own; this process may use {len(cpus)}")
    half = len(cpus) // 2
    return {"receiver": cpus[half:], "sender": cpus[:half]}


def pinned(side):
    """The preexec_fn that puts a child on `side`'s CPUs (PIN), or None when unpinned."""
    cpus = PIN[side]
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def ucx_env(transport):
    """ucx_perftest's environment on `transport`: the UCX transports (and device) slotstream uses there."""
    env = dict(os.environ, UCX_TLS=UCX_TLS[transport])
    if transport == "rdma":
        env["UCX_TLS"] = f"{RDMA['transport'] or 'rc'},self"
        if RDMA["device"]:
            env["UCX_NET_DEVICES"] = RDMA["device"]
        # ucx_perftest connects by worker address, its wire-up over ud: UCX 1.13's ud drops every IPv4 RoCE packet on
        # NICs other than ConnectX unless its destination check is off (docs/rdma.md; slotstream turns it off too).
        env.setdefault("UCX_UD_VERBS_ETH_DGID_CHECK", "n")
    return env


def registry():
    """Every block protocol of this build (`slotstream protocols --json`, UCX's engine; the datagram
    experiments choose theirs in dgram_experiments.py): name -> its entry."""
    try:
        out = subprocess.run([BIN, "protocols", "--json"], capture_output=True, text=True, timeout=30).stdout
        return {p["name"]: p for p in json.loads(out) if p.get("engine", "ucx") == "ucx"}
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"slotstream bench: cannot list the protocols of {BIN}: {e}")


def host_transports():
    """The transports of TRANSPORTS this host offers, as `slotstream transports --json` says (asked of UCX's
    own resource lists); shm and tcp when it cannot say, so that a missing one fails loudly in a peer."""
    try:
        out = subprocess.run([BIN, "transports", "--json"], capture_output=True, text=True, timeout=30).stdout
        have = {t["name"] for t in json.loads(out) if t["available"]}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ["shm", "tcp"]
    return [t for t in TRANSPORTS if t in have] or ["shm", "tcp"]


# ----------------------------------------------------------------------------- peers

_pending = {}  # pid -> bytes read past the last line handed out


def read_line(proc, timeout):
    """The next stdout line of a peer (a report can be megabytes: read in chunks), or what came
    before the timeout or EOF."""
    deadline = time.monotonic() + timeout
    buf = _pending.pop(proc.pid, b"")
    fd = proc.stdout.fileno()
    while b"\n" not in buf and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        buf += chunk
    line, sep, rest = buf.partition(b"\n")
    if rest:
        _pending[proc.pid] = rest
    return line.decode()


def wait_or_kill(proc, seconds):
    """Waits for a program that should end by itself; kills it if it has not after `seconds`."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
    wait_or_kill(proc, 10)


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peers(rx_cmd, tx_cmd, timeout, kind=""):
    """One measurement by a receiver process (rx_cmd prints `listening on ADDR`, then one JSON report)
    and a sender process (tx_cmd(ADDR) -> its command line; it prints one JSON report and exits).
    Returns (sender, receiver) reports; raises PeerError, with the receiver's stderr, when either fails.
    kind: what the errors call the peers ("dgram " for `slotstream dgram-peer`)."""
    rx = subprocess.Popen(rx_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=pinned("receiver"))
    try:
        line = read_line(rx, 20)
        if not line.startswith("listening on "):
            raise PeerError(f"{kind}receiver peer did not start: {line!r}")
        cmd = tx_cmd(line.split()[-1])
        try:
            tx = subprocess.run(cmd, capture_output=True, timeout=timeout, preexec_fn=pinned("sender"))
        except subprocess.TimeoutExpired:
            raise PeerError(f"{kind}sender peer timed out after {timeout} s: {' '.join(cmd)}")
        if tx.returncode != 0:
            raise PeerError(f"{kind}sender peer failed ({tx.returncode}): {tx.stderr.decode()[:500]}")
        sender = json.loads(tx.stdout)
        line = read_line(rx, 30)
        if not line.startswith("{"):
            raise PeerError(f"{kind}receiver peer gave no report within 30 s: {line!r}")
        return sender, json.loads(line)
    except PeerError as e:
        # The receiver's side of the story often names the cause (e.g. out of shared memory).
        stop(rx)
        err = rx.stderr.read().decode(errors="replace").strip()[-500:]
        raise PeerError(f"{e}; receiver peer stderr: {err!r}" if err else str(e)) from None
    except ValueError as e:  # JSON
        raise PeerError(f"a {kind}peer printed malformed JSON: {e}") from None
    finally:
        stop(rx)


def run_pair(transport, protocol, size, count, blocks, devices=1, fps=0.0, gap_us=0, busy_poll=False,
             hold=None, timeout=300, seconds=0.0, rx_extra=(), tx_extra=()):
    """One measurement: a `bench-peer recv` and a `bench-peer send`; returns (sender, receiver) JSON.
    protocol tcp_socket is plain TCP (`--tcp-socket` on both sides, no protocol)."""
    tcp_socket = protocol == "tcp_socket"
    rx_cmd = [BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", transport, *rdma_args(transport)]
    if busy_poll:
        rx_cmd.append("--busy-poll")
    if hold:
        rx_cmd += ["--hold-block", hold]
    if tcp_socket:
        rx_cmd.append("--tcp-socket")
    rx_cmd += list(rx_extra)

    def tx_cmd(addr):
        cmd = [BIN, "bench-peer", "send", "--to", addr, "--transport", transport, *rdma_args(transport)]
        cmd += ["--tcp-socket"] if tcp_socket else ["--protocol", protocol]
        cmd += ["--blocks", str(blocks), "--size", str(size), "--count", str(count), "--devices", str(devices)]
        if fps:
            cmd += ["--fps", str(fps)]
        if gap_us:
            cmd += ["--gap-us", str(gap_us)]
        if seconds:
            cmd += ["--seconds", str(seconds)]
        return cmd + list(tx_extra)

    return run_peers(rx_cmd, tx_cmd, timeout)


def perftest(transport, test, size, iters, extra=(), timeout=120, warmup=10):
    """One `ucx_perftest -t TEST` pair over the transport slotstream uses (same UCX_TLS): the numbers
    of its "Final:" line, i.e. [iterations, overhead p(R) / avg / overall µs, bandwidth avg / overall
    MiB/s, message rate avg / overall msg/s]."""
    env = ucx_env(transport)
    args = ["-t", test, "-s", str(size), "-n", str(iters), "-w", str(warmup), *extra]
    last = ""
    for _ in range(3):  # the port can be taken between free_port() and the server's bind
        port = str(free_port())
        srv = subprocess.Popen(["ucx_perftest", "-p", port, *args], env=env, preexec_fn=pinned("receiver"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            out = ""
            for _ in range(80):  # the server listens a moment after it starts (seconds in an emulated VM)
                time.sleep(0.25)
                try:
                    cli = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port, *args], env=env,
                                         preexec_fn=pinned("sender"), capture_output=True, text=True, timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise PeerError(f"ucx_perftest timed out after {timeout} s ({transport}, {test}, {size} B)")
                out = cli.stdout + cli.stderr
                if cli.returncode == 0 or srv.poll() is not None:
                    break
            m = re.search(r"^Final:((?:\s+[\d.]+)+)\s*$", out, re.M)
            if m:
                return [float(x) for x in m.group(1).split()]
            last = out[-500:]
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait(timeout=10)
    raise PeerError(f"ucx_perftest gave no result ({transport}, {test}, {size} B): {last!r}")


def perftest_latency(transport, size, iters, warmup, rank):
    """The UCX one-way put latency ceiling for one size: `ucx_perftest -t ucp_put_lat` (a put
    ping-pong, both sides polling the last byte of the buffer; it reports half the round trip),
    `iters` timed after `warmup` untimed, as the protocols' points are. Returns (percentile at
    `rank`, mean) in µs. The bench-peer's ucx_raw_put delivers nothing the receiver could time, so
    the latency reference is UCX's own tool, same transport and size."""
    final = perftest(transport, "ucp_put_lat", size, iters, ["-R", str(rank)], warmup=warmup)
    return final[1], final[2]


def perftest_bandwidth(transport, size, count):
    """UCX's put bandwidth ceiling for one size: `ucx_perftest -t ucp_put_bw`, `count` puts back to
    back into one cache-hot buffer with no flow control (issue 11's fabric limit). Returns (MB/s in
    10^6 bytes like every slotstream figure, messages/s)."""
    final = perftest(transport, "ucp_put_bw", size, count)
    rate = final[7]
    return rate * size / 1e6, rate


# ----------------------------------------------------------------------------- records and progress

def pct(values, q):
    """The q-th percentile (nearest rank) of values; 0.0 for none."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def binary_source(binary):
    """The measured binary and the commit of the git checkout it sits in when the run starts: {"binary", "commit",
    "changed"}; commit None outside a checkout (an installed slotstream). `changed`: uncommitted changes to what a
    binary is built from (src/, include/, tools/, CMakeLists.txt). The binary is whatever was last built there."""
    path = pathlib.Path(binary).resolve()
    out = {"binary": str(path), "commit": None, "changed": False}

    def git(*args):
        return subprocess.run(["git", "-C", str(path.parent), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("log", "-1", "--format=%h", "--abbrev=12")
        if head.returncode == 0 and head.stdout.strip():
            changed = git("status", "--porcelain", "--untracked-files=no", "--", ":/src", ":/include", ":/tools",
                          ":/CMakeLists.txt")
            out.update(commit=head.stdout.strip(), changed=bool(changed.stdout.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def cpu_model():
    """The processor's name as the kernel gives it (/proc/cpuinfo), or None: the same command gives different figures
    on different processors (and its ucx_perftest references with them), so a record says which it ran on."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return None


class Results:
    def __init__(self, out, argv):
        self.out = out
        self.records = []
        self.samples = {}
        self.errors = []
        self.config = {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "kernel": platform.release(),
            "slotstream": subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip(),
            "ucx": self._ucx_version(),
            "command": " ".join(["slotstream", "bench", *argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "source": binary_source(BIN),
        }

    @staticmethod
    def _ucx_version():
        try:
            out = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True, timeout=10).stdout
            return out.splitlines()[0].strip("# ").strip() if out else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"

    run = 0  # the independent run (process pairs started afresh) being measured

    def add(self, experiment, protocol, transport, size, blocks, metric, value, unit, repeat=0, variant="",
            **dimensions):
        """One tidy record. `run`: which independent run; `repeat`: a round within that run's process pair
        (throughput); `variant`: a setting of the experiment beyond protocol/transport/size/blocks;
        `dimensions`: an experiment's own axes (e.g. cache: devices, window_bytes)."""
        self.records.append({"experiment": experiment, "protocol": protocol, "transport": transport,
                             "size_bytes": int(size), "blocks": int(blocks), "metric": metric,
                             "value": float(value), "unit": unit, "run": self.run, "repeat": int(repeat),
                             "variant": variant, **dimensions})

    def sample(self, experiment, key, data):
        """Raw samples for the figures, from the first run only (the records carry every run)."""
        if self.run == 0:
            self.samples.setdefault(experiment, {})[key] = data

    def error(self, what, err):
        log(f"  ! {what}: {err}")
        self.errors.append({"what": what, "error": str(err)})

    def save(self):
        doc = {"config": self.config, "records": self.records, "samples": self.samples, "errors": self.errors}
        (self.out / "results.json").write_text(json.dumps(doc, indent=1))


class Progress:
    def __init__(self, total, name, run, runs):
        self.total, self.done, self.t0, self.name = max(total, 1), 0, time.monotonic(), name
        self.tag = f"{name} run {run + 1}/{runs}" if runs > 1 else name

    def step(self, what):
        self.done += 1
        el = time.monotonic() - self.t0
        eta = el / self.done * (self.total - self.done)
        log(f"[{self.tag} {self.done}/{self.total} {el:5.0f}s, ~{eta:4.0f}s left] {what}")


def for_each_point(res, cfg, name, points, measure, label, errors=(PeerError,), prog=None, run_tag=True):
    """Measures every point of an experiment: measure(*point) records what it measured and returns its
    progress line. A point whose measure raises one of `errors` (a peer failed, gave no samples) becomes
    an error record "NAME LABEL (run N)" and a FAILED progress line, and the next point goes on.
    label(*point): how the point is named in both. prog: a Progress shared with other loops of the
    experiment (default: one of len(points) steps called `name`). run_tag=False leaves out "(run N)"."""
    prog = prog or Progress(len(points), name, res.run, cfg.runs)
    for point in points:
        try:
            line = measure(*point)
        except errors as e:
            what = label(*point)
            res.error(f"{name} {what}" + (f" (run {res.run})" if run_tag else ""), e)
            prog.step(f"{what}: FAILED")
            continue
        prog.step(line)
    return prog


def cpu_percent(peer):
    """A peer's CPU (user + system, all threads) over its measured window, in % of one core."""
    return 100 * peer["cpu_seconds"] / max(peer["seconds"], 1e-9)


def add_cpu(res, experiment, p, t, s, b, snd, rcv, variant=""):
    """CPU of both sides, per second and per MB moved, and the part spent progressing UCX."""
    mb = max(snd["bytes"], 1) / 1e6
    for side, peer in (("sender", snd), ("receiver", rcv)):
        res.add(experiment, p, t, s, b, f"cpu_{side}", cpu_percent(peer), "% of one core", variant=variant)
        res.add(experiment, p, t, s, b, f"cpu_{side}_per_mb", 1e3 * peer["cpu_seconds"] / mb, "ms/MB",
                variant=variant)
        # Time inside ucp_worker_progress summed over threads (a thread preempted inside counts
        # too, so this is not CPU and may pass 100% with many threads).
        prog = peer.get("resources", {}).get("progress_seconds")
        if prog is not None:
            res.add(experiment, p, t, s, b, f"progress_{side}", 100 * prog / max(peer["seconds"], 1e-9),
                    "% of wall time, summed over threads", variant=variant)
