"""libslotstream_udp.so carries unmodified programs from Debian packages (socat, iperf3, ffmpeg, sipp, and
python3's socket module for the flag-by-flag semantics) over the datagram RDMA format."""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from dgram_support import SHIM

pytestmark = pytest.mark.skipif(not SHIM.exists(), reason=f"{SHIM} not built (bash scripts/build.sh)")


def need(tool):
    if not shutil.which(tool):
        pytest.skip(f"{tool} is not installed (scripts/setup.sh installs it from Debian)")


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shim_env(log, port=None, **extra):
    env = dict(os.environ, LD_PRELOAD=str(SHIM), SLOTSTREAM_UDP_LOG=str(log))
    if port:
        env["SLOTSTREAM_UDP_PORTS"] = str(port)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def counters(log):
    """Per-process counter lines of the shim's log: a list of dicts."""
    rows = []
    for line in pathlib.Path(log).read_text().splitlines():
        rows.append({k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)})
    return rows


def total(log, key):
    return sum(r.get(key, 0) for r in counters(log))


# ------------------------------------------------------------------ socat


def socat_transfer(tmp_path, data, send_env, recv_env, block=1000):
    need("socat")
    port = free_udp_port()
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    rx = subprocess.Popen(["socat", "-u", "-T", "1", f"UDP-RECV:{port},bind=127.0.0.1,rcvbuf=8388608",
                           f"CREATE:{dst}"], env=recv_env, stderr=subprocess.PIPE)
    time.sleep(0.3)
    tx = subprocess.run(["socat", "-u", "-b", str(block), f"FILE:{src}", f"UDP-SENDTO:127.0.0.1:{port}"],
                        env=send_env, capture_output=True, timeout=30)
    assert tx.returncode == 0, tx.stderr
    rx.wait(timeout=30)
    return dst.read_bytes() if dst.exists() else b"", port


def test_socat_file_byte_exact(tmp_path):
    log = tmp_path / "shim.log"
    data = os.urandom(300_000)
    got, _ = socat_transfer(tmp_path, data, shim_env(log), shim_env(log))
    assert got == data
    assert total(log, "wrapped") == 300 and total(log, "unwrapped") == 300
    assert total(log, "dropped_crc") == 0


