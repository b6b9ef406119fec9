"""The binary codec: the wire format of a DATA body frame (docs/serialization.md, "Binary").

Layout, little-endian::

    data  := u32 count, entry * count
    entry := u8 tag, u8 ndim, u16 name_len, u32 size, name (UTF-8), body (size bytes)

``tag`` is the element type (``DataType & 0x0F``), ``ndim`` 0 for a scalar and 1..32 for an
array; ``size`` is the body's byte length, so one ``unpack_from`` gives everything needed to
bound-check and slice an entry. Numeric array bodies are the raw C-order elements (prefixed by
the dims when ndim > 1) and are decoded zero-copy with ``numpy.frombuffer`` over the received
buffer; a string array is its elements, each followed by NUL, decoded with one ``split``.

Out of band: ``encode(data, arrays)`` with a list leaves the element bytes of every big
read-only numeric array (``OUT_OF_BAND_MIN`` bytes or more, C-contiguous, not bool) out of the
body and appends a byte view of the array to ``arrays``; the entry's tag gets bit 7
(``OUT_OF_BAND``) and its body holds the dims (ndim > 1) and the u32 index of that array.
The protocol sends each as its own frame (BodyKind.ARRAY), so a big waveform is never copied
into the body; ``decode(body, limits, arrays)`` views them in place. Only read-only arrays
go that way: libzmq sends a frame after ``send`` returns, and an array the owner may still
write to must be copied at encode time, as it always was.

Speed matters here (the RDA3 paper's 4.22 us per encode+decode cycle), so the hot loops are
written flat: precompiled structs, locals for globals, no per-entry function calls for the
common types. Every declared length is checked against the bytes remaining *before* anything
is sliced or allocated, so hostile input costs at most what it weighs.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from rda.serialization._data import NUMERIC_DTYPES, Data, DataType
from rda.serialization.errors import DecodeError

__all__ = [
    "OUT_OF_BAND",
    "OUT_OF_BAND_MIN",
    "Codec",
    "DecodeLimits",
    "decode",
    "encode",
    "implementation",
]


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds on what one ``decode`` may build.

    ``max_depth``: levels of Data (the top level is 1; a Data inside a Data or a Data array
    is one more). ``max_elements``: entries plus array elements over the whole message; the
    default admits a 1 GiB float64 array.
    """

    max_depth: int = 64
    max_elements: int = 1 << 27

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.max_elements < 0:
            raise ValueError("max_depth must be >= 1 and max_elements >= 0")


DEFAULT_LIMITS = DecodeLimits()
_MAX_NDIM = 32

_HDR = struct.Struct("<BBHI")
# The same 8 bytes read with tag and ndim as one u16 (tag | ndim << 8): one dict lookup then
# identifies the common entry kinds.
_HDR_CODE = struct.Struct("<HHI")
_U32 = struct.Struct("<I")
_pack_hdr = _HDR.pack
_unpack_hdr = _HDR_CODE.unpack_from
_pack_u32 = _U32.pack
_unpack_u32 = _U32.unpack_from
_DIMS = [struct.Struct(f"<{k}I") for k in range(_MAX_NDIM + 1)]

T = DataType
_BOOL, _STRING, _DATA = int(T.BOOL), int(T.STRING), int(T.DATA)
# Scalar codecs by tag: (struct, byte size). BOOL is read as u8 so 2..255 can be rejected.
_SCALAR_STRUCTS: dict[int, struct.Struct] = {
    int(T.BOOL): struct.Struct("<B"),
    int(T.INT8): struct.Struct("<b"),
    int(T.INT16): struct.Struct("<h"),
    int(T.INT32): struct.Struct("<i"),
    int(T.INT64): struct.Struct("<q"),
    int(T.FLOAT32): struct.Struct("<f"),
    int(T.FLOAT64): struct.Struct("<d"),
}
_ENCODE_SCALAR = {T(tag): s.pack for tag, s in _SCALAR_STRUCTS.items()}
# Indexed by tag; slot 0 is never read (tag 0 is rejected first).
_SCALAR_TYPES: list[DataType] = [T.BOOL] + [T(k) for k in range(1, 10)]
_ARRAY_TYPES: list[DataType] = [T.BOOL_ARRAY] + [T(k | 0x10) for k in range(1, 10)]
# Array element dtype and item size by tag (None for STRING and DATA).
_ARRAY_DTYPES: list[tuple[np.dtype[Any], int] | None] = [None] * 10
for _t, _dt in NUMERIC_DTYPES.items():
    _ARRAY_DTYPES[int(_t)] = (_dt, _dt.itemsize)
