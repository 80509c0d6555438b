"""Usage errors: `send` exits 2 with a clear message before touching the network; `recv` refuses an unusable --out."""
import subprocess

import pytest

from conftest import BIN


def run(*args, timeout=20):
    return subprocess.run([BIN, *[str(a) for a in args]], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


SEND_CASES = {
    "no_source": ([], ["nothing to send", "source", "--file", "--synthetic"]),
    "synthetic_bad_fps": (["--synthetic", "0-1:x:1x1x1", "--duration", "1"], ["synthetic"]),
    "synthetic_bad_range": (["--synthetic", "3-1:25:8x8x3", "--duration", "1"], ["synthetic"]),
    "synthetic_bad_size": (["--synthetic", "0-1:25:8x8", "--duration", "1"], ["synthetic"]),
    "synthetic_garbage": (["--synthetic", "cameras", "--duration", "1"], ["synthetic"]),
    "synthetic_without_duration": (["--synthetic", "0-1:25:8x8x3"], ["duration"]),
    "block_size_63": (["--block-size", "63", "--file", "0=/etc/hostname"], ["block size", "block-size"]),
    "block_size_10": (["--block-size", "10", "--file", "0=/etc/hostname"], ["block size", "block-size"]),
    "unknown_transport": (["--transport", "ib", "--file", "0=/etc/hostname"], ["transport"]),
    "missing_file": (["--file", "0=/nonexistent/file"], ["/nonexistent/file"]),
    "device_out_of_range": (["--file", "70000=/etc/hostname"], ["device"]),
    "file_without_device": (["--file", "/etc/hostname"], ["--file", "D=PATH", "device"]),
}


@pytest.mark.deadline(30)
@pytest.mark.parametrize("case", list(SEND_CASES))
def test_send_usage_errors(case):
    args, needles = SEND_CASES[case]
    # Port 1: nothing listens there, so only a usage check can make the exit code 2.
    p = run("send", "--to", "127.0.0.1:1", "--name", "u", *args)
    assert p.returncode == 2, f"exit {p.returncode}, stderr: {p.stderr!r}"
    assert any(n.lower() in p.stderr.lower() for n in needles), f"stderr mentions none of {needles}: {p.stderr!r}"


@pytest.mark.deadline(30)
def test_send_runtime_failure_is_exit_1():
    # Not a usage error: nobody listens. Exit 1 with the contract's error prefix, promptly.
    p = run("send", "--to", "127.0.0.1:1", "--name", "u", "--file", "0=/etc/hostname")
    assert p.returncode == 1, f"exit {p.returncode}: {p.stderr!r}"
    assert "slotstream send: error:" in p.stderr, p.stderr


@pytest.mark.deadline(30)
@pytest.mark.parametrize("where", ["parent_is_a_file", "out_is_a_file", "under_proc"])
def test_recv_unusable_out_dir(tmp_path, where):
    f = tmp_path / "file"
    f.write_text("x")
    if where == "parent_is_a_file":
        out = f / "sub"
    elif where == "out_is_a_file":
        out = f
    else:
        out = "/proc/slotstream-no-such-dir/out"  # not creatable, not even by root
    try:
        p = run("recv", "--listen", "127.0.0.1:0", "--out", out, timeout=10)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"recv kept running with an unusable --out {out}") from None
    assert p.returncode != 0
    assert "listening on" not in p.stdout, "recv announced it was ready with an unusable --out"
    assert str(out) in p.stderr or "output" in p.stderr.lower(), f"unclear error: {p.stderr!r}"


def test_version_is_cmakes_project_version():
    # One version source: CMakeLists.txt's project(VERSION); the CLI reports it (and through it the image tag,
    # pkg-config and the Python package: test_image, test_install, tests/python).
    import re
    from conftest import REPO
    cmake = re.search(r"project\(slotstream VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text()).group(1)
    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"slotstream {cmake}", p.stdout
