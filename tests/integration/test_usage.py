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


# ------------------------------------------------------------------ no traps (issue 20)

def test_sizes_take_units_everywhere():
    # --block-size 1M used to be refused while --max-memory 4G worked; a bad size says what a size looks like.
    p = run("send", "--to", "127.0.0.1:1", "--name", "u", "--block-size", "1X", "--file", "0=/etc/hostname")
    assert p.returncode == 2 and "64K, 1M or 4G" in p.stderr, p.stderr
    for args in (["recv", "--listen", "127.0.0.1:0", "--out", "/tmp", "--worker-dir", "/tmp", "--backlog-bytes",
                  "1G", "--help"], ["send", "--to", "x:1", "--block-size", "64K", "--help"]):
        assert run(*args).returncode == 0


@pytest.mark.deadline(60)
@pytest.mark.parametrize("size", ["1MB", "1mb", "1MiB", "1M", "1024K", "1048576"])
def test_decimal_unit_names_are_powers_of_1024_as_documented(receiver, tmp_path, size):
    # 1MB used to be taken as 1 MiB without a word anywhere; it still is, and --help and the docs say so.
    import json
    rx = receiver("--discard")
    p = subprocess.run([BIN, "send", "--to", rx.addr, "--name", "u", "--block-size", size, "--file", "0=/etc/hostname",
                        "--json"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["block_size"] == 1048576
    assert "1MB = 1M = 1048576" in run("send", "--help").stdout


def test_every_size_option_uses_the_one_parser():
    # A bad size says the same thing on every size option, and a value in range with units is accepted.
    for args in (["recv", "--listen", "127.0.0.1:0", "--discard", "--max-memory", "4X"],
                 ["recv", "--listen", "127.0.0.1:0", "--out", "/tmp", "--worker-dir", "/tmp", "--backlog-bytes", "1Q"],
                 ["send", "--to", "127.0.0.1:1", "--platform-ttl", "2", "--need-bandwidth", "12 M"],
                 ["recv", "--listen", "127.0.0.1:0", "--discard", "--capacity-bandwidth", "fast"]):
        p = run(*args, timeout=10)
        assert p.returncode == 2 and "expects a size such as 4096, 64K, 1M or 4G" in p.stderr, (args, p.stderr)


def test_edge_block_size_takes_units_like_send():
    # `edge --block-size` took bytes only (64KiB was refused) and its --help gave no unit.
    edge = ["edge", "--platform", "etcd://127.0.0.1:1", "--out", "/tmp/slotstream-usage-edge", "--name", "u",
            "--synthetic", "0:1:8x8x1", "--duration", "1"]
    p = run(*edge, "--block-size", "1X")
    assert p.returncode == 2 and "64K, 1M or 4G" in p.stderr, p.stderr
    p = run(*edge, "--block-size", "64KiB")
    assert "block-size" not in p.stderr and "etcd" in p.stderr, p.stderr  # parsed; then the platform is unreachable
    assert "64K or 1M" in run("edge", "--help").stdout


def test_unknown_protocol_and_transport_list_the_valid_ones():
    p = run("send", "--to", "127.0.0.1:1", "--name", "u", "--protocol", "carrier_pigeon", "--file", "0=/etc/hostname")
    assert p.returncode == 2, p.stderr
    assert "carrier_pigeon" in p.stderr and "status_byte" in p.stderr and "sliding_window" in p.stderr, p.stderr
    p = run("send", "--to", "127.0.0.1:1", "--name", "u", "--transport", "ib", "--file", "0=/etc/hostname")
    assert p.returncode == 2 and all(t in p.stderr for t in ("shm", "tcp", "auto")), p.stderr


@pytest.mark.parametrize("typo,meant", [("--blok-size", "--block-size"), ("--synthtic", "--synthetic"),
                                        ("--tocken-file", "--token-file")])
def test_a_mistyped_flag_suggests_the_closest(typo, meant):
    p = run("send", "--to", "127.0.0.1:1", typo, "5")
    assert p.returncode == 2
    assert f"did you mean {meant} instead of {typo}?" in p.stderr, p.stderr


def test_an_unreadable_file_is_reported_before_connecting():
    # As an unprivileged user (root reads anything): the file cannot be opened. The receiver address is one nothing
    # listens on, so a message about the file, not about connecting, shows the check came first. (Not in pytest's
    # tmp_path, which only root may enter.)
    import pathlib
    import shutil
    import tempfile
    base = pathlib.Path(tempfile.mkdtemp(prefix="slotstream-usage-"))
    base.chmod(0o755)
    secret = base / "secret.raw"
    secret.write_bytes(b"x")
    secret.chmod(0o600)
    try:
        check_unreadable(secret)
    finally:
        shutil.rmtree(base)


def check_unreadable(secret):
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", BIN, "send", "--to",
                        "127.0.0.1:1", "--name", "u", "--file", f"0={secret}"], capture_output=True, text=True,
                       timeout=20)
    assert p.returncode == 2, p.stderr
    assert "cannot read" in p.stderr and "secret.raw" in p.stderr and "connect" not in p.stderr, p.stderr