_NUMERIC_ARRAYS = frozenset(t.array for t in NUMERIC_DTYPES)
_T_STRING_ARRAY = T.STRING_ARRAY
# Inline decode paths by header code: 1-D numeric arrays and numeric scalars, bool excluded
# (its bytes must be checked to be 0 or 1, see _read_other).
_FAST_ARRAYS: dict[int, tuple[DataType, np.dtype[Any], int]] = {
    int(t) | 0x100: (t.array, dt, dt.itemsize) for t, dt in NUMERIC_DTYPES.items() if t != T.BOOL
}
_FAST_SCALARS: dict[int, tuple[DataType, struct.Struct]] = {
    tag: (T(tag), st) for tag, st in _SCALAR_STRUCTS.items() if tag != int(T.BOOL)
}
_object_new = object.__new__


_BIG = 1 << 16  # above this, hand numpy's buffer to join instead of a tobytes() copy
# Tag bit of an entry whose elements travel out of band, and the smallest array that does (the
# protocol's LARGE_BODY: from there a frame of its own is cheaper than a copy).
OUT_OF_BAND = 0x80
OUT_OF_BAND_MIN = 1 << 16
_BOOL_ARRAY = T.BOOL_ARRAY


def _goes_out_of_band(t: DataType, v: Any) -> bool:
    """Big, read-only, C-contiguous, numeric and not bool: sent as its own frame."""
    return (
        v.nbytes >= OUT_OF_BAND_MIN
        and t is not _BOOL_ARRAY
        and not v.flags.writeable
        and v.flags.c_contiguous
    )


# ---------------------------------------------------------------------------------- encode


def encode_python(data: Data, arrays: list[Any] | None = None) -> bytes:
    """Encode ``data`` into its binary form (the DATA body frame); with ``arrays``, big
    read-only arrays are appended there instead of copied in (see the module docstring)."""
    if not isinstance(data, Data):
        raise TypeError(f"encode needs a Data, not {type(data).__name__}")
    parts: list[Any] = []
    try:
        _encode_into(data, parts, 1, arrays)
    except struct.error as exc:  # a length past u32 or a name past u16 (names are checked)
        raise ValueError(f"Data too large for the binary format: {exc}") from None
    return b"".join(parts)


