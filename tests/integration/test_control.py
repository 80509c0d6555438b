"""Bad control input over a raw TCP socket (docs/cli-contract.md, "Control wire"): each is refused with a REFUSE
frame naming the problem or the connection is closed; the receiver says so on stderr and keeps serving."""
import os
import socket
import struct
import time

import pytest

from conftest import assert_device, make_files, run_send

MAGIC = b"SLST"
HELLO, CHALLENGE, AUTH, ACCEPT, REFUSE, FIN, FIN_ACK, CAPACITY_REQ, CAPACITY, SETUP, READY = range(1, 12)
KEEPALIVE = 16
VERSION = 8
MAX_FRAME = 65536


# ------------------------------------------------------------------ a tiny encoder / decoder

def frame(msg_type, body):
    return struct.pack("<IB", len(body) + 1, msg_type) + body


def str8(b):
    return bytes([len(b)]) + b


def str16(b):
    return struct.pack("<H", len(b)) + b


def hello_body(magic=MAGIC, version=VERSION, protocol=b"status_byte", options=b"", blocks=4, block_size=4096,
               transport=0, host=b"host", name=b"raw", devices=(0,), group=0, lane=0, lanes=1, flags=0,
               nonce=b"\x11" * 32, rdma_transport=0, offers=1, shm_domain=b"ipc=1,uid=0"):
    body = magic + struct.pack("<H", version) + str8(protocol) + str16(options)
    body += struct.pack("<IIBBB", blocks, block_size, transport, rdma_transport, offers)
    body += str8(host) + str8(shm_domain) + str8(name)
    body += struct.pack("<H", len(devices)) + b"".join(struct.pack("<H", d) for d in devices)
    body += struct.pack("<QHHB", group, lane, lanes, flags)  # flags 0: no first message numbers
    return body + nonce


def hello(**kw):
    return frame(HELLO, hello_body(**kw))


def read_frames(data):
    """[(type, body)] of the complete frames in data."""
    frames = []
    while len(data) >= 5:
        length, msg_type = struct.unpack("<IB", data[:5])
        if length < 1 or len(data) < 4 + length:
            break
        frames.append((msg_type, data[5:4 + length]))
        data = data[4 + length:]
    return frames


def decode_refuse(body):
    code, mlen = struct.unpack("<HH", body[:4])
    msg = body[4:4 + mlen]
    assert len(msg) == mlen, f"REFUSE message truncated: {body!r}"
    return code, msg.decode("utf-8")


def connect(addr):
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(s, timeout):
    """Everything the peer sends until it closes (or timeout); (data, closed)."""
    s.settimeout(0.5)
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def exchange(addr, payload, timeout=15):
    """Sends raw bytes; returns the REFUSE message, or None when the receiver just closed the connection."""
    with connect(addr) as s:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return None
        data, closed = read_until_closed(s, timeout)
    frames = read_frames(data)
    assert closed or frames, f"the receiver neither answered nor closed within {timeout} s"
    if not frames:
        assert data == b"", f"receiver sent a partial frame: {data!r}"
        return None
    msg_type, body = frames[0]
    assert msg_type == REFUSE, f"expected REFUSE (5), got type {msg_type}: {body!r}"
    return decode_refuse(body)[1]


def still_serves(rx, tmp_path, name="after"):
    f = make_files(tmp_path / "good", [5000], name)
    run_send(rx.addr, "--name", name, "--file", f"0={f[0]}")
    assert_device(rx_out(rx), name, 0, f)


def rx_out(rx):
    return rx.argv[rx.argv.index("--out") + 1]


def assert_refused_on_stderr(rx, needles, timeout=10):
    """The receiver printed a `refused`/`bad` line on stderr, mentioning one of needles (if any)."""
    _, line = rx.stderr.wait_for(r"(?i)refused|bad", timeout)
    if needles:
        assert any(n.lower() in line.lower() for n in needles), f"stderr line {line!r} mentions none of {needles}"


