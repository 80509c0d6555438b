"""Every blocking call of the Python package returns to Python at least every 0.1 s: Ctrl-C (a real SIGINT, sent
by the test) raises KeyboardInterrupt within 0.2 s in a blocked send() and finish(), and send(), finish() and
Receiver.get() take timeout= (slotstream.Timeout). A blocked send() used to ignore Ctrl-C for more than 15 s."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import slotstream
from integration_helpers import BIN

# A sender whose receiver has stopped (SIGSTOP): every block stays full, so send() blocks; then the
# parent's SIGINT must surface as KeyboardInterrupt. The child prints when it caught it (CLOCK_MONOTONIC is
# the same clock in both processes).
CHILD = textwrap.dedent("""
    import sys, time, slotstream
    addr, what = sys.argv[1], sys.argv[2]
    tx = slotstream.Sender(addr, name="ctrl-c-" + what, blocks=2, block_size=4096, devices=[0], transport="shm")
    print("connected", flush=True)
    try:
        if what == "send":
            while True:
                tx.send(0, bytes(4000))
        else:
            for i in range(4):
                tx.send(0, bytes(100))
            print("finishing", flush=True)
            tx.finish()
        print("returned", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted {time.monotonic():.6f}", flush=True)
        tx.close()
""")


def stop(pid):
    """SIGSTOP, and wait until the process is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


@pytest.mark.deadline(60)
@pytest.mark.parametrize("what", ["send", "finish"])
def test_ctrl_c_interrupts_a_blocked_call(receiver, tmp_path, what):
    rx = receiver("--discard")
    child = subprocess.Popen([sys.executable, "-c", CHILD, rx.addr, what], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "connected", child.stderr.read()
        stop(rx.pid)  # the receiver stops taking blocks and answering
        if what == "finish":
            assert child.stdout.readline().strip() == "finishing"
        time.sleep(1.0)  # the call is blocked by now
        assert child.poll() is None, "the call returned although the receiver is stopped"
        sent_at = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        assert line and line[0] == "interrupted", f"{line}: {child.stderr.read()}"
        took = float(line[1]) - sent_at
        print(f"KeyboardInterrupt {took * 1000:.0f} ms after SIGINT in a blocked {what}()")
        assert took < 0.2, f"KeyboardInterrupt came {took:.3f} s after SIGINT"
        assert child.wait(20) == 0, child.stderr.read()
    finally:
        os.kill(rx.pid, signal.SIGCONT)
        child.kill()


def check_timeouts(tx, pid, message):
    """A sender (Sender or PlatformSender, 2 blocks of 4 KiB) whose receiver `pid` is stopped: send() gives up
    after its timeout with the message not sent, then finish() abandons the stream after its own. Returns how
    many messages the loop tried (message(i) for i = 1, 2, ...; the last one timed out)."""
    tx.send(0, message(0), timeout=5)  # room: returns at once
    stop(pid)
    try:
        with pytest.raises(slotstream.Timeout) as e:
            for i in range(1, 100):  # 2 receiver and 2 sender blocks: the fifth message at the latest waits
                t0 = time.monotonic()
                tx.send(0, message(i), timeout=0.3)
        assert i <= 6, f"{i} messages went to a stopped receiver: {tx.stats()}"
        assert 0.25 < time.monotonic() - t0 < 2.0
        assert "not sent" in str(e.value) and isinstance(e.value, slotstream.Error)
        t0 = time.monotonic()
        with pytest.raises(slotstream.Timeout, match="abandoned"):
            tx.finish(timeout=0.5)
        assert 0.4 < time.monotonic() - t0 < 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
        tx.close()
    return i


@pytest.mark.deadline(60)
def test_timeouts_raise_timeout(receiver):
    rx = receiver("--discard")
    tx = slotstream.Sender(rx.addr, name="timeouts", blocks=2, block_size=4096, devices=[0], transport="shm")
    check_timeouts(tx, rx.pid, lambda i: bytes(4000))
    with pytest.raises(ValueError):
        slotstream.Sender(rx.addr, name="neg", devices=[0]).send(0, b"x", timeout=-1)


@pytest.mark.deadline(60)
def test_timeouts_raise_timeout_for_messages_sent_a_block_at_a_time(receiver):
    # Messages larger than a block take their blocks whole. A C++ send without a deadline waits for receiver room
    # itself for those (issue 32); a send with a timeout must not wait inside the protocol, or it could not give up.
    rx = receiver("--discard")
    tx = slotstream.Sender(rx.addr, name="whole", blocks=2, block_size=4096, devices=[0], transport="shm")
    check_timeouts(tx, rx.pid, lambda i: bytes(10000))


@pytest.mark.deadline(60)
def test_receiver_get_waits_with_a_timeout_and_ends_with_none():
    with slotstream.Receiver("127.0.0.1:0", transport="shm", exit_after_senders=1) as rx:
        t0 = time.monotonic()
        with pytest.raises(slotstream.Timeout):
            rx.get(timeout=0.3)
        assert 0.25 < time.monotonic() - t0 < 2.0
        with slotstream.Sender(rx.address, name="one", devices=[0]) as tx:
            tx.send(0, b"hello")
        sender, device, seq, data = rx.get(timeout=10)
        assert (sender, device, seq, bytes(data)) == ("one", 0, 0, b"hello")
        assert rx.get(timeout=10) is None  # exit_after_senders reached: where iteration ends


def test_the_version_is_the_librarys():
    out = subprocess.run([BIN, "--version"], capture_output=True, text=True, timeout=10).stdout.split()
    assert slotstream.__version__ == out[1]
