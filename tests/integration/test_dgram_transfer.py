"""The datagram transport at 0 % loss: `slotstream recv --transport udp` and `send --transport udp` (and the RC
baseline over TCP) move files and synthetic cameras byte-exact, on loopback and between two network namespaces."""
import fcntl
import hashlib
import json
import os
import pathlib
import re
import subprocess
import time
import urllib.request

import pytest

from conftest import BIN, CHECKSUM, SLOW_WORKER, done_of, make_files, run_verify, wait_until
from dgram_support import DgramReceiver, accounted, check_store, dgram_send, netns_pair

PROTOCOLS = [("write_record", "udp"), ("dgram_send", "udp"), ("dgram_rd", "udp"), ("rd_write_record", "udp"),
             ("dgram_rc", "tcp")]


@pytest.mark.parametrize("protocol,transport", PROTOCOLS)
def test_files_byte_exact_on_loopback(tmp_path, protocol, transport):
    sizes = [0, 1, 1407, 1408, 8192, 8193, 300_000, 2_000_000]
    srcs = make_files(tmp_path / "src", sizes, "m")
    other = make_files(tmp_path / "src", [5000, 70_000], "o")
    rx = DgramReceiver(tmp_path / "out", "--exit-after-senders", 1)
    args = ["--protocol", protocol, "--name", "edge"] + [f"--file=0={p}" for p in srcs] + [f"--file=7={p}" for p in other]
    _, j = dgram_send(rx.addr, *args, transport=transport)
    r = accounted(j)
    assert r["complete"] == len(srcs) + len(other) and r["partial"] == r["dropped"] == r["lost"] == 0
    assert j["protocol"] == protocol and j["transport"] == transport
    (rep,) = rx.finished()
    assert rep["line"].startswith("sender edge finished: messages=10 ")
    assert rep["protocol"] == protocol and rep["crc_errors"] == "0" and rep["lost"] == "0"
    assert rep["transport"] == transport, "the receiver names the transport the protocol runs over"
    assert rx.wait(10) == 0
    assert check_store(tmp_path / "out/edge/device-0", srcs) == (list(range(len(srcs))), [])
    assert check_store(tmp_path / "out/edge/device-7", other) == ([0, 1], [])


def test_synthetic_cameras_verify(tmp_path):
    """Six 320x240x3 cameras at 25 fps, write_record: every frame complete, in order, verified by content."""
    rx = DgramReceiver(tmp_path / "out", "--exit-after-senders", 1)
    _, j = dgram_send(rx.addr, "--name", "cams", "--synthetic", "0-5:25:320x240x3", "--duration", "2")
    r = accounted(j)
    # --duration is wall-clock time: under load the sender skips late frames, so what it sent must arrive
    assert r["complete"] == j["messages"] > 0 and r["lost"] == 0, r
    rx.finished()
    v = run_verify(tmp_path / "out")
    assert v.returncode == 0, v.stdout + v.stderr
    assert f"{j['messages']} frames" in v.stdout, v.stdout


@pytest.mark.deadline(180)
@pytest.mark.parametrize("protocol,transport", PROTOCOLS)
def test_between_two_network_namespaces(tmp_path, protocol, transport):
    """Over a veth pair with a 1500-byte MTU (8 KiB segments are IP-fragmented, as on Ethernet), files and
    synthetic cameras arrive byte-exact."""
    srcs = make_files(tmp_path / "src", [1, 64 * 1024, 1_500_000], "m")
    with netns_pair() as (ns_r, addr_r, ns_s, _):
        rx = DgramReceiver(tmp_path / "out", "--exit-after-senders", 2, ns=ns_r, host=addr_r)
        try:
            dgram_send(rx.addr, "--protocol", protocol, "--name", "files", *[f"--file=0={p}" for p in srcs],
                       ns=ns_s, transport=transport)
            _, j = dgram_send(rx.addr, "--protocol", protocol, "--name", "cams", "--synthetic", "0-3:25:160x120x3",
                              "--duration", "1", ns=ns_s, transport=transport)
            assert accounted(j)["complete"] == j["messages"] > 0  # what was sent (late frames are skipped)
            reps = rx.finished(2)
            assert all("finished:" in r["line"] for r in reps), reps
        finally:
            rx.stop()
    assert check_store(tmp_path / "out/files/device-0", srcs) == ([0, 1, 2], [])
    v = run_verify(tmp_path / "out/cams")
    assert v.returncode == 0, v.stdout + v.stderr


def test_metrics_count_sessions_and_datagrams(tmp_path):
    rx = DgramReceiver(tmp_path / "out", "--metrics", "127.0.0.1:0")
    _, line = rx.stderr.wait_for(r"metrics on http://", 10)
    url = line.split()[-1]
    srcs = make_files(tmp_path / "src", [100_000, 10], "m")
    dgram_send(rx.addr, "--name", "m1", *[f"--file=2={p}" for p in srcs])
    rx.finished()
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'slotstream_messages_total{sender="m1",device="2"} 2' in text
    assert 'slotstream_dgram_lost_total{sender="m1",device="2"} 0' in text
    assert re.search(r'slotstream_dgram_datagrams_total\{sender="m1"\} (\d+)', text)
    assert 'slotstream_dgram_crc_errors_total{sender="m1"} 0' in text
    assert "slotstream_sessions_ended_total 1" in text
    rx.stop()