# Each case: payload, words of which the refusal (REFUSE message and receiver's stderr line) names one.
CASES = {
    "wrong_magic": (hello(magic=b"XXXX"), ["magic"]),
    "wrong_version": (hello(version=9), ["version"]),
    "version_zero": (hello(version=0), ["version"]),
    "version_one": (hello(version=1), ["version"]),  # the pre-2 layout is refused by its version, not misread
    "version_two": (hello(version=2), ["version"]),
    "version_three": (hello(version=3), ["version"]),  # the layout before rdma
    "version_four": (hello(version=4), ["version"]),  # no packed units, unsigned frames: refused
    "version_five": (hello(version=5), ["version"]),  # unsigned frames after the handshake: refused
    "version_seven": (hello(version=7), ["version"]),  # takes KEEPALIVE for an unexpected frame: refused
    "unknown_transport": (hello(transport=4), ["transport"]),
    "unknown_rdma_transport": (hello(rdma_transport=9), ["rdma transport"]),
    "unknown_offers": (hello(offers=0x80), ["offers"]),
    "unknown_protocol_option": (hello(options=b"nope=1"), ["option"]),
    "malformed_protocol_options": (hello(options=b"budget"), ["option"]),
    "unknown_protocol": (hello(protocol=b"nope"), ["protocol"]),
    "garbage_frame": (frame(HELLO, b"\x00\x01garbage-garbage-garbage"), []),
    "garbage_bytes": (bytes(range(7, 200)) * 3, []),
    "http_request": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", []),
    "oversized_length": (struct.pack("<I", 0xFFFFFFF0) + b"\x01" + b"x" * 64, ["length", "large", "size", "frame"]),
    "length_just_over_max": (struct.pack("<IB", MAX_FRAME + 1, HELLO) + b"x" * 64, ["length", "large", "size", "frame"]),
    "zero_length": (struct.pack("<I", 0) + b"x" * 16, []),
    "not_a_hello_first": (frame(FIN, b"\x00\x00"), []),
    "unknown_type": (frame(200, b"hello"), []),
    "truncated_hello_body": (frame(HELLO, hello_body()[:-6]), ["truncated", "short", "hello"]),
    "bad_geometry": (hello(block_size=10), ["block", "geometry", "size"]),
    "no_devices": (hello(devices=()), ["device"]),
}


@pytest.mark.deadline(60)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_hello_is_refused_and_receiver_keeps_serving(start_receiver, tmp_path, case):
    payload, needles = CASES[case]
    rx = start_receiver(tmp_path / "out")
    msg = exchange(rx.addr, payload)
    if msg is not None and needles:
        assert any(n in msg.lower() for n in needles), f"REFUSE {msg!r} mentions none of {needles}"
    assert_refused_on_stderr(rx, needles)
    assert rx.poll() is None, "receiver exited"
    still_serves(rx, tmp_path)
    assert os.listdir(rx_out(rx)) == ["after"], "a refused connection left something in the output directory"


