"""The fixed message header and the data-context frame (docs/protocol.md, "Header").

Both are parsed with a single ``struct.unpack_from`` so that the dispatcher thread spends a
predictable, tiny amount of time per message (RDA3 paper, "Header and body").

Header layout, little-endian, 18 fixed bytes then the strings::

    u8  protocol version (2)
    u8  request type   (RequestType)
    u8  update type    (UpdateType)
    u8  flags          (HeaderFlags)
    u64 id             (request id chosen by the client; subscription id for notifications)
    u16 len(device)    u16 len(property)    u16 len(selector)
    device, property, selector: UTF-8, back to back

The three lengths sit together in the fixed part (rather than before each string) so that all
numbers come out of one ``unpack_from``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from rda.serialization.errors import DecodeError

__all__ = [
    "CONTEXT_FIXED",
    "HEADER_FIXED",
    "PROTOCOL_VERSION",
    "DataContext",
    "Header",
    "HeaderFlags",
    "RequestType",
    "UpdateType",
    "decode_context",
    "decode_context_at",
    "decode_header",
    "encode_context",
    "encode_header",
    "encoded_names",
]

PROTOCOL_VERSION = 3
HEADER_FIXED = struct.Struct("<BBBBQHHH")
CONTEXT_FIXED = struct.Struct("<QqqH")
_MAX_NAME = 0xFFFF


class RequestType(enum.IntEnum):
    """Request types, numbered as in RDA3."""

    GET = 0
    SET = 1
    CONNECT = 2
    REPLY = 3
    EXCEPTION = 4
    SUBSCRIBE = 5
    UNSUBSCRIBE = 6
    NOTIFICATION_DATA = 7
    NOTIFICATION_EXC = 8
    SUBSCRIBE_EXCEPTION = 9
    ADMIN = 12


class UpdateType(enum.IntEnum):
    """Why a notification was sent."""

    NORMAL = 0
    FIRST = 1
    IMMEDIATE = 2
    # A recorded update delivered before the live ones of a subscription made with
    # ``backfill`` (docs/history.md, "History as a service"). The client makes these from a
    # history answer; an rda server never sends this value (older peers would refuse it).
    HISTORY = 3


class HeaderFlags(enum.IntFlag):
    """Per-message flags."""

    NONE = 0
    # The notification may be replaced by a newer one for the same subscription id when the
    # client's pipe is full (latest wins; each replacement is counted).
    CONFLATABLE = 1


_NAMES_MAX = 4096
_NAMES_KEY_MAX = 256
_REQUEST_TYPES = {int(t): t for t in RequestType}
_UPDATE_TYPES = {int(t): t for t in UpdateType}


@dataclass(frozen=True, slots=True)
class Header:
    """The routing part of a REQUEST or REPLY: everything needed to schedule the task."""

    request_type: RequestType
    id: int
    device: str = ""
    property: str = ""
    selector: str = ""
    update_type: UpdateType = UpdateType.NORMAL
    flags: HeaderFlags = HeaderFlags.NONE
    version: int = PROTOCOL_VERSION


# Encoded names by (device, property, selector): a sender encodes the same few names over and
# over (every reply, every request of an access point). Bounded like ``_NAMES`` below.
_ENCODED: dict[tuple[str, str, str], tuple[int, int, int, bytes]] = {}


def encoded_names(device: str, prop: str, selector: str) -> tuple[int, int, int, bytes]:
    """(byte length of device, of property, of selector, the three back to back in UTF-8):
    the header's names part, cached."""
    names = _ENCODED.get((device, prop, selector))
    return names if names is not None else _encode_names(device, prop, selector)


def encode_header(header: Header) -> bytes:
    """Pack a header into its frame."""
    key = (header.device, header.property, header.selector)
    names = _ENCODED.get(key)
    if names is None:
        names = _encode_names(*key)
    ld, lp, ls, raw = names
    return (
        HEADER_FIXED.pack(
            header.version,
            header.request_type,
            header.update_type,
            header.flags,
            header.id,
            ld,
            lp,
            ls,
        )
        + raw
    )


def _encode_names(device: str, prop: str, selector: str) -> tuple[int, int, int, bytes]:
    d, p, s = device.encode(), prop.encode(), selector.encode()
    if max(len(d), len(p), len(s)) > _MAX_NAME:
        raise ValueError("device, property and selector must each be at most 65535 UTF-8 bytes")
    names = (len(d), len(p), len(s), d + p + s)
    if len(_ENCODED) < _NAMES_MAX and len(names[3]) <= _NAMES_KEY_MAX:
        _ENCODED[(device, prop, selector)] = names
    return names


# Every message's header passes through decode_header on a dispatcher thread, so the parse is
# kept to one unpack, dictionary lookups and no Python-level constructor:
# - the names part (its three lengths and the UTF-8 bytes) maps to the decoded strings in a
#   bounded cache (entries and key size, so a peer sending ever new or huge names costs at most
#   about 1 MiB): a process talks to few (device, property, selector) triples;
# - flags and enum values come from dicts, not from the (slow) enum constructors;
# - the frozen Header is filled through its slot descriptors, skipping the dataclass
#   ``__init__`` and its ``object.__setattr__`` per field (frozen dataclasses pay for that).
_FLAGS = {int(f): f for f in (HeaderFlags.NONE, HeaderFlags.CONFLATABLE)}
_NAMES: dict[bytes, tuple[str, str, str]] = {}
_NAMES_AT = HEADER_FIXED.size - 6  # the three u16 lengths, then the names
_new = object.__new__
_SET = tuple(
    getattr(Header, name).__set__
    for name in (
        "request_type",
        "id",
        "device",
        "property",
        "selector",
        "update_type",
        "flags",
        "version",
    )
)


