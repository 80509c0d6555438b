"""Multicast (issue 25; src/engine/dgram/wire/control.h ANNOUNCE): a UD sender to an IP multicast group and three
receivers, each in a network namespace of its own on one bridge. There is no handshake and no FIN_ACK: the sender announces
itself to the group and each receiver stores the same stream with its own accounting."""
import contextlib
import json
import os
import random
import re
import struct
import subprocess
import sys

import pytest

from conftest import BIN, Proc, make_files, wait_until
from dgram_support import (SHIM, DgramReceiver, check_store, dgram_send, in_ns, netns, netns_bridge, nft_dropped,
                           nft_loss)

SEG = 1408


def group():
    """A group and port of this test's own (the namespaces are too, so nothing else listens there)."""
    return f"239.77.{random.randrange(256)}.{random.randrange(1, 255)}", random.randrange(20000, 60000)


def counts(rep):
    return {k: int(rep[k]) for k in ("messages", "partial", "dropped", "lost", "sent")}


def cast(tmp_path, srcs, protocol, loss=0, extra=()):
    """Sends srcs on device 0 to a group with three receivers (loss % dropped on arrival at each); returns the
    sender's json and each receiver's report and store directory."""
    addr, port = group()
    with netns_bridge("mc", 3) as ends:
        (ns_s, _, dev_s), receivers = ends[0], ends[1:]
        rxs = []
        try:
            for i, (ns, _, _) in enumerate(receivers):
                if loss:
                    nft_loss(ns, loss)
                rxs.append(DgramReceiver(tmp_path / f"out{i}", "--exit-after-senders", 1, *extra, ns=ns, host=addr,
                                         port=port))
            _, j = dgram_send(f"{addr}:{port}", "--protocol", protocol, "--name", "cast", "--segment-size", SEG,
                              "--ttl", 2, "--interface", dev_s, *[f"--file=0={p}" for p in srcs], ns=ns_s,
                              timeout=30)
            reports = [rx.finished(timeout=10)[0] for rx in rxs]
            for rx in rxs:
                assert rx.wait(10) == 0
            dropped = [nft_dropped(ns) for ns, _, _ in receivers] if loss else []
        finally:
            for rx in rxs:
                rx.stop()
    return j, reports, [tmp_path / f"out{i}/cast/device-0" for i in range(3)], dropped


@pytest.mark.parametrize("protocol", ["write_record", "dgram_send"])
def test_three_receivers_store_the_same_stream_byte_exact(tmp_path, protocol):
    srcs = make_files(tmp_path / "src", [1, 1408, 30_000, 200_000] * 3, "m")
    j, reports, dirs, _ = cast(tmp_path, srcs, protocol)
    assert j["multicast"] is True and j["receiver"] is None, "a group answers no FIN: no receiver accounting"
    assert j["messages"] == len(srcs)
    for rep, d in zip(reports, dirs):
        assert rep["line"].startswith("sender cast finished: "), rep["line"]
        assert counts(rep) == {"messages": len(srcs), "partial": 0, "dropped": 0, "lost": 0, "sent": len(srcs)}
        assert rep["protocol"] == protocol
        assert check_store(d, srcs) == (list(range(len(srcs))), [])


def test_under_loss_each_receiver_accounts_for_every_message(tmp_path):
    """5 % of the packets arriving at each receiver dropped (each its own): every receiver accounts for every
    message sent exactly once (complete, partial kept, dropped or lost), and what it stored is exact where
    valid."""
    srcs = make_files(tmp_path / "src", [20_000] * 30, "m")
    _, reports, dirs, dropped = cast(tmp_path, srcs, "write_record", loss=5,
                                     extra=("--partial", "keep", "--message-timeout", 100))
    assert all(n > 0 for n in dropped), f"the loss rules dropped nothing somewhere: {dropped}"
    for rep, d in zip(reports, dirs):
        c = counts(rep)
        assert c["sent"] == len(srcs), rep["line"]
        assert c["messages"] + c["partial"] + c["dropped"] + c["lost"] == len(srcs), rep["line"]
        complete, kept = check_store(d, srcs)
        assert (len(complete), len(kept)) == (c["messages"], c["partial"])
    assert any(counts(r)["messages"] < len(srcs) for r in reports), "5 % loss of 15-segment messages broke none"


