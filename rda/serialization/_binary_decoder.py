"""The pure-Python decoder of the binary format: ``decode_python(buffer, limits, arrays)``.

The layout is in ``_binary_format``; the compiled decoder (``_cbinary``) mirrors this one check
for check, so any input gives the same Data or the same ``DecodeError`` in both. Numeric arrays
are read-only views over the received buffer (zero-copy); an entry sent out of band is viewed
in place over its array in ``arrays``.

Speed matters here (docs/performance.md, "The binary codec's budget"), so the hot loop is
written flat: precompiled structs, locals for globals, no per-entry function calls for the
common types. Every declared length is checked against the bytes remaining *before* anything
is sliced or allocated, so hostile input costs at most what it weighs; ``DecodeLimits`` bound
the depth and the element count.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from rda.serialization._binary_format import (
    ARRAY_DTYPES,
    ARRAY_TYPES,
    DEFAULT_LIMITS,
    DIMS,
    HEADER_CODE,
    MAX_NDIM,
    OUT_OF_BAND,
    SCALAR_STRUCTS,
    SCALAR_TYPES,
    TAG_BOOL,
    TAG_STRING,
    U32,
    DecodeLimits,
)
from rda.serialization.data import NUMERIC_DTYPES, Data, DataType
from rda.serialization.errors import DecodeError

__all__ = ["decode_python"]

T = DataType
_unpack_hdr = HEADER_CODE.unpack_from
_unpack_u32 = U32.unpack_from
_T_STRING_ARRAY = T.STRING_ARRAY
# Inline decode paths by header code: 1-D numeric arrays and numeric scalars, bool excluded
# (its bytes must be checked to be 0 or 1, see _read_other).
_FAST_ARRAYS: dict[int, tuple[DataType, np.dtype[Any], int]] = {
    int(t) | 0x100: (t.array, dt, dt.itemsize) for t, dt in NUMERIC_DTYPES.items() if t != T.BOOL
}
_FAST_SCALARS: dict[int, tuple[DataType, struct.Struct]] = {
    tag: (T(tag), st) for tag, st in SCALAR_STRUCTS.items() if tag != int(T.BOOL)
}
_object_new = object.__new__


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
        t = SCALAR_TYPES[tag]
        if tag == TAG_BOOL:
            if size != 1 or buf[bpos] > 1:
                raise DecodeError(f"field {name!r}: a bool body is one byte, 0 or 1", bpos)
            return t, buf[bpos] == 1, budget
        if tag == TAG_STRING:
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
    t = ARRAY_TYPES[tag]
    if ndim > MAX_NDIM:
        raise DecodeError(f"field {name!r}: ndim {ndim} exceeds {MAX_NDIM}", start + 1)
    numeric = ARRAY_DTYPES[tag]
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
        if tag == TAG_BOOL and n and bytes(buf[epos:pos]).translate(None, b"\0\1"):
            raise DecodeError(f"field {name!r}: bool array holds bytes other than 0/1", epos)
        value = np.frombuffer(buf, dtype, n, epos)
        return t, value if ndim == 1 else _reshape(value, dims, name, bpos), budget
    if tag == TAG_STRING:
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
    numeric = ARRAY_DTYPES[tag] if 2 <= tag <= 7 else None
    if numeric is None or ndim == 0:
        raise DecodeError(
            f"field {name!r}: only numeric arrays travel out of band, not tag {tag} ndim {ndim}",
            start,
        )
    if ndim > MAX_NDIM:
        raise DecodeError(f"field {name!r}: ndim {ndim} exceeds {MAX_NDIM}", start + 1)
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
    return ARRAY_TYPES[tag], value if ndim == 1 else _reshape(value, dims, name, bpos), budget


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
    dims: tuple[int, ...] = DIMS[ndim].unpack_from(buf, pos)
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
