"""Exceptions raised by slotstream: one class per status code of the C++ library.

Every exception is a :class:`slotstream.Error` whose message is the library's own and whose
``code`` is the library's code name (``"peer gone"``, ``"refused"``, ...). Where Python has a
matching built-in, the class derives from it too, so ``except ConnectionError`` or
``except ValueError`` work as expected.
"""


class Error(Exception):
    """A slotstream call failed."""

    code: str

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


class InvalidArgument(Error, ValueError):
    """Bad options or a call that does not fit the object's state (e.g. send() after finish())."""


class ConnectFailed(Error, ConnectionError):
    """The receiver's control port could not be reached."""


class Refused(Error, ConnectionError):
    """The receiver said no (unknown protocol, name in use, transport not allowed, ...)."""


class AuthFailed(Refused):
    """The token was missing or wrong."""


class ProtocolError(Error):
    """The peer sent a malformed or unexpected control message."""


class VersionMismatch(ProtocolError):
    """The peer speaks another version of the control protocol."""


class PeerGone(Error, ConnectionError):
    """The other side died or closed the connection."""


class TransportError(Error):
    """UCX reported an error."""


class StorageError(Error, OSError):
    """The local file system failed (disk full, permissions)."""


class Timeout(Error, TimeoutError):
    """A deadline passed."""


class Cancelled(Error):
    """The operation was cancelled (shutdown)."""


class Busy(Error):
    """Not now: retried later."""


_BY_CODE = {
    "invalid argument": InvalidArgument,
    "connect failed": ConnectFailed,
    "protocol error": ProtocolError,
    "version mismatch": VersionMismatch,
    "refused": Refused,
    "authentication failed": AuthFailed,
    "peer gone": PeerGone,
    "transport error": TransportError,
    "I/O error": StorageError,
    "timeout": Timeout,
    "cancelled": Cancelled,
    "busy": Busy,
}


def error_class(code: str) -> type[Error]:
    """The exception class for a library code name (used by the extension)."""
    return _BY_CODE.get(code, Error)
