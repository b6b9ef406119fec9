"""The rda error hierarchy: one root, each error says whose fault it is.

The hierarchy lives in the lowest layer so that every layer can raise these types without
importing upwards; ``rda`` re-exports them. Errors that travel over the wire are mapped back
to the same class on the client by :func:`error_from_remote` using the class name.
"""

from __future__ import annotations

import builtins

__all__ = [
    "DecodeError",
    "DisconnectedError",
    "HistoryUnavailableError",
    "NoSuchDeviceError",
    "NotAuthorizedError",
    "OverloadError",
    "ProtocolError",
    "RdaError",
    "RemoteError",
    "TimeoutError",
    "TransportError",
    "error_from_remote",
]


class RdaError(Exception):
    """Root of every error rda raises on purpose."""


class DecodeError(RdaError):
    """Bytes could not be decoded: the message names what is wrong and at which offset."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at offset {offset})")


class ProtocolError(RdaError):
    """A peer broke the wire protocol (wrong kind byte, version mismatch, missing frames)."""


class TimeoutError(RdaError, builtins.TimeoutError):
    """A request got no answer before its deadline."""


class DisconnectedError(RdaError):
    """The connection to the server was lost while the request was pending."""


class TransportError(RdaError):
    """A ZeroMQ-level failure; keeps the errno of the underlying ``zmq.ZMQError``."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        self.errno = errno
        super().__init__(message)


class NoSuchDeviceError(RdaError):
    """The device or property is unknown (to the directory or to the server)."""


class HistoryUnavailableError(RdaError):
    """No recorder serves the history of a signal, or its history server could not answer."""


class NotAuthorizedError(RdaError):
    """The authorization policy denied the operation."""


class OverloadError(RdaError):
    """The server's queue for this device is full and the policy rejects new requests."""


class RemoteError(RdaError):
    """A failure on the server side: ``type`` is the remote exception's type name."""

    def __init__(self, type: str, message: str) -> None:
        self.type = type
        self.message = message
        super().__init__(f"{type}: {message}" if message else type)


# Errors a server may raise that the client re-creates as the same class.
_TRANSPORTABLE: dict[str, type[RdaError]] = {
    cls.__name__: cls
    for cls in (
        NoSuchDeviceError,
        NotAuthorizedError,
        HistoryUnavailableError,
        OverloadError,
        TimeoutError,
        DecodeError,
        ProtocolError,
    )
}


def error_from_remote(type_name: str, message: str) -> RdaError:
    """Turn an EXCEPTION frame's (type, message) back into an exception object.

    rda's own error types come back as themselves; anything else becomes ``RemoteError``.
    """
    cls = _TRANSPORTABLE.get(type_name)
    if cls is None:
        return RemoteError(type_name, message)
    return cls(message)
