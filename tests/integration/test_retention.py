"""`recv --keep N` (tools/retention.h, WorkerOptions::keep): at most the N newest messages per device stay on disk,
and with workers a message is removed only once its worker has finished it. Without it, the README's 60-second
example of 12 cameras writes 16.6 GB."""
import subprocess
import time

import pytest

from conftest import BIN, CHECKSUM, done_of, make_files, run_send, seq_name, sha256


def names(d):
    return sorted(p.name for p in d.iterdir() if not p.name.startswith("."))


def files_of(device, paths):
    return [x for p in paths for x in ("--file", f"{device}={p}")]


@pytest.mark.deadline(60)
def test_keep_leaves_the_newest_n_of_each_device(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--keep", 5)
    small = make_files(tmp_path / "small", [100] * 20, "s")        # packed records: the batch path
    large = make_files(tmp_path / "large", [200_000] * 8, "l")     # a block each and more: the commit path
    run_send(rx.addr, "--name", "k", "--block-size", "64K", *files_of(0, small), *files_of(1, large))
    for device, sources in ((0, small), (1, large)):
        d = out / "k" / f"device-{device}"
        assert names(d) == [seq_name(i) for i in range(len(sources) - 5, len(sources))], names(d)
        for i in range(len(sources) - 5, len(sources)):
            assert sha256(d / seq_name(i)) == sha256(sources[i])
    # A second run of the same sender continues the numbers; the first run's files count too.
    run_send(rx.addr, "--name", "k", *files_of(0, small[:3]))
    assert names(out / "k" / "device-0") == [seq_name(i) for i in range(18, 23)]


@pytest.mark.deadline(60)
def test_keep_never_removes_what_a_worker_has_not_finished(receiver, tmp_path):
    out = tmp_path / "out"
    # A worker that never finishes anything: every message stays.
    rx = receiver("--out", out, "--worker", "sleep 60", "--keep", 2)
    run_send(rx.addr, "--name", "busy", *files_of(0, make_files(tmp_path / "a", [100] * 6, "a")))
    time.sleep(1)
    assert names(out / "busy" / "device-0") == [seq_name(i) for i in range(6)]


@pytest.mark.deadline(60)
def test_keep_with_a_worker_keeps_the_newest_n_once_finished(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", CHECKSUM, "--keep", 2)
    run_send(rx.addr, "--name", "w", *files_of(0, make_files(tmp_path / "a", [100] * 6, "a")))
    deadline = time.monotonic() + 20
    while done_of(out / "w" / "worker-0") < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done_of(out / "w" / "worker-0") == 5
    deadline = time.monotonic() + 5
    while names(out / "w" / "device-0") != [seq_name(4), seq_name(5)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert names(out / "w" / "device-0") == [seq_name(4), seq_name(5)]


@pytest.mark.parametrize("extra,why", [(["--discard"], "--discard"),
                                       (["--out", "/tmp", "--worker", "true", "--keep-processed"], "--keep-processed"),
                                       (["--out", "/tmp", "--transport", "udp"], "--transport udp")])
def test_keep_with_options_it_contradicts_is_a_usage_error(extra, why):
    p = subprocess.run([BIN, "recv", "--listen", "127.0.0.1:0", "--keep", "3", *extra], capture_output=True,
                       text=True, timeout=20)
    assert p.returncode == 2 and "--keep" in p.stderr and why in p.stderr, p.stderr
