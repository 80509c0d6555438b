"""slotstream: many device streams (cameras, radars) over one one-sided-RDMA connection (UCX).

    import numpy as np, slotstream

    with slotstream.Sender("receiver:7000", name="edge-a", devices=range(12)) as tx:
        for cam in range(12):
            tx.send(cam, np.zeros((480, 640, 3), np.uint8))   # any buffer: bytes, memoryview, numpy

    with slotstream.Receiver("0.0.0.0:7000", exit_after_senders=1) as rx:
        for sender, device, seq, data in rx:                  # data: a memoryview
            ...

    # zero-copy: each message stays in its receive block until its view is released
    with slotstream.Receiver("0.0.0.0:7000", exit_after_senders=1, zero_copy=True) as rx:
        for sender, device, seq, view in rx:
            with view:
                image = np.frombuffer(view, np.uint8).reshape(480, 640, 3)   # no copy, read-only
                ...                                                          # del image before the block ends

    # the per-device worker pipeline in process: a worker per (sender, device), on its own thread, given views
    class Analyser:
        def __init__(self, sender, device): ...
        def __call__(self, seq, view): ...                                   # the device's messages in order

    with slotstream.Receiver("0.0.0.0:7000", exit_after_senders=1, zero_copy=True, workers=Analyser) as rx:
        rx.wait()                                                            # senders ended, workers done

    # or let the cloud-edge platform (etcd) choose and reserve a receiver (docs/platform.md)
    with slotstream.PlatformSender("etcd://e1:2379,e2:2379,e3:2379", name="edge-a", devices=range(12),
                                   need_cpu=3, need_bandwidth=12 * 25 * 921600) as tx:
        ...

The C++ library (include/slotstream/slotstream.h) does all the work; this package binds it.
Errors are raised as slotstream.Error subclasses (slotstream.errors) carrying its messages.
"""
# Only the public names (__all__) and __version__ are left without an underscore: `dir(slotstream)` is the API.
import atexit as _atexit

from . import errors
from ._slotstream import (DEFAULT_BLOCK_SIZE, DEFAULT_BLOCKS, Frame, MessageView, PlatformSender, Receiver, Sender,
                          __version__, protocols)
from ._slotstream import close_all as _close_all
from .errors import (AuthFailed, Busy, Cancelled, ConnectFailed, Error, InvalidArgument, PeerGone, ProtocolError,
                     Refused, StorageError, Timeout, TransportError, VersionMismatch)

# __version__ is the C++ library's (CMake's project VERSION, which pyproject.toml's version reads too).
# Receivers still open at exit are stopped while Python can still run their callbacks.
_atexit.register(_close_all)

__all__ = [
    "Sender", "PlatformSender", "Receiver", "Frame", "MessageView", "protocols", "DEFAULT_BLOCKS", "DEFAULT_BLOCK_SIZE", "errors",
    "Error", "InvalidArgument", "ConnectFailed", "Refused", "AuthFailed", "ProtocolError", "VersionMismatch",
    "PeerGone", "TransportError", "StorageError", "Timeout", "Cancelled", "Busy",
]
