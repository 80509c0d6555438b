"""Many idle, authenticated senders on one receiver, without a UCX process each (issue 19, item 8).

Each is a raw control connection that does the whole handshake of wire/control.h — HELLO, the token's CHALLENGE and
AUTH, ACCEPT, a signed SETUP, READY — for a status_byte sender on shared memory, then stays connected and silent: to
the receiver it is an accepted sender whose blocks never fill (status_byte's receiver never reaches into its sender,
so no UCX endpoint is needed on this side). Used by tests/integration/test_idle.py and, for the 1,000-sender
measurement in docs/hardening.md:
    python3 tests/integration/idle_senders.py --senders 1000 --seconds 10 [--bin PATH]
(starts `recv --discard --token-file`, opens the senders, prints the receiver's CPU share and RSS as JSON)."""
import argparse
import hashlib
import hmac
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_control import (ACCEPT, AUTH, CHALLENGE, READY, SETUP, VERSION, frame, hello_body,  # noqa: E402
                          recv_frame)


def proof(token, label, *parts):
    """net::proof (src/net/auth.h): HMAC-SHA256(token, "slotstream-auth-v2" | u8 label | u32-length-prefixed parts)."""
    msg = b"slotstream-auth-v2" + bytes([len(label)]) + label
    for p in parts:
        msg += len(p).to_bytes(4, "little") + p
    return hmac.new(token, msg, hashlib.sha256).digest()


def host_id():
    """The receiver's host id on this machine (common.cc host_id()): with it the hello asks for shared memory."""
    boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}@{socket.gethostname()}".encode()


def shm_domain():
    """This host's shared-memory domain as the receiver computes it (common.cc shm_domain())."""
    return f"ipc={os.stat('/proc/self/ns/ipc').st_ino},uid={os.geteuid()}".encode()


def open_sender(addr, token, name, blocks=2, block_size=4096, transport=1, version=VERSION):
    """An authenticated, connected, silent status_byte sender: the socket, after READY."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=20)
    nonce = os.urandom(32)
    body = hello_body(name=name.encode(), blocks=blocks, block_size=block_size, transport=transport,
                      host=host_id(), nonce=nonce, version=version, shm_domain=shm_domain())
    if version <= 2:  # the layout before version 3's flags and 4's rdma fields: to measure older receivers
        body = hello_v2(body, name, blocks, block_size, transport, nonce)
    s.sendall(frame(1, body))
    t, challenge, rest = recv_frame(s)
    assert t == CHALLENGE, f"expected CHALLENGE, got {t}"
    s.sendall(frame(AUTH, proof(token, b"sender-hello", challenge, nonce, body)))
    t, accept, rest = recv_frame(s, rest)
    assert t == ACCEPT, f"expected ACCEPT, got {t}: {accept[:200]!r}"
    signed = (0).to_bytes(4, "little") + (0).to_bytes(4, "little")  # no worker address, no protocol set-up
    s.sendall(frame(SETUP, signed + bytes([32]) + proof(token, b"sender-setup", challenge, nonce, signed)))
    t, _, _ = recv_frame(s, rest)
    assert t == READY, f"expected READY, got {t}"
    return s


def hello_v2(body, name, blocks, block_size, transport, nonce):
    """The version-2 HELLO of the same sender (no flags, rdma transport, offers or shm domain)."""
    import struct
    from test_control import str8, str16
    out = b"SLST" + struct.pack("<H", 2) + str8(b"status_byte") + str16(b"")
    out += struct.pack("<IIB", blocks, block_size, transport) + str8(host_id()) + str8(name.encode())
    out += struct.pack("<HH", 1, 0) + struct.pack("<QHH", 0, 0, 1)
    return out + nonce


def cpu_seconds(pid):
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def measure(pid, seconds):
    """(share of one core, RSS MiB) of a process over the next `seconds`."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0), rss_mib(pid)


def main():
    repo = pathlib.Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("SLOTSTREAM_BIN", str(repo / "build" / "slotstream")))
    ap.add_argument("--senders", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--control-version", type=int, default=VERSION, help="to measure an older receiver")
    args = ap.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.senders + 1024)), hard))
    with tempfile.NamedTemporaryFile("w", suffix=".token") as tok:
        tok.write("idle-senders\n")
        tok.flush()
        rx = subprocess.Popen([args.bin, "recv", "--listen", "127.0.0.1:0", "--discard", "--token-file", tok.name],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        addr = rx.stdout.readline().split()[2]
        base_rss = rss_mib(rx.pid)
        t0 = time.monotonic()
        socks = [open_sender(addr, b"idle-senders", f"idle-{i}", version=args.control_version)
                 for i in range(args.senders)]
        opened = time.monotonic() - t0
        time.sleep(1.0)  # every session past its first 100 ms of idleness
        share, rss = measure(rx.pid, args.seconds)
        result = {"senders": len(socks), "handshakes_s": round(opened, 1), "cpu_share": round(share, 4),
                  "rss_mib": round(rss, 1), "rss_before_mib": round(base_rss, 1), "threads": threads(rx.pid),
                  "seconds": args.seconds}
        for s in socks:
            s.close()
        rx.kill()
        rx.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
