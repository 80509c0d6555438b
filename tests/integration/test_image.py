"""Workers in real containers (podman, image from `make image`): the command line of
deploy/image/README.md, enforced limits, the example workers, and the receiver's podman runtime;
the image itself: its version tag and labels, the receiver daemon it runs by default as an
unprivileged user, and the GStreamer plugin (slotstreamsrc, slotstreamsink) with gst-launch-1.0.

These tests skip only where podman is not installed. Anywhere else an image that cannot be built
or a container that cannot run is a failure: scripts/test.sh (CI) builds the image first."""
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest
import yaml

from conftest import BIN, REPO, parse_finished, run_send, run_send_json, send, synthetic_slots

REPOSITORY = "localhost/slotstream"
IMAGE = f"{REPOSITORY}:latest"
DAEMON_UID = 10001
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]


def podman_problem():
    """None when the image is built (brought up to date with this build first, as root) and
    containers run here, else what is wrong."""
    if os.geteuid() == 0:
        # Cached: 1 s when nothing changed, ~15 s for a re-import, a few minutes on a fresh machine.
        p = subprocess.run(["bash", str(REPO / "deploy" / "image" / "build.sh")], capture_output=True, text=True,
                           timeout=900)
        if p.returncode != 0:
            return "deploy/image/build.sh failed: " + (p.stdout + p.stderr).strip()[-1500:]
    if subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True).returncode != 0:
        return f"{IMAGE} is not built: run `make image` first (as root; ~2 minutes the first time)"
    p = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", *ULIMITS, "--entrypoint", "true", IMAGE],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return "podman cannot run containers here: " + p.stderr.strip()[-300:]
    return None


@pytest.fixture(scope="module", autouse=True)
def containers_available():
    if not shutil.which("podman"):
        pytest.skip("podman is not installed (scripts/setup.sh installs it)")
    problem = podman_problem()
    if problem:
        pytest.fail(problem, pytrace=False)


def worker_argv(name, device_dir, worker_dir, command, sender="cams", device=0, cpus=None, memory=None,
                detach=False):
    """One worker's `podman run`, exactly as deploy/image/README.md documents it."""
    a = ["podman", "--runtime", "runc", "run", "--rm", "--replace", "--init", "--name", name,
         "--network", "none", "--user", "0:0", "--cap-drop", "all", "--security-opt", "no-new-privileges", *ULIMITS,
         "-v", f"{device_dir}:/data/device:ro", "-v", f"{worker_dir}:/data/worker",
         "-e", "SLOTSTREAM_DEVICE_DIR=/data/device", "-e", "SLOTSTREAM_WORKER_DIR=/data/worker",
         "-e", f"SLOTSTREAM_SENDER={sender}", "-e", f"SLOTSTREAM_DEVICE={device}"]
    if cpus:
        a += ["--cpus", cpus]
    if memory:
        a += ["--memory", memory]
    if detach:
        a.insert(a.index("run") + 1, "-d")
    return a + ["--entrypoint", "/bin/sh", IMAGE, "-c", command]


@pytest.fixture
def container():
    """Names for containers of one test; whatever is still running is removed afterwards."""
    names = []

    def name(kind):
        n = f"slotstream-test{os.getpid()}-{kind}-{uuid.uuid4().hex[:6]}"
        names.append(n)
        return n

    yield name
    if names:
        subprocess.run(["podman", "rm", "-f", "-i", "-t", "0", *names], capture_output=True, timeout=60)


def dirs(tmp_path):
    device, worker = tmp_path / "device-0", tmp_path / "worker-0"
    device.mkdir()
    worker.mkdir()
    return device, worker


