"""Bad input and faults: clear errors, nothing lost, the receiver keeps serving."""
import os
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import BIN, TRANSPORTS, read_line, send, seq_name

MAGIC = b"SLST"


def frame(msg_type, body):
    return struct.pack("<IB", len(body) + 1, msg_type) + body


def hello(magic=MAGIC, version=1, protocol=b"status_byte", blocks=4, block_size=4096, transport=0,
          name=b"raw", devices=(0,)):
    body = magic + struct.pack("<H", version) + bytes([len(protocol)]) + protocol
    body += struct.pack("<IIB", blocks, block_size, transport)
    body += bytes([4]) + b"host" + bytes([len(name)]) + name
    body += struct.pack("<H", len(devices)) + b"".join(struct.pack("<H", d) for d in devices)
    body += struct.pack("<QHH", 1, 0, 1)
    return frame(1, body)


def exchange(addr, payload, close_early=False):
    """Sends raw bytes to the control port; returns the REFUSE message, '' if closed without."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(payload)
        if close_early:
            return ""
        s.settimeout(10)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
    if len(data) < 5:
        return ""
    length, msg_type = struct.unpack("<IB", data[:5])
    assert msg_type == 5, f"expected REFUSE, got type {msg_type}"
    code, mlen = struct.unpack("<HH", data[5:9])
    return data[9:9 + mlen].decode()


def still_serves(rx, tmp_path, name="after"):
    f = tmp_path / f"{name}.bin"
    f.write_bytes(os.urandom(5000))
    send(rx.addr, "--name", name, "--file", f"0={f}")


@pytest.mark.parametrize("payload,expect", [
    (hello(magic=b"XXXX"), "magic"),
    (hello(version=9), "version"),
    (hello(protocol=b"nope"), "unknown protocol"),
    (hello(block_size=10), "geometry"),
    (hello(name=b"../x"), "invalid sender name"),
    (hello(devices=()), "devices"),
    (frame(1, b"\x00\x01garbage"), "magic"),
    (b"\xff\xff\xff\xff" + b"x" * 16, "frame length"),
    (frame(1, hello()[5:-6]), "truncated"),
    (hello()[:-6], "no valid hello"),  # the frame never completes: the 5 s deadline
])
def test_bad_hello_is_refused_and_receiver_keeps_serving(receiver, tmp_path, payload, expect):
    rx = receiver("--out", tmp_path / "out")
    msg = exchange(rx.addr, payload)
    assert expect in msg, f"refusal {msg!r} does not mention {expect!r}"
    still_serves(rx, tmp_path)
    _, _, err = rx.stop()
    assert "refused" in err and expect in err


def test_truncated_hello_then_close(receiver, tmp_path):
    rx = receiver("--out", tmp_path / "out")
    exchange(rx.addr, hello()[:10], close_early=True)
    time.sleep(0.2)
    still_serves(rx, tmp_path)
    _, _, err = rx.stop()
    assert "refused" in err


@pytest.mark.parametrize("name", ["../x", "a/b", ".", "..", ".hidden", ""])
def test_invalid_sender_names_are_refused(receiver, tmp_path, name):
    out = tmp_path / "out"
    rx = receiver("--out", out)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x")
    p = send(rx.addr, "--name", name, "--file", f"0={f}", check=False)
    assert p.returncode != 0
    assert "name" in p.stderr.decode()
    assert not (tmp_path / "x").exists()
    assert not out.exists() or os.listdir(out) == []


def test_token_authentication(receiver, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("guess\n")
    out = tmp_path / "out"
    rx = receiver("--out", out, "--token-file", token)
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(1000))
    for extra in (["--token-file", wrong], []):
        p = send(rx.addr, "--name", "intruder", "--file", f"0={f}", *extra, check=False)
        assert p.returncode == 1
        assert "authentication failed" in p.stderr.decode()
    send(rx.addr, "--name", "friend", "--file", f"0={f}", "--token-file", token)
    assert not (out / "intruder").exists()
    _, _, err = rx.stop()
    assert "authentication failed" in err


def test_name_in_use_is_refused(receiver, tmp_path):
    rx = receiver("--out", tmp_path / "out")
    first = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "cam", "--synthetic", "0:25:64x64x3",
                              "--duration", "3"], stderr=subprocess.PIPE)
    time.sleep(0.7)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x")
    p = send(rx.addr, "--name", "cam", "--file", f"0={f}", check=False)
    assert p.returncode == 1
    assert "already connected" in p.stderr.decode()
    assert first.wait(timeout=20) == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_receiver_killed_sender_exits_quickly(receiver, tmp_path, transport):
    rx = receiver("--out", tmp_path / "out", "--transport", transport)
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "cams", "--transport", transport,
                           "--synthetic", "0-3:25:320x240x3", "--duration", "10"], stderr=subprocess.PIPE)
    time.sleep(1.0)
    rx.proc.kill()
    killed = time.monotonic()
    rc = tx.wait(timeout=10)
    waited = time.monotonic() - killed
    assert rc == 1
    assert waited < 2.0, f"sender took {waited:.2f} s to notice"
    assert "receiver" in tx.stderr.read().decode()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sender_killed_mid_message_keeps_complete_ones(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport)
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "big", "--transport", transport,
                           "--block-size", "65536", "--blocks", "4", "--synthetic", "0-1:50:1000x1000x3",
                           "--duration", "10"], stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    tx.kill()
    tx.wait(timeout=10)
    line = read_line(rx.proc, 10)
    assert line.startswith("sender big lost: kept "), line
    for d in (0, 1):
        names = os.listdir(out / "big" / f"device-{d}")
        assert all(not n.startswith(".") for n in names), f"temporary files left: {names}"
    v = subprocess.run([BIN, "verify", str(out)], capture_output=True, timeout=60)
    assert v.returncode == 0, v.stderr.decode()
    still_serves(rx, tmp_path)


def test_disk_full_back_pressures_without_loss(receiver, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        rx = receiver("--out", mnt)
        src = tmp_path / "m.bin"
        src.write_bytes(os.urandom(700_000))
        tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "f", "--block-size", "65536",
                               "--blocks", "8"] + ["--file", f"0={src}"] * 6, stderr=subprocess.PIPE)
        dev = mnt / "f" / "device-0"
        taken, deadline = 0, time.monotonic() + 60
        stalled_seen = False
        while taken < 6 and time.monotonic() < deadline:
            name = dev / seq_name(taken)
            if name.exists():
                assert name.read_bytes() == src.read_bytes()
                if taken == 1:
                    # The disk holds two messages at most: the sender must be waiting, not done.
                    time.sleep(0.5)
                    stalled_seen = tx.poll() is None
                name.unlink()  # a consumer frees space
                taken += 1
            else:
                time.sleep(0.05)
        assert taken == 6, "not every message arrived"
        assert tx.wait(timeout=20) == 0
        assert stalled_seen, "the sender finished while the disk was full"
        _, _, err = rx.stop()
        assert "No space left" in err
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


@pytest.mark.parametrize("args,needle", [
    ([], "nothing to send"),
    (["--synthetic", "0-1:x:1x1x1", "--duration", "1"], "--synthetic"),
    (["--file", "0=/nonexistent"], "not a readable"),
    (["--file", "70000=/etc/hostname"], "device number"),
    (["--block-size", "10", "--file", "0=/etc/hostname"], "block size"),
    (["--transport", "ib", "--file", "0=/etc/hostname"], "transport"),
])
def test_send_usage_errors(args, needle):
    p = subprocess.run([BIN, "send", "--to", "127.0.0.1:1", *args], capture_output=True, timeout=20)
    assert p.returncode == 2, p.stderr.decode()
    assert needle in p.stderr.decode()


def test_recv_unusable_out_dir(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = subprocess.run([BIN, "recv", "--listen", "127.0.0.1:0", "--out", str(f / "sub")], capture_output=True,
                       timeout=20)
    assert p.returncode == 1
    assert "output directory" in p.stderr.decode()
