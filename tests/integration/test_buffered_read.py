"""buffered_read with real processes over shm and tcp: what is special about it beyond the suites every protocol
runs (test_transfer, test_faults) — a tiny ring that wraps dozens of times under several devices whose records
are freed out of order, the pipelined option, the receiver's counters, and its options checked before connecting."""
import json
import os
import random
import subprocess

import pytest

from conftest import BIN, HEADER, TRANSPORTS, assert_device, hidden, make_files, parse_finished, run_send, tree


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("options", ["", ":pipeline=on,max_read=4K"])
def test_four_devices_through_a_tiny_ring_byte_exact(start_receiver, tmp_path, transport, options):
    # Two blocks of 4 KiB: a ring of 2 x 4104 bytes. Four devices' messages of 0..12 KB (up to four
    # fragments each) interleave in it, wrap around it dozens of times, and are freed by device,
    # i.e. out of ring order.
    out = tmp_path / "out"
    rx = start_receiver(out, transport, "--exit-after-senders", 1)
    rng = random.Random(9)
    files = {d: make_files(tmp_path / "src", [rng.choice([0, 1, 100, 4079, 4080, 4081, 12_000]) for _ in range(25)],
                           f"d{d}") for d in range(4)}
    args = [a for d, fs in files.items() for f in fs for a in ("--file", f"{d}={f}")]
    p = run_send(rx.addr, "--name", "ring", "--transport", transport, "--protocol", "buffered_read" + options,
                 "--blocks", 2, "--block-size", 4096, "--json", *args, timeout=60)
    j = json.loads(p.stdout)
    assert j["messages"] == 100
    ring_bytes = j["protocol_counters"]["ring_bytes"]
    assert ring_bytes > 20 * 8208, f"the ring ({2 * 4104} bytes) wrapped only {ring_bytes / 8208:.0f} times"
    report = parse_finished(rx.stdout.next_line(15))
    assert report["messages"] == 100 and report["gaps"] == 0 and report["duplicates"] == 0, report
    assert rx.wait(15) == 0
    for d, fs in files.items():
        assert_device(out, "ring", d, fs)
    assert hidden(out) == []


def bench_pair(transport, protocol, size, count, devices, blocks):
    rx = subprocess.Popen([BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", transport],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        addr = rx.stdout.readline().split()[-1]
        tx = subprocess.run([BIN, "bench-peer", "send", "--to", addr, "--transport", transport, "--protocol", protocol,
                             "--size", str(size), "--count", str(count), "--devices", str(devices),
                             "--blocks", str(blocks)], capture_output=True, text=True, timeout=60)
        assert tx.returncode == 0, tx.stderr
        return json.loads(tx.stdout), json.loads(rx.stdout.readline())
    finally:
        rx.kill()
        rx.wait(10)


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_receiver_counts_its_reads_and_writes_the_head_back_now_and_then(transport):
    snd, rcv = bench_pair(transport, "buffered_read", 64, 3000, 3, 64)
    assert rcv["messages"] == 9000 and not rcv["lost"], rcv
    c = rcv["protocol_counters"]
    entry = 8 + HEADER + 64  # prefix + block header + 64-byte payload
    assert c["bytes_read"] == 9000 * entry, "every entry read exactly once"
    assert 1 <= c["reads"] <= 9000
    assert c["reads"] <= 2 * c["tail_reads"], "a span is read after a tail read that moved, in at most two gets"
    assert 0 < c["head_writes"] <= 9000 // 4, f"head written back {c['head_writes']} times for 9000 records"
    assert c["protocol_errors"] == 0
    assert snd["protocol_counters"]["ring_bytes"] == 9000 * entry


@pytest.mark.deadline(30)
@pytest.mark.parametrize("spec,what", [("buffered_read:pipeline=maybe", "pipeline"),
                                       ("buffered_read:window=4", "max_read"),
                                       ("buffered_read:max_read=8", "64")])
def test_bad_options_are_refused_before_connecting(start_receiver, tmp_path, spec, what):
    rx = start_receiver(tmp_path / "out")
    f = make_files(tmp_path, [10], "x")
    p = run_send(rx.addr, "--name", "opt", "--protocol", spec, "--file", f"0={f[0]}", check=False, timeout=20)
    assert p.returncode == 2, f"{spec}: exit {p.returncode}, {p.stderr}"
    assert what in p.stderr, p.stderr
    assert tree(tmp_path / "out") == [], "nothing may arrive with bad options"
