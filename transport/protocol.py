"""Wire protocol v1, sans-I/O: frames in, events out; events in, frames out.

No zmq here (docs/protocol.md has the byte layouts). A message is a list of ZeroMQ frames:

* frame 0: one kind byte (:class:`Kind`);
* ``CONNECT`` / ``CONNECT_ACK``: frame 1 = u8 protocol version + a UTF-8 JSON object
  (client info / server info);
* ``HEARTBEAT``: no further frames;
* ``REQUEST`` / ``REPLY``: frame 1 = header (``rda.serialization`` ``encode_header``), then the
  body frames, then one descriptor frame holding one :class:`BodyKind` byte per body frame.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rda.serialization._header import (
    HEADER_FIXED,
    PROTOCOL_VERSION,
    Header,
    decode_header,
    encode_header,
)
from rda.serialization._message import BodyKind, Message
from rda.serialization.errors import DecodeError, ProtocolError

__all__ = [
    "CLIENT_KINDS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "SERVER_KINDS",
    "Connect",
    "ConnectAck",
    "Heartbeat",
    "Incoming",
    "Kind",
    "ProtocolEvent",
    "UnsupportedVersion",
    "decode_frames",
    "encode_connect",
    "encode_connect_ack",
    "encode_heartbeat",
    "encode_message",
]

Buffer = bytes | memoryview
DEFAULT_MAX_MESSAGE_SIZE = 256 * 1024 * 1024
# Client info / server info are small; a bigger handshake is garbage, not a reason to parse.
_MAX_HANDSHAKE = 64 * 1024


class Kind(enum.IntEnum):
    """Frame-0 kind byte; values borrowed from RDA3."""

    CONNECT = 0x20
    REQUEST = 0x21
    HEARTBEAT = 0x22
    CONNECT_ACK = 0x01
    REPLY = 0x02
    SERVER_HEARTBEAT = 0x03


CLIENT_KINDS = frozenset({Kind.CONNECT, Kind.REQUEST, Kind.HEARTBEAT})
SERVER_KINDS = frozenset({Kind.CONNECT_ACK, Kind.REPLY, Kind.SERVER_HEARTBEAT})
_KIND_BYTES = {bytes([k]): k for k in Kind}
_KIND_FRAMES = {k: bytes([k]) for k in Kind}
# The descriptor frames of the messages this library sends (encode_message's lookup).
_DESCRIPTORS = {
    tuple(kinds): bytes(kinds)
    for kinds in (
        (),
        (BodyKind.DATA,),
        (BodyKind.EXCEPTION,),
        (BodyKind.REQUEST_CONTEXT,),
        (BodyKind.DATA, BodyKind.DATA_CONTEXT),
        (BodyKind.DATA, BodyKind.REQUEST_CONTEXT),
        (BodyKind.EXCEPTION, BodyKind.DATA_CONTEXT),
    )
}
_BODY_KINDS = {int(k): k for k in BodyKind}
# Descriptor bytes -> body kinds, filled as layouts are seen (bounded: a peer cannot grow it).
_LAYOUTS: dict[bytes, tuple[BodyKind, ...]] = {}
_LAYOUTS_MAX = 256
_new = object.__new__


class UnsupportedVersion(ProtocolError):
    """The peer speaks another protocol version; ``request_id`` lets the server answer it."""

    def __init__(self, version: int, request_id: int | None = None) -> None:
        self.version = version
        self.request_id = request_id
        super().__init__(
            f"peer speaks protocol version {version}, this side speaks {PROTOCOL_VERSION}"
        )


@dataclass(frozen=True, slots=True)
class Connect:
    """A client opened the conversation; ``info`` has application, user, host, pid, version."""

    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConnectAck:
    """The server accepted (or, with ``info["error"]``, refused) the connection."""

    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing but proof of life."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """A REQUEST (at the server) or a REPLY (at the client): header parsed, body lazy."""

    message: Message


ProtocolEvent = Connect | ConnectAck | Heartbeat | Incoming


def encode_heartbeat(from_server: bool) -> list[bytes]:
    return [bytes([Kind.SERVER_HEARTBEAT if from_server else Kind.HEARTBEAT])]


def _encode_handshake(kind: Kind, info: dict[str, Any]) -> list[bytes]:
    return [bytes([kind]), bytes([PROTOCOL_VERSION]) + json.dumps(info).encode()]


def encode_connect(info: dict[str, Any]) -> list[bytes]:
    return _encode_handshake(Kind.CONNECT, info)


def encode_connect_ack(info: dict[str, Any]) -> list[bytes]:
    return _encode_handshake(Kind.CONNECT_ACK, info)


def encode_message(
    kind: Kind, header: Header, body: Sequence[tuple[BodyKind, Buffer]] = ()
) -> list[Buffer]:
    """REQUEST or REPLY frames. Body buffers are passed through untouched (no copy)."""
    frames: list[Buffer] = [_KIND_FRAMES[kind], encode_header(header)]
    kinds = []
    for body_kind, buf in body:
        frames.append(buf)
        kinds.append(body_kind)
    descriptor = _DESCRIPTORS.get(tuple(kinds))
    frames.append(descriptor if descriptor is not None else bytes(kinds))
    return frames


def _decode_handshake(frames: Sequence[Buffer], kind: Kind) -> dict[str, Any]:
    if len(frames) != 2:
        raise DecodeError(f"{kind.name} has {len(frames)} frames, expected 2")
    frame = frames[1]
    if len(frame) < 1:
        raise DecodeError(f"{kind.name} info frame is empty", 0)
    if len(frame) > _MAX_HANDSHAKE:
        raise DecodeError(f"{kind.name} info frame of {len(frame)} bytes exceeds {_MAX_HANDSHAKE}")
    version = frame[0]
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(version)
    try:
        info = json.loads(bytes(frame[1:]))
    # RecursionError: 64 KiB of "[[[[..." nests deeper than the JSON parser allows.
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise DecodeError(f"{kind.name} info is not a JSON object: {exc}", 1) from exc
    if not isinstance(info, dict):
        raise DecodeError(f"{kind.name} info is a JSON {type(info).__name__}, not an object", 1)
    return info


def _decode_message(frames: Sequence[Buffer]) -> Message:
    n_frames = len(frames)
    if n_frames < 3:
        raise DecodeError(f"message has {n_frames} frames; needs kind, header and descriptor")
    header_frame = frames[1]
    # Version first, so a peer of another version gets an explicit answer with its request id.
    if len(header_frame) >= HEADER_FIXED.size and header_frame[0] != PROTOCOL_VERSION:
        request_id = HEADER_FIXED.unpack_from(header_frame)[4]
        raise UnsupportedVersion(header_frame[0], request_id)
    header = decode_header(header_frame)
    descriptor = frames[-1]
    n_body = n_frames - 3
    if len(descriptor) != n_body:
        raise DecodeError(
            f"descriptor lists {len(descriptor)} body frames but the message carries {n_body}"
        )
    # The descriptor's bytes as a key: one lookup gives every frame's kind (a handful of
    # layouts ever occur), instead of one lookup per body frame.
    kinds = _LAYOUTS.get(bytes(descriptor))
    if kinds is None:
        kinds = _layout(descriptor)
    return Message(header, tuple(zip(kinds, frames[2:-1], strict=True)))


def _layout(descriptor: Buffer) -> tuple[BodyKind, ...]:
    kinds = []
    for i in range(len(descriptor)):
        kind = _BODY_KINDS.get(descriptor[i])
        if kind is None:
            raise DecodeError(f"unknown body frame kind {descriptor[i]}", i)
        kinds.append(kind)
    layout = tuple(kinds)
    if len(_LAYOUTS) < _LAYOUTS_MAX and len(layout) <= 8:
        _LAYOUTS[bytes(descriptor)] = layout
    return layout


def decode_frames(
    frames: Sequence[Buffer],
    *,
    from_server: bool,
    max_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> ProtocolEvent:
    """Turn one received multipart message into an event.

    ``from_server`` says which side sent it (a client receives server kinds and vice versa).
    Raises ``DecodeError`` for malformed input, ``UnsupportedVersion`` for another protocol
    version and ``ProtocolError`` for a kind the receiving side must not get.
    """
    if not frames:
        raise DecodeError("empty message (0 frames)")
    size = sum(map(len, frames))
    if size > max_size:
        raise DecodeError(f"message of {size} bytes exceeds the maximum of {max_size}")
    # Check the length before indexing: a huge bogus frame 0 must not be copied.
    first = frames[0]
    kind = _KIND_BYTES.get(bytes(first)) if len(first) == 1 else None
    if kind is None:
        raise DecodeError(f"unknown kind byte {bytes(first[:8])!r}", 0)
    # REQUEST at the server, REPLY at the client: the message path, tested first.
    if kind is (Kind.REPLY if from_server else Kind.REQUEST):
        return _incoming(_decode_message(frames))
    allowed = SERVER_KINDS if from_server else CLIENT_KINDS
    if kind not in allowed:
        side = "a server" if from_server else "a client"
        raise ProtocolError(f"{kind.name} may not be sent by {side}")
    if kind in (Kind.HEARTBEAT, Kind.SERVER_HEARTBEAT):
        if len(frames) != 1:
            raise DecodeError(f"HEARTBEAT has {len(frames)} frames, expected 1")
        return Heartbeat()
    if kind is Kind.CONNECT:
        return Connect(_decode_handshake(frames, kind))
    return ConnectAck(_decode_handshake(frames, kind))


_set_message: Callable[[Incoming, Message], None] = vars(Incoming)["message"].__set__


def _incoming(message: Message) -> Incoming:
    """``Incoming(message)`` without the frozen dataclass ``__init__`` (hot path)."""
    event: Incoming = _new(Incoming)
    _set_message(event, message)
    return event
