"""`slotstream dgram-peer` (tools/dgram_peer.cc) as processes, run the way bench/harness.py runs them."""
import json
import subprocess

import pytest

from conftest import BIN


@pytest.mark.deadline(90)
def test_the_receiver_serves_on_while_nobody_reads_its_reports(tmp_path):
    # bench/harness.py reads the receiver's stdout only once the sender has exited, and the report of a session of
    # thousands of messages (each one's arrival and latency) is more than a pipe holds. Written from the receiver's
    # network thread, it stopped that thread until someone read it: under loss a FIN_ACK that was lost was never
    # repeated, and the sender failed with "did not confirm the end of the stream within 35 s" (bench loss, 5 %,
    # dgram_rd, 4,096 messages of 1 KiB). The same stopped thread answers no one else either: a second sender, after
    # such a report and with nobody reading it, must still be served.
    err_path = tmp_path / "recv.err"
    with open(err_path, "w") as err:
        rx = subprocess.Popen([BIN, "dgram-peer", "recv", "--listen", "127.0.0.1:0", "--sessions", "2"],
                              stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True)
    try:
        addr = rx.stdout.readline().split()[-1]

        def send(count):
            return subprocess.run([BIN, "dgram-peer", "send", "--to", addr, "--protocol", "dgram_rd", "--size", "64",
                                   "--count", str(count)], capture_output=True, text=True, timeout=40,
                                  stdin=subprocess.DEVNULL)

        # 16,384 messages: a report of some 300 KB or more, several times what a pipe holds; not read yet.
        first = send(16384)
        assert first.returncode == 0, first.stderr + err_path.read_text()
        second = send(10)
        assert second.returncode == 0, second.stderr + err_path.read_text()
        out, _ = rx.communicate(timeout=30)
    finally:
        rx.kill()
        rx.wait()
    assert rx.returncode == 0, err_path.read_text()
    reports = [json.loads(line) for line in out.splitlines()]
    assert [r["finished"] for r in reports] == [True, True], [r["reason"] for r in reports]
    assert sorted(r["sent"] for r in reports) == [10, 16384]
    assert all(r["complete"] == r["sent"] for r in reports), [(r["complete"], r["sent"]) for r in reports]