@pytest.mark.parametrize("args,error", [
    (["--protocol", "dgram_rd"], "239.1.2.3:5000 is a multicast group: it cannot acknowledge datagrams, so dgram_rd"),
    (["--protocol", "rd_write_record"], "so rd_write_record (reliable) cannot send to it"),
    (["--token-file", "TOKEN"], "a multicast group has no handshake, so no token can be proved"),
])
def test_a_reliable_protocol_or_a_token_to_a_group_is_a_usage_error(tmp_path, args, error):
    token = tmp_path / "token"
    token.write_text("secret\n")
    argv = [BIN, "send", "--to", "239.1.2.3:5000", "--transport", "udp", "--file", f"0={token}"]
    p = subprocess.run(argv + [str(token) if a == "TOKEN" else a for a in args], capture_output=True, text=True,
                       timeout=20)
    assert p.returncode == 2 and error in p.stderr, p.stderr


def test_group_options_need_a_group(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    p = subprocess.run([BIN, "send", "--to", "127.0.0.1:9", "--transport", "udp", "--ttl", "3", "--file", f"0={f}"],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "--ttl and --interface apply to a multicast group" in p.stderr, p.stderr
    p = subprocess.run([BIN, "recv", "--transport", "udp", "--listen", "239.1.2.3:0", "--discard"], capture_output=True,
                       text=True, timeout=20)
    assert p.returncode == 2 and "a multicast group needs the port its sender sends to" in p.stderr, p.stderr


# A multicast sender written from the documented layouts (src/engine/dgram/wire/control.h ANNOUNCE, FIN), run in the
# namespace.
RAW_SENDER = """
import socket, struct, sys
import dgram_wire as w
group, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((group, port))
def announce(protocol, name, qp):
    h = w.hello(protocol=protocol, name=name, ring=1, max_message=1024, nonce=bytes(32), pad_to=0)
    s.send(w.segment(b"\\x08" + struct.pack("<IH", 1, len(h)) + h, qp=qp))
announce("dgram_rd", "rel", 3)
announce("dgram_rd", "rel", 3)
announce("write_record", "raw", 4)
s.send(w.segment(b"hello", opcode=w.WRITE_RECORD, qp=4, stag=1, msn=0, offset=0))
fin = b"\\x04" + struct.pack("<HHH", 1, 0, 1) + struct.pack("<HQQ", 0, 1, 5) + struct.pack("<H", 0)
s.send(w.segment(fin, qp=4))
"""


def test_a_receiver_on_a_group_takes_announced_ud_senders_only(tmp_path):
    """ANNOUNCE as documented: a UD sender's opens a session (stored, finished by its FIN without a FIN_ACK); a
    reliable protocol's is refused, logged once however often it is announced."""
    addr, port = group()
    with netns("mcl") as ns:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "multicast", "on"], check=True)
        subprocess.run(["ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", "lo"], check=True)
        rx = DgramReceiver(tmp_path / "out", "--exit-after-senders", 1, ns=ns, host=addr, port=port)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
        subprocess.run(in_ns(ns, [sys.executable, "-c", RAW_SENDER, addr, port]), check=True, env=env, timeout=20)
        (rep,) = rx.finished(timeout=10)
        assert rx.wait(10) == 0
    assert rep["line"].startswith("sender raw finished: messages=1 ") and rep["sent"] == "1", rep["line"]
    assert (tmp_path / "out/raw/device-0/0000000000.bin").read_bytes() == b"hello"
    refusals = [line for line in rx.stderr.text.splitlines() if "refused multicast sender 'rel'" in line]
    assert len(refusals) == 1 and "protocol dgram_rd acknowledges every datagram" in refusals[0], rx.stderr.text


# ------------------------------------------------------------------ a sender's name on a group

@contextlib.contextmanager
def lo_group():
    """A namespace whose lo carries multicast: a receiver and its senders on one group, by route."""
    with netns("mcn") as ns:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "multicast", "on"], check=True)
        subprocess.run(["ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", "lo"], check=True)
        yield ns


def scrape_in(ns, rx):
    """The receiver's /metrics, fetched inside its namespace."""
    _, line = rx.stderr.wait_for(r"metrics on http://", 10)
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    return subprocess.run(in_ns(ns, [sys.executable, "-c", fetch, line.split()[-1]]), capture_output=True, text=True,
                          check=True, timeout=20).stdout


def announces_refused(text):
    return {m[0]: float(m[1]) for m in re.findall(r'^slotstream_dgram_announces_refused_total\{reason="(\w+)"\} (\S+)$',
                                                   text, re.M)}


