"""Data arrives complete, in order, per device — over shm and tcp, with real processes."""
import json
import os
import subprocess
import threading

import pytest

from conftest import BIN, TRANSPORTS, send, seq_name, sha256

BLOCK = 65536
HEADER = 16


def make_files(tmp_path, sizes, tag):
    paths = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"{tag}-{i}.bin"
        p.write_bytes(os.urandom(size))
        paths.append(p)
    return paths


def assert_device(out, sender, device, sources):
    d = out / sender / f"device-{device}"
    names = sorted(os.listdir(d))
    assert names == [seq_name(i) for i in range(len(sources))], f"unexpected files in {d}: {names}"
    for i, src in enumerate(sources):
        assert sha256(d / seq_name(i)) == sha256(src), f"{d / seq_name(i)} differs from {src}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_edge_sizes_several_devices(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport, "--exit-after-senders", 1)
    sizes = [0, 1, BLOCK - HEADER, BLOCK - HEADER + 1, BLOCK, BLOCK + 1, 3_000_000]
    dev = {d: make_files(tmp_path, sizes[d:] + sizes[:d], f"d{d}") for d in range(3)}
    args = ["--name", "edge", "--transport", transport, "--block-size", BLOCK, "--blocks", 8]
    for d, files in dev.items():
        args += [x for f in files for x in ("--file", f"{d}={f}")]
    send(rx.addr, *args)
    report = rx.lines(1)[0]
    assert report.startswith("sender edge finished: messages=21 "), report
    assert "gaps=0 duplicates=0" in report
    rc, _, _ = rx.stop()
    assert rc == 0
    for d, files in dev.items():
        assert_device(out, "edge", d, files)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dir_source_sorted_by_name(receiver, tmp_path, transport):
    out = tmp_path / "out"
    src = tmp_path / "frames"
    src.mkdir()
    for name in ["b", "a", "c"]:
        (src / name).write_bytes(os.urandom(100_000))
    rx = receiver("--out", out, "--transport", transport)
    send(rx.addr, "--name", "dirs", "--transport", transport, "--block-size", 16384, "--dir", f"7={src}")
    assert_device(out, "dirs", 7, [src / "a", src / "b", src / "c"])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_several_senders_at_once(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport, "--exit-after-senders", 3)
    files = {n: make_files(tmp_path, [200_000, 1, 70_000], n) for n in ("s1", "s2", "s3")}
    results = {}

    def run(name):
        args = ["--name", name, "--transport", transport, "--block-size", 32768, "--blocks", 4]
        for f in files[name]:
            args += ["--file", f"0={f}", "--file", f"1={f}"]
        results[name] = send(rx.addr, *args, check=False)

    threads = [threading.Thread(target=run, args=(n,)) for n in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, p in results.items():
        assert p.returncode == 0, p.stderr.decode()
        for d in (0, 1):
            assert_device(out, name, d, files[name])
    assert rx.proc.wait(timeout=20) == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reconnect_continues_numbering(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport)
    first = make_files(tmp_path, [1000, 2000], "first")
    second = make_files(tmp_path, [3000], "second")
    send(rx.addr, "--name", "cam", "--transport", transport, *[x for f in first for x in ("--file", f"0={f}")])
    send(rx.addr, "--name", "cam", "--transport", transport, "--file", f"0={second[0]}")
    assert_device(out, "cam", 0, first + second)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_synthetic_frames_verify_and_json(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport)
    p = send(rx.addr, "--name", "syn", "--transport", transport, "--synthetic", "0-3:50:160x120x3",
             "--duration", 1, "--json")
    j = json.loads(p.stdout)
    for key in ("messages", "bytes", "seconds", "mb_per_s", "devices", "cpu_seconds", "transport", "protocol",
                "blocks", "block_size"):
        assert key in j, key
    assert j["messages"] == 200 and j["devices"] == {str(d): 50 for d in range(4)}
    assert j["transport"] == transport
    v = subprocess.run([BIN, "verify", str(out)], capture_output=True, timeout=60)
    assert v.returncode == 0, v.stderr.decode()
    assert v.stdout.decode().startswith("verified 200 frames in 4 devices")


def test_verify_detects_a_corrupt_frame(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out)
    send(rx.addr, "--name", "syn", "--synthetic", "0:50:64x64x3", "--duration", 0.2)
    victim = out / "syn" / "device-0" / seq_name(3)
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    v = subprocess.run([BIN, "verify", str(out)], capture_output=True, timeout=60)
    assert v.returncode == 1
    assert seq_name(3) in v.stderr.decode()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_held_block_is_skipped_and_reused(receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport, "--hold-block", "2:0:300")
    files = make_files(tmp_path, [3000] * 60, "h")
    p = send(rx.addr, "--name", "held", "--transport", transport, "--blocks", 4, "--block-size", 4096, "--json",
             *[x for f in files for x in ("--file", f"0={f}")])
    j = json.loads(p.stdout)
    assert j["held_skips"] > 0, "the sender never saw the held block"
    assert_device(out, "held", 0, files)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_only_block_held_then_released_is_reused(receiver, tmp_path, transport):
    # One block, held for the first 300 ms: nothing can move until the receiver releases it,
    # so completing at all proves the held block is used again.
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", transport, "--hold-block", "0:0:300")
    files = make_files(tmp_path, [500] * 5, "one")
    p = send(rx.addr, "--name", "one", "--transport", transport, "--blocks", 1, "--block-size", 1024, "--json",
             *[x for f in files for x in ("--file", f"0={f}")])
    j = json.loads(p.stdout)
    assert j["held_skips"] > 0
    assert j["seconds"] >= 0.25, "data moved while the only block was held"
    assert_device(out, "one", 0, files)


def test_progress_line_only_on_a_terminal(receiver, tmp_path):
    rx = receiver("--out", tmp_path / "out")
    quiet = send(rx.addr, "--name", "quiet", "--synthetic", "0:25:32x32x3", "--duration", 0.6)
    assert quiet.stderr == b"", "progress output without a terminal"
    cmd = f"{BIN} send --to {rx.addr} --name tty --synthetic 0:25:32x32x3 --duration 1.2"
    t = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, timeout=60)
    assert t.returncode == 0, t.stdout
    assert b"messages" in t.stdout and b"MB/s" in t.stdout and b"held-block skips" in t.stdout


def test_demo_runs_and_verifies():
    p = subprocess.run([BIN, "demo", "--seconds", "1", "--cameras", "3"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verified: 75 of 75 frames" in p.stdout and "demo OK: zero loss" in p.stdout