def test_corrupted_datagrams_are_dropped_like_bad_checksums(tmp_path):
    """The sender's shim flips a bit in 10 % of its datagrams after computing the CRC: the receiver's shim
    drops exactly those, and socat writes only intact 1000-byte records."""
    log = tmp_path / "shim.log"
    records = [f"{i:06d}".encode() * (1000 // 6) + b"\n" * (1000 % 6) for i in range(300)]
    got, _ = socat_transfer(tmp_path, b"".join(records),
                            shim_env(log, SLOTSTREAM_UDP_INJECT_CORRUPT=10, SLOTSTREAM_UDP_INJECT_SEED=4),
                            shim_env(log))
    corrupted = total(log, "injected_corrupt")
    assert corrupted > 10
    assert total(log, "dropped_crc") == corrupted
    assert len(got) == 1000 * (300 - corrupted)
    received = [got[i:i + 1000] for i in range(0, len(got), 1000)]
    assert all(r in records for r in received), "a corrupted record was delivered"
    assert received == sorted(received), "records out of order"


def test_a_receiver_without_the_shim_sees_the_wrapping(tmp_path):
    """Shimmed traffic is not plain data: an unshimmed receiver gets the segment, header and CRC included."""
    need("socat")
    log = tmp_path / "shim.log"
    port = free_udp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as plain:
        plain.bind(("127.0.0.1", port))
        plain.settimeout(5)
        p = subprocess.run(["socat", "-u", "STDIN", f"UDP-SENDTO:127.0.0.1:{port}"], input=b"hello, world",
                           env=shim_env(log), capture_output=True, timeout=20)
        assert p.returncode == 0, p.stderr
        d = plain.recv(65536)
    assert d != b"hello, world"
    assert d[:3] == b"SD\x02" and len(d) == 12 + 12 + len(b"hello, world") + 4
    assert d[5] == 0 and d[4] & 0x0F == 3  # UD, Send
    assert d[24:-4] == b"hello, world"


def test_a_shimmed_receiver_drops_plain_datagrams(tmp_path):
    """...and the other way round: unwrapped datagrams fail the CRC and are dropped, never handed over."""
    log = tmp_path / "shim.log"
    port = free_udp_port()
    script = textwrap.dedent(f"""
        import socket, sys
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", {port}))
        s.settimeout(3)
        print("ready", flush=True)
        print(s.recv(100).decode(), flush=True)
    """)
    rx = subprocess.Popen([sys.executable, "-c", script], env=shim_env(log), stdout=subprocess.PIPE, text=True)
    assert rx.stdout.readline().strip() == "ready"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as plain:
        for _ in range(3):
            plain.sendto(b"plain text, not a slotstream segment: " * 3, ("127.0.0.1", port))
    time.sleep(0.2)
    sender = subprocess.run([sys.executable, "-c", f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                             f".sendto(b'wrapped', ('127.0.0.1', {port}))"], env=shim_env(log), timeout=20)
    assert sender.returncode == 0
    out, _ = rx.communicate(timeout=10)
    assert out.splitlines()[-1] == "wrapped"
    assert total(log, "dropped_crc") == 3


# ------------------------------------------------------------------ socket semantics, call by call

SEMANTICS = r"""
import errno, json, os, select, socket, sys
PORT, PORT2 = int(sys.argv[1]), int(sys.argv[2])
r = {}
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", PORT))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.connect(("127.0.0.1", PORT))
# send/recv, MSG_PEEK leaves the datagram queued
tx.send(b"abcdef")
r["peek"] = rx.recv(100, socket.MSG_PEEK).decode()
r["after_peek"] = rx.recv(100).decode()
# MSG_TRUNC: a short buffer gets the start and the flag; with MSG_TRUNC in flags the real length
tx.send(b"0123456789")
data, anc, flags, addr = rx.recvmsg(4)
r["trunc_data"] = data.decode()
r["trunc_flag"] = bool(flags & socket.MSG_TRUNC)
tx.send(b"0123456789")
r["trunc_len"] = len(rx.recv(4, socket.MSG_PEEK | socket.MSG_TRUNC))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(4)
r["trunc_return"] = libc.recv(rx.fileno(), buf, 4, socket.MSG_TRUNC)
# sendmsg with several buffers, recvmsg_into scatter, recvfrom address
tx.sendmsg([b"ab", b"cd", b"ef"])
b1, b2 = bytearray(3), bytearray(10)
n, _, _, addr = rx.recvmsg_into([b1, b2])
r["scatter"] = [n, bytes(b1).decode(), bytes(b2[:n - 3]).decode()]
r["from_port"] = addr[1] == tx.getsockname()[1]
# sendto on an unconnected socket, recvfrom
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"to", ("127.0.0.1", PORT))
d, a = rx.recvfrom(10)
r["sendto"] = [d.decode(), a[1] == u.getsockname()[1]]
# write/read, writev/readv through os on a connected pair
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.bind(("127.0.0.1", PORT2))
d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
d.connect(("127.0.0.1", PORT2))
c.connect(d.getsockname())
os.write(d.fileno(), b"via write")
r["read"] = os.read(c.fileno(), 100).decode()
os.writev(d.fileno(), [b"via ", b"writev"])
b3 = bytearray(20)
n = os.readv(c.fileno(), [b3])
r["readv"] = bytes(b3[:n]).decode()
# poll/select see the real descriptor; a non-blocking read of a bad datagram is EAGAIN, not garbage
rx.setblocking(False)
import subprocess
subprocess.run([sys.executable, "-c", f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'junk, not a segment' * 4, ('127.0.0.1', {PORT}))"], env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
readable, _, _ = select.select([rx], [], [], 2)
r["select_readable"] = bool(readable)
try:
    rx.recv(100)
    r["bad_datagram"] = "delivered"
except BlockingIOError:
    r["bad_datagram"] = "EAGAIN"
rx.setblocking(True)
# dup2 and fork keep working on the same descriptor
tx.send(b"dup")
fd = os.dup(rx.fileno())
r["dup"] = os.read(fd, 10).decode()
pid = os.fork()
if pid == 0:
    tx.send(b"from child")
    os._exit(0)
os.waitpid(pid, 0)
r["fork"] = rx.recv(100).decode()
# EMSGSIZE where the headers no longer fit in one datagram (65507 - 28 bytes is the most)
try:
    tx.send(b"x" * (65507 - 28 + 1))
    r["emsgsize"] = "sent"
except OSError as e:
    r["emsgsize"] = errno.errorcode[e.errno]
tx.send(b"y" * (65507 - 28))
r["largest"] = len(rx.recv(70000))
# a port outside SLOTSTREAM_UDP_PORTS is left alone
other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
other.bind(("127.0.0.1", 0))
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.sendto(b"untouched", other.getsockname())
r["other_port"] = other.recv(100).decode()
print(json.dumps(r))
"""


def test_socket_semantics_call_by_call(tmp_path):
    log = tmp_path / "shim.log"
    port, port2 = free_udp_port(), free_udp_port()
    # Only these two ports are wrapped, so that the last check can see one that is not.
    p = subprocess.run([sys.executable, "-c", SEMANTICS, str(port), str(port2)], env=shim_env(log, f"{port},{port2}"),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["peek"] == "abcdef" and r["after_peek"] == "abcdef"
    assert r["trunc_data"] == "0123" and r["trunc_flag"]
    assert r["trunc_len"] == 10 and r["trunc_return"] == 10
    assert r["scatter"] == [6, "abc", "def"]
    assert r["from_port"]
    assert r["sendto"] == ["to", True]
    assert r["read"] == "via write" and r["readv"] == "via writev"
    assert r["select_readable"] and r["bad_datagram"] == "EAGAIN"
    assert r["dup"] == "dup" and r["fork"] == "from child"
    assert r["emsgsize"] == "EMSGSIZE" and r["largest"] == 65507 - 28
    assert r["other_port"] == "untouched"
    assert total(log, "dropped_crc") == 1 and total(log, "emsgsize") == 1 and total(log, "passed") >= 1


def test_malformed_settings_stop_the_program(tmp_path):
    p = subprocess.run([sys.executable, "-c", "print('ran')"], env=shim_env(tmp_path / "log", "5000-"),
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "ran" not in p.stdout and "SLOTSTREAM_UDP_PORTS" in p.stderr


# ------------------------------------------------------------------ iperf3, ffmpeg, sipp


def free_tcp_and_udp_port():
    """A port number free for both TCP and UDP (iperf3 uses one number for its control connection and its
    datagrams)."""
    for _ in range(50):
        port = free_udp_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no port free for both TCP and UDP")


def iperf3_udp_run(log):
    """One iperf3 UDP test through the shim at 5 % injected loss: (client result, server JSON, server stderr)."""
    port = free_tcp_and_udp_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(port), "--json"],
                           env=shim_env(log, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    cli = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-u", "-b", "20M", "-l", "1400", "-w", "4M",
                          "-t", "3", "--json"],
                         env=shim_env(log, port, SLOTSTREAM_UDP_INJECT_LOSS=5, SLOTSTREAM_UDP_INJECT_SEED=8),
                         capture_output=True, text=True, timeout=40)
    out, err = srv.communicate(timeout=30)
    return cli, json.loads(out), err


@pytest.mark.deadline(90)
def test_iperf3_loss_matches_the_injected_rate(tmp_path):
    need("iperf3")
    # iperf3 3.12's server once (1 CI run in ~20; 0 in 150 runs here) ended its JSON with an error and no
    # results while its client exited 0. The error text is kept; a second attempt is made only when iperf3
    # itself reports one, and a second error fails the test.
    errors = []
    for attempt in range(2):
        log = tmp_path / f"shim-{attempt}.log"
        cli, report, err = iperf3_udp_run(log)
        assert cli.returncode == 0, cli.stderr + cli.stdout[-500:]
        if "sum" in report.get("end", {}):
            break
        errors.append(f"attempt {attempt}: iperf3 server error {report.get('error')!r}, stderr {err[-300:]!r}")
        print(errors[-1])
    else:
        pytest.fail("; ".join(errors))
    s = report["end"]["sum"]
    injected = total(log, "injected_loss")
    assert s["packets"] > 5000
    # iperf3 counts sequence gaps; the shim counts what it dropped. Every injected loss is among iperf3's
    # (the last few datagrams' fate can fall outside its window); a busy machine may add a few real ones
    # (a full socket buffer), never many.
    assert injected - 3 <= s["lost_packets"] <= injected + s["packets"] // 100 + 3, (s, injected)
    assert 4.0 < s["lost_percent"] < 6.5, s
    assert total(log, "dropped_crc") == 0


ENCODE = ["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25:duration=2", "-c:v", "mpeg2video", "-q:v", "4",
          "-g", "25", "-bf", "0", "-flags", "+bitexact", "-fflags", "+bitexact"]


def frame_md5s(text):
    return [line.rsplit(",", 1)[-1].strip() for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.deadline(90)
def test_ffmpeg_mpegts_over_the_shim_decodes_identically(tmp_path):
    """An mpegts test pattern streamed over udp:// through the shim at 0 % loss decodes to frames with the
    same checksums as a direct encode of the same pattern."""
    need("ffmpeg")
    log = tmp_path / "shim.log"
    direct = tmp_path / "direct.ts"
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", *ENCODE, "-f", "mpegts", str(direct)], check=True, timeout=60)
    want = frame_md5s(subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(direct), "-f", "framemd5", "-"],
                                     capture_output=True, text=True, check=True, timeout=60).stdout)
    port = free_udp_port()
    rx = subprocess.Popen(["ffmpeg", "-v", "error", "-nostdin", "-i",
                           f"udp://127.0.0.1:{port}?timeout=2000000&fifo_size=1000000&overrun_nonfatal=1",
                           "-f", "framemd5", "-"], env=shim_env(log, port), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    tx = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-re", *ENCODE, "-f", "mpegts",
                         f"udp://127.0.0.1:{port}?pkt_size=1316"], env=shim_env(log, port), capture_output=True,
                        text=True, timeout=60)
    assert tx.returncode == 0, tx.stderr
    out, err = rx.communicate(timeout=30)
    got = frame_md5s(out)
    assert len(want) == 50
    assert got == want, f"{len(got)} frames decoded; stderr: {err[-500:]}"
    assert total(log, "wrapped") > 0 and total(log, "unwrapped") == total(log, "wrapped")


