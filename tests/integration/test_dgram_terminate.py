"""TERMINATE (issue 25; src/engine/dgram/wire/control.h): the side that detects a protocol error sends RDMAP's
Terminate with a reason, and the other side reports it and stops. Hostile or broken peers are played by raw UDP (dgram_wire.py,
written from the documented layouts, not from the C++ code)."""
import socket
import struct
import threading
import time

import pytest

import dgram_wire as w
from conftest import make_files
from dgram_support import DgramReceiver, dgram_send


def udp_to(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.connect(("127.0.0.1", port))
    s.settimeout(2)
    return s


def next_terminate(sock, timeout=2.0):
    """The next TERMINATE on sock as (layer, code, reason); other datagrams are skipped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            d = sock.recv(65536)
        except socket.timeout:
            break
        seg = w.decode(d)
        if seg and seg[2] == w.TERMINATE:
            assert struct.unpack("<I", d[12:16])[0] == w.TERMINATE_QUEUE, "TERMINATE travels on queue 2"
            return w.parse_terminate(seg[5])
    raise AssertionError("no TERMINATE came")


def open_session(rx, protocol="write_record"):
    """A raw session (HELLO -> ACCEPT): (socket, first STag)."""
    s = udp_to(rx.port)
    s.send(w.segment(w.hello(protocol=protocol, name="raw", ring=1, max_message=1024), qp=5))
    seg = w.decode(s.recv(65536))
    assert seg[5][0] == 2, "ACCEPT"
    first_stag = struct.unpack("<I", seg[5][17:21])[0]
    return s, first_stag


@pytest.mark.parametrize("error,code,text", [
    ("placement", 2, "a segment at offset 2000 (10 B) of message 0 of device 0 lies beyond its region (1024 B)"),
    ("opcode", 1, "opcode 0 is not an operation of protocol write_record"),
])
def test_a_malformed_peer_receives_terminate_with_its_reason(tmp_path, error, code, text):
    rx = DgramReceiver(tmp_path / "out")
    s, stag = open_session(rx)
    if error == "placement":
        bad = w.segment(b"x" * 10, opcode=w.WRITE_RECORD, qp=5, stag=stag, msn=0, offset=2000)
    else:  # an RDMA Write (RC's operation) in a Write-Record session
        bad = w.segment(b"x" * 10, opcode=w.WRITE, qp=5, stag=stag, offset=0)
    s.send(bad)
    layer, got_code, reason = next_terminate(s)
    assert (got_code, reason.startswith(text)) == (code, True), reason
    assert layer in (0, 1)
    # Its later datagrams are answered with the same TERMINATE (the first one may have been lost).
    time.sleep(0.15)
    s.send(w.segment(b"y", opcode=w.WRITE_RECORD, qp=5, stag=stag, msn=0, offset=0))
    assert next_terminate(s)[1:] == (got_code, reason)
    rx.stderr.wait_for(r"terminated sender raw from 127\.0\.0\.1:\d+: ", 5)
    rx.stop()


def test_the_receiver_reports_a_terminate_from_its_sender(tmp_path):
    rx = DgramReceiver(tmp_path / "out")
    s, stag = open_session(rx)
    s.send(w.segment(b"x" * 100, opcode=w.WRITE_RECORD, qp=5, stag=stag, msn=0, offset=0, last=False))
    s.send(w.segment(w.terminate(0, 5, "bye from the test"), opcode=w.TERMINATE, qp=5, queue=w.TERMINATE_QUEUE))
    (rep,) = rx.finished(timeout=5)
    assert rep["line"].startswith("sender raw lost: ")
    assert "(terminated by the sender: aborted: bye from the test);" in rep["line"]
    rx.stop()


class FakeReceiver:
    """A receiver played by raw UDP: ACCEPTs the HELLO (with `devices` devices), then answers the first data
    segment with `terminate` (or nothing); keeps every TERMINATE the sender sends."""

    def __init__(self, devices=1, terminate=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.devices, self.terminate, self.received = devices, terminate, []
        self.stop = False
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                d, peer = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            seg = w.decode(d)
            if not seg:
                continue
            _, _, opcode, _, _, payload = seg
            if opcode == w.TERMINATE:
                self.received.append(w.parse_terminate(payload))
            elif opcode == w.SEND and payload[:1] == b"\x01":  # HELLO
                self.sock.sendto(w.segment(w.accept(devices=self.devices), qp=9), peer)
            elif opcode == w.WRITE_RECORD and self.terminate:
                self.sock.sendto(w.segment(w.terminate(*self.terminate), opcode=w.TERMINATE, qp=9,
                                           queue=w.TERMINATE_QUEUE), peer)

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def test_a_sender_that_receives_terminate_exits_with_its_reason(tmp_path):
    srcs = make_files(tmp_path / "src", [100_000] * 5, "m")
    fake = FakeReceiver(terminate=(1, 2, "STag 7 is not one of this session's"))
    try:
        p, _ = dgram_send(f"127.0.0.1:{fake.port}", "--name", "t", *[f"--file=0={f}" for f in srcs], check=False,
                          timeout=20)
    finally:
        fake.close()
    assert p.returncode == 1, p.stderr
    assert (f"the receiver at 127.0.0.1:{fake.port} terminated the session: placement out of range: "
            "STag 7 is not one of this session's") in p.stderr
    assert fake.received == [], "a sender told to stop does not answer with a TERMINATE of its own"


def test_a_sender_that_cannot_honour_the_accept_terminates(tmp_path):
    """An ACCEPT for two devices to a sender of one: the sender fails, and tells the receiver why (the receiver
    has a session for it, which would otherwise wait for its session timeout)."""
    srcs = make_files(tmp_path / "src", [1000], "m")
    fake = FakeReceiver(devices=2)
    try:
        p, _ = dgram_send(f"127.0.0.1:{fake.port}", "--name", "t", f"--file=0={srcs[0]}", check=False, timeout=20)
        time.sleep(0.2)
    finally:
        fake.close()
    assert p.returncode == 1 and "does not match this sender's devices" in p.stderr, p.stderr
    assert fake.received == [(0, 4, "the receiver's ACCEPT does not match this sender's devices")]


def test_corruption_beyond_the_threshold_terminates_both_ends(tmp_path):
    """70 % of the sender's datagrams corrupted (a bit flipped after the CRC): more fail their CRC than pass, so
    the receiver ends the session with TERMINATE; the sender exits 1 saying why (2 % is tolerated:
    test_dgram_loss.py)."""
    srcs = make_files(tmp_path / "src", [30_000] * 10, "m")
    rx = DgramReceiver(tmp_path / "out")
    p, _ = dgram_send(rx.addr, "--name", "noisy", "--segment-size", 1408, "--inject-corrupt", 70, "--inject-seed", 3,
                      *[f"--file=0={f}" for f in srcs], check=False, timeout=30)
    assert p.returncode == 1, p.stderr
    assert "terminated the session: CRC failures: " in p.stderr, p.stderr
    assert "datagrams failed their CRC32C: the path corrupts more than it delivers" in p.stderr
    rx.stderr.wait_for(r"terminated sender noisy from .*: CRC failures: ", 5)
    rx.stop()
