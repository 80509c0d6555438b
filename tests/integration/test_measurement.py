"""What the benchmark's figures stand on, checked as behaviour (never as speed): a passive receiver makes no UCX
call, the status array is read only when no block is free, gaps are detected end to end, the baseline's ACKs do
not stall with more blocks than the shared-memory FIFO holds, and every CPU figure fits the machine."""
import json
import os

import pytest

from conftest import BIN, PROTOCOLS, TRANSPORTS, Proc, make_files, parse_finished, run_send


def bench_pair(transport, protocol, size, count, blocks, *send_extra, recv_extra=(), timeout=60):
    """One `bench-peer recv` + `bench-peer send` measurement; (sender JSON, receiver session JSON)."""
    rx = Proc([BIN, "bench-peer", "recv", "--listen", "127.0.0.1:0", "--transport", transport, *recv_extra])
    try:
        _, line = rx.stdout.wait_for(r"^listening on ", 10)
        addr = line.split()[-1]
        tx = Proc([BIN, "bench-peer", "send", "--to", addr, "--transport", transport, "--protocol", protocol,
                   "--size", size, "--count", count, "--blocks", blocks, *send_extra])
        assert tx.wait(timeout) == 0, f"sender peer failed: {tx.stderr.text}"
        sender = json.loads(tx.stdout.lines[0])
        _, report = rx.stdout.wait_for(r"^\{", 20)
        return sender, json.loads(report)
    finally:
        rx.terminate(5)


@pytest.mark.deadline(60)
def test_a_status_byte_receiver_makes_no_ucx_call_on_shared_memory():
    # The paper's passive receiver: after set-up, data, status bytes and status reads all happen without it.
    snd, rcv = bench_pair("shm", "status_byte", 4096, 3000, 4)
    assert rcv["messages"] == 3000 and snd["sync_operations"] > 0, (rcv["messages"], snd["sync_operations"])
    r = rcv["resources"]
    for k in ("progress_calls", "puts", "gets", "am_sends", "am_received"):
        assert r[k] == 0, f"the receiver made UCX calls after set-up: {k} = {r[k]} ({r})"
    # Nor during it: only rdma's wire-up needs the receiver's worker while a sender connects.
    assert r["setup_progress_calls"] == 0, r
    # The counter does count: a receiver that must take part (two-sided ACKs) shows its progress calls.
    _, rcv = bench_pair("shm", "sliding_window", 4096, 300, 4)
    assert rcv["resources"]["progress_calls"] > 0 and rcv["resources"]["am_sends"] >= 300, rcv["resources"]


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_status_array_is_read_only_when_no_block_is_free(start_receiver, tmp_path, transport):
    rx = start_receiver(tmp_path / "out", transport)
    files = make_files(tmp_path / "src", [1000] * 24, "r")

    def send(n, name):
        # pack=off: one message per block. Packed, 1,000-byte messages that come quickly enough share blocks,
        # and 24 of them may fit the 8 blocks without a read (sync_operations 0, seen once over tcp).
        p = run_send(rx.addr, "--name", name, "--transport", transport, "--protocol", "status_byte:pack=off",
                     "--blocks", 8,
                     "--block-size", 4096, "--json", *[a for f in files[:n] for a in ("--file", f"0={f}")])
        return json.loads(p.stdout)

    j = send(8, "fits")  # eight one-block messages into eight free blocks: no synchronisation at all
    assert j["records_sent"] == 8 and j["sync_operations"] == 0 and j["waits"] == 0, j
    j = send(24, "wraps")  # three times round: the sender must run out of the blocks it knows free, and read
    # Whether it then also waits depends on the receiver's pace: a read that finds blocks the receiver
    # freed meanwhile goes on at once (a wait is counted only when none was free).
    assert j["records_sent"] == 24 and j["sync_operations"] >= 1, j
    # Every read belongs to a wait (one or more reads until a block is free), never to a send that had a block.
    assert j["sync_operations"] >= j["waits"], j


@pytest.mark.deadline(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_missing_packet_is_reported_as_a_gap_end_to_end(transport, protocol):
    # The sender leaves out every sixth packet number (as if that block were lost): 50 one-block messages
    # carry numbers 0..58 with 9 holes; every message still arrives, and the receiver counts 9 gaps.
    snd, rcv = bench_pair(transport, protocol, 1000, 50, 4, "--skip-packet-every", 5)
    assert rcv["messages"] == 50 and not rcv["lost"], rcv
    assert rcv["gaps"] == 9, f"expected 9 gaps, the receiver counted {rcv['gaps']}"
    # Without holes, no gap.
    _, rcv = bench_pair(transport, protocol, 1000, 50, 4)
    assert rcv["gaps"] == 0


@pytest.mark.deadline(60)
def test_gaps_show_in_the_receivers_report(start_receiver, tmp_path):
    rx = start_receiver(tmp_path / "out")
    p = Proc([BIN, "bench-peer", "send", "--to", rx.addr, "--transport", "shm", "--protocol", "status_byte",
              "--size", 100, "--count", 20, "--blocks", 4, "--skip-packet-every", 3])
    assert p.wait(30) == 0, p.stderr.text
    report = parse_finished(rx.stdout.next_line(15))
    assert report["messages"] == 20 and report["gaps"] == 6, report  # holes at 3, 7, 11, 15, 19, 23


@pytest.mark.deadline(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sliding_window_with_more_blocks_than_the_fifo_never_stalls_an_ack(transport):
    # With 128 blocks more ACKs can be queued than the shared-memory FIFO to the sender holds (64); an ACK left
    # queued used to wait for the receiver's progress thread to time out of poll(): 1,000 ms waits. A liveness
    # bound, not a speed: no single wait for a free block comes near that.
    snd, rcv = bench_pair(transport, "sliding_window", 4096, 6000, 128)
    assert rcv["messages"] == 6000
    waits = snd["wait_samples_ns"]
    assert waits, "the window never filled: the test did not exercise ACKs"
    assert max(waits) < 500e6, f"an ACK stalled for {max(waits) / 1e6:.0f} ms"


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cpu_windows_fit_the_machine(transport):
    # CPU is measured over the same window as elapsed time on each side, so no figure can pass all cores.
    cores = os.cpu_count()
    for protocol in ("status_byte", "sliding_window"):
        snd, rcv = bench_pair(transport, protocol, 65536, 2000, 3)
        for side, peer in (("sender", snd), ("receiver", rcv)):
            assert 0 < peer["cpu_seconds"] <= peer["seconds"] * cores * 1.02 + 0.01, (protocol, side, peer["cpu_seconds"],
                                                                                    peer["seconds"])
