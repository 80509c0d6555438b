"""Synthetic cameras: `send --synthetic` frames arrive and `slotstream verify` checks them; `send --json`."""
import json
import os
import re

import pytest

from conftest import TRANSPORTS, hidden, parse_finished, run_send, run_verify, seq_name

JSON_KEYS = ("messages", "bytes", "seconds", "mb_per_s", "devices", "cpu_seconds", "transport", "protocol",
             "blocks", "block_size")


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_synthetic_frames_verify_and_json(start_receiver, tmp_path, transport):
    out = tmp_path / "out"
    rx = start_receiver(out, transport, "--exit-after-senders", 1)
    p = run_send(rx.addr, "--name", "syn", "--transport", transport, "--synthetic", "0-3:50:160x120x3",
                 "--duration", 1, "--json")
    try:
        j = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"send --json did not print one JSON object ({e}): {p.stdout!r}") from None
    assert isinstance(j, dict)
    missing = [k for k in JSON_KEYS if k not in j]
    assert not missing, f"send --json lacks the contract keys {missing}: {j}"
    frame = 160 * 120 * 3
    assert j["messages"] == 200, j
    assert j["devices"] == {str(d): 50 for d in range(4)}, j["devices"]
    assert j["bytes"] == 200 * frame, j
    assert j["transport"] == transport and j["protocol"] == "status_byte", j
    assert isinstance(j["blocks"], int) and isinstance(j["block_size"], int) and j["block_size"] >= 64, j
    for k in ("seconds", "mb_per_s", "cpu_seconds"):
        assert isinstance(j[k], (int, float)) and j[k] > 0, (k, j[k])
    # 50 frames per camera at 50 fps take about a second; the rate is what was sent over that time.
    assert 0.9 <= j["seconds"] < 30, j["seconds"]
    assert abs(j["mb_per_s"] - j["bytes"] / 1e6 / j["seconds"]) < 0.01 * j["mb_per_s"], j
    assert j["cpu_seconds"] <= j["seconds"] * os.cpu_count() * 1.02 + 0.05, j

    report = parse_finished(rx.stdout.next_line(15))
    assert report["name"] == "syn" and report["messages"] == j["messages"] and report["bytes"] == j["bytes"], report
    assert rx.wait(15) == 0

    v = run_verify(out)
    assert v.returncode == 0, v.stderr
    m = re.search(r"verified (\d+) frames in (\d+) devices", v.stdout)
    assert m, f"verify output: {v.stdout!r}"
    assert int(m.group(1)) == j["messages"] and int(m.group(2)) == 4, v.stdout
    assert hidden(out) == []


@pytest.mark.deadline(60)
def test_verify_detects_a_corrupt_frame(start_receiver, tmp_path):
    out = tmp_path / "out"
    rx = start_receiver(out)
    run_send(rx.addr, "--name", "syn", "--synthetic", "0:50:64x64x3", "--duration", 0.2)
    victim = out / "syn" / "device-0" / seq_name(3)
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    v = run_verify(out)
    assert v.returncode == 1
    assert seq_name(3) in v.stderr


@pytest.mark.deadline(60)
def test_verify_detects_a_missing_frame(start_receiver, tmp_path):
    out = tmp_path / "out"
    rx = start_receiver(out)
    run_send(rx.addr, "--name", "syn", "--synthetic", "0:50:64x64x3", "--duration", 0.2)
    (out / "syn" / "device-0" / seq_name(4)).unlink()
    v = run_verify(out)
    assert v.returncode == 1, "verify accepted a gap in the frame numbers"
    assert v.stderr.strip(), "verify gave no reason"
