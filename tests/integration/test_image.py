"""Workers in real containers (podman, image from `make image`): contract, limits, isolation."""
import os
import shutil
import subprocess
import time

import pytest

from conftest import send

IMAGE = "localhost/slotstream:latest"


def podman_ready():
    if not shutil.which("podman"):
        return "podman is not installed (make image installs it)"
    if subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True).returncode != 0:
        return f"{IMAGE} is not built: run `make image` (scripts/test.sh tries it)"
    p = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--ulimit", "nofile=20000:20000",
                        "--ulimit", "nproc=4096:4096", IMAGE, "true"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return "podman cannot run containers here: " + p.stderr.strip()[-300:]
    return None


REASON = podman_ready()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

# Records the container's limits (cgroup v2 or v1 files), then runs the checksum worker.
PROBE = ("sh -c 'for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes "
         "/sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us; "
         "do [ -f $f ] && echo \"$f $(cat $f)\"; done > $SLOTSTREAM_WORKER_DIR/limits; "
         "exec sh /opt/slotstream/workers/checksum.sh'")


def wait_done(path, seq, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if int(path.read_text()) == seq:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{path} never reached {seq}")


def test_workers_run_in_containers_with_enforced_limits(receiver, tmp_path):
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", PROBE, "--worker-runtime", "podman", "--worker-cpus", "0.5",
                  "--worker-memory", "256m", "--keep-processed")
    send(rx.addr, "--name", "cams", "--synthetic", "0-1:25:64x48x3", "--duration", 1)
    for d in (0, 1):
        w = out / "cams" / f"worker-{d}"
        wait_done(w / "done", 24, 90)
        assert sorted(os.listdir(w / "results")) == [f"{i:010d}.json" for i in range(25)]
        limits = dict(line.split(" ", 1) for line in (w / "limits").read_text().splitlines())
        mem = limits.get("/sys/fs/cgroup/memory.max") or limits.get("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        assert int(mem) == 256 * 1024 * 1024, limits
        if "/sys/fs/cgroup/cpu.max" in limits:
            quota, period = limits["/sys/fs/cgroup/cpu.max"].split()
        else:
            quota, period = limits["/sys/fs/cgroup/cpu/cpu.cfs_quota_us"], limits["/sys/fs/cgroup/cpu/cpu.cfs_period_us"]
        assert int(quota) / int(period) == pytest.approx(0.5), limits
    _, _, err = rx.stop(timeout=30)
    assert "started" in err
    names = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    assert "slotstream-cams-device" not in names, "worker containers left behind"


def test_worker_sees_its_device_read_only(receiver, tmp_path):
    out = tmp_path / "out"
    probe = ("sh -c 'touch /data/device/x 2>/dev/null && echo writable > $SLOTSTREAM_WORKER_DIR/ro "
             "|| echo readonly > $SLOTSTREAM_WORKER_DIR/ro; ls /data > $SLOTSTREAM_WORKER_DIR/ls; sleep 30'")
    rx = receiver("--out", out, "--worker", probe, "--worker-runtime", "podman")
    send(rx.addr, "--name", "iso", "--synthetic", "3:25:16x16x3", "--duration", 0.2)
    w = out / "iso" / "worker-3"
    deadline = time.monotonic() + 60
    while not (w / "ls").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (w / "ro").read_text().strip() == "readonly"
    assert sorted((w / "ls").read_text().split()) == ["device", "worker"]


def test_twelve_cameras_and_a_video_processed_in_containers(receiver, tmp_path):
    # 12 synthetic cameras and one ffmpeg test-pattern video, each device in its own container,
    # every frame processed once and in order.
    out = tmp_path / "out"
    rx = receiver("--out", out, "--worker", "sh /opt/slotstream/workers/checksum.sh", "--worker-runtime", "podman",
                  "--worker-cpus", "0.5", "--worker-memory", "128m", "--keep-processed")
    send(rx.addr, "--name", "cams", "--synthetic", "0-11:25:64x48x3", "--duration", 1)
    send(rx.addr, "--name", "video", "--video", "0=lavfi:testsrc=size=640x480:rate=25:duration=1")
    for sender, devices in (("cams", range(12)), ("video", [0])):
        for d in devices:
            w = out / sender / f"worker-{d}"
            wait_done(w / "done", 24, 180)
            results = sorted(os.listdir(w / "results"))
            assert results == [f"{i:010d}.json" for i in range(25)], (sender, d)
    _, _, err = rx.stop(timeout=60)
    names = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    assert "slotstream-cams-device" not in names and "slotstream-video-device" not in names, \
        "worker containers left behind"