# 200 frames, one every 25 ms. The receiver's message timeout of 1 s lets a name pass after 2 s of silence
# (max(1 s, 2 x message timeout)): time enough for a new sender to start and be refused first, on a loaded machine.
CAM = ("--name", "cam", "--synthetic", "0:40:64x48x3", "--duration", 5)
RX = ("--message-timeout", 1000, "--metrics", "127.0.0.1:0")


def check_taken_back(rx, rep, ns):
    """The sender refused while the name was taken got it 2 s after the old session fell silent (at its next
    ANNOUNCE): what it sent from then on is stored, what it sent before counted as lost, and its refusal is in the
    receiver's log once, with the reason, and in /metrics by reason."""
    assert rep["line"].startswith("sender cam finished: ") and rep["sent"] == "200", rep["line"]
    c = counts(rep)
    assert c["messages"] + c["partial"] + c["dropped"] + c["lost"] == 200, rep["line"]
    assert c["messages"] >= 50, f"not stored from 3.75 s on: {rep['line']}"
    refusals = [line for line in rx.stderr.text.splitlines() if "refused multicast sender 'cam'" in line]
    assert len(refusals) == 1 and "already connected" in refusals[0], rx.stderr.text
    by_reason = announces_refused(scrape_in(ns, rx))
    assert by_reason["name_taken"] == 1 and sum(by_reason.values()) == 1, by_reason


@pytest.mark.deadline(60)
def test_a_sender_killed_and_restarted_under_its_name_gets_it_back(tmp_path):
    """A sender killed mid-stream and restarted under the same name within the session timeout was refused for the
    whole run ("already connected": a refused announcer was never checked again) while it sent 150 messages and
    exited 0 with none stored. The killed sender's session, once silent for long enough, passes the name on."""
    addr, port = group()
    out = tmp_path / "out"
    with lo_group() as ns:
        rx = DgramReceiver(out, *RX, ns=ns, host=addr, port=port)
        try:
            first = Proc(in_ns(ns, [BIN, "send", "--to", f"{addr}:{port}", "--transport", "udp", "--name", "cam",
                                    "--synthetic", "0:50:64x48x3", "--duration", 60]))
            wait_until(lambda: len(list((out / "cam/device-0").glob("*.bin"))) >= 10, 10, "the first sender's frames")
            first.sigkill()
            first.wait(10)
            _, j = dgram_send(f"{addr}:{port}", *CAM, ns=ns, timeout=30)
            assert j["multicast"] is True and j["messages"] == 200, "and it exits 0: a group's sender cannot know"
            killed, restarted = rx.finished(2, timeout=10)
            assert killed["line"].startswith("sender cam lost: ") and "replaced by a new session of the same name" \
                in killed["line"], killed["line"]
            check_taken_back(rx, restarted, ns)
        finally:
            rx.stop()
    # The restarted sender's messages are numbered on from the killed one's, nothing overwritten.
    stored = sorted(p.name for p in (out / "cam/device-0").glob("*.bin"))
    assert len(stored) == len(set(stored)) >= int(counts(restarted)["messages"]) + 10


OUTSIDER = """
import socket, struct, sys
import dgram_wire as w
group, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((group, port))
h = w.hello(protocol="write_record", name="cam", ring=4, max_message=1024, nonce=bytes(32), pad_to=0)
for _ in range(10):
    s.send(w.segment(b"\\x08" + struct.pack("<IH", 1, len(h)) + h, qp=77))
"""


@pytest.mark.deadline(60)
def test_an_outsider_announcing_a_name_first_does_not_lock_it_out(tmp_path):
    """Ten ANNOUNCEs of the name from an outsider just before the real sender started locked the real one out for
    the whole run. Once the outsider has been silent for long enough, the name passes to the sender that announces it.
    (An outsider that keeps announcing keeps the name: a group has no token; docs/design.md "Multicast".)"""
    addr, port = group()
    with lo_group() as ns:
        rx = DgramReceiver(tmp_path / "out", *RX, ns=ns, host=addr, port=port)
        try:
            env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
            subprocess.run(in_ns(ns, [sys.executable, "-c", OUTSIDER, addr, port]), check=True, env=env, timeout=20)
            _, j = dgram_send(f"{addr}:{port}", *CAM, ns=ns, timeout=30)
            assert j["multicast"] is True and j["messages"] == 200
            (rep,) = rx.finished(1, timeout=10)
            check_taken_back(rx, rep, ns)
        finally:
            rx.stop()
    assert len(list((tmp_path / "out/cam/device-0").glob("*.bin"))) == int(rep["messages"])


