"""Data over `--transport rdma` on Soft-RoCE (docs/rdma.md): byte-exact files and checked synthetic frames for every
protocol, several devices, two senders at once, 1 MiB blocks; auto picking rdma; the passive status-byte receiver;
ud; a passive protocol over puts UCX would emulate is refused with the reason; the lanes UCX chose are said.
Issue 31: before it, every one of these failed (the sender aborted in UCX, the receiver timed out)."""
import json
import re
import subprocess
import threading

import pytest

from conftest import (BIN, HOST, PROTOCOLS, assert_no_ucx_trouble, env_with, file_args, helpers, send, stored)


def transfer(receiver, tmp_path, protocol, name="h2", extra=()):
    """Files on two devices (one larger than a 1 MiB block, one exactly a block's payload, small ones) over rdma;
    returns (send's CompletedProcess, the receiver)."""
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "rdma", "--exit-after-senders", 1)
    dev0 = helpers.make_files(tmp_path, [3_000_000, 1, 70_000], f"{name}-d0")
    dev1 = helpers.make_files(tmp_path, [(1 << 20) - helpers.HEADER, 200_000], f"{name}-d1")
    p = send(rx.addr, "--name", name, "--transport", "rdma", "--protocol", protocol, "--blocks", 4,
             "--block-size", "1M", *file_args(0, dev0), *file_args(1, dev1), *extra)
    assert p.returncode == 0, p.stderr
    report = helpers.parse_finished(rx.stdout.next_line(120))
    assert report["name"] == name and report["messages"] == 5 and report["gaps"] == 0, report
    assert rx.wait(60) == 0, rx.stderr.text
    for device, paths in ((0, dev0), (1, dev1)):
        for seq, path in enumerate(paths):
            assert stored(out, name, device, seq) == path.read_bytes(), f"{protocol}: device {device} message {seq}"
    assert_no_ucx_trouble(p.stderr, "sender")
    assert_no_ucx_trouble(rx.stderr.text, "receiver")
    return p, rx


@pytest.mark.deadline(600)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_files_arrive_byte_exact_over_rc(receiver, tmp_path, protocol):
    p, _ = transfer(receiver, tmp_path, protocol)
    # The transport line says rc and the lanes UCX chose: one-sided on rc_verbs, no ud lane.
    assert "transport rdma (rc)" in p.stderr, p.stderr
    m = re.search(r"UCX lanes: ([^;\n]*)", p.stderr)
    assert m and "rc_verbs/rxe0:1" in m.group(1) and "rma" in m.group(1), p.stderr