def test_checksum_worker_in_a_container(tmp_path, container):
    device, worker = dirs(tmp_path)
    payloads = [os.urandom(1000 + i) for i in range(5)]
    for i, b in enumerate(payloads):
        (device / f"{i:010d}.bin").write_bytes(b)
    # The worker runs forever (it waits for SEQ 5); stop it once done says 4.
    name = container("checksum")
    p = subprocess.run(worker_argv(name, device, worker, "sh /opt/slotstream/workers/checksum.sh", device=7,
                                   cpus="0.5", memory="128m", detach=True), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    wait_done(worker / "done", 4, 30)
    t = time.monotonic()
    subprocess.run(["podman", "stop", "-t", "2", name], capture_output=True, timeout=30, check=True)
    assert time.monotonic() - t < 1.5, "with --init, SIGTERM stops the worker at once"
    for i, b in enumerate(payloads):
        r = json.loads((worker / "results" / f"{i:010d}.json").read_text())
        assert r == {"device": 7, "seq": i, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
    assert sorted(os.listdir(worker / "results")) == [f"{i:010d}.json" for i in range(5)]
    # --rm removal after a detached container stops is asynchronous: give it a few seconds.
    deadline = time.monotonic() + 10
    while subprocess.run(["podman", "container", "exists", name]).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    gone = subprocess.run(["podman", "container", "exists", name]).returncode
    assert gone != 0, "podman stop on a --rm container removes it"


# Reads the container's own limits (cgroup v2 or v1) and tests them: 100 MB fits in 256m,
# 400 MB is OOM-killed; a 2 s busy loop's CPU time is measured under --cpus.
LIMITS_PROBE = r"""
cg=/sys/fs/cgroup
if [ -f $cg/memory.max ]; then echo "memory $(cat $cg/memory.max)"; echo "cpu $(cat $cg/cpu.max)"
else echo "memory $(cat $cg/memory/memory.limit_in_bytes)"
     echo "cpu $(cat $cg/cpu/cpu.cfs_quota_us) $(cat $cg/cpu/cpu.cfs_period_us)"; fi
used() { if [ -f $cg/cpu.stat ]; then echo $(( $(sed -n 's/^usage_usec //p' $cg/cpu.stat) * 1000 ));
         else cat $cg/cpuacct/cpuacct.usage; fi; }
dd if=/dev/zero of=/dev/null bs=100M count=1 2>/dev/null; echo "alloc100 $?"
dd if=/dev/zero of=/dev/null bs=400M count=1 2>/dev/null; echo "alloc400 $?"
a=$(used); timeout 2 sh -c 'while :; do :; done'; b=$(used); echo "busy_ms $(( (b - a) / 1000000 ))"
"""


def probe_limits(tmp_path, container, **limits):
    device, worker = dirs(tmp_path)
    p = subprocess.run(worker_argv(container("limits"), device, worker, LIMITS_PROBE, **limits),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return dict(line.split(" ", 1) for line in p.stdout.strip().splitlines())


def test_memory_and_cpu_limits_are_enforced(tmp_path, container):
    got = probe_limits(tmp_path, container, cpus="0.5", memory="256m")
    assert int(got["memory"]) == 256 * 1024 * 1024, got
    quota, period = got["cpu"].split()
    assert int(quota) / int(period) == pytest.approx(0.5), got
    assert got["alloc100"] == "0", got
    assert got["alloc400"] == "137", f"400 MB under --memory 256m was not OOM-killed: {got}"
    assert int(got["busy_ms"]) < 1400, f"a 2 s busy loop used more than 0.5 CPU: {got}"


def test_without_limits_nothing_is_capped(tmp_path, container):
    # The control for the test above: the same probe without --memory/--cpus.
    got = probe_limits(tmp_path, container)
    assert got["alloc400"] == "0", got
    assert got["cpu"].split()[0] in ("-1", "max"), got


def ffprobe(path, container_dir=None):
    """codec, frames of a segment (ffprobe on the host, or in the image when the host has none)."""
    args = ["-v", "error", "-select_streams", "v:0", "-count_frames", "-show_entries",
            "stream=codec_name,width,height,nb_read_frames", "-of", "csv=p=0"]
    if shutil.which("ffprobe"):
        cmd = ["ffprobe", *args, str(path)]
    else:
        cmd = ["podman", "--runtime", "runc", "run", "--rm", *ULIMITS, "-v", f"{path.parent}:/seg:ro",
               "--entrypoint", "ffprobe", IMAGE, *args, f"/seg/{path.name}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    codec, w, h, n = p.stdout.strip().split(",")
    return codec, f"{w}x{h}", int(n)


def test_h264_worker_in_a_container_survives_a_restart(tmp_path, container):
    device, worker = dirs(tmp_path)
    # 110 test-pattern frames made by the image's own ffmpeg (the host may have none).
    gen = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--user", "0:0", *ULIMITS,
                          "-v", f"{device}:/frames",
                          "--entrypoint", "/bin/sh", IMAGE, "-c",
                          "ffmpeg -v error -f lavfi -i testsrc=size=640x480:rate=25 -frames:v 110 -f rawvideo "
                          "-pix_fmt rgb24 - | split -b 921600 -d -a 10 --additional-suffix=.bin - /frames/"],
                         capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    assert sorted(os.listdir(device)) == [f"{i:010d}.bin" for i in range(110)]
    cmd = "SLOTSTREAM_IDLE_SECONDS=1 sh /opt/slotstream/workers/h264.sh"
    argv = worker_argv(container("h264"), device, worker, cmd, cpus="0.5", memory="256m", detach=True)
    t0 = time.monotonic()
    subprocess.run(argv, capture_output=True, timeout=60, check=True)
    # Stop it once the first segment is recorded (mid-way through the second), then start again:
    # the second segment is redone from its first frame, nothing is duplicated or skipped.
    wait_done(worker / "done", 49, 120)
    subprocess.run(["podman", "rm", "-f", "-t", "0", argv[argv.index("--name") + 1]], capture_output=True,
                   timeout=30, check=True)
    argv = worker_argv(container("h264"), device, worker, cmd, cpus="0.5", memory="256m", detach=True)
    subprocess.run(argv, capture_output=True, timeout=60, check=True)
    wait_done(worker / "done", 109, 180)
    elapsed = time.monotonic() - t0
    segments = sorted(os.listdir(worker / "segments"))
    assert segments == ["0000000000.mp4", "0000000050.mp4", "0000000100.mp4"], segments  # no temp files left
    got = [ffprobe(worker / "segments" / s) for s in segments]
    assert got == [("h264", "640x480", 50), ("h264", "640x480", 50), ("h264", "640x480", 10)], got
    print(f"110 frames encoded at --cpus 0.5 in {elapsed:.1f} s (including one restart and a 1 s idle close)")


# ------------------------------------------------------------------ the receiver's podman runtime

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
    sent = synthetic_slots(run_send_json(rx.addr, "--name", "cams", "--synthetic", "0-1:25:64x48x3", "--duration", 1),
                           (0, 1), 25, 1)
    for d in (0, 1):
        w = out / "cams" / f"worker-{d}"
        wait_done(w / "done", sent[d] - 1, 90)
        assert sorted(os.listdir(w / "results")) == [f"{i:010d}.json" for i in range(sent[d])]
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
    sent = {"cams": synthetic_slots(run_send_json(rx.addr, "--name", "cams", "--synthetic", "0-11:25:64x48x3",
                                                  "--duration", 1), range(12), 25, 1),
            "video": run_send_json(rx.addr, "--name", "video",
                                   "--video", "0=lavfi:testsrc=size=640x480:rate=25:duration=1")["sent"]}
    assert sent["video"][0] == 25  # a video file's frames are all sent, however long that takes
    for sender, devices in (("cams", range(12)), ("video", [0])):
        for d in devices:
            w = out / sender / f"worker-{d}"
            n = sent[sender][d]
            wait_done(w / "done", n - 1, 180)
            results = sorted(os.listdir(w / "results"))
            assert results == [f"{i:010d}.json" for i in range(n)], (sender, d)
    _, _, err = rx.stop(timeout=60)
    names = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    assert "slotstream-cams-device" not in names and "slotstream-video-device" not in names, \
        "worker containers left behind"


# ------------------------------------------------------------------ the image itself: the receiver daemon

def binary_version():
    out = subprocess.run([BIN, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    m = re.fullmatch(r"slotstream (\S+)", out)
    assert m, out
    return m.group(1)


def test_image_is_tagged_and_labelled_with_the_version():
    version = binary_version()
    tagged = f"{REPOSITORY}:{version}"
    assert subprocess.run(["podman", "image", "exists", tagged]).returncode == 0, f"no {tagged}"
    ids = {subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", i], capture_output=True, text=True,
                          check=True).stdout.strip() for i in (tagged, IMAGE)}
    assert len(ids) == 1, f":latest and :{version} are different images"
    cfg = json.loads(subprocess.run(["podman", "image", "inspect", tagged], capture_output=True, text=True,
                                    check=True).stdout)[0]["Config"]
    assert cfg["Labels"]["org.opencontainers.image.version"] == version
    assert cfg["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert cfg["User"] == f"{DAEMON_UID}:{DAEMON_UID}", "the daemon must not run as root by default"
    assert cfg["Entrypoint"] == ["/usr/local/bin/slotstream"] and cfg["Cmd"][0] == "recv", cfg


def host_uid(container):
    """The real uid (on the host) of a running container's first process."""
    pid = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", container], capture_output=True,
                         text=True, check=True).stdout.strip()
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))


def container_logs_matching(container, pattern, timeout):
    deadline = time.monotonic() + timeout
    logs = ""
    while time.monotonic() < deadline:
        p = subprocess.run(["podman", "logs", container], capture_output=True, text=True, timeout=30)
        logs = p.stdout + p.stderr
        m = re.search(pattern, logs)
        if m:
            return m, logs
        time.sleep(0.2)
    raise AssertionError(f"container {container} never logged {pattern!r}:\n{logs}")


def test_default_command_is_the_receiver_as_an_unprivileged_user(container):
    # The image's own command, unchanged, in a network namespace of its own (port 7000 is then free).
    name = container("daemon")
    subprocess.run(["podman", "--runtime", "runc", "run", "-d", "--rm", "--name", name, *ULIMITS, IMAGE],
                   capture_output=True, timeout=60, check=True)
    container_logs_matching(name, r"listening on 0\.0\.0\.0:7000", 30)
    container_logs_matching(name, r"metrics on http://0\.0\.0\.0:9100/metrics", 10)
    assert host_uid(name) == DAEMON_UID


def test_daemon_in_a_container_stores_what_a_sender_sends(tmp_path, container):
    # The daemon image as deployed (its entrypoint, its user), on the host network with ports picked
    # by the kernel; a sender on the host sends to it over tcp into a host directory it owns.
    out = tmp_path / "streams"
    out.mkdir()
    os.chown(out, DAEMON_UID, DAEMON_UID)
    name = container("daemon")
    subprocess.run(["podman", "--runtime", "runc", "run", "-d", "--rm", "--name", name, "--network", "host",
                    *ULIMITS, "-v", f"{out}:/var/lib/slotstream/streams", IMAGE,
                    "recv", "--listen", "127.0.0.1:0", "--out", "/var/lib/slotstream/streams", "--transport", "tcp"],
                   capture_output=True, timeout=60, check=True)
    m, _ = container_logs_matching(name, r"listening on (127\.0\.0\.1:\d+)", 30)
    run_send(m.group(1), "--name", "cam", "--transport", "tcp", "--synthetic", "0-1:25:64x48x3", "--duration", 1)
    files = sorted((out / "cam" / "device-0").iterdir())
    assert len(files) == 25, files
    assert all(f.stat().st_uid == DAEMON_UID for f in files), "stored by someone else than the daemon user"
    assert subprocess.run([BIN, "verify", str(out)], capture_output=True, timeout=60).returncode == 0


# ------------------------------------------------------------------ the GStreamer plugin in the image

def test_gstreamer_plugin_in_the_image_streams_to_a_receiver_on_the_host(receiver, tmp_path, container):
    """GStreamer finds both elements of this version in its own plugin directory (no GST_PLUGIN_PATH), and a
    pipeline in a container, as the image's user, sends 10 frames with slotstreamsink to `slotstream recv` on the
    host over tcp (the image had no GStreamer before)."""
    for element, long_name in (("slotstreamsrc", "slotstream source"), ("slotstreamsink", "slotstream sink")):
        p = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--network", "none", *ULIMITS,
                            "--entrypoint", "gst-inspect-1.0", IMAGE, element], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert re.search(rf"Long-name\s+{long_name}$", p.stdout, re.M), p.stdout
        assert re.search(rf"Version\s+{re.escape(binary_version())}$", p.stdout, re.M), p.stdout
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "tcp", "--exit-after-senders", "1")
    p = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--name", container("gst"), "--network", "host",
                        *ULIMITS, "--entrypoint", "gst-launch-1.0", IMAGE, "-q", "videotestsrc", "num-buffers=10", "!",
                        "video/x-raw,width=64,height=48,format=RGB,framerate=25/1", "!", "slotstreamsink",
                        f"to={rx.addr}", "transport=tcp", "device=2", "sender-name=gst-image", "sync=false"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert rx.wait(30) == 0, rx.stderr.text
    # The stream as slotstreamsink sends it: caps, the 10 frames (64x48 RGB each, with their timestamps), end of stream.
    files = sorted((out / "gst-image" / "device-2").iterdir())
    assert len(files) == 12, files
    assert all(f.stat().st_size >= 64 * 48 * 3 for f in files[1:11]), [f.stat().st_size for f in files]
    report = parse_finished(rx.stdout.next_line(5))
    assert report["name"] == "gst-image" and report["messages"] == 12 and report["gaps"] == 0, report


