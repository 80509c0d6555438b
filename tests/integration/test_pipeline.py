"""The edge pipeline: per-device workers, back-pressure through held blocks, restarts, metrics."""
import json
import shutil
import os
import pathlib
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import (BIN, CHECKSUM, REPO, SLOW_WORKER, done_of, make_files, metrics_address, run_send_json, send,
                      seq_name, sha256, synthetic_slots)


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def metrics(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return None


def test_every_frame_processed_once_in_order(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", CHECKSUM, "--keep-processed")
    sent = synthetic_slots(run_send_json(rx.addr, "--name", "cams", "--synthetic", "0-2:50:64x48x3", "--duration", 1),
                           range(3), 50, 1)
    for d in range(3):
        w = out / "cams" / f"worker-{d}"
        wait_for(lambda: done_of(w) == sent[d] - 1, 20, f"worker {d} to finish")
        results = sorted(os.listdir(w / "results"))
        assert results == [f"{i:010d}.json" for i in range(sent[d])]
        for i in range(sent[d]):
            r = json.loads((w / "results" / f"{i:010d}.json").read_text())
            assert r["seq"] == i and r["device"] == d
            assert r["sha256"] == sha256(out / "cams" / f"device-{d}" / seq_name(i))


def test_processed_files_are_removed(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", CHECKSUM)
    sent = synthetic_slots(run_send_json(rx.addr, "--name", "cams", "--synthetic", "0:50:64x48x3", "--duration", 0.5),
                           [0], 50, 0.5)
    dev = out / "cams" / "device-0"
    wait_for(lambda: done_of(out / "cams" / "worker-0") == sent[0] - 1, 20, "worker")
    wait_for(lambda: os.listdir(dev) == [], 5, "processed files to be removed")




def test_slow_worker_throttles_the_sender_with_bounded_backlog(receiver, tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "slow.sh"
    script.write_text(SLOW_WORKER)
    rx = receiver("--out", out, "--worker", f"sh {script}", "--backlog-messages", 4,
                  "--metrics", "127.0.0.1:0")
    maddr = metrics_address(rx)
    # 40 files, not synthetic frames: frames that cannot be sent in their time (--duration is wall-clock) would
    # be counted late, and back-pressure is what this test makes.
    make_files(tmp_path / "frames", [3072] * 40, "f")
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "cam", "--blocks", "4", "--block-size", "8192",
                           "--dir", f"0={tmp_path / 'frames'}", "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    backlog, paused = [], []
    while tx.poll() is None:
        text = metrics(maddr)
        b = metric(text, "slotstream_worker_backlog_messages", sender="cam", device="0")
        if b is not None:
            backlog.append(b)
        h = metric(text, "slotstream_device_paused", sender="cam", device="0")
        if h is not None:
            paused.append(h)
        time.sleep(0.1)
    assert tx.returncode == 0, tx.stderr.read().decode()
    j = json.loads(tx.stdout.read())
    assert j["messages"] == 40
    # 40 messages through a worker doing 20 per second: the sender was held back.
    assert max(backlog) <= 4 + 1, f"backlog grew past its limit: {max(backlog)}"
    assert max(paused) > 0, "the device was never paused"
    w = out / "cam" / "worker-0"
    wait_for(lambda: done_of(w) == 39, 20, "the worker to catch up")
    text = metrics(maddr)
    assert metric(text, "slotstream_messages_total", sender="cam", device="0") == 40
    assert metric(text, "slotstream_stalls_total", sender="cam") >= 1
    assert metric(text, "slotstream_device_pauses_total", sender="cam", device="0") >= 1


def test_a_slow_worker_holds_back_its_own_device_only(receiver, tmp_path):
    # Device 0's worker does 20 messages a second; devices 1 and 2 have fast workers. Back-pressure is per device:
    # the slow one is paused while the others are stored and processed at once — they used to wait for it.
    out = tmp_path / "out"
    slow = tmp_path / "slow.sh"
    slow.write_text(SLOW_WORKER.replace("sleep 0.05", "sleep 0.25"))  # 4 messages a second
    fast = tmp_path / "fast.sh"
    fast.write_text(SLOW_WORKER.replace("sleep 0.05", ":"))  # as fast as the shell goes
    script = tmp_path / "pick.sh"
    script.write_text(f'if [ "$SLOTSTREAM_DEVICE" = 0 ]; then exec sh {slow}; else exec sh {fast}; fi\n')
    rx = receiver("--out", out, "--worker", f"sh {script}", "--backlog-messages", 3)
    # 40 files per device (synthetic frames held back this long would be counted late: --duration is wall-clock).
    make_files(tmp_path / "frames", [3072] * 40, "f")
    frames = f"{tmp_path / 'frames'}"
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "cam", "--blocks", "8", "--block-size", "8192",
                           "--dir", f"0={frames}", "--dir", f"1={frames}", "--dir", f"2={frames}"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for d in (1, 2):
        wait_for(lambda: done_of(out / "cam" / f"worker-{d}") == 39, 30, f"device {d}'s worker to finish")
    slow_done = done_of(out / "cam" / "worker-0")
    assert slow_done < 30, f"device 0 ({slow_done + 1} of 40 processed) was not behind: the test proves nothing"
    assert tx.wait(60) == 0, tx.stderr.read().decode()
    wait_for(lambda: done_of(out / "cam" / "worker-0") == 39, 30, "device 0's worker to catch up")
    _, _, err = rx.stop()
    assert "device 0 paused" in err, err


def test_killed_worker_restarts_and_skips_nothing(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", CHECKSUM, "--keep-processed", "--metrics", "127.0.0.1:0")
    maddr = metrics_address(rx)
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "cam", "--synthetic", "0:50:64x48x3",
                           "--duration", "3"], stderr=subprocess.PIPE)
    w = out / "cam" / "worker-0"
    wait_for(lambda: done_of(w) >= 10, 20, "the worker to start processing")
    # The worker's own processes (sh -c COMMAND and the script), not the receiver's command line.
    pattern = "^(/bin/)?sh .*" + str(REPO / "workers" / "checksum.sh")
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    assert pids, "worker process not found"
    # `sh -c COMMAND` first, the process whose end the receiver sees: killed after the script (or a subshell
    # of it), it could end on their deaths first ("exited with status 1" under load) instead of SIGKILL.
    shells = subprocess.run(["pgrep", "-f", "^(/bin/)?sh -c .*" + str(REPO / "workers" / "checksum.sh")],
                            capture_output=True, text=True).stdout.split()
    assert shells, "the worker's sh -c process not found"
    for pid in shells + [p for p in pids if p not in shells]:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass  # the script, gone with its sh -c's process group
    assert tx.wait(timeout=30) == 0
    wait_for(lambda: done_of(w) == 149, 30, "the restarted worker to finish")
    results = sorted(os.listdir(w / "results"))
    assert results == [f"{i:010d}.json" for i in range(150)], "a message was skipped or processed twice"
    text = metrics(maddr)
    assert metric(text, "slotstream_worker_restarts_total", sender="cam", device="0") >= 1
    _, _, err = rx.stop()
    assert "worker slotstream-cam-device-0 killed by signal 9; restarting" in err, err


def test_metrics_and_health(receiver, tmp_path):
    rx = receiver("--out", tmp_path / "out", "--metrics", "127.0.0.1:0")
    maddr = metrics_address(rx)
    sent = synthetic_slots(run_send_json(rx.addr, "--name", "m", "--synthetic", "0-1:50:32x32x3", "--duration", 0.2),
                           [0, 1], 50, 0.2)
    with urllib.request.urlopen(f"http://{maddr}/health", timeout=5) as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    text = metrics(maddr)
    assert metric(text, "slotstream_messages_total", sender="m", device="1") == sent[1]
    assert metric(text, "slotstream_gaps_total", sender="m", device="0") == 0
    assert metric(text, "slotstream_sessions_ended_total") == 1
    assert "# TYPE slotstream_held_blocks gauge" in text


def test_send_to_a_list_picks_a_live_receiver(receiver, tmp_path):
    a = receiver("--out", tmp_path / "a")
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(1000))
    p = send(f"127.0.0.1:1,{a.addr}", "--name", "pick", "--file", f"0={f}")
    assert f"using {a.addr}" in p.stderr.decode()
    assert "127.0.0.1:1: unavailable" in p.stderr.decode()
    assert sha256(tmp_path / "a" / "pick" / "device-0" / seq_name(0)) == sha256(f)


def test_video_test_pattern_one_message_per_frame(receiver, tmp_path):
    if subprocess.run(["which", "ffmpeg"], capture_output=True).returncode:
        pytest.fail("ffmpeg is missing: run scripts/setup.sh")
    out = tmp_path / "out"
    rx = receiver("--out", out)
    p = send(rx.addr, "--name", "vid", "--video", "3=lavfi:testsrc=size=640x480:rate=25:duration=1", "--json")
    assert json.loads(p.stdout)["messages"] == 25
    files = sorted(os.listdir(out / "vid" / "device-3"))
    assert files == [seq_name(i) for i in range(25)]
    assert all((out / "vid" / "device-3" / n).stat().st_size == 640 * 480 * 3 for n in files)


def test_external_workers_are_watched_for_back_pressure(receiver, tmp_path):
    # Workers that run elsewhere (Kubernetes pods) only record progress; the receiver holds
    # blocks while they lag and removes what they have finished.
    out, progress = tmp_path / "out", tmp_path / "progress"
    rx = receiver("--out", out, "--worker-dir", progress, "--backlog-messages", 3)
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "ext", "--blocks", "2", "--block-size", "4096",
                           "--synthetic", "0:200:16x16x3", "--duration", "0.05"], stderr=subprocess.PIPE)
    dev = out / "ext" / "device-0"
    wait_for(lambda: dev.exists() and len(os.listdir(dev)) >= 3, 10, "three messages")
    time.sleep(0.5)
    assert tx.poll() is None, "the sender finished although nobody processed anything"
    assert len([n for n in os.listdir(dev) if not n.startswith(".")]) == 3
    w = progress / "ext" / "worker-0"
    w.mkdir(parents=True)
    (w / "done").write_text("9\n")  # the external worker finished everything up to SEQ 9
    assert tx.wait(timeout=20) == 0
    wait_for(lambda: not (dev / seq_name(0)).exists(), 5, "processed messages to be removed")