def test_resumed_sender_continues_numbering(tmp_path):
    srcs = make_files(tmp_path / "src", [10, 20], "m")
    rx = DgramReceiver(tmp_path / "out")
    dgram_send(rx.addr, "--name", "again", f"--file=0={srcs[0]}")
    dgram_send(rx.addr, "--name", "again", f"--file=0={srcs[1]}")
    rx.finished(2)
    rx.stop()
    assert sorted(os.listdir(tmp_path / "out/again/device-0")) == ["0000000000.bin", "0000000001.bin"]
    assert (tmp_path / "out/again/device-0/0000000001.bin").read_bytes() == srcs[1].read_bytes()


def test_refusals_are_clear(tmp_path):
    big = make_files(tmp_path / "src", [300_000], "big")[0]
    rx = DgramReceiver(tmp_path / "out", "--max-message", 100_000)
    p, _ = dgram_send(rx.addr, "--name", "toolarge", f"--file=0={big}", check=False)
    assert p.returncode == 1 and "receiver refused" in p.stderr and "--max-message" in p.stderr, p.stderr
    # The RC baseline over UDP, and a UCX protocol over udp, are usage errors before anything is sent.
    p, _ = dgram_send(rx.addr, "--protocol", "dgram_rc", f"--file=0={big}", check=False)
    assert p.returncode == 2 and "--transport tcp" in p.stderr
    p, _ = dgram_send(rx.addr, "--protocol", "status_byte", f"--file=0={big}", check=False)
    assert p.returncode == 2 and "UCX" in p.stderr
    rx.stop()
    # Nothing listening: the sender says so quickly (ICMP port unreachable), not after a long wait.
    t0 = time.monotonic()
    p, _ = dgram_send(rx.addr, f"--file=0={big}", check=False)
    assert p.returncode == 1 and "nothing listens" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 5


def test_usage_errors(tmp_path):
    f = make_files(tmp_path, [10], "x")[0]
    cases = [
        ([BIN, "recv", "--listen", "127.0.0.1:0", "--out", tmp_path, "--partial", "keep"], "--partial"),
        ([BIN, "recv", "--listen", "127.0.0.1:0", "--discard", "--transport", "udp", "--worker", "true"], "--worker"),
        ([BIN, "recv", "--listen", "127.0.0.1:0", "--out", tmp_path, "--transport", "udp", "--rdma-device", "x"],
         "--rdma-device"),
        ([BIN, "recv", "--listen", "127.0.0.1:0", "--out", tmp_path, "--transport", "udp", "--hold-block", "x"],
         "--hold-block"),
        ([BIN, "recv", "--listen", "127.0.0.1:0", "--out", tmp_path, "--transport", "udp", "--partial", "maybe"], "--partial"),
        ([BIN, "recv", "--listen", "127.0.0.1:0", "--out", tmp_path, "--transport", "udp", "--inject-loss", "x"], "--inject-loss"),
        ([BIN, "send", "--to", "127.0.0.1:9", "--transport", "udp", "--block-size", "100", "--file", f"0={f}"], "--block-size"),
        ([BIN, "send", "--to", "127.0.0.1:9", "--inject-corrupt", "5", "--file", f"0={f}"], "--inject-corrupt"),
        ([BIN, "send", "--to", "127.0.0.1:9", "--transport", "udp", "--segment-size", "10", "--file", f"0={f}"], "--segment-size: 10 B is below the least, 64 B"),
        ([BIN, "send", "--to", "127.0.0.1:9", "--transport", "tcp", "--protocol", "dgram_rc", "--inject-loss", "1",
          "--file", f"0={f}"], "fault injection"),
    ]
    for argv, needle in cases:
        p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=20)
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert needle in p.stderr, (argv, p.stderr)


