"""Failures over rdma on Soft-RoCE (docs/rdma.md, "Errors"): a sender or a receiver killed at each phase of a
connection ends only its own session, with a clear message, never a UCX abort; the receiver's queue pairs of senders
that have gone are gone too; a low locked-memory limit is one clear error before UCX pins anything.

The phases: hello (HELLO sent / read), wire-up (the sender's endpoint connecting / the receiver's listener accepting),
data (mid-stream), FIN (FIN sent / read). A process is stopped exactly there by SLOTSTREAM_TEST_STOP_AT (fabric.h:
test_stop_point; it says "stopped at PHASE" and SIGSTOPs itself), then SIGKILLed. Issue 31: a sender whose receiver did
not answer its wire-up aborted (SIGABRT in ucp_ep_close_nbx, a UCX assertion)."""
import signal
import subprocess
import threading
import time

import pytest

from conftest import (BIN, HOST, assert_no_ucx_trouble, env_with, file_args, helpers, qps, send, stored)

STREAM = ["--synthetic", "0-1:10:160x120x3", "--duration", 60, "--blocks", 4, "--block-size", "64K"]


def stopped_at(proc, phase, timeout=180):
    helpers.wait_until(lambda: f"stopped at {phase}" in proc.stderr.text or proc.poll() is not None, timeout,
                       f"the process to stop at {phase}")
    assert proc.poll() is None, f"it ended before reaching {phase}: {proc.stderr.text}"
    helpers.wait_until(lambda: helpers.all_threads_stopped(proc.pid), 30, "all its threads to stop")


def sender_proc(spawn, addr, name, phase=None, args=STREAM):
    """`send --transport rdma ARGS` in the background; stopping itself at `phase` when given."""
    env = env_with(SLOTSTREAM_TEST_STOP_AT=phase) if phase else None
    return spawn([BIN, "send", "--to", addr, "--name", name, "--transport", "rdma", *args], env=env)


@pytest.mark.deadline(900)
@pytest.mark.parametrize("phase", ["hello", "wireup", "data", "fin"])
def test_a_sender_killed_at_each_phase_ends_only_its_session(receiver, spawn, tmp_path, phase):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "rdma")
    args = STREAM if phase != "fin" else ["--file", f"0={helpers.make_files(tmp_path, [50_000], 'f')[0]}"]
    victim = sender_proc(spawn, rx.addr, "victim", None if phase == "data" else phase, args)
    if phase == "data":
        helpers.wait_until(lambda: any("sender victim" in l for l in rx.stderr.lines + rx.stdout.lines) or
                           (out / "victim" / "device-0" / helpers.seq_name(3)).exists(), 240, "data to flow")
    else:
        stopped_at(victim, phase)
    victim.sigkill()
    # The receiver goes on: it ends that session (refused, lost, or finished where FIN had come), and serves the next.
    f = helpers.make_files(tmp_path, [1_500_000], "next")
    p = send(rx.addr, "--name", "next", "--transport", "rdma", *file_args(0, f))
    assert p.returncode == 0, p.stderr
    assert stored(out, "next", 0, 0) == f[0].read_bytes()
    assert rx.poll() is None, "the receiver died"
    if phase in ("data", "wireup", "hello"):
        helpers.wait_until(lambda: "victim" in rx.stdout.text + rx.stderr.text, 60, "the receiver to end the session")
    assert_no_ucx_trouble(rx.stderr.text, "receiver")
    assert rx.terminate(30) == 0


@pytest.mark.deadline(900)
@pytest.mark.parametrize("phase", ["hello", "accept", "data", "fin"])
def test_a_receiver_killed_at_each_phase_is_a_clear_error_of_the_sender(spawn, tmp_path, phase):
    out = tmp_path / "out"
    env = env_with(SLOTSTREAM_TEST_STOP_AT=phase) if phase != "data" else None
    rx = spawn([BIN, "recv", "--listen", f"{HOST}:0", "--out", out, "--transport", "rdma"], env=env)
    _, line = rx.stdout.wait_for(r"^listening on ", 120)
    addr = line.split()[-1]
    args = STREAM if phase in ("data", "accept", "hello") else \
        ["--file", f"0={helpers.make_files(tmp_path, [50_000], 'f')[0]}"]
    tx = spawn([BIN, "send", "--to", addr, "--name", "s", "--transport", "rdma", *args])
    if phase == "data":
        helpers.wait_until(lambda: (out / "s" / "device-0" / helpers.seq_name(3)).exists(), 240, "data to flow")
    else:
        stopped_at(rx, phase)
    rx.sigkill()
    t0 = time.monotonic()
    rc = tx.wait(120)
    took = time.monotonic() - t0
    err = tx.stderr.text
    assert rc not in (0, -signal.SIGABRT, 128 + signal.SIGABRT), (rc, err)
    assert rc > 0, f"the sender was killed by signal {-rc}:\n{err}"
    assert "slotstream send: error:" in err and "receiver" in err, err
    assert_no_ucx_trouble(err, "sender")
    print(f"receiver killed at {phase}: the sender exited {rc} after {took:.1f} s: {err.strip().splitlines()[-1]}")