def _encode_into(data: Data, parts: list[Any], depth: int, arrays: list[Any] | None = None) -> None:
    if depth > DEFAULT_LIMITS.max_depth:
        raise ValueError(f"Data nested deeper than {DEFAULT_LIMITS.max_depth} levels")
    append = parts.append
    types = data._types
    pack_hdr = _pack_hdr
    append(_pack_u32(len(types)))
    for name, v in data._values.items():
        t = types[name]
        nb = name.encode()
        if t in _NUMERIC_ARRAYS:
            if arrays is not None and _goes_out_of_band(t, v):
                ref = _pack_u32(len(arrays))
                arrays.append(memoryview(v).cast("B"))
                ndim = v.ndim
                tag = (t & 0x0F) | OUT_OF_BAND
                if ndim == 1:
                    append(pack_hdr(tag, 1, len(nb), 4))
                    append(nb)
                else:
                    dims = _DIMS[ndim].pack(*v.shape)
                    append(pack_hdr(tag, ndim, len(nb), len(dims) + 4))
                    append(nb)
                    append(dims)
                append(ref)
                continue
            size = v.nbytes
            # Small arrays: tobytes() is the cheapest call. Big contiguous ones: hand the array
            # itself to join (buffer protocol), saving a full copy.
            raw = v if size > _BIG and v.flags.c_contiguous else v.tobytes()
            ndim = v.ndim
            if ndim == 1:
                append(pack_hdr(t & 0x0F, 1, len(nb), size))
                append(nb)
            else:
                dims = _DIMS[ndim].pack(*v.shape)
                append(pack_hdr(t & 0x0F, ndim, len(nb), len(dims) + size))
                append(nb)
                append(dims)
            append(raw)
        elif t is _T_STRING_ARRAY:
            if type(v) is list:
                if v:
                    blob = "\x00".join(v).encode()
                    append(pack_hdr(_STRING, 1, len(nb), len(blob) + 1))
                    append(nb)
                    append(blob)
                    append(b"\x00")  # every element is NUL-terminated
                else:
                    append(pack_hdr(_STRING, 1, len(nb), 0))
                    append(nb)
            else:
                dims = _DIMS[v.ndim].pack(*v.shape)
                items = v.ravel().tolist()
                blob = "\x00".join(items).encode() + b"\x00" if items else b""
                append(pack_hdr(_STRING, v.ndim, len(nb), len(dims) + len(blob)))
                append(nb)
                append(dims)
                append(blob)
        elif t is T.STRING:
            b = v.encode()
            append(pack_hdr(_STRING, 0, len(nb), len(b)))
            append(nb)
            append(b)
        elif t is T.DATA:
            sub: list[Any] = []
            _encode_into(v, sub, depth + 1, arrays)
            body = b"".join(sub)
            append(pack_hdr(_DATA, 0, len(nb), len(body)))
            append(nb)
            append(body)
        elif t is T.DATA_ARRAY:
            sub = [_pack_u32(len(v))]
            for item in v:
                _encode_into(item, sub, depth + 1, arrays)
            body = b"".join(sub)
            append(pack_hdr(_DATA, 1, len(nb), len(body)))
            append(nb)
            append(body)
        else:
            raw = _ENCODE_SCALAR[t](v)
            append(pack_hdr(t, 0, len(nb), len(raw)))
            append(nb)
            append(raw)


# ---------------------------------------------------------------------------------- decode


class _OutOfBand:
    """The out-of-band arrays of one decode and how many entries have claimed one."""

    __slots__ = ("buffers", "used")

    def __init__(self, buffers: list[memoryview]) -> None:
        self.buffers = buffers
        self.used = 0


def _byte_view(buffer: Any) -> memoryview:
    """A read-only view of ``buffer``'s bytes (TypeError for what has no buffer)."""
    try:
        view = memoryview(buffer)
        return view.toreadonly() if view.format == "B" else view.cast("B").toreadonly()
    except TypeError as exc:
        raise TypeError(f"decode needs a bytes-like object: {exc}") from None


def decode_python(
    buffer: bytes | bytearray | memoryview,
    limits: DecodeLimits | None = None,
    arrays: Sequence[Any] = (),
) -> Data:
    """Decode a binary body into a Data.

    Numeric arrays are read-only views over ``buffer`` (zero-copy): they keep it alive, and
    ``arr.copy()`` gives a writable array. Any malformed input raises ``DecodeError`` naming
    the problem and its offset.
    """
    if type(buffer) is not bytes:
        # A read-only byte view, so decoded arrays can never be written through (and a
        # bytearray mutated later cannot be mistaken for a decoded value).
        buffer = _byte_view(buffer)
    ext = _OutOfBand([_byte_view(a) for a in arrays]) if arrays else None
    lim = DEFAULT_LIMITS if limits is None else limits
    end = len(buffer)
    try:
        data, pos, _ = _read_data(buffer, 0, end, 1, lim.max_elements, lim, ext)
    except RecursionError:  # only reachable when max_depth is set beyond the Python stack
        raise DecodeError("Data nested too deeply for the Python stack", 0) from None
    if pos != end:
        raise DecodeError(f"{end - pos} trailing bytes after the Data", pos)
    if ext is not None and ext.used != len(ext.buffers):
        raise DecodeError(
            f"{len(ext.buffers)} out-of-band arrays came with the Data, it refers to {ext.used}",
            end,
        )
    return data