def test_receiver_gone_mid_stream(tmp_path):
    """A receiver killed while a UD sender streams: the sender stops with an error instead of sending into the
    void (ICMP port unreachable on its connected socket), well before its FIN deadline."""
    rx = DgramReceiver(tmp_path / "out")
    sender = subprocess.Popen([BIN, "send", "--to", rx.addr, "--transport", "udp", "--name", "doomed", "--synthetic",
                               "0:25:64x64x3", "--duration", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    time.sleep(1.0)
    rx.sigkill()
    rx.wait(10)
    try:
        _, err = sender.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        sender.kill()
        raise AssertionError("sender did not notice its receiver died")
    assert sender.returncode == 1 and "gone" in err, err


def test_a_name_is_one_session_and_a_dead_senders_name_can_be_reused(tmp_path):
    """A second sender under a live sender's name is refused; once the first has died (SIGKILL: it cannot say so
    over UDP) and been silent for a second, a restarted sender takes its name over and numbers on after what the
    first one stored."""
    rx = DgramReceiver(tmp_path / "out")
    first = subprocess.Popen([BIN, "send", "--to", rx.addr, "--transport", "udp", "--name", "cam", "--synthetic",
                              "0:25:64x64x3", "--duration", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        p, _ = dgram_send(rx.addr, "--name", "cam", "--synthetic", "0:25:64x64x3", "--duration", "1", check=False)
        assert p.returncode == 1 and "already connected" in p.stderr, p.stderr
    finally:
        first.kill()
        first.wait(10)
    time.sleep(1.5)  # silent long enough to be replaced; anything of it still in flight is stored by now
    stored = len(os.listdir(tmp_path / "out/cam/device-0"))
    assert stored > 0
    _, j = dgram_send(rx.addr, "--name", "cam", "--synthetic", "0:25:64x64x3", "--duration", "1")
    assert accounted(j)["complete"] == j["messages"] > 0  # what was sent (late frames are skipped)
    lost, fin = rx.finished(2)
    assert "lost:" in lost["line"] and "replaced" in lost["line"], lost["line"]
    assert "finished:" in fin["line"]
    rx.stop()
    names = sorted(os.listdir(tmp_path / "out/cam/device-0"))
    n = j["messages"]
    assert len(names) == stored + n and names[-1] == f"{stored + n - 1:010d}.bin"
    assert run_verify(tmp_path / "out").returncode == 0


def test_workers_process_every_message_of_a_datagram_sender(tmp_path):
    """recv --transport udp runs the per-device workers as the block receiver does (issue 23: it used to refuse
    --worker): every stored message is handed to its device's worker once, in order."""
    srcs = make_files(tmp_path / "src", [1000 + i for i in range(8)], "m")
    out = tmp_path / "out"
    rx = DgramReceiver(out, "--worker", CHECKSUM, "--keep-processed")
    _, j = dgram_send(rx.addr, "--protocol", "dgram_rd", "--name", "w", *[f"--file={d}={p}" for d in (0, 3) for p in srcs])
    assert accounted(j)["complete"] == 16
    for d in (0, 3):
        w = out / "w" / f"worker-{d}"
        wait_until(lambda: done_of(w) == len(srcs) - 1, 20, f"worker {d}")
        for i, src in enumerate(srcs):
            r = json.loads((w / "results" / f"{i:010d}.json").read_text())
            assert r["seq"] == i and r["device"] == d and r["bytes"] == 1000 + i
            assert r["sha256"] == hashlib.sha256(pathlib.Path(src).read_bytes()).hexdigest()
    rx.stop()


def test_a_slow_worker_pauses_its_device_and_rd_holds_the_sender_back(tmp_path):
    """--backlog-messages over udp: a device whose worker is behind pauses (counted in
    slotstream_device_pauses_total); dgram_rd's sender is held back by credits, so nothing is dropped."""
    srcs = make_files(tmp_path / "src", [2000] * 20, "m")
    out = tmp_path / "out"
    rx = DgramReceiver(out, "--worker", SLOW_WORKER, "--backlog-messages", 2, "--keep-processed",
                       "--metrics", "127.0.0.1:0")
    _, line = rx.stderr.wait_for(r"metrics on http://", 10)
    url = line.split()[-1]
    _, j = dgram_send(rx.addr, "--protocol", "dgram_rd", "--name", "slow", *[f"--file=0={p}" for p in srcs])
    r = accounted(j)
    assert r["complete"] == 20 and r["dropped"] == 0
    wait_until(lambda: done_of(out / "slow" / "worker-0") == 19, 20, "the slow worker")
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r'slotstream_device_pauses_total\{sender="slow",device="0"\} (\d+)', text)
    assert m and int(m.group(1)) >= 1, text
    rx.stop()


@pytest.mark.deadline(120)
def test_the_receiver_serves_on_while_nobody_reads_its_stdout(tmp_path):
    """`recv --transport udp` printed each session's line from its network thread, the thread that also answers
    every sender: once its stdout pipe was full and nobody read it, the next sender got no answer at all. The lines
    now leave from a thread of their own; they wait there, none lost, and senders are served meanwhile."""
    src = make_files(tmp_path / "src", [10], "m")[0]
    err_path = tmp_path / "recv.err"
    with open(err_path, "w") as err:
        rx = subprocess.Popen([BIN, "recv", "--transport", "udp", "--listen", "127.0.0.1:0", "--discard"],
                              stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    try:
        fcntl.fcntl(rx.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # one page: some twenty session lines fill it
        # `listening on HOST:PORT`, and nothing more read from here on
        addr = os.read(rx.stdout.fileno(), 200).decode().splitlines()[0].split()[-1]
        senders = 60
        for i in range(senders):
            p, _ = dgram_send(addr, "--name", f"s{i}", f"--file=0={src}", timeout=30, check=False)
            assert p.returncode == 0, f"sender {i} of {senders}: {p.stderr}\nreceiver:\n{err_path.read_text()}"
        rx.terminate()
        out, _ = rx.communicate(timeout=30)
    finally:
        rx.kill()
        rx.wait()
    finished = re.findall(r"^sender (s\d+) finished:", out.decode(), re.M)
    assert sorted(finished) == sorted(f"s{i}" for i in range(senders)), out.decode()[-2000:]
