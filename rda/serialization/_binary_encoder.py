"""The pure-Python encoder of the binary format: ``encode_python(data, arrays=None)``, and
``writable_arrays_python(data)``, the count of the arrays it would copy only for being writable.

The layout is in ``_binary_format``; the compiled encoder (``_cbinary``) writes the same bytes.
With a list as ``arrays``, the element bytes of every big read-only numeric array stay out of
the body: a byte view of the array is appended to ``arrays`` (the protocol sends each as its
own frame, BodyKind.ARRAY, so a big waveform is never copied into the body) and the entry
refers to it by index. Only read-only arrays go that way: libzmq sends a frame after ``send``
returns, and an array the owner may still write to must be copied at encode time, as it
always was. ``writable_arrays_python`` counts the big writable arrays that would go out of
band if they were read-only: a server asks it to know when a reply is worth handing over
zero-copy (``rda.business.server.replies``; docs/serialization.md, "Out of band").

Speed matters here (docs/performance.md, "The binary codec's budget"), so the hot loop is
written flat: precompiled structs, locals for globals, no per-entry function calls for the
common types.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from rda.serialization._binary_format import (
    DEFAULT_LIMITS,
    DIMS,
    HEADER,
    OUT_OF_BAND,
    OUT_OF_BAND_MIN,
    SCALAR_STRUCTS,
    TAG_DATA,
    TAG_STRING,
    U32,
)
from rda.serialization.data import NUMERIC_DTYPES, Data, DataType

__all__ = ["encode_python", "writable_arrays_python"]

T = DataType
_pack_hdr = HEADER.pack
_pack_u32 = U32.pack
_ENCODE_SCALAR = {T(tag): s.pack for tag, s in SCALAR_STRUCTS.items()}
_NUMERIC_ARRAYS = frozenset(t.array for t in NUMERIC_DTYPES)
_T_STRING_ARRAY = T.STRING_ARRAY
_T_DATA = T.DATA
_T_DATA_ARRAY = T.DATA_ARRAY
_NDARRAY = np.ndarray
_BOOL_ARRAY = T.BOOL_ARRAY
_BIG = 1 << 16  # above this, hand numpy's buffer to join instead of a tobytes() copy


def _goes_out_of_band(t: DataType, v: Any) -> bool:
    """Big, read-only, C-contiguous, numeric and not bool: sent as its own frame."""
    return (
        v.nbytes >= OUT_OF_BAND_MIN
        and t is not _BOOL_ARRAY
        and not v.flags.writeable
        and v.flags.c_contiguous
    )


def writable_arrays_python(data: Data, depth: int = 1) -> int:
    """How many arrays of ``data`` (nested Data and Data arrays included) are big, writable,
    C-contiguous, numeric and not bool: copied into the body by ``encode_python(data, arrays)``
    only because they are writable. Only exact ``numpy.ndarray`` values count (a subclass, say
    a ``numpy.memmap``, belongs to something else). Past the depth encode refuses: 0."""
    if depth > DEFAULT_LIMITS.max_depth:
        return 0
    n = 0
    types = data._types
    for name, v in data._values.items():
        cls = type(v)
        if cls is float or cls is int or cls is str or cls is bool:
            continue
        t = types[name]
        if cls is _NDARRAY:
            if (
                t in _NUMERIC_ARRAYS
                and t is not _BOOL_ARRAY
                and v.nbytes >= OUT_OF_BAND_MIN
                and v.flags.writeable
                and v.flags.c_contiguous
            ):
                n += 1
        elif t is _T_DATA:
            n += writable_arrays_python(v, depth + 1)
        elif t is _T_DATA_ARRAY:
            for item in v:
                n += writable_arrays_python(item, depth + 1)
    return n


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
                    dims = DIMS[ndim].pack(*v.shape)
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
                dims = DIMS[ndim].pack(*v.shape)
                append(pack_hdr(t & 0x0F, ndim, len(nb), len(dims) + size))
                append(nb)
                append(dims)
            append(raw)
        elif t is _T_STRING_ARRAY:
            if type(v) is list:
                if v:
                    blob = "\x00".join(v).encode()
                    append(pack_hdr(TAG_STRING, 1, len(nb), len(blob) + 1))
                    append(nb)
                    append(blob)
                    append(b"\x00")  # every element is NUL-terminated
                else:
                    append(pack_hdr(TAG_STRING, 1, len(nb), 0))
                    append(nb)
            else:
                dims = DIMS[v.ndim].pack(*v.shape)
                items = v.ravel().tolist()
                blob = "\x00".join(items).encode() + b"\x00" if items else b""
                append(pack_hdr(TAG_STRING, v.ndim, len(nb), len(dims) + len(blob)))
                append(nb)
                append(dims)
                append(blob)
        elif t is T.STRING:
            b = v.encode()
            append(pack_hdr(TAG_STRING, 0, len(nb), len(b)))
            append(nb)
            append(b)
        elif t is T.DATA:
            sub: list[Any] = []
            _encode_into(v, sub, depth + 1, arrays)
            body = b"".join(sub)
            append(pack_hdr(TAG_DATA, 0, len(nb), len(body)))
            append(nb)
            append(body)
        elif t is T.DATA_ARRAY:
            sub = [_pack_u32(len(v))]
            for item in v:
                _encode_into(item, sub, depth + 1, arrays)
            body = b"".join(sub)
            append(pack_hdr(TAG_DATA, 1, len(nb), len(body)))
            append(nb)
            append(body)
        else:
            raw = _ENCODE_SCALAR[t](v)
            append(pack_hdr(t, 0, len(nb), len(raw)))
            append(nb)
            append(raw)
