"""Wire protocol v3, sans-I/O: frames in, events out; events in, frames out.

No zmq here (docs/protocol.md has the byte layouts). A message is one packed ZeroMQ frame,
plus one frame per large body. Frame 0 always starts with the kind byte (:class:`Kind`) and
the protocol version (u8, 3):

* ``CONNECT`` / ``CONNECT_ACK``: kind, version, then a UTF-8 JSON object (client info /
  server info);
* ``HEARTBEAT``: kind and version only;
* ``RECONNECT``: kind and version only; the server's answer to a HEARTBEAT or REQUEST from a
  peer it does not know (dropped after a heartbeat timeout): "connect again, now";
* ``REQUEST`` / ``REPLY``: kind, the header (``rda.serialization`` ``encode_header``, whose
  first byte is the version), the body table (u8 count, one kind byte per body, one u32 length
  per body), then the small bodies back to back; each body of ``LARGE_BODY`` bytes or more is
  marked ``EXTERNAL`` in the table and follows as its own frame (zero-copy).

One frame per small message means one pyzmq send/receive (one GIL release) per message on
each side, instead of one per frame; the receiver parses the fixed header and the body table
and keeps the bodies as ``memoryview`` slices of the received frame (no copy).
"""

from __future__ import annotations

import enum
import json
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rda.serialization.errors import DecodeError, RemoteDecodeError, RemoteProtocolError, as_remote
from rda.serialization.header import (
    HEADER_FIXED,
    PROTOCOL_VERSION,
    Header,
    RequestType,
    decode_header,
    encode_header,
    encoded_names,
)
from rda.serialization.message import BodyKind, Message