# ------------------------------------------------------------------ the Helm chart's receiver pod, for real

CHART = REPO / "deploy" / "helm" / "slotstream"


def helm_template(*args):
    tool = REPO / "build" / "tools-bin" / "helm"
    tool = str(tool) if tool.exists() else shutil.which("helm")
    if not tool:
        pytest.fail("helm is missing: run `bash scripts/setup.sh test` (it builds helm into build/tools-bin)")
    p = subprocess.run([tool, "template", "slotstream", str(CHART), *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def pod_of_the_charts_receiver(tmp_path, control, metrics):
    """The Pod the chart's receiver DaemonSet makes (default values: transport auto, no RDMA), as the kubelet would
    run it on one node, with what podman 4.3's `kube play` does differently from a kubelet made explicit: the
    node's hostPath directories and the token Secret become directories here (the Secret as the kubelet mounts it:
    the token file, mode 0440, the pod's fsGroup); an emptyDir is a 0777 directory (the kubelet's mode; podman's
    own would be root's 0755, where the unprivileged receiver cannot make UCX's shared memory); no container ports
    on the host network (podman refuses any port mapping there) and the probes' named port as its number; the init
    container kept after it ran (podman's default, removing it, races its exit: "failed to remove once init
    container")."""
    docs = helm_template("--set", f"receiver.controlPort={control}", "--set", f"receiver.metricsPort={metrics}")
    ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "slotstream-receiver")
    template = ds["spec"]["template"]
    spec = template["spec"]
    gid = spec["securityContext"]["fsGroup"]
    dirs = {}
    for v in spec["volumes"]:
        d = dirs[v["name"]] = tmp_path / "volumes" / v["name"]
        d.mkdir(parents=True)
        if "secret" in v:
            secret = next(s for s in docs if s["kind"] == "Secret" and s["metadata"]["name"] == v["secret"]["secretName"])
            for key, value in secret["data"].items():
                f = d / key
                f.write_bytes(base64.b64decode(value))
                os.chown(f, 0, gid)
                f.chmod(v["secret"]["defaultMode"])
            del v["secret"]
        elif "emptyDir" in v:
            d.chmod(0o777)
            del v["emptyDir"]
        else:
            assert v["hostPath"]["type"] == "DirectoryOrCreate", v
            del v["hostPath"]
        v["hostPath"] = {"path": str(d), "type": "Directory"}
    for c in spec["containers"]:
        ports = {p["name"]: p["containerPort"] for p in c.pop("ports", [])}
        for probe in ("livenessProbe", "readinessProbe"):
            c[probe]["httpGet"]["port"] = ports.get(c[probe]["httpGet"]["port"], c[probe]["httpGet"]["port"])
    spec.pop("nodeSelector", None)
    name = f"slotstream-test-{uuid.uuid4().hex[:8]}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": template["metadata"]["labels"],
                        "annotations": {"io.podman.annotations.init.container.type": "always"}},
           "spec": spec}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path, pod, dirs