def _read_data(
    buf: Any,
    pos: int,
    end: int,
    depth: int,
    budget: int,
    lim: DecodeLimits,
    ext: _OutOfBand | None = None,
) -> tuple[Data, int, int]:
    """Read one ``data`` from ``buf[pos:end]``: (Data, position after it, elements left)."""
    if depth > lim.max_depth:
        raise DecodeError(f"Data nested deeper than max_depth={lim.max_depth}", pos)
    if pos + 4 > end:
        raise DecodeError(f"truncated: a Data needs a 4-byte entry count, {end - pos} left", pos)
    (count,) = _unpack_u32(buf, pos)
    pos += 4
    if count * 9 > end - pos:  # every entry takes at least 9 bytes (8 + a 1-byte name)
        raise DecodeError(
            f"Data declares {count} entries but only {end - pos} bytes remain", pos - 4
        )
    budget -= count
    if budget < 0:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements", pos - 4)
    values: dict[str, Any] = {}
    types: dict[str, DataType] = {}
    is_bytes = type(buf) is bytes
    fast_arrays = _FAST_ARRAYS
    frombuffer = np.frombuffer
    unpack_hdr = _unpack_hdr
    start = pos
    for _ in range(count):
        # The common kinds are decoded inline (a function call costs as much as the work);
        # the rest (bool, N-D, Data, scalars but float64/int64, errors) in _read_other. The
        # u16 ``code`` is tag | ndim << 8.
        start = pos
        try:
            code, nlen, size = unpack_hdr(buf, pos)
        except struct.error:  # past the buffer; a header past ``end`` only fails the next test
            raise DecodeError(
                f"truncated: an entry header needs 8 bytes, {end - pos} left", pos
            ) from None
        bpos = pos + 8 + nlen
        pos = bpos + size
        if pos > end or not nlen:
            raise DecodeError(
                f"entry declares a {nlen}-byte name and a {size}-byte body, "
                f"{end - start - 8} bytes remain"
                if nlen
                else "empty field name",
                start,
            )
        try:
            name = (
                buf[start + 8 : bpos].decode() if is_bytes else str(buf[start + 8 : bpos], "utf-8")
            )
        except UnicodeDecodeError as exc:
            raise DecodeError("field name is not valid UTF-8", start + 8 + exc.start) from None
        if "\x00" in name:
            raise DecodeError(f"field name {name!r} contains NUL", start + 8)
        try:
            spec = fast_arrays.get(code)
            if spec is not None:
                t, dtype, itemsize = spec
                if size % itemsize:
                    raise DecodeError(
                        f"field {name!r}: {size} bytes is not a whole number of "
                        f"{itemsize}-byte elements",
                        start + 4,
                    )
                n = size // itemsize
                budget -= n
                values[name] = frombuffer(buf, dtype, n, bpos)
            elif code == 0x108:  # 1-D string array: NUL-terminated elements, one split
                t = _T_STRING_ARRAY
                if size:
                    if buf[pos - 1] or size > budget:
                        _check_strings(buf, bpos, pos, name, budget, lim)
                    items = (
                        buf[bpos : pos - 1].decode()
                        if is_bytes
                        else str(buf[bpos : pos - 1], "utf-8")
                    ).split("\x00")
                    budget -= len(items)
                    values[name] = items
                else:
                    values[name] = []
            else:
                t, values[name], budget = _read_other(
                    buf, start, code, bpos, pos, depth, name, budget, lim, ext
                )
        except UnicodeDecodeError as exc:  # only the inline string-array path gets here
            raise DecodeError(f"field {name!r}: invalid UTF-8", bpos + exc.start) from None
        types[name] = t
    if budget < 0:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements", start)
    if len(values) != count:
        raise DecodeError("duplicate field names in one Data", start)
    data: Data = _object_new(Data)
    data._values = values
    data._types = types
    return data, pos, budget