def decode_header(frame: bytes | memoryview) -> Header:
    """Parse a header frame; any malformed input raises ``DecodeError`` naming the problem."""
    size = len(frame)
    if size < HEADER_FIXED.size:
        raise DecodeError(
            f"header is {size} bytes, shorter than the {HEADER_FIXED.size}-byte fixed part", 0
        )
    version, rtype, utype, flags, ident, ld, lp, ls = HEADER_FIXED.unpack_from(frame)
    if version != PROTOCOL_VERSION:
        raise DecodeError(
            f"unsupported protocol version {version} (this side speaks {PROTOCOL_VERSION})", 0
        )
    request_type = _REQUEST_TYPES.get(rtype)
    if request_type is None:
        raise DecodeError(f"unknown request type {rtype}", 1)
    update_type = _UPDATE_TYPES.get(utype)
    if update_type is None:
        raise DecodeError(f"unknown update type {utype}", 2)
    end = HEADER_FIXED.size + ld + lp + ls
    if end != size:
        raise DecodeError(
            f"header declares {end - HEADER_FIXED.size} bytes of names but carries "
            f"{size - HEADER_FIXED.size}",
            HEADER_FIXED.size,
        )
    key = bytes(frame[_NAMES_AT:])
    names = _NAMES.get(key)
    if names is None:
        names = _decode_names(key[6:], ld, lp)
        if len(_NAMES) < _NAMES_MAX and len(key) <= _NAMES_KEY_MAX:
            _NAMES[key] = names
    header_flags = _FLAGS.get(flags)
    if header_flags is None:
        header_flags = HeaderFlags(flags)
    header: Header = _new(Header)
    set_type, set_id, set_device, set_property, set_selector, set_update, set_flags, set_v = _SET
    set_type(header, request_type)
    set_id(header, ident)
    set_device(header, names[0])
    set_property(header, names[1])
    set_selector(header, names[2])
    set_update(header, update_type)
    set_flags(header, header_flags)
    set_v(header, version)
    return header


def _decode_names(raw: bytes, ld: int, lp: int) -> tuple[str, str, str]:
    try:
        return raw[:ld].decode(), raw[ld : ld + lp].decode(), raw[ld + lp :].decode()
    except UnicodeDecodeError as exc:
        raise DecodeError(
            f"header names are not valid UTF-8: {exc.reason}", HEADER_FIXED.size + exc.start
        ) from exc


@dataclass(frozen=True, slots=True)
class DataContext:
    """When and for which cycle a value was acquired; stamps are ns since the epoch, UTC."""

    cycle_name: str = ""
    cycle_stamp: int = 0
    acq_stamp: int = 0
    selector: str = ""


def encode_context(context: DataContext, seq: int = 0, acq_stamp: int | None = None) -> bytes:
    """Pack the DATA_CONTEXT body frame: u64 seq, i64 acq_stamp, i64 cycle_stamp, u16 + cycle name.

    The selector is not repeated here: it travels in the header. ``seq`` is the
    per-subscription notification sequence number (0 for replies). ``acq_stamp``, when given,
    is sent instead of the context's (a value stamped as it is sent, without a new context).
    """
    name = context.cycle_name.encode()
    if len(name) > _MAX_NAME:
        raise ValueError("cycle name must be at most 65535 UTF-8 bytes")
    stamp = context.acq_stamp if acq_stamp is None else acq_stamp
    return CONTEXT_FIXED.pack(seq, stamp, context.cycle_stamp, len(name)) + name


def decode_context(frame: bytes | memoryview, selector: str = "") -> tuple[DataContext, int]:
    """Parse a DATA_CONTEXT frame into ``(context, seq)``."""
    return decode_context_at(frame, 0, len(frame), selector)


def decode_context_at(
    buffer: bytes | memoryview, start: int, end: int, selector: str
) -> tuple[DataContext, int]:
    """``decode_context(buffer[start:end], selector)`` without making that slice: a received
    message keeps its small bodies as spans of its first frame (``Message``). Offsets in its
    errors are the body's own."""
    size = end - start
    if size < _CONTEXT_SIZE:
        raise DecodeError(f"data context is {size} bytes, shorter than {_CONTEXT_SIZE}", 0)
    seq, acq_stamp, cycle_stamp, ln = _unpack_context(buffer, start)
    if _CONTEXT_SIZE + ln != size:
        raise DecodeError(
            f"data context declares a {ln}-byte cycle name but carries {size - _CONTEXT_SIZE}",
            _CONTEXT_SIZE - 2,
        )
    if ln:
        try:
            name = str(buffer[start + _CONTEXT_SIZE : end], "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError("cycle name is not valid UTF-8", _CONTEXT_SIZE + exc.start) from exc
    else:
        name = ""
    # Once per reply and notification read: filled through the slots, as decode_header does.
    context = _new(DataContext)
    _set_name(context, name)
    _set_cycle_stamp(context, cycle_stamp)
    _set_acq_stamp(context, acq_stamp)
    _set_selector(context, selector)
    return context, seq


# Read once per reply and notification: bound once.
_CONTEXT_SIZE = CONTEXT_FIXED.size
_unpack_context = CONTEXT_FIXED.unpack_from
_set_name, _set_cycle_stamp, _set_acq_stamp, _set_selector = (
    getattr(DataContext, field).__set__
    for field in ("cycle_name", "cycle_stamp", "acq_stamp", "selector")
)