@pytest.mark.deadline(600)
def test_synthetic_frames_of_a_mebibyte_verify(receiver, tmp_path):
    """Every frame carries a payload derived from its device and number (tools/synthetic.h), checked by `slotstream
    verify`: a torn, stale or misplaced block fails it. 1 MiB frames in 1 MiB blocks (each spans two)."""
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "rdma", "--exit-after-senders", 1)
    p = send(rx.addr, "--name", "syn", "--transport", "rdma", "--blocks", 8, "--block-size", "1M",
             "--synthetic", "0-2:5:1024x1024x1", "--duration", 3, "--json")
    assert p.returncode == 0, p.stderr
    sent = json.loads(p.stdout)
    assert sent["messages"] > 0 and sent["transport"] == "rdma", sent
    report = helpers.parse_finished(rx.stdout.next_line(120))
    assert report["messages"] == sent["messages"] and report["gaps"] == 0, (report, sent)
    v = subprocess.run([BIN, "verify", str(out)], capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stdout + v.stderr
    assert re.search(rf"verified {sent['messages']} frames in 3 devices", v.stdout), v.stdout


@pytest.mark.deadline(600)
def test_two_senders_at_once(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "rdma", "--exit-after-senders", 2)
    files = {name: helpers.make_files(tmp_path, [2_500_000, 300_000, 5], name) for name in ("a", "b")}
    results = {}

    def run(name, protocol):
        results[name] = send(rx.addr, "--name", name, "--transport", "rdma", "--protocol", protocol,
                             "--blocks", 3, "--block-size", "1M", *file_args(0, files[name][:2]),
                             *file_args(4, files[name][2:]))

    threads = [threading.Thread(target=run, args=("a", "status_byte")),
               threading.Thread(target=run, args=("b", "credit"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, p in results.items():
        assert p.returncode == 0, (name, p.stderr)
    reports = {r["name"]: r for r in (helpers.parse_finished(rx.stdout.next_line(120)) for _ in range(2))}
    assert set(reports) == {"a", "b"} and all(r["messages"] == 3 and r["gaps"] == 0 for r in reports.values())
    assert rx.wait(60) == 0
    for name, paths in files.items():
        assert [stored(out, name, 0, 0), stored(out, name, 0, 1), stored(out, name, 4, 0)] == \
               [p.read_bytes() for p in paths], name


@pytest.mark.deadline(300)
def test_auto_picks_rdma_where_shared_memory_does_not_reach(receiver, tmp_path):
    """Both ends have the device; the sender runs in another IPC namespace (no shm between them): auto says rdma."""
    out = tmp_path / "out"
    rx = receiver("--out", out, "--exit-after-senders", 1)  # recv's default: auto
    f = helpers.make_files(tmp_path, [1_500_000], "auto")
    p = send(rx.addr, "--name", "auto", *file_args(0, f), prefix=("unshare", "--ipc"))
    assert p.returncode == 0, p.stderr
    assert re.search(r"transport rdma \(rc\): .*no shm", p.stderr), p.stderr
    line = rx.stdout.next_line(120)
    assert helpers.parse_finished(line)["messages"] == 1 and " transport=rdma " in line + " ", line
    assert stored(out, "auto", 0, 0) == f[0].read_bytes()


def bench_pair(receiver_args, sender_args, env=None, timeout=300):
    """One bench-peer pair (docs/bench-peer.md): the receiver's session record (JSON) for one sender."""
    rx = helpers.Proc([BIN, "bench-peer", "recv", "--listen", f"{HOST}:0", "--sessions", 1, *receiver_args], env=env)
    try:
        _, line = rx.stdout.wait_for(r"^listening on ", 120)
        addr = line.split()[-1]
        p = subprocess.run([BIN, "bench-peer", "send", "--to", addr, *map(str, sender_args)], capture_output=True,
                           text=True, timeout=timeout, env=env)
        assert p.returncode == 0, p.stderr
        _, record = rx.stdout.wait_for(r'^\{.*"event": *"session"', 120)
        return json.loads(record)
    finally:
        rx.terminate(10)


@pytest.mark.deadline(600)
def test_the_status_byte_receiver_makes_no_progress_call_while_data_moves():
    """The paper's passive receiver on rc: its UCX worker is not progressed once the sender is connected (progress
    during the connection is counted apart). sliding_window's receiver, which takes part, shows the count is live."""
    passive = bench_pair(["--transport", "rdma"], ["--transport", "rdma", "--protocol", "status_byte",
                                                   "--size", 65536, "--count", 400, "--blocks", 3])
    assert passive["messages"] == 400, passive
    res = passive["resources"]
    assert res["progress_calls"] == 0, res
    assert res["setup_progress_calls"] > 0, res
    active = bench_pair(["--transport", "rdma"], ["--transport", "rdma", "--protocol", "sliding_window",
                                                  "--size", 65536, "--count", 100, "--blocks", 3])
    assert active["messages"] == 100 and active["resources"]["progress_calls"] > 0, active


@pytest.mark.deadline(600)
def test_ud_works_and_its_receiver_takes_part(receiver, tmp_path):
    """ud has no RMA in hardware: UCX emulates it, and the receiver's worker answers (a progress thread). It works,
    and says so: `protocols --json` marks rdma:ud as taking part, and the receiver's progress calls show it."""
    info = {p["name"]: p for p in json.loads(subprocess.run([BIN, "protocols", "--json"], capture_output=True,
                                                             text=True, timeout=60).stdout)}
    assert info["status_byte"]["receiver_progress_on"]["rdma:ud"] is True
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "rdma", "--rdma-transport", "ud", "--exit-after-senders", 1)
    f = helpers.make_files(tmp_path, [1_200_000, 10], "ud")
    p = send(rx.addr, "--name", "ud", "--transport", "rdma", "--block-size", "256K", *file_args(0, f))
    assert p.returncode == 0, p.stderr
    assert "transport rdma (ud)" in p.stderr and "ud_verbs" in p.stderr, p.stderr
    assert helpers.parse_finished(rx.stdout.next_line(120))["messages"] == 2
    assert [stored(out, "ud", 0, i) for i in range(2)] == [x.read_bytes() for x in f]
    rec = bench_pair(["--transport", "rdma", "--rdma-transport", "ud"],
                     ["--transport", "rdma", "--protocol", "status_byte", "--size", 4096, "--count", 50, "--blocks", 3])
    assert rec["messages"] == 50 and rec["resources"]["progress_calls"] > 0, rec


@pytest.mark.deadline(600)
def test_a_passive_protocol_over_emulated_puts_is_refused_with_the_reason(receiver, tmp_path):
    """A user's UCX_TLS=ud_verbs on both ends leaves UCX no lane that puts in hardware; over rc the status-byte receiver
    is not progressed, so its puts would never complete. The sender refuses it (saying the lanes and what to do), the
    receiver logs why, nobody hangs; a protocol whose receiver takes part still works there."""
    env = env_with(UCX_TLS="ud_verbs")
    rx = receiver("--out", tmp_path / "out", "--transport", "rdma", env=env)
    f = helpers.make_files(tmp_path, [100_000], "emu")
    p = send(rx.addr, "--name", "emu", "--transport", "rdma", "--protocol", "status_byte", *file_args(0, f), env=env,
             timeout=180)
    assert p.returncode != 0
    assert "UCX chose no lane that puts in hardware" in p.stderr and "ud_verbs" in p.stderr, p.stderr
    assert "UCX_TLS=ud_verbs from the environment" in p.stderr, p.stderr
    helpers.wait_until(lambda: "refused sender emu" in rx.stderr.text, 60, "the receiver's refusal line")
    assert "UCX chose no lane that puts in hardware" in rx.stderr.text
    ok = send(rx.addr, "--name", "emu2", "--transport", "rdma", "--protocol", "credit", *file_args(0, f), env=env)
    assert ok.returncode == 0, ok.stderr
    assert stored(tmp_path / "out", "emu2", 0, 0) == f[0].read_bytes()