def _check_strings(buf: Any, pos: int, end: int, name: str, budget: int, lim: DecodeLimits) -> None:
    """Raise for a string-array body that is not NUL-terminated or holds too many elements."""
    if buf[end - 1] != 0:
        raise DecodeError(f"field {name!r}: string array does not end with NUL", end - 1)
    if bytes(buf[pos:end]).count(b"\0") > budget:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements", pos)


def _read_other(
    buf: Any,
    start: int,
    code: int,
    bpos: int,
    pos: int,
    depth: int,
    name: str,
    budget: int,
    lim: DecodeLimits,
    ext: _OutOfBand | None = None,
) -> tuple[DataType, Any, int]:
    """Decode an entry of a type without an inline fast path: (type, value, elements left)."""
    tag, ndim = code & 0xFF, code >> 8
    size = pos - bpos
    scalar = _FAST_SCALARS.get(code)
    if scalar is not None:
        t, st = scalar
        if size != st.size:
            raise DecodeError(
                f"field {name!r}: a {t.label} body is {st.size} bytes, not {size}", start
            )
        return t, st.unpack_from(buf, bpos)[0], budget
    if tag & OUT_OF_BAND:
        return _read_out_of_band(buf, start, tag, ndim, bpos, pos, name, budget, lim, ext)
    if not 0 < tag < 10:
        raise DecodeError(f"field {name!r}: unknown type tag {tag}", start)
    value: Any
    if ndim == 0:
        t = _SCALAR_TYPES[tag]
        if tag == _BOOL:
            if size != 1 or buf[bpos] > 1:
                raise DecodeError(f"field {name!r}: a bool body is one byte, 0 or 1", bpos)
            return t, buf[bpos] == 1, budget
        if tag == _STRING:
            try:
                value = str(buf[bpos:pos], "utf-8")
            except UnicodeDecodeError as exc:
                raise DecodeError(f"field {name!r}: invalid UTF-8", bpos + exc.start) from None
            if "\x00" in value:
                raise DecodeError(f"field {name!r}: string contains NUL", bpos)
            return t, value, budget
        value, sub_end, budget = _read_data(buf, bpos, pos, depth + 1, budget, lim, ext)
        if sub_end != pos:
            raise DecodeError(f"field {name!r}: {pos - sub_end} stray bytes in Data", sub_end)
        return t, value, budget
    t = _ARRAY_TYPES[tag]
    if ndim > _MAX_NDIM:
        raise DecodeError(f"field {name!r}: ndim {ndim} exceeds {_MAX_NDIM}", start + 1)
    numeric = _ARRAY_DTYPES[tag]
    if numeric is not None:
        dtype, itemsize = numeric
        if ndim == 1:
            n, epos = size // itemsize, bpos
            dims: tuple[int, ...] = (n,)
        else:
            n, dims, epos = _read_dims(buf, bpos, pos, ndim, name, lim.max_elements)
        if n * itemsize != pos - epos:
            raise DecodeError(
                f"field {name!r}: dims {dims} need {n * itemsize} bytes, body has {pos - epos}",
                bpos,
            )
        budget -= n
        if budget < 0:
            raise DecodeError(f"more than max_elements={lim.max_elements} elements", start)
        if tag == _BOOL and n and bytes(buf[epos:pos]).translate(None, b"\0\1"):
            raise DecodeError(f"field {name!r}: bool array holds bytes other than 0/1", epos)
        value = np.frombuffer(buf, dtype, n, epos)
        return t, value if ndim == 1 else _reshape(value, dims, name, bpos), budget
    if tag == _STRING:
        value, budget = _read_strings(buf, bpos, pos, ndim, name, budget, lim)
        return t, value, budget
    if ndim != 1:
        raise DecodeError(f"field {name!r}: Data arrays are 1-D, not {ndim}-D", start)
    value, budget = _read_data_array(buf, bpos, pos, depth, name, budget, lim, ext)
    return t, value, budget