@pytest.mark.deadline(1200)
def test_the_queue_pairs_of_senders_that_have_gone_are_gone(receiver, spawn, tmp_path):
    """`rdma resource show qp` before and after 20 senders (5 at a time) of a passive protocol: the receiver keeps none
    of theirs. While one sender is connected, its queue pairs are there (the count can tell)."""
    rx = receiver("--out", tmp_path / "out", "--transport", "rdma")
    before = qps()
    f = helpers.make_files(tmp_path, [20_000], "q")[0]
    held = sender_proc(spawn, rx.addr, "held", "fin", args=["--file", f"0={f}"])
    stopped_at(held, "fin")
    during = qps()
    assert len(during) > len(before), (before, during)
    held.sigkill()
    for round_ in range(4):
        threads, results = [], {}
        for i in range(5):
            name = f"q{round_}-{i}"
            t = threading.Thread(target=lambda n=name: results.__setitem__(
                n, send(rx.addr, "--name", n, "--transport", "rdma", "--protocol", "status_byte", "--file", f"0={f}")))
            threads.append(t)
            t.start()
        for t in threads:
            t.join()
        assert all(p.returncode == 0 for p in results.values()), {n: p.stderr for n, p in results.items()}
    helpers.wait_until(lambda: len(qps()) <= len(before), 120,
                       f"the queue pairs to go (before: {len(before)}, now: {qps()})")
    assert rx.poll() is None
    assert_no_ucx_trouble(rx.stderr.text, "receiver")


def under_limit(kib, argv):
    """argv under `ulimit -l KIB` without CAP_IPC_LOCK (which would lock any amount)."""
    return ["bash", "-c", f'ulimit -l {kib} && exec setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock "$@"', "sh",
            *map(str, argv)]


@pytest.mark.deadline(600)
def test_a_low_locked_memory_limit_is_one_clear_error_before_ucx_pins(receiver, spawn, tmp_path):
    # A receiver that cannot pin even its own worker's buffers: exit 2 at start, one line naming the limit.
    r = subprocess.run(under_limit(16384, [BIN, "recv", "--listen", f"{HOST}:0", "--discard", "--transport", "rdma"]),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slotstream recv: error: the locked-memory limit (ulimit -l) is "
                                                   "16.0 MiB"), r.stderr
    # A sender likewise, before it connects: 32 x 1 MiB blocks and UCX's buffers do not fit in 16 MiB.
    rx = receiver("--discard", "--transport", "rdma")
    s = subprocess.run(under_limit(16384, [BIN, "send", "--to", rx.addr, "--transport", "rdma", "--synthetic",
                                           "0:5:64x64x1", "--duration", 1]),
                       capture_output=True, text=True, timeout=180)
    assert s.returncode == 2, (s.returncode, s.stderr)
    lines = s.stderr.strip().splitlines()
    assert len(lines) == 1 and "the locked-memory limit (ulimit -l) is 16.0 MiB" in lines[0] and \
        "UCX's buffers of a worker" in lines[0], s.stderr
    # A receiver whose limit covers its start but not a sender's blocks and worker refuses that sender, saying why.
    low = spawn(under_limit(100 * 1024, [BIN, "recv", "--listen", f"{HOST}:0", "--discard", "--transport", "rdma"]))
    _, line = low.stdout.wait_for(r"^listening on ", 120)
    p = send(line.split()[-1], "--name", "big", "--transport", "rdma", "--blocks", 32, "--block-size", "1M",
             "--synthetic", "0:5:64x64x1", "--duration", 1)
    assert p.returncode != 0
    assert "the receiver cannot pin the blocks" in p.stderr and "locked-memory limit" in p.stderr, p.stderr
    assert_no_ucx_trouble(low.stderr.text, "receiver")
