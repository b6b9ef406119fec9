"""A received message: the header parsed at once, the body decoded on first access.

Its bytes came from the peer, so a body that does not decode is the peer's fault: the
accessors raise ``RemoteDecodeError`` (the codec's ``DecodeError`` made remote).

The dispatcher thread only ever builds a :class:`Message` (header parse + keeping the body
frames as ``memoryview``); the worker that runs the task touches ``.data``, which is when the
binary codec runs. A task dropped on overflow never decodes its body (RDA3 paper, "Header and
body").
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rda.serialization import binary
from rda.serialization.errors import DecodeError, as_remote
from rda.serialization.header import DataContext, Header, decode_context, decode_context_at

if TYPE_CHECKING:
    from rda.serialization.data import Data

__all__ = [
    "BodyKind",
    "Message",
    "decode_alarm",
    "decode_exception",
    "encode_alarm",
    "encode_data_body",
    "encode_exception",
]

Buffer = bytes | memoryview

_EXC_FIXED = struct.Struct("<H")
_SEQ = struct.Struct("<Q")  # the first field of a DATA_CONTEXT body (header.CONTEXT_FIXED)


class BodyKind(enum.IntEnum):
    """What a body frame holds; one byte per body frame in the descriptor frame."""

    DATA = 1
    DATA_CONTEXT = 2
    REQUEST_CONTEXT = 3
    EXCEPTION = 4
    # The elements of one big read-only array of the DATA body, in the order the body refers
    # to them (``binary.encode(data, arrays)``): sent as a frame of its own, never copied.
    ARRAY = 5
    # Kind 3 in a REPLY or notification (the server's side): a Data of optional keys about
    # the value, today its alarm (``alarm_severity``, ``alarm_message``, ``alarm_field``;
    # docs/protocol.md, "Alarms"). Sent only when there is something to say; decoders from
    # before it know kind 3 and never read it in a reply, so they skip it.
    REPLY_CONTEXT = 3


# Read once for the encoders: each ``BodyKind.X`` read goes through the enum class's
# ``__getattr__`` hook on Python 3.11 (ten times a module global's cost).
_DATA, _ARRAY = BodyKind.DATA, BodyKind.ARRAY


def encode_data_body(data: Data) -> list[tuple[BodyKind, Buffer]]:
    """A value's bodies: DATA, then an ARRAY per big read-only array it refers to, each sent
    as a frame of its own instead of copied into DATA (``binary.encode(data, arrays)``)."""
    arrays: list[Buffer] = []
    body = binary.encode(data, arrays)
    if not arrays:
        return [(_DATA, body)]
    return [(_DATA, body), *[(_ARRAY, array) for array in arrays]]


def encode_exception(type_name: str, message: str) -> bytes:
    """EXCEPTION body frame: u16 length of the type name, the type name, then the message (UTF-8)."""
    name = type_name.encode()[:0xFFFF]
    return _EXC_FIXED.pack(len(name)) + name + message.encode()


def decode_exception(frame: Buffer) -> tuple[str, str]:
    """Parse an EXCEPTION body frame into ``(type_name, message)``."""
    if len(frame) < _EXC_FIXED.size:
        raise DecodeError("exception frame shorter than its 2-byte type length", 0)
    (ln,) = _EXC_FIXED.unpack_from(frame)
    if _EXC_FIXED.size + ln > len(frame):
        raise DecodeError(f"exception type length {ln} runs past the {len(frame)}-byte frame", 0)
    raw = bytes(frame)
    try:
        return raw[2 : 2 + ln].decode(), raw[2 + ln :].decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("exception frame is not valid UTF-8", exc.start) from exc


def encode_alarm(severity: int, message: str, field: str) -> bytes:
    """The REPLY_CONTEXT body of a value in alarm: a Data with ``alarm_severity`` (int32,
    1 MINOR .. 3 INVALID), ``alarm_message`` and ``alarm_field`` (docs/protocol.md, "Alarms").
    Built from its parts (``Data.from_parts``, a fifth of appending them one by one): the
    strings come from the server's own declarations and value names, valid Data strings."""
    from rda.serialization.data import Data

    values = {"alarm_severity": severity, "alarm_message": message, "alarm_field": field}
    return binary.encode(Data.from_parts(values, _ALARM_TYPES))


