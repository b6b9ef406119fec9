"""The rda error hierarchy: one root, each error says whose fault it is.

The hierarchy lives in the lowest layer so that every layer can raise these types without
importing upwards; ``rda`` re-exports them. Errors that travel over the wire are mapped back
to the same class on the client by :func:`error_from_remote` using the class name.

Whose fault (docs/protocol.md, "Whose fault"), as h11 splits its ``ProtocolError``: *remote*
means the peer sent something wrong, *local* means this process did something wrong. Both
``DecodeError`` and ``ProtocolError`` have a ``Remote`` and a ``Local`` subclass; the base
classes still catch both. The codec raises the base ``DecodeError`` (it cannot know whose
bytes it reads); the code that receives a peer's bytes turns it into ``RemoteDecodeError``
(:func:`as_remote`). Crossing the wire flips the view: the server's ``RemoteDecodeError``
("this client's request does not decode") is the client's ``LocalDecodeError``.
"""

from __future__ import annotations

import builtins
from typing import ClassVar

__all__ = [
    "DecodeError",
    "DisconnectedError",
    "HistoryUnavailableError",
    "LocalDecodeError",
    "LocalProtocolError",
    "NoSuchDeviceError",
    "NotAuthorizedError",
    "OverloadError",
    "ProtocolError",
    "RdaError",
    "RemoteDecodeError",
    "RemoteError",
    "RemoteProtocolError",
    "TimeoutError",
    "TransportError",
    "as_remote",
    "error_from_remote",
    "wire_type",
]


class RdaError(Exception):
    """Root of every error rda raises on purpose."""


class DecodeError(RdaError):
    """Bytes could not be decoded: the message names what is wrong and at which offset.

    Raised as such by the codec, which does not know whose bytes it reads (``origin`` None);
    :class:`RemoteDecodeError` and :class:`LocalDecodeError` say whose fault it is.
    """

    #: "remote" (the peer sent it), "local" (this process did it) or None (not known).
    origin: ClassVar[str | None] = None

    def __init__(self, message: str, offset: int | None = None) -> None:
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at offset {offset})")


class RemoteDecodeError(DecodeError):
    """Bytes a peer sent do not decode: a request at the server, a reply or notification at
    the client; or the server reports that it could not decode data of its own."""

    origin = "remote"


class LocalDecodeError(DecodeError):
    """This process's bytes do not decode: at the client, the server reports that it could
    not decode this client's request."""

    origin = "local"


class ProtocolError(RdaError):
    """The wire protocol was broken (wrong kind byte, version mismatch, missing frames).

    :class:`RemoteProtocolError` and :class:`LocalProtocolError` say by whom; the base class
    catches both, and raised as such (``origin`` None) it does not say.
    """

    #: "remote" (the peer broke it), "local" (this process did) or None (not known).
    origin: ClassVar[str | None] = None


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol: a frame it sent is not allowed (or not of this version),
    a reply lacks the frame its type needs, or the server reports breaking it itself."""

    origin = "remote"


class LocalProtocolError(ProtocolError):
    """This process broke the protocol: a bug on this side (a connection-state transition
    the table forbids), or the server reports that this client's request broke it."""

    origin = "local"


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


def as_remote(error: DecodeError) -> RemoteDecodeError:
    """``error`` as the fault of the peer whose bytes did not decode: same message, offset
    and traceback. For the code that decodes received bytes (h11 re-raises its internal
    errors as remote the same way, where data from the peer comes in)."""
    if isinstance(error, RemoteDecodeError):
        return error
    remote = RemoteDecodeError(str(error))
    remote.offset = error.offset
    return remote.with_traceback(error.__traceback__)


# Errors a server may raise that the client re-creates as the same class.
_TRANSPORTABLE: dict[str, type[RdaError]] = {
    cls.__name__: cls
    for cls in (
        NoSuchDeviceError,
        NotAuthorizedError,
        HistoryUnavailableError,
        OverloadError,
        TimeoutError,
    )
}

# The wire's names for decode and protocol errors, from the sender's (the server's) view, and
# what each becomes at the receiver, whose view is the other side's: "DecodeError" and
# "ProtocolError" (names older clients know) say the receiver's request was at fault; the
# "Local" names say the server was. (receiver's class, what the message is prefixed with)
_FLIPPED: dict[str, tuple[type[DecodeError] | type[ProtocolError], str]] = {
    "DecodeError": (LocalDecodeError, "the server could not decode this client's request"),
    "ProtocolError": (LocalProtocolError, "the server reports that this client broke the protocol"),
    "LocalDecodeError": (RemoteDecodeError, "the server reports a decode error of its own"),
    "LocalProtocolError": (RemoteProtocolError, "the server reports a protocol error of its own"),
}


def wire_type(error: BaseException) -> str:
    """The type name an EXCEPTION frame carries for ``error`` (the sender's view).

    A decode or protocol error that is the peer's fault travels as ``DecodeError`` /
    ``ProtocolError``; one that is not known to be (this side's own, or of unknown origin)
    as ``LocalDecodeError`` / ``LocalProtocolError``; anything else under its class name.
    """
    if isinstance(error, DecodeError):
        return "DecodeError" if isinstance(error, RemoteDecodeError) else "LocalDecodeError"
    if isinstance(error, ProtocolError):
        return "ProtocolError" if isinstance(error, RemoteProtocolError) else "LocalProtocolError"
    return type(error).__name__


def error_from_remote(type_name: str, message: str) -> RdaError:
    """Turn an EXCEPTION frame's (type, message) back into an exception object.

    rda's own error types come back as themselves, except decode and protocol errors, whose
    fault flips sides (the server's "your request does not decode" is this client's
    ``LocalDecodeError``) and whose message says that the server reported them; anything
    else becomes ``RemoteError``.
    """
    flipped = _FLIPPED.get(type_name)
    if flipped is not None:
        cls, said = flipped
        return cls(f"{said}: {message}" if message else said)
    known = _TRANSPORTABLE.get(type_name)
    if known is None:
        return RemoteError(type_name, message)
    return known(message)
