"""slotstream.Receiver(..., zero_copy=True) fed by real `slotstream send` processes: each message is a MessageView
of its receive block — numpy reads it in place (same address, read-only), release() gives the block back, using a
released view raises, release() is refused while numpy still uses it, garbage collection releases, and a message
spanning blocks is copied once."""
import subprocess
import threading

import numpy as np
import pytest

import slotstream
from integration_helpers import BIN, TRANSPORTS, make_files

BLOCK = 65536


def sender(addr, transport, paths, *extra):
    files = [x for p in paths for x in ("--file", f"0={p}")]
    argv = [BIN, "send", "--to", addr, "--name", "cam", "--transport", transport, "--block-size", BLOCK, *extra, *files]
    return subprocess.Popen([str(a) for a in argv], stderr=subprocess.PIPE, text=True)


@pytest.mark.deadline(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_numpy_reads_the_receive_block_in_place(tmp_path, transport):
    paths = make_files(tmp_path, [1, 1000, BLOCK - 16, 40_000], "f")
    got = []
    with slotstream.Receiver("127.0.0.1:0", transport=transport, exit_after_senders=1, zero_copy=True) as rx:
        tx = sender(rx.address, transport, paths)
        for name, device, seq, view in rx:
            assert isinstance(view, slotstream.MessageView)
            assert (name, device, seq) == ("cam", 0, len(got)) and view.seq == seq and view.sender == "cam"
            assert view.in_place and not view.copied and not view.released
            arr = np.frombuffer(view, np.uint8)
            assert arr.ctypes.data == view.address, "numpy copied the message"
            assert not arr.flags.writeable
            got.append(arr.tobytes())
            del arr
            view.release()
            assert view.released and view.address == 0
            with pytest.raises(ValueError, match="released"):
                memoryview(view)
        assert tx.wait(30) == 0, tx.stderr.read()
    assert got == [p.read_bytes() for p in paths]


@pytest.mark.deadline(60)
def test_release_is_refused_while_numpy_still_uses_the_block(tmp_path):
    paths = make_files(tmp_path, [5000], "f")
    with slotstream.Receiver("127.0.0.1:0", transport="shm", exit_after_senders=1, zero_copy=True) as rx:
        tx = sender(rx.address, "shm", paths)
        _, _, _, view = next(rx)
        arr = np.frombuffer(view, np.uint8)
        with pytest.raises(BufferError, match="still use this message"):
            view.release()
        assert arr.tobytes() == paths[0].read_bytes(), "the refused release left the bytes in place"
        del arr
        with view:  # the end of the block releases it
            assert bytes(memoryview(view)[:10]) == paths[0].read_bytes()[:10]
        assert view.released
        assert list(rx) == []
        assert tx.wait(30) == 0, tx.stderr.read()


@pytest.mark.deadline(90)
def test_garbage_collected_views_release_their_blocks(tmp_path):
    # At most 2 blocks may be held: if dropping a view did not release its block, the stream would stop at the
    # third message and this test would hit its deadline.
    paths = make_files(tmp_path, [3000] * 20, "f")
    with slotstream.Receiver("127.0.0.1:0", transport="shm", exit_after_senders=1, zero_copy=True,
                             max_held_blocks=2) as rx:
        tx = sender(rx.address, "shm", paths, "--protocol", "status_byte:pack=off")
        got = [bytes(memoryview(view)) for _, _, _, view in rx]  # each view dropped unreleased
        assert tx.wait(30) == 0, tx.stderr.read()
    assert got == [p.read_bytes() for p in paths]


@pytest.mark.deadline(60)
def test_a_message_spanning_blocks_is_copied_once_and_callbacks_get_views(tmp_path):
    paths = make_files(tmp_path, [200_000, 100], "f")
    kept, done = [], threading.Event()

    def on_message(name, device, seq, view):
        kept.append(view)  # the application may keep it
        if len(kept) == 2:
            done.set()

    with slotstream.Receiver("127.0.0.1:0", on_message, transport="shm", exit_after_senders=1,
                             zero_copy=True) as rx:
        tx = sender(rx.address, "shm", paths)
        assert rx.wait(timeout=30)
        assert tx.wait(30) == 0, tx.stderr.read()
    assert done.is_set()
    assert kept[0].copied and not kept[0].in_place
    assert not kept[1].copied and kept[1].in_place
    assert [bytes(memoryview(v)) for v in kept] == [p.read_bytes() for p in paths]
    for v in kept:
        v.release()


@pytest.mark.deadline(60)
def test_a_sender_with_another_protocol_is_refused(tmp_path):
    paths = make_files(tmp_path, [10], "f")
    with slotstream.Receiver("127.0.0.1:0", transport="shm", zero_copy=True) as rx:
        tx = sender(rx.address, "shm", paths, "--protocol", "credit")
        assert tx.wait(30) != 0
        assert "zero-copy" in tx.stderr.read()