@pytest.mark.deadline(60)
def test_duration_is_wall_clock_time_even_at_an_impossible_rate(receiver):
    # 4 cameras of 640x480x3 at 100,000 fps for 2 s (368 GB/s): it ran 165 s and would have written ~737 GB.
    import json
    import time
    rx = receiver("--discard")
    t0 = time.monotonic()
    p = subprocess.run([BIN, "send", "--to", rx.addr, "--name", "fast", "--synthetic", "0-3:100000:640x480x3",
                        "--duration", "2", "--json"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert took < 6, f"--duration 2 ran {took:.1f} s"  # 2 s + kLateAfter + start and FIN, on a loaded machine
    assert report["messages"] + report["late_frames"] == 4 * 200000, report
    assert report["late_frames"] > 0 and "late" in p.stderr, p.stderr


def run_completion(words):
    """What bash completes for `words` (the last one being completed) with the generated completion."""
    script = REPO_BUILD / "share" / "bash-completion" / "completions" / "slotstream"
    quoted = " ".join(f"'{w}'" for w in words)
    cmd = f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _slotstream; echo ${{COMPREPLY[@]}}"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


REPO_BUILD = __import__("pathlib").Path(BIN).resolve().parent


def test_bash_completion_knows_commands_options_and_choices():
    assert {"recv", "send", "bench", "protocols"} <= set(run_completion(["slotstream", ""]))
    assert run_completion(["slotstream", "send", "--block-s"]) == ["--block-size"]
    assert set(run_completion(["slotstream", "recv", "--transport", ""])) >= {"auto", "shm", "tcp"}
    assert "--listen" in run_completion(["slotstream", "recv", "--li"])


def test_man_page_has_every_option_of_every_command():
    page = REPO_BUILD / "share" / "man" / "man1" / "slotstream.1"
    text = subprocess.run(["man", "-l", "-P", "cat", str(page)], capture_output=True, text=True, timeout=30,
                          env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin"}).stdout
    assert "slotstream recv" in text and "slotstream send" in text
    for command in ("recv", "send", "demo"):
        helptext = run(command, "--help").stdout
        for flag in set(__import__("re").findall(r"^  (?:-\w,)?(--[\w-]+)", helptext, __import__("re").M)) - {"--help"}:
            assert flag in text, f"{flag} of {command} is missing from the man page"
    zsh = (REPO_BUILD / "share" / "zsh" / "site-functions" / "_slotstream").read_text()
    assert zsh.startswith("#compdef slotstream") and "'--block-size[" in zsh


# ------------------------------------------------------------------ CLI audit: units, ranges, names, token files

def test_durations_take_units_everywhere(tmp_path):
    # A bare number is in the option's own unit (seconds, or ms for --message-timeout); 90s/500ms/2m/1h work on
    # every duration option. Exit 1 (nothing listens / the output is a file) shows the value itself was accepted.
    bad_out = tmp_path / "file"
    bad_out.write_text("x")
    accepted = [
        ["send", "--to", "127.0.0.1:1", "--name", "u", "--synthetic", "0-0:25:8x8x1", "--duration", "300ms"],
        ["recv", "--listen", "127.0.0.1:0", "--out", bad_out, "--metrics-prune-after", "5m"],
        # 500 s = 500,000 ms is within --message-timeout's 1..600,000 ms; 100 ms is --session-timeout's minimum.
        ["recv", "--listen", "127.0.0.1:0", "--out", bad_out, "--transport", "udp", "--message-timeout", "500s",
         "--session-timeout", "100ms"],
    ]
    for args in accepted:
        p = run(*args)
        assert p.returncode == 1, f"{args}: exit {p.returncode}: {p.stderr!r}"
    refused = [
        (["send", "--to", "127.0.0.1:1", "--synthetic", "0-0:25:8x8x1", "--duration", "5x"], "duration such as"),
        (["demo", "--duration", "10 s"], "duration such as"),  # demo takes send's --duration (and --seconds)
        (["send", "--to", "127.0.0.1:1", "--synthetic", "0-0:25:8x8x1", "--duration", "-1s"], "duration such as"),
        (["recv", "--listen", "127.0.0.1:0", "--discard", "--metrics-prune-after", "-5"], "duration such as"),
        # Converted before the range check: 700 s is 700,000 ms, 50 ms is 0.05 s.
        (["recv", "--listen", "127.0.0.1:0", "--discard", "--transport", "udp", "--message-timeout", "700s"],
         "--message-timeout"),
        (["recv", "--listen", "127.0.0.1:0", "--discard", "--transport", "udp", "--session-timeout", "50ms"],
         "--session-timeout"),
    ]
    for args, needle in refused:
        p = run(*args)
        assert p.returncode == 2 and needle in p.stderr, f"{args}: exit {p.returncode}: {p.stderr!r}"


RANGE_CASES = {
    # Each used to say only "Could not convert", or to be taken as a huge unsigned number.
    "blocks_negative": (["send", "--to", "127.0.0.1:1", "--blocks", "-1", "--file", "0=/etc/hostname"],
                        "--blocks: -1 is not in range 1..4096"),
    # Sizes are said in units (it used to be "Value 1099511627776 not in range 64 to 67108864").
    "block_size_1T": (["send", "--to", "127.0.0.1:1", "--block-size", "1T", "--file", "0=/etc/hostname"],
                      "--block-size: 1 TiB is above the most, 64 MiB"),
    "block_size_63": (["send", "--to", "127.0.0.1:1", "--block-size", "63", "--file", "0=/etc/hostname"],
                      "--block-size: 63 B is below the least, 64 B"),
    "max_memory_0": (["recv", "--listen", "127.0.0.1:0", "--discard", "--max-memory", "0"],
                     "--max-memory: 0 B is below the least, 1 B"),
    "max_message_beyond": (["recv", "--listen", "127.0.0.1:0", "--discard", "--transport", "udp", "--max-message",
                            "5G"], "--max-message: 5 GiB is above the most, 4 GiB"),
    "exit_after_negative": (["recv", "--listen", "127.0.0.1:0", "--discard", "--exit-after-senders", "-1"],
                            "--exit-after-senders: Value -1 not in range"),
    # Used to be accepted and never held: a sender has at most 4096 blocks.
    "hold_block_beyond_blocks": (["recv", "--listen", "127.0.0.1:0", "--discard", "--hold-block", "99999:0:10"],
                                 "--hold-block: block index 99999 is not in range 0..4095"),
    "worker_cpus_zero": (["recv", "--listen", "127.0.0.1:0", "--discard", "--worker", "true", "--worker-cpus", "0"],
                         "--worker-cpus: Value 0 not in range"),
}


@pytest.mark.parametrize("case", list(RANGE_CASES))
def test_out_of_range_values_name_the_range(case):
    args, needle = RANGE_CASES[case]
    p = run(*args, timeout=10)
    assert p.returncode == 2 and needle in p.stderr, f"exit {p.returncode}: {p.stderr!r}"


def test_an_unknown_command_is_named_with_the_closest_one():
    p = run("verfy", "/tmp")
    assert p.returncode == 2
    assert "slotstream: error: unknown command 'verfy'; did you mean verify?" in p.stderr, p.stderr
    assert "commands: recv send" in p.stderr and "bench-peer" not in p.stderr, p.stderr  # hidden ones stay hidden


@pytest.mark.parametrize("kind", ["directory", "empty", "missing"])
def test_an_unusable_token_file_says_what_is_wrong(tmp_path, kind):
    token = tmp_path / "token"
    if kind == "directory":
        token.mkdir()
    elif kind == "empty":
        token.write_text("\n")
    want = {"directory": "is a directory", "empty": "is empty: write the shared secret",
            "missing": "No such file or directory"}[kind]
    for cmd in (["recv", "--listen", "127.0.0.1:0", "--discard"], ["send", "--to", "127.0.0.1:1", "--name", "u",
                                                                    "--file", "0=/etc/hostname"]):
        p = run(*cmd, "--token-file", token, timeout=10)
        assert p.returncode == 2 and want in p.stderr and str(token) in p.stderr, f"{cmd}: {p.stderr!r}"


def test_a_world_readable_token_file_is_warned_about(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    args = ("send", "--to", "127.0.0.1:1", "--name", "u", "--file", "0=/etc/hostname", "--token-file", token)
    token.chmod(0o644)
    p = run(*args)
    assert p.returncode == 1 and "is readable by every user of this host: chmod o-r" in p.stderr, p.stderr
    token.chmod(0o640)  # group-readable: the Helm chart's 0440 for the receiver's group
    p = run(*args)
    assert p.returncode == 1 and "readable by every user" not in p.stderr, p.stderr


def test_bench_with_an_unusable_out_is_a_usage_error(tmp_path):
    # Used to end in a Python traceback.
    f = tmp_path / "file"
    f.write_text("x")
    p = run("bench", "latency", "--quick", "--runs", "1", "--out", f / "sub", timeout=30)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"slotstream bench: error: cannot create --out {f / 'sub'}" in p.stderr, p.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs, 3,000,000 bytes of it taken by `filler`: the receiver's output fills up after one frame."""
    disk = tmp_path / "disk"
    disk.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {p.stderr.strip()}")
    (disk / "filler").write_bytes(b"\0" * 3_000_000)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.deadline(40)
def test_a_full_disk_holds_the_sender_says_so_and_loses_nothing(receiver, small_disk):
    # The receiver holds its blocks while a write fails (docs/design.md: disk full), and says so; the sender
    # waits and, from kStallNotice (5 s) on, says why; freed space lets every frame through, verified.
    rx = receiver("--out", small_disk, "--exit-after-senders", "1")
    tx = subprocess.Popen([BIN, "send", "--to", rx.addr, "--name", "full", "--synthetic", "0-0:4:640x480x3",
                           "--duration", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # A warning (it needs someone to free space), not an info line like worker back-pressure.
        rx.stderr.wait_for(r" warning slotstream recv: sender full: holding blocks until this clears: .*No space left on device "
                           r"\(disk full: free space; nothing is dropped", 15)
        stall = tx.stderr.readline() + tx.stderr.readline()  # the transport line, then the notice
        assert "no message has gone out for 5 s" in stall and "disk may be full" in stall, stall
        assert tx.poll() is None, "the sender ended while the receiver could store nothing"
        (small_disk / "filler").unlink()
        assert tx.wait(timeout=20) == 0, tx.stderr.read()
    finally:
        tx.kill()
    rx.stderr.wait_for(r"storing again", 10)
    assert rx.wait(10) == 0
    p = run("verify", small_disk)
    assert p.returncode == 0 and "verified 4 frames in 1 devices" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("transport", ["shm", "udp"])
def test_a_listen_port_in_use_says_so_and_what_to_do(transport):
    # Used to read "connect failed: cannot listen on ...: Address already in use".
    import socket
    kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as held:
        held.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            held.listen()
        addr = f"127.0.0.1:{held.getsockname()[1]}"
        p = run("recv", "--listen", addr, "--discard", "--transport", transport, timeout=10)
    assert p.returncode == 1, p.stderr
    assert addr in p.stderr and "Address already in use (another process has that port" in p.stderr, p.stderr
    assert "connect failed" not in p.stderr, p.stderr


def test_verify_of_a_directory_without_frames_says_what_to_give(tmp_path):
    p = run("verify", tmp_path)
    assert p.returncode == 1, p.stderr
    assert f"slotstream verify: error: no received frames under '{tmp_path}': give the receiver's --out" in p.stderr
