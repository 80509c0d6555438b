"""The Python package and the GStreamer elements over rdma on Soft-RoCE, once each: slotstream.Sender and
slotstream.Receiver(transport="rdma") against the CLI, and slotstreamsink transport=rdma into slotstreamsrc.
The Python tests need the package importable (tests/rdma/run.sh runs the suite with the venv CTest's python.install
makes, build/python-venv); the GStreamer test the build tree's plugin (build/gst)."""
import hashlib
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import BIN, HOST, REPO, file_args, helpers, send, stored

PLUGIN_DIR = pathlib.Path(BIN).resolve().parent / "gst"


def slotstream_module():
    try:
        import slotstream
    except ImportError as e:
        raise AssertionError(f"the slotstream package is not importable here ({e}): run the suite through "
                             f"tests/rdma/run.sh, which makes build/python-venv") from None
    return slotstream


@pytest.mark.deadline(600)
def test_python_sender_over_rdma(receiver, tmp_path):
    slotstream = slotstream_module()
    out = tmp_path / "out"
    rx = receiver("--out", out, "--transport", "rdma", "--exit-after-senders", 1)
    frames = [os.urandom(300_000) for _ in range(4)]
    with slotstream.Sender(rx.addr, name="py", transport="rdma", devices=[0, 5]) as tx:
        assert tx.transport == "rdma", tx.transport_reason
        assert "UCX lanes: rc_verbs" in tx.transport_reason, tx.transport_reason
        for i, frame in enumerate(frames):
            tx.send(0 if i % 2 == 0 else 5, frame)
    report = helpers.parse_finished(rx.stdout.next_line(120))
    assert report["messages"] == 4 and report["gaps"] == 0, report
    assert [stored(out, "py", 0, 0), stored(out, "py", 5, 0), stored(out, "py", 0, 1), stored(out, "py", 5, 1)] == \
           frames


@pytest.mark.deadline(600)
def test_python_receiver_over_rdma(tmp_path):
    slotstream = slotstream_module()
    files = helpers.make_files(tmp_path, [1_300_000, 7, 64_000], "pyrx")
    with slotstream.Receiver(f"{HOST}:0", transport="rdma", exit_after_senders=1) as rx:
        p = subprocess.Popen([BIN, "send", "--to", rx.address, "--name", "cli", "--transport", "rdma",
                              *file_args(2, files)], stderr=subprocess.PIPE, text=True)
        got = [(s, d, q, bytes(data)) for s, d, q, data in rx]
        assert p.wait(300) == 0, p.stderr.read()
        sessions = rx.sessions()
    assert got == [("cli", 2, i, f.read_bytes()) for i, f in enumerate(files)]
    assert sessions[0]["transport"] == "rdma" and sessions[0]["finished"], sessions


@pytest.mark.deadline(600)
def test_gstreamer_elements_over_rdma(tmp_path):
    assert shutil.which("gst-launch-1.0"), "gst-launch-1.0 is not installed (scripts/setup.sh installs it)"
    assert (PLUGIN_DIR / "libgstslotstream.so").exists(), f"the plugin was not built in {PLUGIN_DIR}"
    env = dict(os.environ, GST_PLUGIN_PATH=str(PLUGIN_DIR), GST_REGISTRY=str(tmp_path / "registry.bin"),
               GST_DEBUG_NO_COLOR="1")
    (tmp_path / "tx").mkdir()
    (tmp_path / "rx").mkdir()
    rx = helpers.Proc(["gst-launch-1.0", "-m", "slotstreamsrc", f"listen={HOST}:0", "device=1", "!",
                       "multifilesink", f"location={tmp_path}/rx/%05d.raw"], env=env)
    try:
        _, line = rx.stdout.wait_for(r"slotstream-listening, address=\(string\)(\S+?),", 180)
        addr = re.search(r"address=\(string\)(\S+?),", line).group(1)
        tx = subprocess.run(["gst-launch-1.0", "videotestsrc", "num-buffers=12", "pattern=snow", "!",
                             "video/x-raw,width=320,height=240,format=RGB,framerate=25/1", "!", "tee", "name=t", "!",
                             "queue", "!", "multifilesink", f"location={tmp_path}/tx/%05d.raw", "t.", "!", "queue", "!",
                             "slotstreamsink", f"to={addr}", "device=1", "transport=rdma", "sync=false"],
                            env=env, capture_output=True, text=True, timeout=300)
        assert tx.returncode == 0, tx.stdout[-2000:] + tx.stderr
        assert rx.wait(120) == 0, rx.stderr.text
    finally:
        rx.terminate(10)

    def digests(d):
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(pathlib.Path(d).iterdir())]

    sent, got = digests(tmp_path / "tx"), digests(tmp_path / "rx")
    assert len(sent) == 12 and got == sent and len(set(sent)) == 12
