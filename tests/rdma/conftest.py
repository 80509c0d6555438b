"""Fixtures for the RDMA suite (tests/rdma): real slotstream processes over a real verbs stack, Soft-RoCE (rdma_rxe) in
the VM of scripts/softroce-vm.sh, where rxe0 sits on dummy0 at 10.9.0.1 and UCX lists rc_verbs and ud_verbs on rxe0:1.
Both ends of every connection run in the VM and meet at 10.9.0.1 (the NIC loops back). Run by tests/rdma/run.sh,
which boots the VM once; outside it every test fails at once (no RDMA device), never silently.

The helpers of tests/integration/conftest.py (Receiver processes, the per-test deadline, ...) are loaded from there
under another module name, so both suites share one copy. The VM emulates its CPU (TCG): a process takes seconds to
start and data moves at tens of MB/s, hence the long deadlines; nothing here asserts a speed.
"""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    "integration_helpers", pathlib.Path(__file__).resolve().parents[1] / "integration" / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
sys.modules["integration_helpers"] = helpers
_spec.loader.exec_module(helpers)

pytest_configure = helpers.pytest_configure
_deadline = helpers._deadline
spawn = helpers.spawn

BIN = helpers.BIN
REPO = helpers.REPO
HOST = "10.9.0.1"
START_TIMEOUT = 120.0  # a receiver's `listening on` under emulation, beside other processes
# What UCX prints when it gives up on the process (a fatal error, a failed assertion) or reports an error of its own.
UCX_TROUBLE = re.compile(r"UCX\s+(ERROR|FATAL)|Assertion .* failed|Fatal:|==== backtrace")
PROTOCOLS = helpers.PROTOCOLS  # every data protocol of this build; each offers rdma (`slotstream protocols`)


def pytest_sessionstart(session):
    report = json.loads(subprocess.run([BIN, "transports", "--json"], capture_output=True, text=True,
                                       timeout=120).stdout)
    rdma = {t["name"]: t for t in report}["rdma"]
    if not rdma["available"]:
        raise pytest.UsageError(f"no usable RDMA device here ({rdma['why']}): tests/rdma runs inside the Soft-RoCE VM "
                                f"(bash tests/rdma/run.sh)")


@pytest.fixture
def receiver():
    """receiver(*args, env=None) -> Receiver listening on 10.9.0.1 (its own port); stopped at test end."""
    started = []

    def start(*args, env=None, listen=f"{HOST}:0"):
        r = helpers.Receiver([str(a) for a in args], start_timeout=START_TIMEOUT, listen=listen) if env is None \
            else EnvReceiver([str(a) for a in args], env, listen)
        started.append(r)
        return r

    yield start
    for r in started:
        r.terminate(30)


class EnvReceiver(helpers.Receiver):
    """A Receiver in its own environment (e.g. UCX_TLS)."""

    def __init__(self, args, env, listen):
        # helpers.Receiver starts the process itself; repeat its start-up with an environment.
        helpers.Proc.__init__(self, [BIN, "recv", "--listen", listen, *args], env=env)
        _, line = self.stdout.wait_for(r"", START_TIMEOUT)
        self.stdout.cursor = 1
        m = re.fullmatch(r"listening on (\S+):(\d+)", line)
        assert m, f"first receiver line is not `listening on HOST:PORT`: {line!r}; stderr:\n{self.stderr.text}"
        self.host, self.port = m.group(1), int(m.group(2))
        self.addr = f"{self.host}:{self.port}"


def send(addr, *args, env=None, timeout=300, prefix=()):
    """`slotstream send --to addr ARGS` to completion (text CompletedProcess); `prefix`: a command it runs under."""
    argv = [*prefix, BIN, "send", "--to", addr, *[str(a) for a in args]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def file_args(device, paths):
    return [x for p in paths for x in ("--file", f"{device}={p}")]


def stored(out, sender, device, seq):
    return (pathlib.Path(out) / sender / f"device-{device}" / helpers.seq_name(seq)).read_bytes()


def assert_no_ucx_trouble(text, who):
    m = UCX_TROUBLE.search(text)
    assert not m, f"{who}: UCX reported trouble ({m.group(0)!r}):\n{text[-3000:]}"


def qps(pid=None):
    """The queue pairs the kernel has (`rdma resource show qp`), the GSI one aside; of one process when `pid`."""
    out = subprocess.run(["rdma", "resource", "show", "qp"], capture_output=True, text=True, timeout=30).stdout
    lines = [line for line in out.splitlines() if line.strip() and "type GSI" not in line]
    return [line for line in lines if f" pid {pid} " in line + " "] if pid else lines


def env_with(**vars):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in vars.items()})
    return env