__all__ = [
    "CLIENT_KINDS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "EXTERNAL",
    "LARGE_BODY",
    "SERVER_KINDS",
    "Connect",
    "ConnectAck",
    "Heartbeat",
    "Incoming",
    "Kind",
    "ProtocolEvent",
    "Reconnect",
    "UnsupportedVersion",
    "decode_frames",
    "decode_from_server",
    "encode_connect",
    "encode_connect_ack",
    "encode_heartbeat",
    "encode_message",
    "encode_reconnect",
    "encode_refusal",
    "encode_routed",
    "encode_tail",
    "frame_parser",
    "join_tail",
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
    # Not RDA3's: "I do not know this connection (any more): send CONNECT again". A client of
    # version 3 from before it drops an unknown kind, so the version did not change for it.
    RECONNECT = 0x04


CLIENT_KINDS = frozenset({Kind.CONNECT, Kind.REQUEST, Kind.HEARTBEAT})
SERVER_KINDS = frozenset({Kind.CONNECT_ACK, Kind.REPLY, Kind.SERVER_HEARTBEAT, Kind.RECONNECT})
_KINDS = {int(k): k for k in Kind}
_KIND_FRAMES = {k: bytes([k]) for k in Kind}
_REPLY_FRAME = bytes([Kind.REPLY])
_HEARTBEATS = {
    True: bytes([Kind.SERVER_HEARTBEAT, PROTOCOL_VERSION]),
    False: bytes([Kind.HEARTBEAT, PROTOCOL_VERSION]),
}
_RECONNECT = bytes([Kind.RECONNECT, PROTOCOL_VERSION])
# Two bytes, kind and version: the messages that carry nothing else.
_BARE = frozenset({Kind.HEARTBEAT, Kind.SERVER_HEARTBEAT, Kind.RECONNECT})
# Version 1 put a version byte first in frame 1 of every kind but the heartbeats.
_VERSIONED_V1 = frozenset(Kind) - _BARE
_BODY_KINDS = {int(k): k for k in BodyKind}

# A body of this many bytes or more travels as its own frame after the packed one: copying it
# into the packed frame would cost more than the extra pyzmq call (pyzmq's zero-copy threshold
# is the same 64 KiB).
LARGE_BODY = 65536
# Bit 7 of a body kind byte: "this body is the next frame, not a slice of the packed frame".
EXTERNAL = 0x80
_MAX_BODIES = 255
_BODY_LAYOUTS: dict[int, struct.Struct] = {}
_TWO_BODIES = struct.Struct("<BBBII")  # the body table of two bodies (_body_layout(2))
_ONE_BODY = struct.Struct("<BBI")
_THREE_BODIES = struct.Struct("<BBBBIII")  # _body_layout(3): a notification with an alarm
# Kind byte + the fixed header: what encode_routed packs in one call.
_ROUTED = struct.Struct("<B" + HEADER_FIXED.format.lstrip("<"))
_NO_BODY = b"\x00"
_HEADER_END = 1 + HEADER_FIXED.size  # kind byte + fixed header
_NAME_LENGTHS = struct.Struct("<HHH")
_NAME_LENGTHS_AT = _HEADER_END - _NAME_LENGTHS.size
_new = object.__new__


class UnsupportedVersion(RemoteProtocolError):
    """The peer speaks another protocol version; ``request_id`` lets the server answer it.

    Remote: the peer sent what this side does not speak."""

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
class Reconnect:
    """The server does not know this connection (it dropped it, e.g. after a heartbeat timeout
    while this process was paused): the client must connect again at once."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """A REQUEST (at the server) or a REPLY (at the client): header parsed, body lazy."""

    message: Message


ProtocolEvent = Connect | ConnectAck | Heartbeat | Reconnect | Incoming


def encode_heartbeat(from_server: bool) -> list[bytes]:
    return [_HEARTBEATS[from_server]]


def encode_reconnect() -> list[bytes]:
    return [_RECONNECT]


def _encode_handshake(kind: Kind, info: dict[str, Any]) -> list[bytes]:
    return [bytes([kind, PROTOCOL_VERSION]) + json.dumps(info).encode()]


def encode_connect(info: dict[str, Any]) -> list[bytes]:
    return _encode_handshake(Kind.CONNECT, info)


def encode_connect_ack(info: dict[str, Any]) -> list[bytes]:
    return _encode_handshake(Kind.CONNECT_ACK, info)


def encode_refusal(exc: UnsupportedVersion) -> list[bytes]:
    """The refusing CONNECT_ACK for a peer of another version, framed so that it can read it.

    A version-1 peer gets the version-1 framing (kind byte, then version 1 + JSON in a second
    frame): its decoder accepts that and reports the connection refused with our message,
    instead of dropping an ACK it cannot parse and waiting for its connect timeout.
    """
    info = json.dumps({"error": str(exc)}).encode()
    if exc.version == 1:
        return [bytes([Kind.CONNECT_ACK]), b"\x01" + info]
    return [bytes([Kind.CONNECT_ACK, PROTOCOL_VERSION]) + info]


def _nbytes(buf: Any) -> int:
    # len() of a memoryview counts items, not bytes (a view of a float64 array).
    return len(buf) if type(buf) is bytes else memoryview(buf).nbytes


def _body_layout(n: int) -> struct.Struct:
    """u8 count, ``n`` body kind bytes, ``n`` u32 lengths; cached per count."""
    layout = _BODY_LAYOUTS.get(n)
    if layout is None:
        layout = struct.Struct(f"<B{n}B{n}I")
        _BODY_LAYOUTS[n] = layout  # n is a u8: at most 256 entries
    return layout


def _split_body(
    body: Sequence[tuple[BodyKind, Buffer]],
) -> tuple[bytes, list[Buffer], list[Buffer]]:
    """(body table, bodies packed into the frame, bodies sent as their own frames)."""
    n = len(body)
    if n > _MAX_BODIES:
        raise ValueError(f"a message carries at most {_MAX_BODIES} body frames, not {n}")
    kinds: list[int] = []
    sizes: list[int] = []
    inline: list[Buffer] = []
    external: list[Buffer] = []
    for body_kind, buf in body:
        size = _nbytes(buf)
        if size >= LARGE_BODY:
            # Its own frame: pyzmq hands it to libzmq without a copy.
            kinds.append(body_kind | EXTERNAL)
            external.append(buf)
        else:
            kinds.append(body_kind)
            inline.append(buf)
        sizes.append(size)
    return _body_layout(n).pack(n, *kinds, *sizes), inline, external


def encode_message(
    kind: Kind, header: Header, body: Sequence[tuple[BodyKind, Buffer]] = ()
) -> list[Buffer]:
    """REQUEST or REPLY: one packed frame, then one frame per large body (passed untouched)."""
    if not body:
        return [b"".join((_KIND_FRAMES[kind], encode_header(header), _NO_BODY))]
    table, inline, external = _split_body(body)
    packed = b"".join((_KIND_FRAMES[kind], encode_header(header), table, *inline))
    return [packed, *external] if external else [packed]


def encode_routed(
    kind: Kind,
    request_type: RequestType,
    rid: int,
    device: str,
    prop: str,
    selector: str,
    body: Sequence[tuple[BodyKind, Buffer]] = (),
) -> list[Buffer]:
    """``encode_message(kind, Header(request_type, rid, device, prop, selector), body)``
    without the Header: the same bytes, for the senders of every request and every reply.

    A frozen dataclass costs an ``object.__setattr__`` per field to build, and the header it
    would describe is packed once and thrown away: this measured about a third of building and
    packing it (docs/performance.md, "Routed encoding without a Header"; the common bodies, one
    or two small ones, skip the general table loop as ``encode_tail`` does)."""
    ld, lp, ls, names = encoded_names(device, prop, selector)
    fixed = _ROUTED.pack(kind, PROTOCOL_VERSION, request_type, 0, 0, rid, ld, lp, ls)
    n = len(body)
    if n == 0:
        return [b"".join((fixed, names, _NO_BODY))]
    if n == 1:
        k0, b0 = body[0]
        n0 = _nbytes(b0)
        if n0 < LARGE_BODY:
            return [b"".join((fixed, names, _ONE_BODY.pack(1, k0, n0), b0))]
    elif n == 2:
        (k0, b0), (k1, b1) = body
        n0, n1 = _nbytes(b0), _nbytes(b1)
        if n0 < LARGE_BODY and n1 < LARGE_BODY:
            return [b"".join((fixed, names, _TWO_BODIES.pack(2, k0, k1, n0, n1), b0, b1))]
    table, inline, external = _split_body(body)
    packed = b"".join((fixed, names, table, *inline))
    return [packed, *external] if external else [packed]


def encode_tail(body: Sequence[tuple[BodyKind, Buffer]]) -> list[Buffer]:
    """The part of a REPLY after its header, encoded once and shared by every subscriber of a
    notification (``ServerTransport.publish``): the body table and the small bodies as one
    ``bytes``, then the large bodies. :func:`join_tail` puts a header in front."""
    if len(body) == 2:
        # A notification (DATA or EXCEPTION, then DATA_CONTEXT), both small: the same bytes
        # as below without the general loop (a third of the tail's cost per update).
        (k0, b0), (k1, b1) = body
        n0, n1 = _nbytes(b0), _nbytes(b1)
        if n0 < LARGE_BODY and n1 < LARGE_BODY:
            return [b"".join((_TWO_BODIES.pack(2, k0, k1, n0, n1), b0, b1))]
    elif len(body) == 3:
        # The same with an alarm's REPLY_CONTEXT after them (a value in alarm).
        (k0, b0), (k1, b1), (k2, b2) = body
        n0, n1, n2 = _nbytes(b0), _nbytes(b1), _nbytes(b2)
        if n0 < LARGE_BODY and n1 < LARGE_BODY and n2 < LARGE_BODY:
            return [b"".join((_THREE_BODIES.pack(3, k0, k1, k2, n0, n1, n2), b0, b1, b2))]
    table, inline, external = _split_body(body)
    return [b"".join((table, *inline)), *external]


def join_tail(header: Buffer, tail: Sequence[Buffer]) -> list[Buffer]:
    """One subscriber's REPLY frames: kind byte + its ``header`` + the shared ``tail``."""
    return [b"".join((_REPLY_FRAME, header, tail[0])), *tail[1:]]


def _decode_handshake(frames: Sequence[Buffer], kind: Kind) -> dict[str, Any]:
    if len(frames) != 1:
        raise RemoteDecodeError(f"{kind.name} has {len(frames)} frames, expected 1")
    frame = frames[0]
    if len(frame) > _MAX_HANDSHAKE:
        raise RemoteDecodeError(f"{kind.name} frame of {len(frame)} bytes exceeds {_MAX_HANDSHAKE}")
    try:
        info = json.loads(bytes(frame[2:]))
    # RecursionError: 64 KiB of "[[[[..." nests deeper than the JSON parser allows.
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RemoteDecodeError(f"{kind.name} info is not a JSON object: {exc}", 2) from exc
    if not isinstance(info, dict):
        raise RemoteDecodeError(
            f"{kind.name} info is a JSON {type(info).__name__}, not an object", 2
        )
    return info


def _decode_message(frames: Sequence[Buffer]) -> Message:
    first = frames[0]
    view = first if type(first) is memoryview else memoryview(first)
    size = len(view)
    if size < _HEADER_END:
        raise RemoteDecodeError(
            f"message of {size} bytes is shorter than kind + the {HEADER_FIXED.size}-byte header", 1
        )
    ld, lp, ls = _NAME_LENGTHS.unpack_from(view, _NAME_LENGTHS_AT)
    end = _HEADER_END + ld + lp + ls
    if end >= size:
        raise RemoteDecodeError(
            f"header names ({ld + lp + ls} bytes) and the body count run past the "
            f"{size}-byte frame",
            _HEADER_END,
        )
    # Only the fixed header and the body table are parsed here (dispatcher thread); the
    # bodies stay memoryview slices of the received frame, decoded by the worker.
    try:
        header = decode_header(view[1:end])
    except DecodeError as exc:
        raise as_remote(exc) from None
    n = view[end]
    layout = _BODY_LAYOUTS.get(n) or _body_layout(n)
    pos = end + layout.size
    if pos > size:
        raise RemoteDecodeError(f"body table of {n} entries runs past the {size}-byte frame", end)
    fields = layout.unpack_from(view, end)
    body: list[tuple[BodyKind, Buffer]] = []
    n_frames = len(frames)
    next_frame = 1
    for i in range(n):
        raw_kind, length = fields[1 + i], fields[1 + n + i]
        kind = _BODY_KINDS.get(raw_kind & ~EXTERNAL)
        if kind is None:
            raise RemoteDecodeError(f"unknown body kind {raw_kind}", end + 1 + i)
        if raw_kind & EXTERNAL:
            if next_frame >= n_frames:
                raise RemoteDecodeError(f"body {i} is announced in its own frame but it is missing")
            frame = frames[next_frame]
            next_frame += 1
            if _nbytes(frame) != length:
                raise RemoteDecodeError(
                    f"body {i} is announced as {length} bytes but its frame has {_nbytes(frame)}"
                )
            body.append((kind, frame))
        else:
            if pos + length > size:
                raise RemoteDecodeError(f"body {i} of {length} bytes runs past the frame", pos)
            body.append((kind, view[pos : pos + length]))
            pos += length
    if pos != size:
        raise RemoteDecodeError(f"{size - pos} bytes after the last body", pos)
    if next_frame != n_frames:
        raise RemoteDecodeError(
            f"message has {n_frames} frames but its body table announces {next_frame}"
        )
    return Message(header, tuple(body))


def _version_one(kind: Kind, frames: Sequence[Buffer]) -> UnsupportedVersion:
    """A kind byte alone in frame 0 is version 1's framing: name the version it carries."""
    second = frames[1] if len(frames) > 1 else b""
    version = second[0] if len(second) and kind in _VERSIONED_V1 else 1
    return UnsupportedVersion(version)


def decode_from_server(frames: Sequence[Buffer], max_size: int) -> ProtocolEvent:
    """``decode_frames(frames, from_server=True, max_size=max_size)`` with positional
    arguments: a client's dispatcher decodes every message it receives through it (compiled,
    a C call without keyword arguments to parse)."""
    if _parse_compiled is not None and type(frames) is list:
        message = _parse_compiled(frames, _SERVER_KINDS, max_size)
        if message is not None:
            return _incoming(message)
    return decode_frames(frames, from_server=True, max_size=max_size)


def decode_frames(
    frames: Sequence[Buffer],
    *,
    from_server: bool,
    max_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> ProtocolEvent:
    """Turn one received multipart message into an event.

    ``from_server`` says which side sent it (a client receives server kinds and vice versa).
    Every error is the sender's fault: ``RemoteDecodeError`` for malformed input,
    ``UnsupportedVersion`` (a ``RemoteProtocolError``) for another protocol version and
    ``RemoteProtocolError`` for a kind the receiving side must not get. A message's bodies are
    decoded later (:class:`Message`), and their errors are remote too.
    """
    # The message path first, compiled: it returns None for anything it does not accept as
    # it is, and the Python parser below takes the message again and names what is wrong.
    if _parse_compiled is not None and type(frames) is list:
        message = _parse_compiled(frames, _MESSAGE_KINDS[from_server], max_size)
        if message is not None:
            return _incoming(message)
    if not frames:
        raise RemoteDecodeError("empty message (0 frames)")
    size = sum(map(len, frames))
    if size > max_size:
        raise RemoteDecodeError(f"message of {size} bytes exceeds the maximum of {max_size}")
    first = frames[0]
    kind = _KINDS.get(first[0]) if len(first) else None
    if kind is None:
        raise RemoteDecodeError(f"unknown kind byte {bytes(first[:1])!r}", 0)
    if len(first) == 1:
        raise _version_one(kind, frames)
    # Every kind carries the version right after the kind byte (the header's first byte for
    # REQUEST/REPLY): checked first, so that a peer of another version is told so.
    version = first[1]
    if version != PROTOCOL_VERSION:
        request_id = None
        if kind is Kind.REQUEST and len(first) >= _HEADER_END:
            request_id = HEADER_FIXED.unpack_from(first, 1)[4]
        raise UnsupportedVersion(version, request_id)
    # REQUEST at the server, REPLY at the client: the message path, tested first.
    if kind is (Kind.REPLY if from_server else Kind.REQUEST):
        return _incoming(_decode_message(frames))
    allowed = SERVER_KINDS if from_server else CLIENT_KINDS
    if kind not in allowed:
        side = "a server" if from_server else "a client"
        raise RemoteProtocolError(f"{kind.name} may not be sent by {side}")
    if kind in _BARE:
        if len(frames) != 1 or len(first) != 2:
            name = "RECONNECT" if kind is Kind.RECONNECT else "HEARTBEAT"
            raise RemoteDecodeError(
                f"{name} is {len(frames)} frame(s) of {size} bytes, expected 1 of 2"
            )
        return Reconnect() if kind is Kind.RECONNECT else Heartbeat()
    if kind is Kind.CONNECT:
        return Connect(_decode_handshake(frames, kind))
    return ConnectAck(_decode_handshake(frames, kind))


_set_message: Callable[[Incoming, Message], None] = vars(Incoming)["message"].__set__


def _incoming(message: Message) -> Incoming:
    """``Incoming(message)`` without the frozen dataclass ``__init__`` (hot path)."""
    event: Incoming = _new(Incoming)
    _set_message(event, message)
    return event


def _load_compiled_parser() -> Callable[[list[Any], int, int], Message | None] | None:
    """``_cframe.parse_message`` when it was built and ``RDA_PURE_PYTHON`` is not set."""
    if os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from rda.transport._cframe import parse_message
    except ImportError:
        return None
    return parse_message


# The kind byte of the message a side receives: REQUEST at a server, REPLY at a client.
_MESSAGE_KINDS = (int(Kind.REQUEST), int(Kind.REPLY))  # indexed by from_server
_SERVER_KINDS = _MESSAGE_KINDS[True]  # what a server sends: REPLY
_parse_compiled = _load_compiled_parser()
frame_parser: str = "python" if _parse_compiled is None else "compiled"
"""Which parser takes REQUEST/REPLY frames first: "compiled" (``_cframe``) or "python"."""