def sipp(args, env, timeout):
    return subprocess.run(["sipp", "-nostdin", *args], env=env, cwd=env.get("SIPP_CWD"), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.deadline(60)
def test_sipp_uac_uas_over_the_shim(tmp_path):
    need("sipp")
    log = tmp_path / "shim.log"
    uas_port, uac_port = free_udp_port(), free_udp_port()
    env = shim_env(log, f"{uas_port},{uac_port}", SIPP_CWD=str(tmp_path))
    uas = subprocess.Popen(["sipp", "-nostdin", "-sn", "uas", "-i", "127.0.0.1", "-p", str(uas_port), "-m", "30"],
                           env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    uac = sipp(["-sn", "uac", f"127.0.0.1:{uas_port}", "-i", "127.0.0.1", "-p", str(uac_port), "-m", "30", "-r", "50",
                "-timeout", "20s"], env, 40)
    uas.wait(timeout=20)
    assert uac.returncode == 0, uac.stdout[-1500:] + uac.stderr[-500:]
    assert uas.returncode == 0, uas.stderr
    # 30 calls: INVITE, ACK, BYE out of the client; 180, 200, 200 out of the server.
    assert total(log, "wrapped") >= 30 * 6 and total(log, "dropped_crc") == 0


@pytest.mark.deadline(60)
def test_sipp_server_without_the_shim_refuses_shimmed_calls(tmp_path):
    need("sipp")
    log = tmp_path / "shim.log"
    uas_port, uac_port = free_udp_port(), free_udp_port()
    plain = dict(os.environ)
    uas = subprocess.Popen(["sipp", "-nostdin", "-sn", "uas", "-i", "127.0.0.1", "-p", str(uas_port), "-timeout", "8s"],
                           env=plain, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        uac = sipp(["-sn", "uac", f"127.0.0.1:{uas_port}", "-i", "127.0.0.1", "-p", str(uac_port), "-m", "3",
                    "-timeout", "4s", "-timeout_error"], shim_env(log, f"{uas_port},{uac_port}", SIPP_CWD=str(tmp_path)),
                   30)
    finally:
        uas.kill()
        uas.wait(10)
    assert uac.returncode != 0, "a SIP server without the shim answered shimmed calls"
    assert total(log, "unwrapped") == 0
