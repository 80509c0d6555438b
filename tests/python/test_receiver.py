"""slotstream.Receiver fed by real `slotstream send` processes over shm and tcp: messages arrive complete and in
order per device as (sender, device, seq, memoryview), by iterator or callback; a raising callback stops the
receiver and its exception reaches the caller; the examples and the type stubs are checked too."""
import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import slotstream
from integration_helpers import BIN, TRANSPORTS, make_files, run_send, run_send_json, seq_name, synthetic_slots

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "python"


def file_args(device, paths):
    return [x for p in paths for x in ("--file", f"{device}={p}")]


def receive_from_cli(transport, send_args, dev0, dev7):
    """Runs `slotstream send` of dev0's files to device 0 and dev7's to device 7 into a Receiver on `transport`;
    returns what the Receiver yielded (in its order), what it should be (by device, then seq), and its sessions."""
    with slotstream.Receiver("127.0.0.1:0", transport=transport, exit_after_senders=1) as rx:
        sender = subprocess.Popen([BIN, "send", "--to", rx.address, "--name", "cli", "--transport", transport,
                                   *send_args, *file_args(0, dev0), *file_args(7, dev7)],
                                  stderr=subprocess.PIPE, text=True)
        got = [(s, d, q, bytes(data)) for s, d, q, data in rx]  # ends by itself after the sender's session
        assert sender.wait(30) == 0, sender.stderr.read()
        sessions = rx.sessions()
    want = ([("cli", 0, i, p.read_bytes()) for i, p in enumerate(dev0)] +
            [("cli", 7, i, p.read_bytes()) for i, p in enumerate(dev7)])
    return got, want, sessions


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_iterator_yields_every_message_in_order(tmp_path, transport):
    dev0 = make_files(tmp_path, [0, 1, 70_000, 5000, 300_000], "d0")  # some span several 64 KiB blocks
    dev7 = make_files(tmp_path, [123, 65_536 - 16, 65_536], "d7")
    got, want, sessions = receive_from_cli(transport, ["--block-size", "65536"], dev0, dev7)
    assert sorted(got, key=lambda m: (m[1], m[2])) == want
    per_device = {d: [q for _, dd, q, _ in got if dd == d] for d in (0, 7)}
    assert per_device == {0: list(range(5)), 7: list(range(3))}, "per-device order"
    assert len(sessions) == 1 and sessions[0]["finished"] and sessions[0]["messages"] == 8
    assert sessions[0]["transport"] == transport and sessions[0]["sender"] == "cli"


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_callback_sees_frames_it_may_keep(tmp_path, transport):
    kept = []

    def on_message(sender, device, seq, data):
        assert isinstance(data, memoryview)
        kept.append((sender, device, seq, data, hashlib.sha256(data).hexdigest()))

    with slotstream.Receiver("127.0.0.1:0", on_message, transport=transport) as rx:
        # --duration is wall-clock time: under load the sender skips frames it could not produce in time, so
        # what must arrive is exactly what it says it sent.
        summary = run_send_json(rx.address, "--name", "cams", "--transport", transport,
                                "--synthetic", "0-2:200:640x480x3", "--duration", "0.1")
        sent = synthetic_slots(summary, range(3), 200, 0.1)
        assert rx.wait(1, timeout=20)
    assert len(kept) == summary["messages"]
    # The views were kept past their callbacks and the receiver's blocks were reused meanwhile: each
    # view is the message's own copy, still equal to what arrived (and writable, for in-place work).
    for sender, device, seq, data, sha in kept:
        assert hashlib.sha256(data).hexdigest() == sha
        assert bytes(data[:8]) == b"SSYNTH01"
        assert int.from_bytes(data[8:12], "little") == device and int.from_bytes(data[12:16], "little") == seq
    frame = np.frombuffer(kept[0][3], np.uint8).reshape(480, 640, 3)
    frame[0, 0, 0] ^= 0xFF
    assert sorted((d, q) for _, d, q, _, _ in kept) == [(d, q) for d in range(3) for q in range(sent[d])]


@pytest.mark.deadline(60)
def test_a_raising_callback_stops_the_receiver_and_reaches_the_caller(tmp_path):
    seen = []

    def fragile(sender, device, seq, data):
        seen.append(seq)
        if seq == 2:
            raise ArithmeticError("checksum worker failed on message 2")

    files = make_files(tmp_path, [1000] * 10, "m")
    rx = slotstream.Receiver("127.0.0.1:0", fragile)
    sender = subprocess.run([BIN, "send", "--to", rx.address, "--name", "victim", *file_args(0, files)],
                            capture_output=True, text=True, timeout=30)
    assert sender.returncode != 0, "the sender must learn that the receiver stopped"
    assert "receiver" in sender.stderr, sender.stderr
    with pytest.raises(ArithmeticError, match="failed on message 2"):
        rx.wait(1, timeout=20)
    rx.close()  # raised once; closing again is quiet
    assert seen == [0, 1, 2], "nothing is delivered after the callback raised"


@pytest.mark.deadline(60)
def test_messages_of_a_reconnecting_sender_continue_its_sequence(tmp_path):
    files = make_files(tmp_path, [10, 20, 30], "r")
    with slotstream.Receiver("127.0.0.1:0", exit_after_senders=2) as rx:
        for part in (files[:2], files[2:]):
            run_send(rx.address, "--name", "again", *file_args(4, part))
        got = [(q, bytes(data)) for _, _, q, data in rx]
    assert got == [(i, p.read_bytes()) for i, p in enumerate(files)]


