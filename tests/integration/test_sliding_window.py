"""The sliding-window baseline over real UCX: every byte, in order, one connection per device."""
import json
import os

import pytest

from conftest import TRANSPORTS, metrics_address, send, seq_name, sha256


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_byte_in_order_several_devices(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport, "--exit-after-senders", 1)
    files = {}
    args = ["--name", "sw", "--protocol", "sliding_window", "--transport", transport, "--blocks", 3,
            "--block-size", 8192, "--json"]
    for d in range(3):
        files[d] = []
        for i, size in enumerate([0, 1, 8176, 8177, 100_000]):
            p = tmp_path / f"d{d}-{i}"
            p.write_bytes(os.urandom(size))
            files[d].append(p)
            args += ["--file", f"{d}={p}"]
    j = json.loads(send(rx.addr, *args).stdout)
    assert j["protocol"] == "sliding_window"
    assert rx.lines(1)[0].startswith("sender sw finished: messages=15 "), "one report for all connections"
    for d, srcs in files.items():
        dev = out / "sw" / f"device-{d}"
        assert sorted(os.listdir(dev)) == [seq_name(i) for i in range(len(srcs))]
        for i, src in enumerate(srcs):
            assert sha256(dev / seq_name(i)) == sha256(src)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unreleased_block_blocks_the_head(receiver, tmp_path, transport):
    # The receiver keeps block 0 unprocessed for 300 ms: with in-order release the head cannot
    # pass it, so the sender waits even though the other blocks are freed.
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport, "--hold-block", "0:0:300")
    srcs = []
    for i in range(10):
        p = tmp_path / f"m{i}"
        p.write_bytes(os.urandom(3000))
        srcs.append(p)
    j = json.loads(send(rx.addr, "--name", "head", "--protocol", "sliding_window", "--transport", transport,
                        "--blocks", 3, "--block-size", 4096, "--json",
                        *[x for p in srcs for x in ("--file", f"0={p}")]).stdout)
    assert j["seconds"] >= 0.25, "the sender got past a block the receiver had not released"
    dev = out / "head" / "device-0"
    for i, src in enumerate(srcs):
        assert sha256(dev / seq_name(i)) == sha256(src)


def test_every_lanes_devices_reach_the_report_and_the_metrics(receiver, tmp_path):
    # One connection per device: the sender's report and the per-device counters must hold every lane's devices,
    # not only the first one's (and must not go backwards once the sender has ended).
    import urllib.request
    rx = receiver("--out", tmp_path / "out", "--metrics", "127.0.0.1:0")
    maddr = metrics_address(rx)
    args = ["--name", "lanes", "--protocol", "sliding_window", "--blocks", 3, "--block-size", 4096]
    for d in range(3):
        for i in range(d + 2):
            p = tmp_path / f"d{d}-{i}"
            p.write_bytes(os.urandom(100 + i))
            args += ["--file", f"{d}={p}"]
    send(rx.addr, *args)
    assert rx.lines(1)[0].startswith("sender lanes finished: messages=9 ")
    with urllib.request.urlopen(f"http://{maddr}/metrics", timeout=5) as r:
        text = r.read().decode()
    for d in range(3):
        line = f'slotstream_messages_total{{sender="lanes",device="{d}"}} {d + 2}'
        assert line in text, f"missing {line!r} in:\n" + "\n".join(l for l in text.splitlines() if "messages_total" in l)
