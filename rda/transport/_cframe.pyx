# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""The compiled fast path of ``protocol.decode_frames`` for REQUEST and REPLY messages.

Every get, set and notification is one packed frame (kind byte, fixed header, names, body
table, small bodies; docs/protocol.md) that a dispatcher thread parses before anything else
can happen: in pure Python that parse was a third of the client dispatcher's time per
notification (py-spy). Here it is C, and it builds the same objects: a ``Header`` (its slots
set directly, as ``header.decode_header`` does), a ``Message`` whose small bodies are
memoryview slices of the received frame and whose large bodies are the received frames.

It *accepts* only: anything this parser does not take as it is (a short frame, another
kind or version, an unknown request/update type, flags or body kind, a length that runs past
the frame, a missing or extra frame, a message above ``max_size``, names that are not UTF-8)
returns ``None``, and ``decode_frames`` parses the message again in Python, which raises the
precise ``RemoteDecodeError`` (or ``UnsupportedVersion``). So the errors have one source,
the same classes and messages whichever parser saw the message first, and bad bytes can
never do more here than send a message down the slow path: every length read from the input
is checked against the bytes left before it is used.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from rda.serialization.header import (
    _FLAGS,
    _NAMES,
    _NAMES_KEY_MAX,
    _NAMES_MAX,
    _REQUEST_TYPES,
    _UPDATE_TYPES,
    HEADER_FIXED,
    PROTOCOL_VERSION,
    Header,
    RequestType,
)
from rda.serialization.message import BodyKind, Message

cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    object PySequence_GetSlice(object o, Py_ssize_t i1, Py_ssize_t i2)

# The fixed header: u8 version, u8 request type, u8 update type, u8 flags, u64 id, then the
# u16 lengths of device, property and selector names (HEADER_FIXED, little-endian).
assert HEADER_FIXED.format == "<BBBBQHHH" and HEADER_FIXED.size == 18
DEF HEADER_END = 19  # kind byte + the 18-byte fixed header
DEF LENGTHS_AT = 13  # in the frame: kind byte + 12 bytes of the fixed header
DEF EXTERNAL = 0x80
DEF DATA_CONTEXT = 2  # BodyKind.DATA_CONTEXT

cdef int _VERSION = PROTOCOL_VERSION
cdef object _new = object.__new__
cdef object _Header = Header
cdef object _Message = Message
# Message is an extension type in its compiled build (serialization/message.pxd), which
# object.__new__ refuses to make and whose tp_new sets every slot to None; as Python (its .py
# running) it is a class with __slots__ that object.__new__ leaves unset, so the slots of its
# decoded-on-first-read values are set here to None ("not read yet").
cdef object _new_message = Message.__new__
cdef bint _message_is_python = bool(Message.__flags__ & (1 << 9))  # Py_TPFLAGS_HEAPTYPE
cdef tuple _A_UNREAD = ("_data", "_request_context", "_context_seq", "_alarm", "_exception")
cdef dict _names = _NAMES
cdef dict _flags = _FLAGS
cdef dict _request_types = _REQUEST_TYPES
cdef dict _update_types = _UPDATE_TYPES
cdef Py_ssize_t _names_max = _NAMES_MAX
cdef Py_ssize_t _names_key_max = _NAMES_KEY_MAX
cdef dict _body_kinds = {int(k): k for k in BodyKind}
cdef object _version_obj = PROTOCOL_VERSION
# Interned attribute names of Header's slots.
cdef object _A_TYPE = "request_type"
cdef object _A_ID = "id"
cdef object _A_DEVICE = "device"
cdef object _A_PROPERTY = "property"
cdef object _A_SELECTOR = "selector"
cdef object _A_UPDATE = "update_type"
cdef object _A_FLAGS = "flags"
cdef object _A_VERSION = "version"
cdef object _A_HEADER = "header"
cdef object _A_BODY = "_body"
cdef object _A_FRAME = "_frame"
cdef object _A_SPANS = "_spans"
cdef object _A_SEQ = "_seq"
# Shared notification headers by their bytes (see _header). Emptied when full rather than
# bounded by refusing: it must not keep a header per subscription of a client that has
# thousands (``benchmarks/memory.py``: ~230 bytes each), and the subscriptions updating now
# refill it at once.
cdef dict _headers = {}
cdef Py_ssize_t _HEADERS_MAX = 256
cdef frozenset _notifications = frozenset(
    {RequestType.NOTIFICATION_DATA, RequestType.NOTIFICATION_EXC, RequestType.SUBSCRIBE_EXCEPTION}
)