@pytest.mark.deadline(60)
def test_truncated_hello_then_close(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    with connect(rx.addr) as s:
        s.sendall(hello()[:10])
    assert_refused_on_stderr(rx, [])
    still_serves(rx, tmp_path)


@pytest.mark.deadline(60)
def test_connect_and_close_without_a_byte(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    for _ in range(5):
        connect(rx.addr).close()
    still_serves(rx, tmp_path)


@pytest.mark.deadline(60)
def test_stalled_hello_is_not_kept_forever(start_receiver, tmp_path):
    # The frame never completes and the socket stays open: the receiver must give up on it, not wait forever,
    # and must serve others meanwhile.
    rx = start_receiver(tmp_path / "out")
    with connect(rx.addr) as s:
        s.sendall(hello()[:-6])
        still_serves(rx, tmp_path, "meanwhile")
        data, closed = read_until_closed(s, 20)
    assert closed, "the receiver kept a stalled hello open for 20 s"
    frames = read_frames(data)
    if frames:
        assert frames[0][0] == REFUSE
    assert_refused_on_stderr(rx, [])


@pytest.mark.deadline(60)
@pytest.mark.parametrize("name", ["../x", "a/b", ".", "..", "", "x/../../y", "a\x00b", "-rf", "--help"])
def test_bad_sender_name_in_raw_hello_is_refused(start_receiver, tmp_path, name):
    out = tmp_path / "out"
    rx = start_receiver(out)
    before = sorted(p for p in tmp_path.rglob("*") if out not in p.parents and p != out)
    msg = exchange(rx.addr, hello(name=name.encode()))
    assert msg is not None, "no REFUSE for an invalid sender name"
    assert "name" in msg.lower(), msg
    assert_refused_on_stderr(rx, ["name"])
    assert sorted(p for p in tmp_path.rglob("*") if out not in p.parents and p != out) == before
    assert not out.exists() or os.listdir(out) == []
    still_serves(rx, tmp_path)


@pytest.mark.deadline(60)
def test_token_receiver_challenges_and_refuses_a_bad_mac(start_receiver, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    rx = start_receiver(tmp_path / "out", None, "--token-file", token)
    with connect(rx.addr) as s:
        s.sendall(hello(name=b"mallory"))
        s.settimeout(10)
        data = b""
        while not read_frames(data):
            chunk = s.recv(65536)
            assert chunk, "connection closed instead of a CHALLENGE"
            data += chunk
        msg_type, body = read_frames(data)[0]
        assert msg_type == CHALLENGE, f"expected CHALLENGE (2) from a token receiver, got {msg_type}"
        assert len(body) >= 16, f"challenge nonce too short: {len(body)} bytes"
        s.sendall(frame(AUTH, b"\x00" * 32))
        data, _ = read_until_closed(s, 10)
    frames = read_frames(data)
    assert frames, "no answer to a wrong AUTH"
    assert frames[0][0] == REFUSE, f"wrong AUTH answered with type {frames[0][0]}"
    assert "authentication failed" in decode_refuse(frames[0][1])[1]
    assert_refused_on_stderr(rx, ["authentication failed"])


# ------------------------------------------------------------------ mutual authentication (version 2)

def recv_frame(s, buf=b""):
    """(type, body, rest) of the next complete frame on socket s."""
    while True:
        frames = read_frames(buf)
        if frames:
            t, body = frames[0]
            return t, body, buf[4 + 1 + len(body):]
        chunk = s.recv(65536)
        assert chunk, "peer closed the connection"
        buf += chunk


class Proxy:
    """A TCP man in the middle between a sender and a receiver that rewrites the sender's first frame."""

    def __init__(self, target, rewrite):
        import threading
        self.target, self.rewrite = target, rewrite
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import threading
        c, _ = self.listener.accept()
        r = connect(self.target)
        t, body, rest = recv_frame(c)
        r.sendall(frame(t, self.rewrite(body)) + rest)

        def pump(a, b):
            try:
                while True:
                    d = a.recv(65536)
                    if not d:
                        break
                    b.sendall(d)
            except OSError:
                pass
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=pump, args=(r, c), daemon=True).start()
        pump(c, r)


def add_device(hello):
    """The HELLO with device 9 added to its device list (re-encoded as a proxy would)."""
    off = 4 + 2
    off += 1 + hello[off]                                   # protocol
    off += 2 + struct.unpack_from("<H", hello, off)[0]      # options
    off += 4 + 4 + 1 + 1 + 1                                # blocks, block size, transport, rdma transport, offers
    off += 1 + hello[off]                                   # host id
    off += 1 + hello[off]                                   # shm domain
    off += 1 + hello[off]                                   # name
    n = struct.unpack_from("<H", hello, off)[0]
    devices = hello[off + 2:off + 2 + 2 * n]
    return hello[:off] + struct.pack("<H", n + 1) + devices + struct.pack("<H", 9) + hello[off + 2 + 2 * n:]


@pytest.mark.deadline(60)
def test_a_proxy_that_adds_a_device_to_an_authenticated_hello_is_refused(start_receiver, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    rx = start_receiver(tmp_path / "out", None, "--token-file", token)
    proxy = Proxy(rx.addr, add_device)
    f = make_files(tmp_path / "src", [4000], "p")
    p = run_send(proxy.addr, "--name", "proxied", "--token-file", token, "--file", f"0={f[0]}", check=False)
    assert p.returncode == 1, f"an altered hello was accepted: exit {p.returncode} {p.stderr}"
    assert "authentication failed" in p.stderr, p.stderr
    assert_refused_on_stderr(rx, ["authentication failed"])
    assert not (tmp_path / "out" / "proxied").exists()
    # The same sender straight to the receiver is fine: the MAC, not the token, failed.
    run_send(rx.addr, "--name", "direct", "--token-file", token, "--file", f"0={f[0]}")
    assert_device(tmp_path / "out", "direct", 0, f)


@pytest.mark.deadline(60)
def test_a_sender_with_a_token_refuses_a_receiver_without_one(start_receiver, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    rx = start_receiver(tmp_path / "out")
    f = make_files(tmp_path / "src", [4000], "t")
    p = run_send(rx.addr, "--name", "careful", "--token-file", token, "--file", f"0={f[0]}", check=False)
    assert p.returncode == 1, f"a sender with a token streamed to an unauthenticated receiver: {p.stderr}"
    assert "did not ask for the token" in p.stderr, p.stderr
    assert not (tmp_path / "out" / "careful" / "device-0").exists(), "data reached the receiver"


@pytest.mark.deadline(60)
def test_a_sender_refuses_a_receiver_that_cannot_prove_the_token(tmp_path):
    # A fake receiver: it challenges, ignores the answer, and accepts with a made-up proof.
    import threading
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    seen = []

    def fake():
        c, _ = listener.accept()
        with c:
            t, body, rest = recv_frame(c)
            seen.append(t)
            c.sendall(frame(CHALLENGE, os.urandom(32)))
            t, body, rest = recv_frame(c, rest)
            seen.append(t)
            # shm, no rdma transport, no offers, an empty reason; address, set-up, a made-up proof
            accept = bytes([1, 0, 0]) + str16(b"") + struct.pack("<I", 4) + b"addr" + struct.pack("<I", 0) + \
                bytes([32]) + os.urandom(32)
            c.sendall(frame(ACCEPT, accept))
            try:
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    seen.extend(f[0] for f in read_frames(d))
            except OSError:
                pass

    th = threading.Thread(target=fake, daemon=True)
    th.start()
    f = make_files(tmp_path / "src", [100], "x")
    p = run_send(f"127.0.0.1:{listener.getsockname()[1]}", "--name", "victim", "--token-file", token,
                 "--file", f"0={f[0]}", check=False)
    th.join(10)
    assert p.returncode == 1, f"sender trusted an unproven receiver: {p.stderr}"
    assert "not signed with the token" in p.stderr, p.stderr
    assert seen[:2] == [HELLO, AUTH], seen
    assert SETUP not in seen, "the sender went on with its set-up after a bad proof"


# ------------------------------------------------------------------ sender groups (lanes)

def open_lane(addr, **kw):
    """A raw connection whose HELLO the receiver accepted (ACCEPT read); the socket stays open."""
    s = connect(addr)
    s.sendall(hello(**kw))
    t, body, _ = recv_frame(s)
    return s, t, body


@pytest.mark.deadline(60)
def test_two_senders_with_one_name_and_group_are_not_merged(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    first, t, _ = open_lane(rx.addr, name=b"twin", group=0, lane=0, lanes=2, devices=(0,))
    assert t == ACCEPT, f"the first lane was not accepted (type {t})"
    try:
        # Same name, same (documented) group 0, same lane: another sender, not a second lane of this one.
        s, t, body = open_lane(rx.addr, name=b"twin", group=0, lane=0, lanes=2, devices=(1,))
        s.close()
        assert t == REFUSE and "lane 0" in decode_refuse(body)[1], (t, body)
        # The other lane number, but a device the first lane already has.
        s, t, body = open_lane(rx.addr, name=b"twin", group=0, lane=1, lanes=2, devices=(0,))
        s.close()
        assert t == REFUSE and "device 0" in decode_refuse(body)[1], (t, body)
        # Another name may use group 0 too: ids are the sender's own, not global.
        s, t, body = open_lane(rx.addr, name=b"other", group=0, lane=0, lanes=1, devices=(0,))
        s.close()
        assert t == ACCEPT, (t, body)
    finally:
        first.close()
    still_serves(rx, tmp_path)


@pytest.mark.deadline(60)
def test_a_hello_that_lists_a_device_twice_is_refused(start_receiver, tmp_path):
    """One device twice in one HELLO would give it two streams into one directory. The rule is the
    datagram engine's too (engine/hello_rules.h): one message, whichever engine judges the hello."""
    rx = start_receiver(tmp_path / "out")
    s, t, body = open_lane(rx.addr, name=b"twice", devices=(3, 7, 3))
    s.close()
    assert t == REFUSE, f"a hello listing device 3 twice was not refused (type {t})"
    assert "device 3 is listed twice" in decode_refuse(body)[1], body
    still_serves(rx, tmp_path)


@pytest.mark.deadline(60)
def test_a_sender_of_many_lanes_declares_at_most_4096_devices_in_all(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    first, t, _ = open_lane(rx.addr, name=b"many", group=5, lane=0, lanes=2, devices=tuple(range(4096)))
    assert t == ACCEPT
    try:
        s, t, body = open_lane(rx.addr, name=b"many", group=5, lane=1, lanes=2, devices=(5000,))
        s.close()
        assert t == REFUSE and "more than 4096 devices" in decode_refuse(body)[1], (t, body)
    finally:
        first.close()


# ------------------------------------------------------------------ FIN (issue 19, item 6)

def connected_lane(addr, devices):
    """A raw sender through HELLO, ACCEPT, SETUP and READY (status_byte: the receiver never reaches into the
    sender, so an empty SETUP is enough); the socket stays open."""
    s, t, body = open_lane(addr, name=b"counter", devices=devices)
    assert t == ACCEPT, (t, body)
    setup = struct.pack("<I", 0) + struct.pack("<I", 0) + bytes([0])
    s.sendall(frame(SETUP, setup))
    t, body, _ = recv_frame(s)
    assert t == READY, (t, body)
    return s


def fin_ack_of(s):
    s.settimeout(15)
    t, body, rest = recv_frame(s)
    while t == KEEPALIVE:  # the receiver's, every second it has sent nothing else (version 8)
        assert body == b"", body
        t, body, rest = recv_frame(s, rest)
    assert t == FIN_ACK, (t, body)
    ok, stored, mlen = struct.unpack("<BQH", body[:11])
    return ok, stored, body[11:11 + mlen].decode()


@pytest.mark.deadline(60)
def test_a_fin_whose_counts_wrap_is_answered_missing_not_all_stored(start_receiver, tmp_path):
    """Two devices counted 2^63 messages each: the sum wrapped to 0 and the receiver answered "all stored" having
    stored nothing."""
    rx = start_receiver(tmp_path / "out")
    with connected_lane(rx.addr, (0, 1)) as s:
        s.sendall(frame(FIN, struct.pack("<H", 2) + struct.pack("<HQ", 0, 1 << 63) + struct.pack("<HQ", 1, 1 << 63)))
        ok, stored, message = fin_ack_of(s)
    assert (ok, stored) == (0, 0), (ok, stored, message)
    assert "did not arrive" in message, message
    line = rx.stdout.wait_for(r"^sender counter ", 10)[1]
    assert " lost: " in line, line


@pytest.mark.deadline(60)
def test_a_fin_that_counts_an_undeclared_device_ends_the_session(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    with connected_lane(rx.addr, (0,)) as s:
        s.sendall(frame(FIN, struct.pack("<H", 1) + struct.pack("<HQ", 5, 1)))
        data, closed = read_until_closed(s, 10)
    assert closed and not any(t == FIN_ACK for t, _ in read_frames(data)), data
    rx.stderr.wait_for(r"device 5, which this connection did not declare", 10)
    still_serves(rx, tmp_path)

