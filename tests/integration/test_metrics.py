"""recv --metrics under load and attack (tools/metrics.cc): idle connections do not starve /health, hellos that
are never accepted create no series, ended senders' series are pruned after the grace period, and a sender that
comes back within it keeps counting up."""
import socket
import time
import urllib.request

import pytest

from conftest import metrics_address, run_send, wait_until
from test_control import (ACCEPT, READY, REFUSE, SETUP, connect, decode_refuse, frame, hello, open_lane, read_frames,
                          read_until_closed, recv_frame)
from test_pipeline import metric


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def metrics_receiver(receiver, *extra):
    rx = receiver("--discard", "--metrics", "127.0.0.1:0", *extra)
    return rx, f"http://{metrics_address(rx)}"


@pytest.mark.deadline(60)
def test_idle_connections_do_not_delay_health(receiver):
    """The hand-written server read each connection in turn: 200 idle ones delayed /health by 6.5 s."""
    rx, url = metrics_receiver(receiver)
    host, port = url[len("http://"):].split(":")
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(200)]
    try:
        t0 = time.monotonic()
        status, body = get(url + "/health", timeout=10)
        took = time.monotonic() - t0
        print(f"/health with 200 idle connections: {took:.3f} s")
        assert (status, body) == (200, "ok\n")
        # Not a speed test: a bound far above the measured ~0.75 s and far below the 6.5 s it was.
        assert took < 3.0, f"/health took {took:.1f} s behind 200 idle connections"
        status, _ = get(url + "/metrics")
        assert status == 200
    finally:
        for s in idle:
            s.close()


@pytest.mark.deadline(90)
def test_hellos_never_accepted_create_no_series(receiver):
    """200 senders refused after the hello (here: over the memory budget, past authentication) leave no series
    behind and the scrape stays small; an accepted sender does get its series."""
    rx, url = metrics_receiver(receiver, "--max-memory", "64K")
    for i in range(200):
        with connect(rx.addr) as s:
            s.sendall(hello(name=f"intruder-{i}".encode(), group=i + 1, blocks=4, block_size=65536))
            data, _ = read_until_closed(s, 5)
        frames = read_frames(data)
        assert frames and frames[0][0] == REFUSE, frames
        assert "memory" in decode_refuse(frames[0][1])[1]
    _, text = get(url + "/metrics")
    print(f"scrape after 200 refused hellos: {len(text)} bytes")
    assert "intruder" not in text
    assert metric(text, "slotstream_sessions_ended_total") == 0
    assert len(text) < 8192, f"{len(text)} bytes of metrics after 200 refused hellos"

    run_send(rx.addr, "--name", "welcome", "--blocks", "4", "--block-size", "4096",
             "--synthetic", "0:50:32x32x3", "--duration", "0.2")
    _, text = get(url + "/metrics")
    assert metric(text, "slotstream_messages_total", sender="welcome", device="0") == 10
    assert metric(text, "slotstream_sessions_ended_total") == 1


@pytest.mark.deadline(60)
def test_declared_devices_without_data_create_no_series(receiver):
    """Issue 19: 100 accepted hellos declaring 4,096 devices each made 2,052,206 series (a 119 MB scrape, the
    receiver's RSS 16 -> 1,028 MB). Series are now made for devices that carried data only."""
    rx, url = metrics_receiver(receiver)
    lanes = []
    try:
        for i in range(100):
            s, t, body = open_lane(rx.addr, name=f"wide-{i}".encode(), group=i + 1, blocks=2, block_size=4096,
                                   devices=tuple(range(4096)))
            lanes.append(s)
            assert t == ACCEPT, (t, body)
            s.sendall(frame(SETUP, bytes(9)))  # empty worker address, set-up and proof: status_byte needs none
            assert recv_frame(s)[0] == READY
        wait_until(lambda: "wide-99" in get(url + "/metrics")[1], 10, "the live sessions in the scrape")
        _, text = get(url + "/metrics")
        print(f"scrape with 100 senders of 4,096 declared devices: {len(text)} bytes")
        assert 'slotstream_messages_total{sender="wide-' not in text
        assert len(text) < 256 * 1024, f"{len(text)} bytes of metrics for 100 senders that sent nothing"
    finally:
        for s in lanes:
            s.close()
    run_send(rx.addr, "--name", "narrow", "--synthetic", "0-1:50:32x32x3", "--duration", "0.2")
    _, text = get(url + "/metrics")
    assert metric(text, "slotstream_messages_total", sender="narrow", device="1") == 10


@pytest.mark.deadline(60)
def test_ended_sender_series_are_pruned_after_the_grace_period(receiver):
    rx, url = metrics_receiver(receiver, "--metrics-prune-after", "2")
    run_send(rx.addr, "--name", "brief", "--synthetic", "0-1:50:32x32x3", "--duration", "0.2")
    _, text = get(url + "/metrics")
    assert metric(text, "slotstream_messages_total", sender="brief", device="1") == 10  # kept for a while
    t0 = time.monotonic()
    wait_until(lambda: 'sender="brief"' not in get(url + "/metrics")[1], 15, "brief's series to be pruned")
    assert time.monotonic() - t0 > 0.5, "pruned before its grace period"
    _, text = get(url + "/metrics")
    assert metric(text, "slotstream_sessions_ended_total") == 1  # the total is not per sender


@pytest.mark.deadline(60)
def test_a_sender_back_within_the_grace_period_keeps_counting(receiver):
    rx, url = metrics_receiver(receiver)
    for _ in range(2):
        run_send(rx.addr, "--name", "again", "--synthetic", "0-1:50:32x32x3", "--duration", "0.2")
    _, text = get(url + "/metrics")
    assert metric(text, "slotstream_messages_total", sender="again", device="0") == 20
    assert metric(text, "slotstream_sessions_ended_total") == 2