cdef inline uint16_t _u16(const uint8_t* p) noexcept nogil:
    return <uint16_t>(p[0] | (p[1] << 8))


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)  # x86-64 and aarch64 Linux: little-endian, as the wire
    return v


cdef inline uint64_t _u64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v


cdef Py_ssize_t _nbytes(object frame):
    """The byte length of a frame, or -1 when it has no simple byte buffer."""
    cdef Py_buffer buf
    try:
        PyObject_GetBuffer(frame, &buf, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        return -1
    cdef Py_ssize_t n = buf.len
    PyBuffer_Release(&buf)
    return n


cdef object _names_of(const uint8_t* p, Py_ssize_t ld, Py_ssize_t lp, Py_ssize_t ls):
    """(device, property, selector) of the names at ``p`` (the six length bytes first), from
    the cache ``_header`` shares, or decoded and cached; None when they are not UTF-8."""
    cdef Py_ssize_t key_len = 6 + ld + lp + ls
    key = PyBytes_FromStringAndSize(<const char*>p, key_len)
    names = _names.get(key)
    if names is not None:
        return names
    cdef const char* s = <const char*>(p + 6)
    try:
        names = (
            PyUnicode_DecodeUTF8(s, ld, NULL),
            PyUnicode_DecodeUTF8(s + ld, lp, NULL),
            PyUnicode_DecodeUTF8(s + ld + lp, ls, NULL),
        )
    except UnicodeDecodeError:
        return None
    if len(_names) < _names_max and key_len <= _names_key_max:
        _names[key] = names
    return names


def parse_message(list frames, int kind, Py_ssize_t max_size):
    """The ``Message`` of a well-formed REQUEST/REPLY whose first byte is ``kind``, or None
    (the caller then parses it in Python, which names what is wrong)."""
    cdef Py_ssize_t n_frames = len(frames)
    if n_frames == 0:
        return None
    first = frames[0]
    cdef Py_buffer buf
    try:
        view = first if type(first) is memoryview else memoryview(first)
        PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE)
    except (BufferError, TypeError):
        return None
    try:
        return _parse(frames, n_frames, view, <const uint8_t*>buf.buf, buf.len, kind, max_size)
    finally:
        PyBuffer_Release(&buf)