def test_h264_worker_encodes_segments_of_every_frame(receiver, tmp_path):
    for tool in ("ffmpeg", "ffprobe"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: run scripts/setup.sh")
    out = tmp_path / "out"
    worker = f"SLOTSTREAM_SEGMENT_FRAMES=25 SLOTSTREAM_IDLE_SECONDS=1 sh {REPO / 'workers' / 'h264.sh'}"
    rx = receiver("--out", out, "--worker", worker)
    send(rx.addr, "--name", "vid", "--video", "0=lavfi:testsrc=size=640x480:rate=25:duration=2.4")
    w = out / "vid" / "worker-0"
    wait_for(lambda: done_of(w) == 59, 60, "the encoder to finish all 60 frames")
    segs = sorted(os.listdir(w / "segments"))
    assert segs == ["0000000000.mp4", "0000000025.mp4", "0000000050.mp4"]
    frames = []
    for s in segs:
        p = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames", "-show_entries",
                            "stream=codec_name,nb_read_frames", "-of", "csv=p=0", str(w / "segments" / s)],
                           capture_output=True, text=True, timeout=60)
        codec, n = p.stdout.strip().split(",")
        assert codec == "h264"
        frames.append(int(n))
    assert frames == [25, 25, 10]


def running(pattern):
    """pids of processes whose whole command line starts with `pattern` (not the shells that mention it)."""
    return subprocess.run(["pgrep", "-f", "^" + pattern], capture_output=True, text=True).stdout.split()


