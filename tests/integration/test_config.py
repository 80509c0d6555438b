"""`recv|send --config FILE` (tools/cli_util.cc, docs/config.md): every option can come from a flat TOML file, the
command line wins, an unknown key is an error that names the closest option, and the documented example files are
valid for this build."""
import json
import re
import subprocess
import tomllib

import pytest

from conftest import BIN, REPO, run_send


def options_of(command):
    out = subprocess.run([BIN, command, "--help"], capture_output=True, text=True, timeout=20).stdout
    return set(re.findall(r"^  (?:-\w,)?--([\w-]+)", out, re.M))


@pytest.mark.deadline(60)
def test_values_from_the_file_apply(receiver, tmp_path):
    out = tmp_path / "out"
    conf = tmp_path / "recv.toml"
    conf.write_text(f'# a receiver from a file\nlisten = "127.0.0.1:0"\nout = "{out}"\nexit-after-senders = 1\n')
    rx = subprocess.Popen([BIN, "recv", "--config", conf], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = rx.stdout.readline()
        addr = re.fullmatch(r"listening on (\S+)\n", line).group(1)
        send_conf = tmp_path / "send.toml"
        send_conf.write_text(f'to = "{addr}"\nname = "from-file"\nblock-size = "64K"\nblocks = 8\njson = true\n'
                             'synthetic = "0-1:50:32x32x3"\nduration = 0.2\n')
        p = subprocess.run([BIN, "send", "--config", send_conf], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        report = json.loads(p.stdout)
        assert (report["block_size"], report["blocks"]) == (65536, 8), report
        # synthetic and duration came from the file: two cameras x 0.2 s x 50 fps, sent or (under load) late
        assert report["messages"] + report["late_frames"] == 20 and report["messages"] > 0, report
        assert rx.wait(30) == 0, rx.stderr.read()  # exit-after-senders came from the file
    finally:
        rx.kill()
    assert sorted(p.name for p in (out / "from-file").iterdir()) == ["device-0", "device-1"]


@pytest.mark.deadline(60)
def test_the_command_line_wins(receiver, tmp_path):
    rx = receiver("--out", tmp_path / "out")
    conf = tmp_path / "send.toml"
    conf.write_text(f'to = "{rx.addr}"\nname = "from-file"\nblock-size = "64K"\njson = true\n'
                    'file = ["0=/etc/hostname", "0=/etc/hostname"]\n')
    p = run_send(rx.addr, "--config", conf, "--name", "from-flag", "--block-size", "128K",
                 "--file", f"3={conf}")
    report = json.loads(p.stdout)
    assert report["block_size"] == 131072, report
    assert report["devices"] == {"3": 1}, "a list on the command line replaces the file's list"
    assert (tmp_path / "out" / "from-flag" / "device-3").is_dir()
    assert not (tmp_path / "out" / "from-file").exists()


@pytest.mark.deadline(30)
def test_an_unknown_key_is_an_error_naming_the_closest_option(tmp_path):
    conf = tmp_path / "send.toml"
    conf.write_text('blok-size = "1M"\n')
    p = subprocess.run([BIN, "send", "--config", conf, "--to", "127.0.0.1:1", "--file", "0=/etc/hostname"],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2, p.stderr
    # It used to say "INI was not able to parse send.blok-size" although this page promised a suggestion.
    assert f"slotstream send: error: unknown key 'blok-size' in {conf} (did you mean 'block-size'?)" in p.stderr, \
        p.stderr
    assert "INI" not in p.stderr, p.stderr
    conf.write_text('listen = "127.0.0.1:0"\nzzz-nothing-like-it = 1\n')
    p = subprocess.run([BIN, "recv", "--config", conf, "--discard"], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2, p.stderr
    assert f"unknown key 'zzz-nothing-like-it' in {conf} (a key is one of `slotstream recv --help`'s long options" \
        in p.stderr, p.stderr
    # A "[recv]" section (the file is flat) was "unknown key 'recv.++'", CLI11's name for an opened section.
    conf.write_text('[recv]\nlisten = "127.0.0.1:0"\n')
    p = subprocess.run([BIN, "recv", "--config", conf, "--discard"], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2, p.stderr
    assert f"'[recv]' in {conf}: the file is flat, with no sections" in p.stderr, p.stderr
    assert "++" not in p.stderr, p.stderr
    p = subprocess.run([BIN, "send", "--config", tmp_path / "missing.toml", "--to", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "missing.toml" in p.stderr, p.stderr


def documented_files():
    text = (REPO / "docs" / "config.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    files = {}
    for b in blocks:
        m = re.search(r"slotstream (recv|send) --config", b)
        assert m, f"an example that does not say which command it is for:\n{b}"
        files[m.group(1)] = tomllib.loads(b)
    return files


def test_the_documented_twelve_camera_example_is_valid():
    files = documented_files()
    assert set(files) == {"recv", "send"}
    for command, conf in files.items():
        unknown = set(conf) - options_of(command)
        assert not unknown, f"docs/config.md's {command} file has keys {command} does not take: {unknown}"
    assert len(files["send"]["video"]) == 12


@pytest.mark.deadline(30)
def test_the_documented_receiver_file_starts_a_receiver(tmp_path):
    # The recv example as written, with only the paths and ports a test may use replaced on the command line.
    conf = documented_files()["recv"]
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o600)  # a world-readable one is warned about (test_usage), and this reads the first log line
    text = (REPO / "docs" / "config.md").read_text()
    body = re.search(r"```toml\n(# slotstream recv --config.*?)```", text, re.S).group(1)
    path = tmp_path / "recv.toml"
    path.write_text(body)
    p = subprocess.Popen([BIN, "recv", "--config", path, "--listen", "127.0.0.1:0", "--out", tmp_path / "out",
                          "--token-file", token, "--metrics", "127.0.0.1:0", "--worker", "sleep 60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("listening on 127.0.0.1:"), p.stderr.read()
        err = p.stderr.readline()
        assert json.loads(err)["message"].startswith("metrics on"), "log-format json came from the file"
    finally:
        p.terminate()
        p.wait(20)
    assert conf["backlog-bytes"] == "256M"


@pytest.mark.deadline(30)
def test_a_size_out_of_range_in_the_file_is_said_in_units(tmp_path):
    # It used to say "Value 68719476736 not in range 64 to 67108864".
    conf = tmp_path / "send.toml"
    conf.write_text('block-size = "64G"\n')
    p = subprocess.run([BIN, "send", "--config", conf, "--to", "127.0.0.1:1", "--file", "0=/etc/hostname"],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "--block-size: 64 GiB is above the most, 64 MiB" in p.stderr, p.stderr
