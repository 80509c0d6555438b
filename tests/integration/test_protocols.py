"""`slotstream protocols --json` (docs/cli-contract.md): every capability flag of a protocol's descriptor
(src/protocol/protocol.h), so that scripts (bench/, conftest.PROTOCOLS) decide by flags, not by names."""
import json
import subprocess

import pytest

from conftest import BIN

FLAGS = {"reference", "holds", "connection_per_device", "receiver_progress", "receiver_endpoint", "sender_wakeup",
         "packs"}


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
        assert set(e) == {"name", "summary", "options", "receiver_progress_on"} | FLAGS, (name, sorted(e))
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
    # What each descriptor declares (src/protocol/<name>.cc), one protocol per flag.
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
