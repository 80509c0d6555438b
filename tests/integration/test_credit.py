"""credit (SDP §2) and carc (CARC) between real processes over shm and tcp: what is special about them.

Byte-exact transfers, several devices, edge sizes, dead receivers, killed senders and a full disk run
for them in test_transfer.py and test_faults.py (parametrised by every protocol); here: credit
updates batched as the sender's counters show them, carc's bound on unprocessed bytes seen by the
receiver (and credit's lack of one), the budget's default and the option errors.
"""
import json
import os
import pathlib
import subprocess

import pytest

from conftest import BIN, HEADER, TRANSPORTS, Proc, assert_device, make_files, run_send


def file_args(device, paths):
    return [x for p in paths for x in ("--file", f"{device}={p}")]


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_credit_returns_credits_in_batches_of_half(start_receiver, tmp_path, transport):
    block, blocks = 4096, 8
    cap = block - HEADER
    out = tmp_path / "out"
    rx = start_receiver(out, transport, "--exit-after-senders", 1)
    # Sizes that fill a buffer exactly, nearly, not at all, and need several: 3 devices, wrapping
    # the 8 buffers many times.
    sizes = [cap, cap - 1, 1, 0, cap + 1, 5 * cap + 3, 100, 2 * cap]
    per_device = {d: make_files(tmp_path / "src", sizes * 3, f"d{d}") for d in range(3)}
    p = run_send(rx.addr, "--name", "cr", "--transport", transport, "--protocol", "credit",
                 "--blocks", blocks, "--block-size", block, "--json",
                 *[a for d, srcs in per_device.items() for a in file_args(d, srcs)])
    j = json.loads(p.stdout)
    for d, srcs in per_device.items():
        assert_device(out, "cr", d, srcs)

    c = j["protocol_counters"]
    records = j["records_sent"]
    assert records == 3 * 3 * sum(max(1, -(-s // cap)) for s in sizes)
    assert c["credits"] == blocks
    # SDP §2.1: the receiver returns credits once half of them were used, never one by one.
    assert c["max_credits_per_update"] == blocks // 2, c
    assert c["credits_returned"] == c["credit_updates"] * (blocks // 2), c
    # To send record r (from 0) the sender needed r + 1 - 8 credits back: only the last few may be missing.
    assert records - blocks <= c["credits_returned"] <= records, (records, c)
    assert c.get("updates_ignored", 0) == 0, c
    assert j["sync_operations"] == c["credit_updates"]


def bench_pair(transport, protocol, *, size, blocks, count, process_ns_per_byte):
    """Runs bench-peer recv + send once; returns (sender JSON, receiver session JSON)."""
    rx = Proc([BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", transport,
               "--process-ns-per-byte", process_ns_per_byte])
    try:
        line = rx.stdout.next_line(10)
        assert line.startswith("listening on "), f"{line!r} {rx.stderr.text}"
        tx = subprocess.run([BIN, "bench-peer", "send", "--to", line.split()[-1], "--transport", transport,
                             "--protocol", protocol, "--blocks", str(blocks), "--size", str(size),
                             "--count", str(count)], capture_output=True, text=True, timeout=60)
        assert tx.returncode == 0, tx.stderr
        assert rx.wait(20) == 0, rx.stderr.text
        session = json.loads(next(l for l in rx.stdout.lines if l.startswith("{")))
        return json.loads(tx.stdout), session
    finally:
        if rx.poll() is None:
            rx.sigkill()


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_carc_never_lets_unprocessed_bytes_pass_its_budget(transport):
    # A receiver slower than the sender (3 ns per byte of processing): whatever the protocol allows
    # in flight piles up unprocessed. 32 buffers of 64 KiB = 2 MiB; carc's budget is 256 KiB.
    size, blocks, budget = 65536 - HEADER, 32, 256 * 1024
    tx, rx = bench_pair(transport, f"carc:budget={budget}", size=size, blocks=blocks, count=120,
                        process_ns_per_byte=3)
    assert rx["messages"] == 120 and rx["gaps"] == 0 and not rx["lost"], rx
    assert rx["process"]["bytes"] == 120 * size, "every byte processed once"
    r, s = rx["protocol_counters"], tx["protocol_counters"]
    assert r["budget_bytes"] == budget and s["budget_bytes"] == budget
    # The receiver's own view: received and not yet processed, at most the budget...
    assert r["max_unreleased_bytes"] <= budget, r
    # ...the sender's: sent and not yet reported processed, at most the budget — and the budget was
    # what held the sender back (otherwise this test shows nothing). (The receiver's consumer
    # completes a receive only when it polls its worker, between records, so in-flight data waits
    # in the transport rather than in completed records: the sender's count is the one that fills.)
    assert s["max_unprocessed_bytes"] <= budget, s
    assert s["max_unprocessed_bytes"] >= budget // 2, s
    assert s["budget_waits"] > 0, s
    assert r["counter_puts"] >= 1 and r["unexpected_messages"] == 0, r

    # credit with the same buffers bounds messages, not bytes: far more than the budget goes out unprocessed.
    tx, rx = bench_pair(transport, "credit", size=size, blocks=blocks, count=120, process_ns_per_byte=3)
    assert rx["messages"] == 120, rx
    assert tx["protocol_counters"]["max_messages_in_flight"] * size > 2 * budget, tx["protocol_counters"]


def cache_share():
    """The receiving core's share of its last-level cache, as carc reads it (0: unknown)."""
    best = (0, 0, 1)
    for d in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (d / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            level = int((d / "level").read_text())
            size = (d / "size").read_text().strip()
            n = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1] in "KM" else int(size)
            cpus = 0
            for part in (d / "shared_cpu_list").read_text().strip().split(","):
                lo, _, hi = part.partition("-")
                cpus += int(hi or lo) - int(lo) + 1
        except (OSError, ValueError, KeyError):
            continue
        if level > best[0]:
            best = (level, n, max(cpus, 1))
    return best[1] // best[2]


@pytest.mark.deadline(60)
def test_carc_default_budget_is_the_receiving_cores_cache_share(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out", "shm", "--exit-after-senders", 1)
    src = make_files(tmp_path / "src", [1000, 70000], "m")
    j = json.loads(run_send(rx.addr, "--name", "dflt", "--protocol", "carc", "--block-size", 65536,
                            "--json", *file_args(0, src)).stdout)
    share = cache_share() or 2 << 20
    assert j["protocol_counters"]["budget_bytes"] == max(share, 65536), j["protocol_counters"]
    assert_device(tmp_path / "out", "dflt", 0, src)


@pytest.mark.deadline(60)
@pytest.mark.parametrize("spec,needle", [
    ("carc:budget=lots", "budget=lots is not a size"),
    ("carc:budget=0", "more than 0"),
    ("carc:window=4", "has no option 'window'"),
    ("credit:budget=1M", "credit has no option 'budget'"),
])
def test_bad_protocol_options_are_usage_errors(spec, needle):
    p = subprocess.run([BIN, "send", "--to", "127.0.0.1:1", "--name", "u", "--protocol", spec,
                        "--file", "0=/etc/hostname"], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stderr, p.stderr


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_budget_below_one_block_is_refused_by_the_receiver_and_it_keeps_serving(start_receiver, tmp_path,
                                                                                  transport):
    out = tmp_path / "out"
    rx = start_receiver(out, transport)
    src = make_files(tmp_path / "src", [10], "m")
    p = run_send(rx.addr, "--name", "small", "--transport", transport, "--protocol", "carc:budget=16K",
                 "--block-size", 65536, *file_args(0, src), check=False)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "smaller than one block" in p.stderr and "receiver refused" in p.stderr, p.stderr
    assert not (out / "small").exists()
    run_send(rx.addr, "--name", "big", "--transport", transport, "--protocol", "carc:budget=64K",
             "--block-size", 65536, *file_args(0, src))
    assert_device(out, "big", 0, src)