@pytest.mark.deadline(60)
@pytest.mark.parametrize("protocol", ["write_record", "dgram_rd"])
def test_udp_receiver_yields_every_message_byte_exact(tmp_path, protocol):
    """transport="udp": the datagram engine behind the same Receiver (Receiver refused udp before)."""
    dev0 = make_files(tmp_path, [0, 1, 1408, 70_000, 300_000], "d0")
    dev7 = make_files(tmp_path, [123, 8193], "d7")
    got, want, sessions = receive_from_cli("udp", ["--protocol", protocol, "--segment-size", "1408"], dev0, dev7)
    assert sorted(got, key=lambda m: (m[1], m[2])) == want
    assert len(sessions) == 1 and sessions[0]["finished"] and sessions[0]["messages"] == 7
    assert sessions[0]["transport"] == "udp" and sessions[0]["sender"] == "cli"


def test_udp_receiver_refuses_zero_copy():
    with pytest.raises(slotstream.InvalidArgument, match="zero-copy"):
        slotstream.Receiver("127.0.0.1:0", transport="udp", zero_copy=True)


def test_receiver_errors_are_exceptions():
    with pytest.raises(slotstream.InvalidArgument, match="HOST:PORT"):
        slotstream.Receiver("nowhere")
    with pytest.raises(slotstream.InvalidArgument, match="transport must be"):
        slotstream.Receiver("127.0.0.1:0", transport="carrier-pigeon")
    with pytest.raises(TypeError, match="callable"):
        slotstream.Receiver("127.0.0.1:0", callback=42)
    with slotstream.Receiver("127.0.0.1:0") as first:
        with pytest.raises(slotstream.Error, match="in use|bind"):
            slotstream.Receiver(first.address)
    with slotstream.Receiver("127.0.0.1:0", lambda *a: None) as rx:
        with pytest.raises(slotstream.InvalidArgument, match="callback"):
            next(iter(rx))
        with pytest.raises(slotstream.InvalidArgument, match="senders=N"):
            rx.wait()
        assert rx.wait(1, timeout=0.2) is False
    with slotstream.Receiver("127.0.0.1:0") as idle:
        pass
    assert list(idle) == [], "a closed receiver's iteration ends"


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_examples_camera_sender_to_checksum_receiver(tmp_path, transport):
    worker = subprocess.Popen([sys.executable, str(EXAMPLES / "checksum_receiver.py"), "--senders", "1",
                               "--transport", transport], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = worker.stdout.readline()
    assert first.startswith("listening on "), first + worker.stderr.read()
    addr = first.split()[-1]
    cams = subprocess.run([sys.executable, str(EXAMPLES / "camera_sender.py"), "--to", addr, "--name", "example",
                           "--transport", transport, "--cameras", "3", "--fps", "0", "--frames", "4"],
                          capture_output=True, text=True, timeout=60)
    assert cams.returncode == 0, cams.stderr
    summary = json.loads(cams.stdout)
    assert summary["frames"] == 12 and summary["transport"] == transport
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert sorted((m["device"], m["seq"]) for m in lines) == [(d, k) for d in range(3) for k in range(4)]
    # camera_sender stamps frame k's first 8 bytes with k on a fixed random image per camera.
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(3)]
    for m in lines:
        img = images[m["device"]].copy()
        img.reshape(-1)[:8] = np.frombuffer(m["seq"].to_bytes(8, "little"), np.uint8)
        assert m["sha256"] == hashlib.sha256(img).hexdigest() and m["bytes"] == img.nbytes
    assert '"finished": true' in err


def test_the_package_ships_type_stubs():
    pkg = pathlib.Path(slotstream.__file__).parent
    assert (pkg / "py.typed").exists()
    stub = (pkg / "_slotstream.pyi").read_text()
    compile(stub, "_slotstream.pyi", "exec")  # valid Python syntax
    assert ("def send(self, device: int, data: Buffer | numpy.typing.NDArray[Any], *, timeout: float | None = None) "
            "-> None") in stub
    assert "def get(self, *, timeout: float | None = None)" in stub
    assert "def __next__(self) -> tuple[str, int, int, memoryview | MessageView]" in stub
    assert "class Receiver" in stub and "class Sender" in stub and "class MessageView" in stub
    assert "zero_copy: bool = False" in stub
    assert slotstream.__version__ == _cmake_version()


def _cmake_version():
    import re
    text = (REPO / "CMakeLists.txt").read_text()
    return re.search(r"project\(slotstream VERSION ([0-9.]+)", text).group(1)


def test_the_package_namespace_is_its_api():
    # `dir(slotstream)` showed `annotations` (a __future__ import) and `atexit`: helpers are underscored.
    public = {n for n in dir(slotstream) if not n.startswith("_")}
    assert public == set(slotstream.__all__), public ^ set(slotstream.__all__)
    assert {n for n in dir(slotstream.errors) if not n.startswith("_")} >= {"Error", "error_class"}
    assert "annotations" not in dir(slotstream.errors)


def test_protocols_are_listed():
    names = [n for n, _ in slotstream.protocols()]
    assert "status_byte" in names and "sliding_window" in names


@pytest.mark.parametrize("kwargs,needle", [
    ({"exit_after_senders": -1}, "exit_after_senders -1 is not in range 0.."),
    ({"max_queue": 0}, "max_queue 0 is not in range 1.."),
    ({"max_held_blocks": -2}, "max_held_blocks -2 is not in range 0..4294967295"),
])
def test_a_negative_or_out_of_range_number_is_invalid_argument_naming_the_range(kwargs, needle):
    # Negative numbers used to give nanobind's multi-line "incompatible function arguments" TypeError.
    with pytest.raises(slotstream.InvalidArgument, match=needle):
        slotstream.Receiver("127.0.0.1:0", **kwargs)
