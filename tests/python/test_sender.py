"""slotstream.Sender against a real `slotstream recv`, over shm and tcp: numpy frames arrive byte-exact,
every buffer type is read in place, errors are Python exceptions with the library's message, and a
blocked send() lets other Python threads run."""
import hashlib
import json
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import slotstream
from integration_helpers import BIN, LOST_RE, TRANSPORTS, parse_finished, seq_name, tree

FRAME = (480, 640, 3)


def digest(data):
    return hashlib.sha256(data).hexdigest()


def stored(out, sender, device, seq):
    return (out / sender / f"device-{device}" / seq_name(seq)).read_bytes()


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_numpy_camera_frames_arrive_byte_exact(start_receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = start_receiver(out, transport, "--exit-after-senders", 1)
    rng = np.random.default_rng(1)
    cameras, frames = 12, 4
    sent = {}  # (device, seq) -> sha256 of what was sent
    with slotstream.Sender(rx.addr, name="py-cams", transport=transport, devices=range(cameras)) as tx:
        assert tx.transport == transport and tx.devices == list(range(cameras))
        frame = rng.integers(0, 256, FRAME, dtype=np.uint8)
        for k in range(frames):
            for cam in range(cameras):
                frame[0, 0, 0], frame[-1, -1, -1] = k, cam  # the same array, changed in place between sends
                tx.send(cam, frame)
                sent[cam, k] = digest(frame.tobytes())
        stats = tx.stats()
    assert stats["messages"] == cameras * frames and stats["bytes"] == cameras * frames * frame.nbytes
    report = parse_finished(rx.stdout.next_line(15))
    assert report["messages"] == cameras * frames and report["gaps"] == 0
    for (cam, k), want in sent.items():
        assert digest(stored(out, "py-cams", cam, k)) == want, f"camera {cam} frame {k} differs"
    assert len(tree(out)) == cameras * frames


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_buffer_type_is_sent_as_its_bytes(start_receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = start_receiver(out, transport, "--exit-after-senders", 1)
    big = np.arange(300_000, dtype=np.float32)         # larger than a block: fragmented and reassembled
    payloads = [b"", b"bytes", bytearray(b"bytearray"), memoryview(b"0123456789")[2:7], big,
                np.arange(10, dtype=np.int64)[::1], array_module_buffer()]
    with slotstream.Sender(rx.addr, name="py-bufs", transport=transport, block_size=65536, devices=[3]) as tx:
        for p in payloads:
            tx.send(3, p)
        with pytest.raises(ValueError, match="C-contiguous"):
            tx.send(3, np.arange(24).reshape(4, 6)[:, ::2])  # strided: not one run of bytes
        with pytest.raises(ValueError, match="C-contiguous"):
            tx.send(3, np.asfortranarray(np.arange(12).reshape(3, 4)))  # one run, but not in C order
        with pytest.raises(TypeError, match="bytes-like"):
            tx.send(3, "text is not bytes")
        with pytest.raises(slotstream.InvalidArgument, match="device 4 was not declared"):
            tx.send(4, b"x")
    parse_finished(rx.stdout.next_line(15))
    for seq, p in enumerate(payloads):
        assert stored(out, "py-bufs", 3, seq) == bytes(memoryview(p).cast("B")), f"payload {seq} ({type(p).__name__})"
    assert len(tree(out)) == len(payloads), "a rejected send() must send nothing"


@pytest.mark.deadline(90)
@pytest.mark.parametrize("protocol", ["write_record", "dgram_rd"])
def test_udp_frames_arrive_byte_exact(start_receiver, tmp_path, protocol):
    """transport="udp": the datagram engine behind the same Sender (Sender refused udp before)."""
    out = tmp_path / "out"
    rx = start_receiver(out, "udp", "--exit-after-senders", 1)
    rng = np.random.default_rng(3)
    sent = {}  # (device, seq) -> the bytes sent
    with slotstream.Sender(rx.addr, name="py-udp", transport="udp", protocol=protocol, devices=[0, 5],
                           segment_size=1408, max_message=1 << 20) as tx:
        assert tx.transport == "udp" and tx.protocol == protocol
        for k in range(5):
            for cam in (0, 5):
                frame = rng.integers(0, 256, 200_000 + 1000 * k + cam, dtype=np.uint8)
                tx.send(cam, frame)
                sent[cam, k] = frame.tobytes()
        tx.send(5, b"")  # an empty message is a message
        sent[5, 5] = b""
        tx.finish()
        stats = tx.stats()
    assert stats["messages"] == len(sent) and stats["bytes"] == sum(map(len, sent.values()))
    # What the receiver made of every message, as it said at finish() (its FIN_ACK).
    assert stats["delivered"] == {0: {"complete": 5, "partial": 0, "dropped": 0, "lost": 0,
                                      "valid_bytes": sum(len(v) for (d, _), v in sent.items() if d == 0)},
                                  5: {"complete": 6, "partial": 0, "dropped": 0, "lost": 0,
                                      "valid_bytes": sum(len(v) for (d, _), v in sent.items() if d == 5)}}
    report = rx.stdout.next_line(15)
    assert report.startswith("sender py-udp finished: messages=11 "), report
    for (cam, k), want in sent.items():
        assert stored(out, "py-udp", cam, k) == want, f"device {cam} message {k} differs"
    assert len(tree(out)) == len(sent)


@pytest.mark.deadline(30)
def test_udp_refuses_what_the_datagram_transport_cannot_do(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out", "udp")
    with pytest.raises(slotstream.InvalidArgument, match="rdma options"):
        slotstream.Sender(rx.addr, name="n", transport="udp", rdma_transport="rc")
    with pytest.raises(slotstream.InvalidArgument, match="protocol dgram_rc runs over tcp"):
        slotstream.Sender(rx.addr, name="n", transport="udp", protocol="dgram_rc")
    with slotstream.Sender(rx.addr, name="small", transport="udp", max_message=1000) as tx:
        with pytest.raises(slotstream.InvalidArgument, match="message of 1001 B is larger than the declared 1000 B"):
            tx.send(0, b"x" * 1001)  # larger than it announced: the receiver's regions are that size
        tx.send(0, b"y" * 1000)  # the connection goes on
    assert (tmp_path / "out" / "small" / "device-0" / seq_name(0)).read_bytes() == b"y" * 1000


def array_module_buffer():
    import array
    return array.array("d", [1.5, -2.25, 1e300])


@pytest.mark.deadline(60)
def test_connection_errors_are_exceptions_with_the_librarys_message(start_receiver, tmp_path):
    # Nothing listens on port 1.
    with pytest.raises(slotstream.ConnectFailed, match=r"cannot connect to 127\.0\.0\.1:1") as e:
        slotstream.Sender("127.0.0.1:1")
    assert isinstance(e.value, ConnectionError) and e.value.code == "connect failed"

    tcp_only = start_receiver(tmp_path / "a", "tcp")
    with pytest.raises(slotstream.Refused, match="only accepts transport tcp") as e:
        slotstream.Sender(tcp_only.addr, name="wrong-transport", transport="shm")
    assert e.value.code == "refused"

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    guarded = start_receiver(tmp_path / "b", None, "--token-file", token)
    with pytest.raises(slotstream.AuthFailed, match="requires a token"):
        slotstream.Sender(guarded.addr, name="no-token")
    with pytest.raises(slotstream.AuthFailed, match="wrong token"):
        slotstream.Sender(guarded.addr, name="bad-token", token="guess")
    with slotstream.Sender(guarded.addr, name="good-token", token="s3cret") as tx:
        tx.send(0, b"authenticated")
    assert (tmp_path / "b" / "good-token" / "device-0" / seq_name(0)).read_bytes() == b"authenticated"


@pytest.mark.parametrize("kwargs, match", [
    ({"to": "no-port"}, "HOST:PORT"),
    ({"to": "127.0.0.1:1", "transport": "udp", "protocol": "status_byte"}, "protocol status_byte runs over UCX"),
    ({"to": "127.0.0.1:1", "transport": "udp", "block_size": 4096}, "block_size does not apply to the datagram"),
    ({"to": "127.0.0.1:1", "transport": "udp", "segment_size": 10}, "segment_size 10 B is below the least, 64 B"),
    ({"to": "127.0.0.1:1", "transport": "tcp", "segment_size": 1408}, "datagram options .* apply to transport udp"),
    ({"to": "127.0.0.1:1", "transport": "ib"}, "transport must be 'auto', 'shm', 'tcp', 'rdma' or 'udp'"),
    ({"to": "127.0.0.1:1", "transport": "rdma", "rdma_transport": "xrc"}, "rdma_transport must be 'rc', 'dc' or 'ud'"),
    ({"to": "127.0.0.1:1", "name": "has space"}, "sender name may only contain"),
    ({"to": "127.0.0.1:1", "name": "n", "block_size": 8}, r"block_size 8 B is below the least, 64 B"),
    ({"to": "127.0.0.1:1", "name": "n", "protocol": "nope"}, "unknown protocol 'nope'"),
    ({"to": "127.0.0.1:1", "name": "n", "devices": []}, "no devices declared"),
    ({"to": "127.0.0.1:1", "name": "n", "devices": [1, 1]}, "declared twice"),
    ({"to": "127.0.0.1:1", "name": "n", "devices": [70000]}, r"not in 0\.\.65535"),
])
def test_bad_options_raise_invalid_argument(kwargs, match):
    with pytest.raises(slotstream.InvalidArgument, match=match) as e:
        slotstream.Sender(**kwargs)
    assert isinstance(e.value, ValueError)


def host_has_rdma():
    return any(t["available"] for t in json.loads(subprocess.run([BIN, "transports", "--json"], capture_output=True,
                                                                 text=True, timeout=30).stdout) if t["name"] == "rdma")


@pytest.mark.deadline(30)
def test_rdma_without_a_device_is_invalid_argument_before_connecting():
    if host_has_rdma():
        pytest.skip("this host has an RDMA device")
    # Nothing listens on port 1: the error is the missing device, found before any connection.
    t0 = time.monotonic()
    with pytest.raises(slotstream.InvalidArgument, match=r"^transport rdma: no RDMA device .*; use --transport tcp") as e:
        slotstream.Sender("127.0.0.1:1", name="n", transport="rdma")
    assert time.monotonic() - t0 < 2 and isinstance(e.value, ValueError)
    with pytest.raises(slotstream.InvalidArgument, match=r"^transport rdma: no RDMA device"):
        slotstream.Receiver("127.0.0.1:0", transport="rdma")


@pytest.mark.deadline(60)
def test_the_sender_says_which_transport_and_why(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    with slotstream.Sender(rx.addr, name="why") as tx:
        assert tx.transport == "shm"
        assert tx.transport_reason == "shm: sender and receiver share this host and its shared memory"
    with slotstream.Sender(rx.addr, name="why-tcp", transport="tcp") as tx:
        assert tx.transport == "tcp" and tx.transport_reason == "tcp: the sender asked for it"


@pytest.mark.deadline(60)
def test_send_after_finish_and_finish_twice(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out", "shm")
    tx = slotstream.Sender(rx.addr, name="once")
    tx.send(0, b"one")
    tx.finish()
    tx.finish()  # idempotent
    assert tx.closed and tx.stats()["messages"] == 1
    with pytest.raises(slotstream.InvalidArgument, match="finished or closed"):
        tx.send(0, b"two")


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_leaving_the_block_by_an_exception_abandons_and_keeps_it(start_receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = start_receiver(out, transport)
    with pytest.raises(KeyError, match="camera unplugged"):
        with slotstream.Sender(rx.addr, name="quitter", transport=transport, devices=[0]) as tx:
            for i in range(3):
                tx.send(0, bytes([i]) * 1000)
            time.sleep(0.3)  # let the receiver store them before the connection goes
            raise KeyError("camera unplugged")
    assert tx.closed
    line = rx.stdout.next_line(15)
    assert LOST_RE.match(line), f"the receiver should report the sender lost: {line!r}"
    assert [stored(out, "quitter", 0, i) for i in range(3)] == [bytes([i]) * 1000 for i in range(3)]


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_receiver_killed_raises_peer_gone(start_receiver, tmp_path, transport):
    rx = start_receiver(tmp_path / "out", transport)
    frame = np.zeros(FRAME, np.uint8)
    tx = slotstream.Sender(rx.addr, name="orphan", transport=transport, devices=[0], blocks=4)
    tx.send(0, frame)
    rx.signal(signal.SIGKILL)
    deadline = time.monotonic() + 20
    with pytest.raises(slotstream.PeerGone) as e:
        while time.monotonic() < deadline:  # sends may still land in free blocks until the death is noticed
            tx.send(0, frame)
        tx.finish()
    assert isinstance(e.value, ConnectionError)
    assert re.search(r"receiver|die", str(e.value)), str(e.value)
    tx.close()


@pytest.mark.deadline(60)
def test_a_stopped_receiver_raises_peer_gone_after_the_stall_timeout(start_receiver, tmp_path):
    """A receiver stopped with SIGSTOP says nothing, not even the keepalive a live one sends every second:
    after stall_timeout a blocked send() raises PeerGone instead of waiting for ever (issue 35)."""
    rx = start_receiver(tmp_path / "out", "shm")
    tx = slotstream.Sender(rx.addr, name="patient", transport="shm", devices=[0], blocks=2, block_size=4096,
                           stall_timeout=2.5)
    tx.send(0, bytes(3000))
    rx.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(slotstream.PeerGone, match=r"said nothing for 2\.\d s.*stopped, hung"):
            for _ in range(1000):
                tx.send(0, bytes(3000))
        assert time.monotonic() - t0 < 2.5 + 1.5
    finally:
        rx.signal(signal.SIGCONT)
        tx.close()
    for bad in (-1, 0.5, float("nan")):
        with pytest.raises(slotstream.InvalidArgument, match="stall"):
            slotstream.Sender(rx.addr, name="bad", devices=[0], stall_timeout=bad)


@pytest.mark.deadline(60)
def test_a_blocked_send_releases_the_gil(tmp_path):
    # A Python receiver that is not iterated holds its blocks (max_queue reached): send() blocks.
    # Messages of 3000 bytes take a 4 KiB block each (small ones would share blocks: issue 21's
    # packing, and the receiver copies a paused device's records aside up to its region's size),
    # so the two blocks on each side fill after a few.
    rx = slotstream.Receiver("127.0.0.1:0", transport="shm", max_queue=1, exit_after_senders=1)
    sent = []

    def produce():
        with slotstream.Sender(rx.address, name="blocked", blocks=2, block_size=4096, devices=[0]) as tx:
            for i in range(20):
                tx.send(0, bytes([i]) * 3000)
                sent.append(i)

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(1.0)
    assert producer.is_alive() and len(sent) < 20, "send() should be blocked by the full receiver"
    # This thread ran meanwhile (we are here), and keeps running while the producer waits:
    spins, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 0.3:
        spins += 1
    assert spins > 1000 and producer.is_alive()
    got = [bytes(data) for _, _, _, data in rx]  # drains; ends when the producer's session ends
    producer.join(10)
    rx.close()
    assert got == [bytes([i]) * 3000 for i in range(20)] and sent == list(range(20))


@pytest.mark.parametrize("kwargs,needle", [
    ({"blocks": -1}, "blocks -1 is not in range 1..4096"),
    ({"blocks": 5000}, "blocks 5000 is not in range 1..4096"),
    ({"block_size": -64}, r"block_size -64 B is below the least, 64 B"),
    ({"block_size": 1 << 30}, r"block_size 1 GiB is above the most, 64 MiB"),
])
def test_a_negative_or_out_of_range_number_is_invalid_argument_naming_the_range(kwargs, needle):
    # Checked before connecting (port 1: nothing listens); negative numbers used to be nanobind's TypeError.
    with pytest.raises(slotstream.InvalidArgument, match=needle):
        slotstream.Sender("127.0.0.1:1", name="r", **kwargs)
