"""Nothing left in /dev/shm however a process ends (issue 19, item 7): senders SIGKILLed at several points of their
set-up (the first shared-memory segment, a 256 MiB ring being written, anywhere in the first 225 ms) and a receiver
SIGKILLed while it writes a sender's region leave no segment and no directory behind
(src/engine/ucx/fabric/shm_dir.h). Before, UCX's `ucx_shm_posix_*` files of a process killed between their creation and their unlink stayed in /dev/shm.

The processes run in a private mount namespace with a /dev/shm of their own (other tests use the real one at the same
time), which needs root and unshare(1), both part of every CI run."""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import BIN

HERE = pathlib.Path(__file__).resolve().parent


def in_private_shm(*argv):
    script = f"mount -t tmpfs -o size=1g tmpfs /dev/shm && exec {' '.join(argv)}"
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=150)


@pytest.mark.deadline(180)
def test_processes_killed_at_any_point_of_set_up_leave_nothing_in_dev_shm():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private /dev/shm (CI has both)")
    p = in_private_shm("python3", str(HERE / "shm_kill_points.py"), BIN)
    assert p.returncode == 0, f"the kill script failed: {p.stderr[-2000:]}"
    report = json.loads(p.stdout.strip().splitlines()[-1])
    print(report)
    assert report["kills"]["sender: first segment"] >= 2, report
    assert report["kills"]["sender: ring being written"] >= 2, report
    assert report["kills"]["receiver: region being written"] >= 1, report
    assert report["sessions"] == 1, "a session over shared memory failed in the namespace"
    assert report["left"] == [], f"left in /dev/shm: {report['left']}"