def _read_out_of_band(
    buf: Any,
    start: int,
    tag: int,
    ndim: int,
    bpos: int,
    pos: int,
    name: str,
    budget: int,
    lim: DecodeLimits,
    ext: _OutOfBand | None,
) -> tuple[DataType, Any, int]:
    """An entry whose elements are the next out-of-band array: its body is the dims (ndim > 1)
    and the u32 index of that array."""
    tag &= ~OUT_OF_BAND
    numeric = _ARRAY_DTYPES[tag] if 2 <= tag <= 7 else None
    if numeric is None or ndim == 0:
        raise DecodeError(
            f"field {name!r}: only numeric arrays travel out of band, not tag {tag} ndim {ndim}",
            start,
        )
    if ndim > _MAX_NDIM:
        raise DecodeError(f"field {name!r}: ndim {ndim} exceeds {_MAX_NDIM}", start + 1)
    want = (4 * ndim if ndim > 1 else 0) + 4
    if pos - bpos != want:
        raise DecodeError(
            f"field {name!r}: an out-of-band reference of {ndim} dims is {want} bytes, "
            f"not {pos - bpos}",
            start + 4,
        )
    (index,) = _unpack_u32(buf, pos - 4)
    have = 0 if ext is None else len(ext.buffers)
    expected = 0 if ext is None else ext.used
    if ext is None or index != expected or index >= have:
        raise DecodeError(
            f"field {name!r}: refers to out-of-band array {index}; "
            f"{have} came with the Data and the next unclaimed is {expected}",
            pos - 4,
        )
    ext.used += 1
    array = ext.buffers[index]
    dtype, itemsize = numeric
    nbytes = len(array)
    if ndim == 1:
        if nbytes % itemsize:
            raise DecodeError(
                f"field {name!r}: out-of-band array of {nbytes} bytes is not a whole number "
                f"of {itemsize}-byte elements",
                pos - 4,
            )
        n = nbytes // itemsize
        dims: tuple[int, ...] = (n,)
    else:
        n, dims, _ = _read_dims(buf, bpos, pos - 4, ndim, name, lim.max_elements)
        if n * itemsize != nbytes:
            raise DecodeError(
                f"field {name!r}: dims {dims} need {n * itemsize} bytes, "
                f"the out-of-band array has {nbytes}",
                bpos,
            )
    budget -= n
    if budget < 0:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements", start)
    value = np.frombuffer(array, dtype, n)
    return _ARRAY_TYPES[tag], value if ndim == 1 else _reshape(value, dims, name, bpos), budget


def _read_dims(
    buf: Any, pos: int, end: int, ndim: int, name: str, max_elements: int
) -> tuple[int, tuple[int, ...], int]:
    """Read ``ndim`` u32 dims: (element count, dims, position after them).

    A zero-size array can declare absurd dims, e.g. (3774873604, 0): it holds no bytes, yet
    ``tolist()``/``repr`` of it would build billions of nested lists. So the nested lists a
    shape implies (the products of its leading dims) count against ``max_elements`` too.
    """
    if pos + 4 * ndim > end:
        raise DecodeError(f"field {name!r}: body too short for {ndim} dims", pos)
    dims: tuple[int, ...] = _DIMS[ndim].unpack_from(buf, pos)
    nested = 0
    prefix = 1
    for d in dims[:-1]:
        prefix *= d
        nested += prefix
    if nested > max_elements:
        raise DecodeError(
            f"field {name!r}: dims {dims} imply {nested} nested lists, more than "
            f"max_elements={max_elements}",
            pos,
        )
    return math.prod(dims), dims, pos + 4 * ndim


def _reshape(arr: Any, dims: tuple[int, ...], name: str, pos: int) -> Any:
    try:
        return arr.reshape(dims)
    except ValueError as exc:  # e.g. zero-size dims whose product overflows numpy's intp
        raise DecodeError(f"field {name!r}: cannot shape the array as {dims}: {exc}", pos) from None