def decode_alarm(frame: Buffer) -> tuple[int, str, str]:
    """``(severity, message, field)`` of a REPLY_CONTEXT body; ``(0, "", "")`` when it carries
    no alarm. Raises ``DecodeError`` for a body that is no Data or an alarm of the wrong types."""
    context = binary.decode(frame)
    if "alarm_severity" not in context:
        return 0, "", ""
    severity = context["alarm_severity"]
    message = context.get("alarm_message", "")
    field = context.get("alarm_field", "")
    if type(severity) is not int or not isinstance(message, str) or not isinstance(field, str):
        raise DecodeError("alarm: alarm_severity must be an int, message and field strings", 0)
    return severity, message, field


def _alarm_types() -> dict[str, Any]:
    from rda.serialization.data import DataType

    return {
        "alarm_severity": DataType.INT32,
        "alarm_message": DataType.STRING,
        "alarm_field": DataType.STRING,
    }


# Shared by every alarm body: the Data built around it is encoded and dropped at once.
_ALARM_TYPES = _alarm_types()


class Message:
    """Header plus lazily decoded body frames.

    ``body`` pairs each body frame with its :class:`BodyKind`. Accessors return ``None`` when
    the message carries no frame of that kind; decoding errors surface as
    ``RemoteDecodeError`` on first access, in the thread that asks.

    A message the compiled frame parser built keeps its small bodies as offsets into the
    received frame (``_frame``, ``_spans``) until ``body`` is first read: the memoryview slices
    (and the pair tuples around them) are made then. A notification waits in its
    subscription's queue with no objects of its own for the garbage collector to walk but this
    one (timed with ``gc.callbacks``, the collector's passes over queued messages' views and
    tuples were measured close to half of a client's time per notification: docs/performance.md,
    "Body views made on first read").
    """

    # ``_alarm``, ``_context_seq``, ``_data``, ``_exception``, ``_request_context``: each
    # accessor's decoded value, None until its first read (an accessor whose answer is None,
    # no such body, finds that again at the cost of one search). Values decoded from
    # immutable frames: two threads racing on a first read both decode, one result stays.
    # Plain slots, not a caching descriptor writing an instance ``__dict__``: the compiled
    # build (message.pxd) makes Message an extension type whose accessors read C slots.
    __slots__ = (
        "_alarm",
        "_body",
        "_context_seq",
        "_data",
        "_exception",
        "_frame",
        "_request_context",
        "_seq",
        "_spans",
        "header",
    )

    def __init__(self, header: Header, body: Sequence[tuple[BodyKind, Buffer]] = ()) -> None:
        self.header = header
        self._body: tuple[tuple[BodyKind, Buffer], ...] | None = tuple(body)
        self._frame: Buffer = b""
        # Flat (kind, start, end, kind, start, end, ...) into ``_frame`` while _body is None.
        self._spans: tuple[Any, ...] = ()
        self._seq: int | None = None  # peek_seq, once known (the compiled parser sets it)
        self._data: Data | None = None
        self._request_context: Data | None = None
        self._context_seq: tuple[DataContext, int] | None = None
        self._alarm: tuple[int, str, str] | None = None
        self._exception: tuple[str, str] | None = None

    def __repr__(self) -> str:
        kinds = ",".join(k.name for k, _ in self.body)
        return f"Message({self.header!r}, body=[{kinds}])"

    @property
    def body(self) -> tuple[tuple[BodyKind, Buffer], ...]:
        body = self._body
        if body is None:
            view = memoryview(self._frame)
            spans = self._spans
            body = tuple(
                (spans[i], view[spans[i + 1] : spans[i + 2]]) for i in range(0, len(spans), 3)
            )
            self._body = body
        return body

    def frame(self, kind: BodyKind) -> Buffer | None:
        """The first body frame of ``kind``, undecoded."""
        if self._body is None:
            # Without building ``body``: one slice, gone again when the caller is done with it.
            # Only the compiled frame parser leaves ``_body`` None, so this runs compiled but
            # for a Message edited after its build: one pass over the kinds, compared by
            # identity as below (the parser puts BodyKind members there), instead of
            # ``in`` and ``index`` (two passes and a method call).
            spans = self._spans
            for i in range(0, len(spans), 3):
                if spans[i] is kind:
                    return memoryview(self._frame)[spans[i + 1] : spans[i + 2]]
            return None
        for k, frame in self._body:
            if k is kind:
                return frame
        return None

    def peek_seq(self) -> int:
        """The sequence number a notification's DATA_CONTEXT body starts with, without decoding
        the context (the client dispatcher's gap check, once per notification); 0 when there
        is no such body or it is shorter than 8 bytes."""
        seq = self._seq
        if seq is None:
            frame = self.frame(_DATA_CONTEXT)
            seq = 0 if frame is None or len(frame) < _SEQ.size else _SEQ.unpack_from(frame)[0]
            self._seq = seq
        return seq

    @property
    def data(self) -> Data | None:
        data = self._data
        if data is None:
            frame = self.frame(_DATA)
            if frame is None:
                return None
            # A try costs nothing until something is raised (Python 3.11's zero-cost
            # exceptions).
            try:
                arrays = self.arrays()  # usually none: no out-of-band arrays
                data = binary.decode(frame, None, arrays) if arrays else binary.decode(frame)
            except DecodeError as exc:
                raise as_remote(exc) from None
            self._data = data
        return data

    def arrays(self) -> list[Buffer]:
        """The ARRAY bodies, in order: the out-of-band arrays of the DATA body."""
        if self._body is None:
            # One pass over the kinds by identity, as in frame(): ``_ARRAY in spans`` compared
            # the kind with every offset too, a rich comparison each.
            spans = self._spans
            found: list[Buffer] = []
            for i in range(0, len(spans), 3):
                if spans[i] is _ARRAY:
                    found.append(memoryview(self._frame)[spans[i + 1] : spans[i + 2]])
            return found
        return [frame for kind, frame in self._body if kind is _ARRAY]

    @property
    def request_context(self) -> Data | None:
        """The REQUEST_CONTEXT frame: a Data with optional ``filters`` (Data) and
        ``timeout_ms`` (int64, the client's deadline for this request)."""
        context = self._request_context
        if context is None:
            frame = self.frame(_REQUEST_CONTEXT)
            if frame is None:
                return None
            try:
                context = binary.decode(frame)
            except DecodeError as exc:
                raise as_remote(exc) from None
            self._request_context = context
        return context

    @property
    def filters(self) -> Data | None:
        ctx = self.request_context
        if ctx is None or "filters" not in ctx:
            return None
        filters: Data = ctx["filters"]
        return filters

    @property
    def timeout(self) -> float | None:
        """The client's timeout for this request in seconds, if it sent one."""
        ctx = self.request_context
        if ctx is None or "timeout_ms" not in ctx:
            return None
        return int(ctx["timeout_ms"]) / 1000.0

    def _context_and_seq(self) -> tuple[DataContext, int]:
        context_seq = self._context_seq
        if context_seq is None:
            selector = self.header.selector
            try:
                if self._body is None:
                    # Read in place from the received frame (its span, as frame() finds it):
                    # no view of the body made for it.
                    spans = self._spans
                    for i in range(0, len(spans), 3):
                        if spans[i] is _DATA_CONTEXT:
                            context_seq = decode_context_at(
                                self._frame, spans[i + 1], spans[i + 2], selector
                            )
                            break
                else:
                    frame = self.frame(_DATA_CONTEXT)
                    if frame is not None:
                        context_seq = decode_context(frame, selector)
            except DecodeError as exc:
                raise as_remote(exc) from None
            if context_seq is None:
                context_seq = DataContext(selector=selector), 0
            self._context_seq = context_seq
        return context_seq

    @property
    def context(self) -> DataContext:
        return self._context_and_seq()[0]

    @property
    def seq(self) -> int:
        """Per-subscription sequence number of a notification (0 when absent)."""
        return self._context_and_seq()[1]

    @property
    def alarm(self) -> tuple[int, str, str]:
        """``(severity, message, field)`` from the REPLY_CONTEXT body (``decode_alarm``);
        ``(0, "", "")`` when the server sent none (a value in no alarm, or an older server)."""
        alarm = self._alarm
        if alarm is None:
            frame = self.frame(_REPLY_CONTEXT)
            try:
                alarm = _NO_ALARM if frame is None else decode_alarm(frame)
            except DecodeError as exc:
                raise as_remote(exc) from None
            self._alarm = alarm
        return alarm

    @property
    def exception(self) -> tuple[str, str] | None:
        exception = self._exception
        if exception is None:
            frame = self.frame(_EXCEPTION)
            if frame is None:
                return None
            try:
                exception = decode_exception(frame)
            except DecodeError as exc:
                raise as_remote(exc) from None
            self._exception = exception
        return exception


# The other kinds Message's accessors look for, read once as _DATA and _ARRAY above.
_DATA_CONTEXT = BodyKind.DATA_CONTEXT
_REQUEST_CONTEXT = BodyKind.REQUEST_CONTEXT
_REPLY_CONTEXT = BodyKind.REPLY_CONTEXT
_EXCEPTION = BodyKind.EXCEPTION
_NO_ALARM = (0, "", "")