# ------------------------------------------------------------------ the preload shim on multicast sockets

SHIM_MC_RX = r"""
import json, pathlib, socket, sys, time
group, port, addr, mode, sender, count, out = sys.argv[1:8]
port, count, out = int(port), int(count), pathlib.Path(out)
IP_PKTINFO = 8
socks = []
for k in range(2 if mode == "two" else 1):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root): the second socket waits its turn
    s.bind(("0.0.0.0" if mode == "two" else group, port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group) + socket.inet_aton(addr))
    s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    if mode == "connected":
        h, p = sender.rsplit(":", 1)
        s.connect((h, int(p)))
    s.settimeout(8)
    socks.append(s)
print("ready", flush=True)
meta = []
def take(k, s, n):
    d, anc, flags, frm = s.recvmsg(70000, 256)
    dst = [socket.inet_ntoa(data[8:12]) for lvl, typ, data in anc if (lvl, typ) == (socket.IPPROTO_IP, IP_PKTINFO)]
    (out / f"{k}-{n}.bin").write_bytes(d)
    meta.append([k, n, dst, frm[0], flags])
for k, s in enumerate(socks):
    for n in range(count):
        take(k, s, n)
# Nothing more is due (a datagram here fails the test's count). The first look places what is still queued, the
# second comes after the reassembly timer: whatever was incomplete is handed over or dropped by then.
for _ in range(2):
    time.sleep(0.2)
    for k, s in enumerate(socks):
        s.setblocking(False)
        try:
            take(k, s, count)
        except BlockingIOError:
            pass
print(json.dumps(meta), flush=True)
"""

SHIM_MC_TX = r"""
import random, socket, struct, sys, time
group, port, addr, sport, phase, arg = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, sport))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 2)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(addr))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
if phase == "exact":  # each size sent with sendto, then again on the socket connect()ed to the group
    rng = random.Random(25)
    sizes = [int(x) for x in arg.split(",")]
    for n in sizes:
        s.sendto(rng.randbytes(n), (group, port))
        time.sleep(0.003)
    s.connect((group, port))
    for n in sizes:
        s.send(rng.randbytes(n))
        time.sleep(0.003)
else:  # every segment-sized chunk names its datagram and place, never zero: a hole is told from data
    count, size, chunk = (int(x) for x in arg.split(","))
    for i in range(count):
        s.sendto(b"".join(struct.pack("<HH", i + 1, k + 1) * (chunk // 4) for k in range(-(-size // chunk)))[:size],
                 (group, port))
        time.sleep(0.005)
"""

SHIM_SEGMENT = 1500 - 20 - 8 - 28 - 4  # a Write-Record segment's payload through the shim (IPv4, MTU 1500, no key)


def shim_exact_datagrams(sizes):
    rng = random.Random(25)
    return [rng.randbytes(n) for n in sizes * 2]


