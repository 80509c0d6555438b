"""`slotstream protocols --json` (docs/cli-contract.md): every protocol of both engines — the block protocols
(src/engine/ucx/protocol/protocol.h) and the datagram transport's (src/engine/dgram/protocol/protocol.h) — each
naming its engine and the transports it runs on, and every capability flag of its descriptor, so that scripts (bench/, conftest.PROTOCOLS)
decide by flags, not by names."""
import json
import subprocess

import pytest

from conftest import BIN

FLAGS = {"reference", "holds", "connection_per_device", "receiver_progress", "receiver_endpoint", "sender_wakeup",
         "packs", "reliable", "partial", "one_sided", "multicast"}
# The datagram transport's protocols and the transport each runs on (src/engine/dgram/protocol/registry.cc).
DATAGRAM = {"write_record": "udp", "dgram_send": "udp", "dgram_rd": "udp", "rd_write_record": "udp", "dgram_rc": "tcp"}


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)


def listing():
    p = run("protocols", "--json")
    assert p.returncode == 0, p.stderr
    return {e["name"]: e for e in json.loads(p.stdout)}


@pytest.mark.deadline(30)
def test_every_protocol_exports_every_descriptor_flag_as_a_boolean():
    protocols = listing()
    assert protocols, "no protocol listed"
    for name, e in protocols.items():
        # receiver_progress_on: per transport (tests/integration/test_rdma.py).
        assert set(e) == {"name", "summary", "engine", "transports", "options", "receiver_progress_on"} | FLAGS, \
            (name, sorted(e))
        for flag in FLAGS:
            assert isinstance(e[flag], bool), (name, flag, e[flag])
    # A flag exported as a constant would pass the checks above: each one is true for some protocol
    # of this registry and false for another.
    for flag in FLAGS:
        values = {e[flag] for e in protocols.values()}
        assert values == {True, False}, f"{flag} is {values} for every protocol"


@pytest.mark.deadline(30)
def test_the_flags_are_the_descriptors():
    p = listing()
    # What each descriptor declares (src/engine/ucx/protocol/<name>.cc), one protocol per flag.
    assert p["ucx_raw_put"]["reference"] and not p["status_byte"]["reference"]
    assert p["status_byte"]["holds"] and not p["status_byte"]["receiver_progress"], "the paper's passive receiver"
    assert p["sliding_window"]["connection_per_device"] and not p["status_byte"]["connection_per_device"]
    assert p["credit"]["receiver_endpoint"] and p["credit"]["receiver_progress"]
    assert p["buffered_read"]["receiver_endpoint"] and p["buffered_read"]["sender_wakeup"]
    assert not p["credit"]["sender_wakeup"]


@pytest.mark.deadline(30)
def test_references_are_not_offered_by_send():
    help_text = run("send", "--help").stdout
    for name, e in listing().items():
        offered = f" {name}: " in help_text
        assert offered != e["reference"], f"{name}: reference={e['reference']} but offered by send: {offered}"


@pytest.mark.deadline(30)
def test_both_engines_are_listed_each_with_its_transports():
    p = listing()
    engines = {name: e["engine"] for name, e in p.items()}
    assert {n for n, e in engines.items() if e == "dgram"} == set(DATAGRAM), engines
    for name, transport in DATAGRAM.items():
        e = p[name]
        assert e["transports"] == [transport], (name, e["transports"])
        assert e["receiver_progress_on"] == {transport: True}, "the kernel's sockets: the receiver always takes part"
        assert not e["reference"] and not e["holds"], "nothing to lend: no blocks"
    for name, e in p.items():
        if e["engine"] == "ucx":
            assert e["transports"] == ["shm", "tcp", "rdma"], (name, e["transports"])
            assert not (e["reliable"] or e["partial"] or e["one_sided"] or e["multicast"]), name
    # The datagram capabilities are the descriptors': RD and RC retransmit or stream, Write-Record keeps
    # partial messages and places one-sided, only the unreliable UDP protocols send to a group.
    assert p["dgram_rd"]["reliable"] and p["dgram_rc"]["reliable"] and not p["write_record"]["reliable"]
    assert p["write_record"]["partial"] and p["rd_write_record"]["partial"] and not p["dgram_send"]["partial"]
    assert p["write_record"]["one_sided"] and not p["dgram_rd"]["one_sided"]
    assert p["write_record"]["multicast"] and p["dgram_send"]["multicast"] and not p["dgram_rd"]["multicast"]
    text = run("protocols").stdout
    assert "write_record\n" in text and "engine: dgram, over udp" in text and "engine: ucx, over shm, tcp, rdma" in text


@pytest.mark.deadline(30)
def test_the_transports_listing_derives_udp_from_the_registry():
    """`slotstream transports` says what udp carries from the datagram registry itself (no restated list)."""
    p = run("transports", "--json")
    assert p.returncode == 0, p.stderr
    udp = next(t for t in json.loads(p.stdout) if t["name"] == "udp")
    for name in DATAGRAM:
        assert name in udp["why"], (name, udp["why"])
