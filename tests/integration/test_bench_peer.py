"""`slotstream bench-peer` (tools/bench_peer.cc) as a process: what it does when its peer is not there."""
import json
import socket
import subprocess
import time

import pytest

from conftest import BIN


@pytest.mark.deadline(60)
def test_the_plain_tcp_reference_gives_up_on_a_connection_nobody_accepts():
    # A listener that never accepts, its accept queue full: the kernel drops every further SYN, so a connect
    # neither succeeds nor fails (it would retry for about two minutes); only the sender's own bound ends it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(4):  # more than the queue holds (backlog + 1)
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                fillers.append(s)
            time.sleep(0.2)
            t0 = time.monotonic()
            p = subprocess.run([BIN, "bench-peer", "send", "--to", f"127.0.0.1:{port}", "--tcp-socket", "--count", "1",
                                "--size", "64"], capture_output=True, text=True, timeout=40, stdin=subprocess.DEVNULL)
            waited = time.monotonic() - t0
        finally:
            for s in fillers:
                s.close()
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"cannot connect to 127.0.0.1:{port}: no answer within 5 s" in p.stderr, p.stderr
    assert waited >= 4.5, f"it gave up after {waited:.1f} s, before its 5 s bound: {p.stderr}"
    assert p.stdout == "", p.stdout  # no measurement was printed


@pytest.mark.deadline(30)
def test_the_plain_tcp_reference_says_a_refused_connection_at_once():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        p = subprocess.run([BIN, "bench-peer", "send", "--to", f"127.0.0.1:{port}", "--tcp-socket", "--count", "1",
                            "--size", "64"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and f"cannot connect to 127.0.0.1:{port}: Connection refused" in p.stderr, p.stderr


@pytest.mark.deadline(60)
def test_the_plain_tcp_reference_stops_after_its_seconds():
    # bench throughput bounds every point's sender by time (--seconds; --count is then an upper bound), the plain
    # TCP reference included: it used to send all of --count whatever --seconds said.
    rx = subprocess.Popen([BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", "tcp", "--tcp-socket"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        addr = rx.stdout.readline().split()[-1]
        t0 = time.monotonic()
        p = subprocess.run([BIN, "bench-peer", "send", "--to", addr, "--tcp-socket", "--count", "100000000", "--size",
                            "64", "--seconds", "0.3"], capture_output=True, text=True, timeout=40,
                           stdin=subprocess.DEVNULL)
        took = time.monotonic() - t0
        assert p.returncode == 0, p.stderr
        sent = json.loads(p.stdout)
        received = json.loads(rx.stdout.readline())
    finally:
        rx.kill()
        rx.wait()
    assert took < 20, f"the sender ran {took:.1f} s for --seconds 0.3"
    assert 0 < sent["messages"] < 100000000, sent["messages"]
    assert len(sent["send_times_ns"]) == sent["messages"]
    assert received["messages"] == sent["messages"], (received["messages"], sent["messages"])