def _read_strings(
    buf: Any, pos: int, end: int, ndim: int, name: str, budget: int, lim: DecodeLimits
) -> tuple[Any, int]:
    if ndim > 1:
        n, dims, pos = _read_dims(buf, pos, end, ndim, name, lim.max_elements)
    size = end - pos
    if size == 0:
        items: list[str] = []
    else:
        if buf[end - 1] != 0 or size > budget:
            _check_strings(buf, pos, end, name, budget, lim)
        try:
            items = str(buf[pos : end - 1], "utf-8").split("\x00")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"field {name!r}: invalid UTF-8", pos + exc.start) from None
    budget -= len(items)
    if budget < 0:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements", pos)
    if ndim == 1:
        return items, budget
    if n != len(items):
        raise DecodeError(f"field {name!r}: dims {dims} need {n} strings, got {len(items)}", pos)
    arr = np.empty(n, dtype=object)
    arr[:] = items
    return _reshape(arr, dims, name, pos), budget


def _read_data_array(
    buf: Any,
    pos: int,
    end: int,
    depth: int,
    name: str,
    budget: int,
    lim: DecodeLimits,
    ext: _OutOfBand | None = None,
) -> tuple[list[Data], int]:
    if pos + 4 > end:
        raise DecodeError(f"field {name!r}: Data array needs a 4-byte count", pos)
    (n,) = _unpack_u32(buf, pos)
    pos += 4
    if n * 4 > end - pos:  # every Data takes at least its 4-byte count
        raise DecodeError(
            f"field {name!r}: {n} Data declared but only {end - pos} bytes remain", pos - 4
        )
    budget -= n
    if budget < 0:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements", pos - 4)
    items: list[Data] = []
    for _ in range(n):
        item, pos, budget = _read_data(buf, pos, end, depth + 1, budget, lim, ext)
        items.append(item)
    if pos != end:
        raise DecodeError(f"field {name!r}: {end - pos} stray bytes after the Data array", pos)
    return items, budget


# ------------------------------------------------------------------ the implementation in use


class _Encode(Protocol):
    def __call__(self, data: Data, arrays: list[Any] | None = None) -> bytes: ...


class _Decode(Protocol):
    def __call__(
        self,
        buffer: bytes | bytearray | memoryview,
        limits: DecodeLimits | None = None,
        arrays: Sequence[Any] = (),
    ) -> Data: ...


class Codec(NamedTuple):
    """One implementation of the binary codec: ``name`` is "python" or "compiled"."""

    name: str
    encode: _Encode
    decode: _Decode


PYTHON = Codec("python", encode_python, decode_python)


def _load_compiled() -> Codec | None:
    """The Cython build of this codec (``_cbinary``), or None when it was not built."""
    try:
        from rda.serialization import _cbinary
    except ImportError:
        return None
    _cbinary.set_default_limits(DEFAULT_LIMITS)  # one source of the defaults: this module
    if getattr(_cbinary, "OUT_OF_BAND_MIN", None) != OUT_OF_BAND_MIN:  # a stale older build
        return None
    return Codec("compiled", _cbinary.encode, _cbinary.decode)


COMPILED = _load_compiled()
# RDA_PURE_PYTHON=1 forces the pure-Python codec (to compare, or to rule the extension out).
_PURE_WANTED = os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0")
_IN_USE = PYTHON if COMPILED is None or _PURE_WANTED else COMPILED

implementation: str = _IN_USE.name
"""Which codec ``encode``/``decode`` are: "compiled" (the Cython extension) or "python"."""

encode: _Encode = _IN_USE.encode
"""``encode(data: Data, arrays=None) -> bytes``: the binary form of ``data`` (the DATA body
frame). With a list as ``arrays``, big read-only arrays are appended to it (byte views, to be
sent as frames of their own) instead of being copied into the body."""

decode: _Decode = _IN_USE.decode
"""``decode(buffer, limits=None, arrays=()) -> Data``; any malformed input raises
``DecodeError`` naming the problem and its offset. Numeric arrays are read-only zero-copy
views over ``buffer`` (or over their out-of-band array in ``arrays``)."""