def shim_chunked(i, size):
    return b"".join(struct.pack("<HH", i + 1, k + 1) * (SHIM_SEGMENT // 4)
                    for k in range(-(-size // SHIM_SEGMENT)))[:size]


def shim_counters(log):
    return [{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)} for line in log.read_text().splitlines()]


@pytest.mark.skipif(not SHIM.exists(), reason=f"{SHIM} not built (bash scripts/build.sh)")
@pytest.mark.deadline(60)
def test_the_shim_carries_multicast_sockets(tmp_path):
    """python3's socket module, unmodified, under LD_PRELOAD=libslotstream_udp.so: one sender (IP_MULTICAST_TTL,
    _IF, _LOOP 0; sendto, then connect() to the group and send) and three receivers in their own namespaces on
    a bridge, joined with IP_ADD_MEMBERSHIP: one socket bound to the group, two SO_REUSEADDR sockets of one
    process bound to the port (each gets every datagram, recombined on its own), one bound to the group and
    connect()ed to the sender. 1 B to 65,507 B arrive byte-exact at every socket, each with its IP_PKTINFO
    (the group; a recombined datagram carries its first segment's). Then nftables drops every 10th large
    packet at the third receiver only: there, with SLOTSTREAM_UDP_PARTIAL=deliver, the datagrams that lost a
    segment arrive partial (holes zero, one per dropped segment), and a second program with the default (drop)
    gets only the whole ones; the other receivers get every datagram whole."""
    addr, port = group()
    sizes = [1, 1444, 1445, 8192, 30_000, 65_507]
    count, size = 20, 5 * SHIM_SEGMENT + 100  # 6 segments each, 5 of them long enough for the drop rule
    exact = shim_exact_datagrams(sizes)
    # (namespace, how its sockets are set up, SLOTSTREAM_UDP_PARTIAL, datagrams each socket gets)
    plan = [(0, "group", "deliver", len(exact) + count), (1, "two", "deliver", len(exact) + count),
            (2, "connected", "deliver", len(exact) + count), (2, "group", "drop", len(exact) + count // 2)]
    with netns_bridge("ms", 3) as ends:
        (ns_s, addr_s, _), receivers = ends[0], ends[1:]
        sport = random.randrange(20000, 60000)
        logs = [tmp_path / f"rx{i}.log" for i in range(len(plan))]
        rxs = []
        for i, (r, mode, partial, expect) in enumerate(plan):
            (tmp_path / f"out{i}").mkdir()
            ns, a, _ = receivers[r]
            env = dict(os.environ, LD_PRELOAD=str(SHIM), SLOTSTREAM_UDP_LOG=str(logs[i]),
                       SLOTSTREAM_UDP_PARTIAL=partial, SLOTSTREAM_UDP_REASSEMBLY_MS="50")
            rx = subprocess.Popen(in_ns(ns, [sys.executable, "-c", SHIM_MC_RX, addr, port, a, mode,
                                             f"{addr_s}:{sport}", expect, tmp_path / f"out{i}"]),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert rx.stdout.readline().strip() == "ready", rx.stderr.read()
            rxs.append(rx)
        tx_env = dict(os.environ, LD_PRELOAD=str(SHIM), SLOTSTREAM_UDP_LOG=str(tmp_path / "tx.log"))

        def send(phase, arg):
            tx = subprocess.run(in_ns(ns_s, [sys.executable, "-c", SHIM_MC_TX, addr, port, addr_s, sport, phase, arg]),
                                env=tx_env, capture_output=True, text=True, timeout=30)
            assert tx.returncode == 0, tx.stderr

        send("exact", ",".join(map(str, sizes)))
        lossy = receivers[2][0]
        r = subprocess.run(in_ns(lossy, ["nft", "-f", "-"]), input=(
            "table inet t { chain input { type filter hook input priority 0; policy accept;\n"
            "  udp length > 1000 numgen inc mod 10 == 9 counter drop\n}\n}\n"), capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"nftables unavailable: {r.stderr.strip()}")
        send("chunks", f"{count},{size},{SHIM_SEGMENT}")
        metas = []
        for rx in rxs:
            out, err = rx.communicate(timeout=20)
            assert rx.returncode == 0, err
            metas.append(json.loads(out.splitlines()[-1]))
        listed = subprocess.run(in_ns(lossy, ["nft", "list", "table", "inet", "t"]), capture_output=True, text=True)
        dropped = int(re.search(r"counter packets (\d+)", listed.stdout).group(1))
    large = sum(len(d) > 1444 for d in exact)
    for i, ((r, mode, partial, expect), meta) in enumerate(zip(plan, metas)):
        sockets = 2 if mode == "two" else 1
        holes, seen = 0, []
        for k, n, dst, sender, flags in meta:
            got = (tmp_path / f"out{i}/{k}-{n}.bin").read_bytes()
            assert dst == [addr], f"{mode} socket {k} datagram {n}: IP_PKTINFO {dst}, not the group"
            assert sender == addr_s and flags == 0, (mode, k, n, sender, flags)
            if n < len(exact):
                assert got == exact[n], f"{mode} socket {k} datagram {n}: {len(got)} of {len(exact[n])} B"
                continue
            # A chunked datagram: which one it is comes from its bytes (a partial one is delivered at its timer,
            # after newer whole ones).
            chunks = [got[c:c + SHIM_SEGMENT] for c in range(0, len(got), SHIM_SEGMENT)]
            d = struct.unpack("<H", next(c for c in chunks if any(c))[:2])[0] - 1
            full = shim_chunked(d, size)
            full = [full[c:c + SHIM_SEGMENT] for c in range(0, len(full), SHIM_SEGMENT)]
            assert len(chunks) == len(full) and all(c == full[j] or c == bytes(len(c)) for j, c in enumerate(chunks))
            holes += sum(c != full[j] for j, c in enumerate(chunks))
            seen.append((k, d))
        assert len(meta) == expect * sockets and len(set(seen)) == len(seen), (mode, partial, len(meta))
        (c,) = shim_counters(logs[i])
        if r < 2:
            assert holes == 0 and c["partial_delivered"] == 0, (mode, c)
            assert c["reassembled"] == (large + count) * sockets, (mode, c)
        elif partial == "deliver":  # every 10th of the 5 long segments of 20 datagrams: the 5th of every second
            assert holes == dropped == 10 and c["partial_delivered"] == 10, (holes, dropped, c)
            assert c["reassembled"] == large + count - 10, c
        else:
            assert holes == 0 and c["partial_dropped"] == 10 and c["reassembled"] == large + count - 10, c


SHIM_MC6_RX = r"""
import hashlib, json, socket, struct, sys
group, port, dev, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.bind(("::", port))
mreq = socket.inet_pton(socket.AF_INET6, group) + struct.pack("@I", socket.if_nametoindex(dev))
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
s.settimeout(8)
print("ready", flush=True)
out = []
for _ in range(count):
    d, anc, flags, _ = s.recvmsg(70000, 256)
    dst = [socket.inet_ntop(socket.AF_INET6, x[:16]) for lvl, typ, x in anc
           if (lvl, typ) == (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO)]
    out.append([hashlib.sha256(d).hexdigest(), dst, flags])
print(json.dumps(out), flush=True)
"""

SHIM_MC6_TX = r"""
import hashlib, json, random, socket, sys
group, port, dev, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], [int(x) for x in sys.argv[4].split(",")]
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, socket.if_nametoindex(dev))
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 2)
rng = random.Random(6)
out = []
for n in sizes:
    d = rng.randbytes(n)
    s.sendto(d, (group, port))
    out.append(hashlib.sha256(d).hexdigest())
print(json.dumps(out), flush=True)
"""


def snmp6(ns, field):
    text = subprocess.run(in_ns(ns, ["cat", "/proc/net/snmp6"]), capture_output=True, text=True, check=True).stdout
    return int(dict(line.split() for line in text.splitlines() if line.strip())[field])


@pytest.mark.skipif(not SHIM.exists(), reason=f"{SHIM} not built (bash scripts/build.sh)")
@pytest.mark.deadline(30)
def test_the_shim_carries_ipv6_multicast_sockets(tmp_path):
    """The same over IPv6 (a site-scope group, IPV6_JOIN_GROUP, IPV6_MULTICAST_IF/HOPS): 1 B to 65,527 B (the
    largest UDP payload over IPv6; 1,424 B is the largest single segment there) byte-exact with IPV6_PKTINFO
    naming the group, and no IPv6 fragment leaves the sender."""
    grp, port = f"ff15::77:{random.randrange(1, 0xffff):x}", random.randrange(20000, 60000)
    sizes = [1, 1424, 1425, 9000, 65_527]
    env = dict(os.environ, LD_PRELOAD=str(SHIM), SLOTSTREAM_UDP_LOG=str(tmp_path / "shim.log"))
    with netns_bridge("m6", 1) as ends:
        for i, (ns, _, dev) in enumerate(ends):  # no duplicate address detection: usable at once
            subprocess.run(in_ns(ns, ["ip", "-6", "addr", "add", f"fd78::{i + 1}/64", "dev", dev, "nodad"]), check=True)
        (ns_s, _, dev_s), (ns_r, _, dev_r) = ends
        rx = subprocess.Popen(in_ns(ns_r, [sys.executable, "-c", SHIM_MC6_RX, grp, port, dev_r, len(sizes)]), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert rx.stdout.readline().strip() == "ready", rx.stderr.read()
        frags = snmp6(ns_s, "Ip6FragCreates")
        tx = subprocess.run(in_ns(ns_s, [sys.executable, "-c", SHIM_MC6_TX, grp, port, dev_s, ",".join(map(str, sizes))]),
                            env=env, capture_output=True, text=True, timeout=20)
        assert tx.returncode == 0, tx.stderr
        out, err = rx.communicate(timeout=20)
        assert rx.returncode == 0, err
        assert snmp6(ns_s, "Ip6FragCreates") == frags
    assert json.loads(out) == [[h, [grp], 0] for h in json.loads(tx.stdout)]
    (c,) = [r for r in shim_counters(tmp_path / "shim.log") if r["unwrapped"]]
    segment = 1500 - 40 - 8 - 28 - 4  # a Write-Record segment's payload over IPv6
    assert c["reassembled"] == 3 and c["segments_in"] == sum(-(-n // segment) for n in sizes if n > 1424), c
