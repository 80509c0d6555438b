"""Multicast (issue 25; src/dgram/control.h ANNOUNCE): a UD sender to an IP multicast group and three receivers,
each in a network namespace of its own on one bridge. There is no handshake and no FIN_ACK: the sender announces
itself to the group and each receiver stores the same stream with its own accounting."""
import os
import random
import subprocess
import sys

import pytest

from conftest import BIN, make_files
from dgram_support import (DgramReceiver, check_store, dgram_send, in_ns, netns, netns_bridge, nft_dropped,
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


# A multicast sender written from the documented layouts (src/dgram/control.h ANNOUNCE, FIN), run in the namespace.
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