@pytest.mark.deadline(240)
def test_the_charts_receiver_pod_runs_under_podman_kube_play(tmp_path):
    """The chart's receiver pod spec run for real (`podman kube play`, the image from deploy/image): its init
    container hands the data directory to the unprivileged user, the receiver runs as 10001 with a read-only
    root and no capability, its probes' /health and /ready answer on the metrics port, and a sender on the host
    stores frames through it into the node's directory; `podman kube down` removes it all."""
    control, metrics = free_ports(2)
    path, pod, dirs = pod_of_the_charts_receiver(tmp_path, control, metrics)
    name = pod["metadata"]["name"]
    rx = pod["spec"]["containers"][0]
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n'
                    '[engine]\nruntime = "runc"\n')
    env = dict(os.environ, CONTAINERS_CONF=str(conf))
    try:
        p = subprocess.run(["podman", "kube", "play", "--replace", str(path)], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        container = f"{name}-{rx['name']}"
        probes = {k: f"http://127.0.0.1:{rx[k]['httpGet']['port']}{rx[k]['httpGet']['path']}"
                  for k in ("livenessProbe", "readinessProbe")}
        assert probes == {"livenessProbe": f"http://127.0.0.1:{metrics}/health",
                          "readinessProbe": f"http://127.0.0.1:{metrics}/ready"}
        deadline = time.monotonic() + 60
        while True:
            answers = {k: http_get(url) for k, url in probes.items()}
            if all(status == 200 for status, _ in answers.values()):
                break
            state = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", container],
                                   capture_output=True, text=True, timeout=30).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                logs = subprocess.run(["podman", "logs", container], capture_output=True, text=True, timeout=30)
                raise AssertionError(f"probes {answers}, container {state}:\n{logs.stdout}{logs.stderr}")
            time.sleep(0.5)
        assert json.loads(answers["readinessProbe"][1])["ready"] is True, answers
        assert host_uid(container) == DAEMON_UID
        inspect = json.loads(subprocess.run(["podman", "inspect", container], capture_output=True, text=True,
                                            check=True, timeout=30).stdout)[0]
        assert inspect["HostConfig"]["ReadonlyRootfs"] is True
        assert not inspect.get("EffectiveCaps"), inspect.get("EffectiveCaps")
        assert (dirs["streams"].stat().st_uid, dirs["streams"].stat().st_gid) == (DAEMON_UID, DAEMON_UID), \
            "the init container did not hand the node's directory over"
        # Wall-clock --duration: under load some of the 25 frames a second are late and not sent (the summary says).
        sent = run_send_json(f"127.0.0.1:{control}", "--name", "cam", "--token-file", str(dirs["token"] / "token"),
                             "--transport", "tcp", "--synthetic", "0-1:25:64x48x3", "--duration", 1)
        assert sent["messages"] + sent["late_frames"] == 50 and sent["sent"][0] > 0, sent
        files = sorted((dirs["streams"] / "cam" / "device-0").iterdir())
        assert len(files) == sent["sent"][0] and all(f.stat().st_uid == DAEMON_UID for f in files), (files, sent)
        assert subprocess.run([BIN, "verify", str(dirs["streams"])], capture_output=True, timeout=60).returncode == 0
    finally:
        down = subprocess.run(["podman", "kube", "down", str(path)], capture_output=True, text=True, timeout=120,
                              env=env)
        left = subprocess.run(["podman", "pod", "exists", name], capture_output=True, timeout=30).returncode == 0
        if left:
            subprocess.run(["podman", "pod", "rm", "-f", name], capture_output=True, timeout=120)
    assert down.returncode == 0 and not left, down.stdout + down.stderr
