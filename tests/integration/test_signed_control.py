"""Control frames after an authenticated handshake are signed (issue 19, item 5; wire/control.h "Signed frames"):
a TCP proxy between a sender and a receiver that both have the token forges a FIN_ACK, injects a PAUSE, or replays
a frame the receiver really sent — each is detected and ends the session with a clear error, instead of a sender
that exits 0 while its last messages were never stored, or a device stalled by a stranger."""
import socket
import struct
import threading
import time

import pytest

from conftest import run_send, send_argv, wait_until
from test_control import FIN, FIN_ACK, READY, connect

PAUSE = 12


class FrameProxy:
    """Relays control frames between one sender and the receiver. `on_frame(proxy, direction, type, body)` sees each
    frame ("s>r" or "r>s", body with any signature trailer) and returns True to forward it; proxy.inject(direction,
    type, body) sends a frame of its own."""

    def __init__(self, target, on_frame):
        self.target, self.on_frame = target, on_frame
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen, self.ready = [], threading.Event()
        self.socks = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def inject(self, direction, msg_type, body):
        with self.lock:
            self.socks[direction].sendall(struct.pack("<IB", len(body) + 1, msg_type) + body)

    def _serve(self):
        client, _ = self.listener.accept()
        server = connect(self.target)
        self.socks = {"s>r": server, "r>s": client}
        threading.Thread(target=self._pump, args=(server, "r>s"), daemon=True).start()
        self._pump(client, "s>r")

    def _pump(self, src, direction):
        buf = b""
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 5:
                    length, msg_type = struct.unpack("<IB", buf[:5])
                    if len(buf) < 4 + length:
                        break
                    body, buf = buf[5:4 + length], buf[4 + length:]
                    self.seen.append((direction, msg_type))
                    if msg_type == READY and direction == "r>s":
                        self.ready_frame = body
                        self.ready.set()
                    if self.on_frame(self, direction, msg_type, body):
                        self.inject(direction, msg_type, body)
        except OSError:
            pass
        for s in self.socks.values():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def token_pair(start_receiver, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    rx = start_receiver(tmp_path / "out", None, "--token-file", token)
    return rx, token


def fin_ack(ok, stored, message):
    text = message.encode()
    return struct.pack("<BQH", 1 if ok else 0, stored, len(text)) + text


@pytest.mark.deadline(60)
def test_a_forged_fin_ack_does_not_make_the_sender_report_success(start_receiver, tmp_path):
    """The proxy keeps the sender's FIN from the receiver and answers it itself with "all stored" (with and without
    a made-up signature): before, the sender exited 0 although the receiver never confirmed anything."""
    rx, token = token_pair(start_receiver, tmp_path)
    for trailer in (b"", bytes(40)):
        def forge(proxy, direction, msg_type, body):
            if direction == "s>r" and msg_type == FIN:
                proxy.inject("r>s", FIN_ACK, fin_ack(True, 50, "all stored") + trailer)
                return False
            return True

        proxy = FrameProxy(rx.addr, forge)
        p = run_send(proxy.addr, "--name", f"forged{len(trailer)}", "--token-file", token,
                     "--synthetic", "0:25:32x32x1", "--duration", 0.4, check=False, timeout=30)
        assert p.returncode == 1, f"the sender trusted a forged FIN_ACK: exit {p.returncode} {p.stderr}"
        assert "authentication" in p.stderr and ("unsigned" in p.stderr or "forged" in p.stderr), p.stderr
        assert ("s>r", FIN) in proxy.seen


def send_injecting(rx, token, name, frame_of):
    """`send` through a proxy that, 0.2 s after READY, sends the sender the frame frame_of(proxy) returns."""
    proxy = FrameProxy(rx.addr, lambda *a: True)

    def inject():
        if proxy.ready.wait(20):
            time.sleep(0.2)
            proxy.inject("r>s", *frame_of(proxy))

    threading.Thread(target=inject, daemon=True).start()
    return run_send(proxy.addr, "--name", name, "--token-file", token, "--synthetic", "0:25:32x32x1",
                    "--duration", 2, check=False, timeout=30)


@pytest.mark.deadline(60)
def test_an_injected_pause_ends_the_session_instead_of_stalling_a_device(start_receiver, tmp_path):
    rx, token = token_pair(start_receiver, tmp_path)
    p = send_injecting(rx, token, "paused", lambda proxy: (PAUSE, struct.pack("<HB", 0, 1)))
    assert p.returncode == 1, f"an injected PAUSE was obeyed or ignored: exit {p.returncode} {p.stderr}"
    assert "authentication" in p.stderr, p.stderr
    # The receiver sees its sender go and ends the session (its report says lost).
    line = rx.stdout.wait_for(r"^sender paused ", 10)[1]
    assert " lost: " in line, line


@pytest.mark.deadline(60)
def test_a_replayed_frame_of_the_receiver_ends_the_session(start_receiver, tmp_path):
    """The receiver's own READY (signed, sequence 0) sent to the sender a second time mid-stream."""
    rx, token = token_pair(start_receiver, tmp_path)
    p = send_injecting(rx, token, "replayed", lambda proxy: (READY, proxy.ready_frame))
    assert p.returncode == 1, f"a replayed frame was accepted: exit {p.returncode} {p.stderr}"
    assert "replayed" in p.stderr, p.stderr


@pytest.mark.deadline(60)
def test_through_an_honest_proxy_the_signed_session_completes(start_receiver, tmp_path):
    rx, token = token_pair(start_receiver, tmp_path)
    proxy = FrameProxy(rx.addr, lambda *a: True)
    run_send(proxy.addr, "--name", "honest", "--token-file", token, "--synthetic", "0:25:32x32x1", "--duration", 0.4)
    assert ("r>s", READY) in proxy.seen and ("r>s", FIN_ACK) in proxy.seen
    line = rx.stdout.wait_for(r"^sender honest ", 10)[1]
    assert " finished: " in line, line