def test_a_killed_receiver_leaves_no_worker_process_behind(receiver, tmp_path):
    # A compound worker command: a background child, a pipeline, and a double-forked stray. The receiver dies by
    # SIGKILL (no clean-up code of its own runs); every one of them must go with it.
    marker = f"98765{os.getpid() % 1000:03d}"
    command = (f"sleep {marker}1 & sleep {marker}2 | cat & (sleep {marker}3 &) ; "
               f"sh {REPO / 'workers' / 'checksum.sh'}")
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", command)
    send(rx.addr, "--name", "cam", "--synthetic", "0:25:16x16x1", "--duration", "0.2")
    wait_for(lambda: len(running(f"sleep {marker}")) == 3, 20, "the worker's three sleeps")
    rx.sigkill()
    rx.wait(10)
    wait_for(lambda: running(f"sleep {marker}") == [], 10, "the worker's processes to end")


def test_a_worker_whose_command_ends_takes_its_children_along(receiver, tmp_path):
    # The command itself exits (and is restarted), leaving a background child: that child must not pile up.
    marker = f"97531{os.getpid() % 1000:03d}"
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", f"sleep {marker} & exit 3")
    send(rx.addr, "--name", "cam", "--synthetic", "0:25:16x16x1", "--duration", "0.2")
    _, line = rx.stderr.wait_for(r"exited with status 3", 20)
    time.sleep(1.0)
    assert len(running(f"sleep {marker}")) <= 1, "background children of ended worker commands keep running"
    rx.stop()
    wait_for(lambda: running(f"sleep {marker}") == [], 10, "the worker's processes to end")


@pytest.mark.deadline(60)
def test_checksum_worker_goes_on_past_numbers_stored_elsewhere(tmp_path):
    """A device that moved to another receiver and back leaves a gap in its directory (docs/platform.md):
    the example worker processes what is here, in order, and does not wait for the gap."""
    device, work = tmp_path / "device-0", tmp_path / "worker-0"
    device.mkdir()
    for n in (3, 4, 9, 10):
        (device / seq_name(n)).write_bytes(bytes([n]) * 8)
    env = dict(os.environ, SLOTSTREAM_DEVICE_DIR=str(device), SLOTSTREAM_WORKER_DIR=str(work), SLOTSTREAM_DEVICE="0")
    w = subprocess.Popen(["sh", str(REPO / "workers" / "checksum.sh")], env=env)
    try:
        wait_for(lambda: done_of(work) == 10, 20, "the worker past the gap")
        time.sleep(0.2)  # the gap's numbers do not appear later: a late one (5) is not waited for either
        (device / seq_name(11)).write_bytes(b"x")
        wait_for(lambda: done_of(work) == 11, 20, "the next message after the gap")
        assert sorted(p.name for p in (work / "results").glob("*.json")) == [
            f"{n:010d}.json" for n in (3, 4, 9, 10, 11)]
    finally:
        w.kill()
        w.wait()
