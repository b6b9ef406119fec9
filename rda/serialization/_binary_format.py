"""The binary format of a DATA body frame: its layout and the tables both directions share.

docs/serialization.md, "Binary". Layout, little-endian::

    data  := u32 count, entry * count
    entry := u8 tag, u8 ndim, u16 name_len, u32 size, name (UTF-8), body (size bytes)

``tag`` is the element type (``DataType & 0x0F``), ``ndim`` 0 for a scalar and 1..32 for an
array; ``size`` is the body's byte length, so one ``unpack_from`` gives everything needed to
bound-check and slice an entry. Numeric array bodies are the raw C-order elements (prefixed by
the dims when ndim > 1) and are decoded zero-copy with ``numpy.frombuffer`` over the received
buffer; a string array is its elements, each followed by NUL, decoded with one ``split``.

Out of band: the element bytes of a big read-only numeric array (``OUT_OF_BAND_MIN`` bytes or
more, C-contiguous, not bool) may travel outside the body, as a frame of its own
(BodyKind.ARRAY); the entry's tag then gets bit 7 (``OUT_OF_BAND``) and its body holds the dims
(ndim > 1) and the u32 index of that array.

Here: the entry header structs, the tables from a tag to its DataType, struct and dtype, the
out-of-band constants and ``DecodeLimits`` (the one source of the decoders' defaults, the
compiled one included). The pure-Python encoder and decoder that use them are
``_binary_encoder`` and ``_binary_decoder``; ``_binary`` picks the implementation in use.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from rda.serialization.data import NUMERIC_DTYPES, DataType

__all__ = [
    "ARRAY_DTYPES",
    "ARRAY_TYPES",
    "DEFAULT_LIMITS",
    "DIMS",
    "HEADER",
    "HEADER_CODE",
    "MAX_NDIM",
    "OUT_OF_BAND",
    "OUT_OF_BAND_MIN",
    "SCALAR_STRUCTS",
    "SCALAR_TYPES",
    "TAG_BOOL",
    "TAG_DATA",
    "TAG_STRING",
    "U32",
    "DecodeLimits",
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
MAX_NDIM = 32

# Tag bit of an entry whose elements travel out of band, and the smallest array that does (the
# protocol's LARGE_BODY: from there a frame of its own is cheaper than a copy).
OUT_OF_BAND = 0x80
OUT_OF_BAND_MIN = 1 << 16

HEADER = struct.Struct("<BBHI")
# The same 8 bytes read with tag and ndim as one u16 (tag | ndim << 8): one dict lookup then
# identifies the common entry kinds.
HEADER_CODE = struct.Struct("<HHI")
U32 = struct.Struct("<I")
# The dims of an N-D array, by ndim.
DIMS = [struct.Struct(f"<{k}I") for k in range(MAX_NDIM + 1)]

T = DataType
TAG_BOOL, TAG_STRING, TAG_DATA = int(T.BOOL), int(T.STRING), int(T.DATA)
# Scalar codecs by tag: (struct, byte size). BOOL is read as u8 so 2..255 can be rejected.
SCALAR_STRUCTS: dict[int, struct.Struct] = {
    int(T.BOOL): struct.Struct("<B"),
    int(T.INT8): struct.Struct("<b"),
    int(T.INT16): struct.Struct("<h"),
    int(T.INT32): struct.Struct("<i"),
    int(T.INT64): struct.Struct("<q"),
    int(T.FLOAT32): struct.Struct("<f"),
    int(T.FLOAT64): struct.Struct("<d"),
}
# Indexed by tag; slot 0 is never read (tag 0 is rejected first).
SCALAR_TYPES: list[DataType] = [T.BOOL] + [T(k) for k in range(1, 10)]
ARRAY_TYPES: list[DataType] = [T.BOOL_ARRAY] + [T(k | 0x10) for k in range(1, 10)]
# Array element dtype and item size by tag (None for STRING and DATA).
ARRAY_DTYPES: list[tuple[np.dtype[Any], int] | None] = [None] * 10
for _t, _dt in NUMERIC_DTYPES.items():
    ARRAY_DTYPES[int(_t)] = (_dt, _dt.itemsize)