cdef object _parse(
    list frames,
    Py_ssize_t n_frames,
    object view,
    const uint8_t* p,
    Py_ssize_t size,
    int kind,
    Py_ssize_t max_size,
):
    cdef Py_ssize_t total = size
    cdef Py_ssize_t i, n, end, pos, table, length, frame_len, next_frame
    # Python objects: PyTuple_SET_ITEM steals a reference, so no temporaries converted from C.
    cdef object start, stop
    cdef uint8_t raw_kind
    if size < HEADER_END or p[0] != kind or p[1] != _VERSION:
        return None
    cdef Py_ssize_t ld = _u16(p + LENGTHS_AT)
    cdef Py_ssize_t lp = _u16(p + LENGTHS_AT + 2)
    cdef Py_ssize_t ls = _u16(p + LENGTHS_AT + 4)
    end = HEADER_END + ld + lp + ls
    if end >= size:
        return None
    request_type = _request_types.get(p[2])
    update_type = _update_types.get(p[3])
    header_flags = _flags.get(p[4])
    if request_type is None or update_type is None or header_flags is None:
        return None
    names = _names_of(p + LENGTHS_AT, ld, lp, ls)
    if names is None:
        return None

    # Body table: u8 count, count kind bytes, count u32 lengths. Small bodies become offsets
    # into the frame (Message makes the memoryview slices when ``body`` is first read); a
    # message with a large body, rare, gets its body built here.
    n = p[end]
    table = end + 1
    pos = table + 5 * n
    if pos > size:
        return None
    spans = PyTuple_New(3 * n)
    next_frame = 1
    # The u64 a notification's DATA_CONTEXT starts with (Message.peek_seq), when its first
    # DATA_CONTEXT body is a small one; otherwise Message works it out when asked.
    cdef bint seen_context = False, have_seq = False
    cdef uint64_t seq = 0
    external = False
    for i in range(n):
        raw_kind = p[table + i]
        body_kind = _body_kinds.get(raw_kind & ~EXTERNAL)
        if body_kind is None:
            return None
        length = _u32(p + table + n + 4 * i)
        if raw_kind & EXTERNAL:
            if next_frame >= n_frames:
                return None
            frame = frames[next_frame]
            next_frame += 1
            frame_len = _nbytes(frame)
            if frame_len != length:
                return None
            total += frame_len
            external = True
            if (raw_kind & ~EXTERNAL) == DATA_CONTEXT:
                seen_context = True  # a large context first: Message.peek_seq reads it
            start = next_frame - 1  # the frame's index, marked by stop = -1
            stop = -1
        else:
            if length > size - pos:
                return None
            start = pos
            stop = pos + length
            if (raw_kind & ~EXTERNAL) == DATA_CONTEXT and not seen_context:
                have_seq = True
                seq = _u64(p + pos) if length >= 8 else 0
                seen_context = True
            pos += length
        Py_INCREF(body_kind)
        PyTuple_SET_ITEM(spans, 3 * i, body_kind)
        Py_INCREF(start)
        PyTuple_SET_ITEM(spans, 3 * i + 1, start)
        Py_INCREF(stop)
        PyTuple_SET_ITEM(spans, 3 * i + 2, stop)
    if pos != size or next_frame != n_frames or total > max_size:
        return None

    message = _new_message(_Message)
    if _message_is_python:
        for name in _A_UNREAD:
            PyObject_GenericSetAttr(message, name, None)
    PyObject_GenericSetAttr(message, _A_SEQ, seq if have_seq else None)
    PyObject_GenericSetAttr(message, _A_HEADER, _header(p, end, request_type, update_type, header_flags, names))
    if external:
        PyObject_GenericSetAttr(message, _A_BODY, _eager_body(frames, view, spans))
        PyObject_GenericSetAttr(message, _A_FRAME, b"")
        PyObject_GenericSetAttr(message, _A_SPANS, ())
    else:
        PyObject_GenericSetAttr(message, _A_BODY, None)
        PyObject_GenericSetAttr(message, _A_FRAME, frames[0])
        PyObject_GenericSetAttr(message, _A_SPANS, spans)
    return message


cdef object _header(
    const uint8_t* p, Py_ssize_t end, object request_type, object update_type,
    object header_flags, object names,
):
    """The frame's ``Header``. A notification's header bytes are the same for every update of
    its subscription (the id is the subscription's), so those headers are cached by their
    bytes and shared (``Header`` is frozen): no new object per update."""
    key = None
    if request_type in _notifications:
        key = PyBytes_FromStringAndSize(<const char*>p, end)
        header = _headers.get(key)
        if header is not None:
            return header
    header = _new(_Header)
    PyObject_GenericSetAttr(header, _A_TYPE, request_type)
    PyObject_GenericSetAttr(header, _A_ID, _u64(p + 5))
    PyObject_GenericSetAttr(header, _A_DEVICE, names[0])
    PyObject_GenericSetAttr(header, _A_PROPERTY, names[1])
    PyObject_GenericSetAttr(header, _A_SELECTOR, names[2])
    PyObject_GenericSetAttr(header, _A_UPDATE, update_type)
    PyObject_GenericSetAttr(header, _A_FLAGS, header_flags)
    PyObject_GenericSetAttr(header, _A_VERSION, _version_obj)
    if key is not None:
        if len(_headers) >= _HEADERS_MAX:
            _headers.clear()
        _headers[key] = header
    return header


cdef tuple _eager_body(list frames, object view, tuple spans):
    """``Message.body`` of a message with a large (external) body: small bodies as slices of
    the first frame, large ones as their received frames."""
    cdef Py_ssize_t i, n = len(spans) // 3
    body = PyTuple_New(n)
    for i in range(n):
        stop = spans[3 * i + 2]
        if stop == -1:
            entry = (spans[3 * i], frames[spans[3 * i + 1]])
        else:
            entry = (spans[3 * i], PySequence_GetSlice(view, spans[3 * i + 1], stop))
        Py_INCREF(entry)
        PyTuple_SET_ITEM(body, i, entry)
    return body
