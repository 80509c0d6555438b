"""slotstream.PlatformSender: the Python face of `send --platform` (docs/platform.md), against a real
etcd cluster and real `slotstream recv --platform` processes."""
import pathlib
import sys

import pytest
import slotstream

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from platform_support import start_cluster  # noqa: E402
import test_interrupt  # noqa: E402  (its check_timeouts(): a stopped receiver, send and finish time out)



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("etcd"), 1)
    yield c
    c.stop()


def test_a_platform_sender_is_scheduled_and_a_dead_receiver_replaced_without_loss(cluster, receiver, tmp_path):
    out = tmp_path / "out"
    rxs = [receiver("--out", out, "--platform", cluster.url, "--platform-name", f"p{i}", "--platform-ttl", 2,
                    "--capacity-cpu", 1) for i in range(2)]
    for i, r in enumerate(rxs):
        r.stderr.wait_for(f"registered on the platform as p{i} ", 10)
    with slotstream.PlatformSender(cluster.url, name="py", devices=[0, 1], need_cpu=1, transport="tcp") as tx:
        first = tx.stats()["receiver"]
        assert first in ("p0", "p1")
        assert cluster.reservations()[0]["amount"]["cpu"] == 1
        for k in range(200):
            if k == 100:
                rxs[int(first[1])].sigkill()
            tx.send(k % 2, k.to_bytes(4, "little") * 256)
    # After finish (leaving the block): with record packing, the 100 messages after the kill can all
    # fit the blocks already written, so the loss may show first at FIN, which moves the stream too.
    stats = tx.stats()
    assert stats["reschedules"] == 1 and stats["connections"] == 2
    assert stats["receiver"] == "" or stats["receiver"] != first
    for d in (0, 1):
        files = sorted((out / "py" / f"device-{d}").glob("*.bin"))
        assert [int(f.name[:10]) for f in files] == list(range(100))
        assert [int.from_bytes(f.read_bytes()[:4], "little") for f in files] == list(range(d, 200, 2))
    assert cluster.reservations() == []


def test_no_receiver_with_room_is_refused_with_the_shortfall(cluster, receiver, tmp_path):
    r = receiver("--out", tmp_path / "out", "--platform", cluster.url, "--platform-name", "small",
                 "--capacity-cpu", 0.5)
    r.stderr.wait_for("registered on the platform", 10)
    with pytest.raises(slotstream.Refused, match=r"small: cpu 0\.50 short"):
        slotstream.PlatformSender(cluster.url, name="big", devices=[0], need_cpu=1)
    with pytest.raises(slotstream.InvalidArgument, match="etcd://HOST:PORT"):
        slotstream.PlatformSender("http://nowhere:1", name="x")
    # Issue 35: a negative need made room for others on a full receiver; absurd ones swallow small ones.
    for need in ({"need_cpu": -100}, {"need_fps": 1e300}, {"need_bandwidth": float("nan")}):
        with pytest.raises(slotstream.InvalidArgument, match="must be 0.."):
            slotstream.PlatformSender(cluster.url, name="neg", devices=[0], **need)
    with pytest.raises(slotstream.InvalidArgument, match="password"):
        slotstream.PlatformSender(cluster.url, name="x", platform_user="rx")
    with pytest.raises(slotstream.InvalidArgument, match="cannot be read"):
        slotstream.PlatformSender(cluster.url, name="x", platform_cacert=str(tmp_path / "none.pem"))


@pytest.mark.deadline(60)
def test_send_and_finish_take_a_timeout_like_sender(cluster, receiver, tmp_path):
    """PlatformSender.send/finish had no timeout= (Sender's have): a stopped receiver blocked them for good."""
    out = tmp_path / "out"
    rx = receiver("--out", out, "--platform", cluster.url, "--platform-name", "slow", "--platform-ttl", 2)
    rx.stderr.wait_for("registered on the platform as slow ", 10)
    tx = slotstream.PlatformSender(cluster.url, name="pyt", devices=[0], blocks=2, block_size=4096, transport="shm")
    i = test_interrupt.check_timeouts(tx, rx.pid, lambda i: i.to_bytes(4, "little") * 1000)
    # What reached the receiver before the stream was abandoned is stored, numbered from 0, in order (messages
    # still in the sender's own blocks went with it); the message that timed out never went.
    rx.stdout.wait_for("sender pyt lost", 10)
    files = sorted((out / "pyt" / "device-0").glob("*.bin"))
    assert 1 <= len(files) <= i
    assert [int.from_bytes(f.read_bytes()[:4], "little") for f in files] == list(range(len(files)))
    with pytest.raises(ValueError):
        tx.send(0, b"x", timeout=-1)
