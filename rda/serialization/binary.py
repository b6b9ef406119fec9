"""The binary codec in use: ``encode``/``decode`` of a DATA body frame (docs/serialization.md).

The codec exists twice with one contract (same bytes, same Data, same ``DecodeError``): the
Cython extension ``_cbinary`` and the pure Python, which is split in three:

* ``_binary_format``: the layout, the header structs, the type tables by tag, the out-of-band
  constants and ``DecodeLimits``;
* ``_binary_encoder``: ``encode_python`` and ``writable_arrays_python``;
* ``_binary_decoder``: ``decode_python``.

This module picks one at import: the compiled codec when it was built (and ``RDA_PURE_PYTHON``
is not set), else the pure one. ``implementation`` names it, ``encode``/``decode`` are it, and
both stay reachable as ``PYTHON`` and ``COMPILED``. The rest of rda imports the codec from
here (``rda.serialization.binary``), the names above included.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

# Re-exported (``X as X``): the pure functions and the default limits, used as binary.X.
from rda.serialization._binary_decoder import decode_python as decode_python
from rda.serialization._binary_encoder import encode_python as encode_python
from rda.serialization._binary_encoder import writable_arrays_python as writable_arrays_python
from rda.serialization._binary_format import DEFAULT_LIMITS as DEFAULT_LIMITS
from rda.serialization._binary_format import OUT_OF_BAND, DecodeLimits
from rda.serialization._binary_format import OUT_OF_BAND_MIN as OUT_OF_BAND_MIN
from rda.serialization.data import Data

__all__ = [
    "OUT_OF_BAND",
    "OUT_OF_BAND_MIN",
    "Codec",
    "DecodeLimits",
    "decode",
    "encode",
    "implementation",
    "writable_arrays",
]


class _Encode(Protocol):
    def __call__(self, data: Data, arrays: list[Any] | None = None) -> bytes: ...


class _Decode(Protocol):
    def __call__(
        self,
        buffer: bytes | bytearray | memoryview,
        limits: DecodeLimits | None = None,
        arrays: Sequence[Any] = (),
    ) -> Data: ...


class _Count(Protocol):
    def __call__(self, data: Data) -> int: ...


class Codec(NamedTuple):
    """One implementation of the binary codec: ``name`` is "python" or "compiled"."""

    name: str
    encode: _Encode
    decode: _Decode
    writable_arrays: _Count


PYTHON = Codec("python", encode_python, decode_python, writable_arrays_python)


def _load_compiled() -> Codec | None:
    """The Cython build of this codec (``_cbinary``), or None when it was not built."""
    try:
        from rda.serialization import _cbinary
    except ImportError:
        return None
    _cbinary.set_default_limits(DEFAULT_LIMITS)  # one source of the defaults: _binary_format
    if getattr(_cbinary, "OUT_OF_BAND_MIN", None) != OUT_OF_BAND_MIN:  # a stale older build
        return None
    if not hasattr(_cbinary, "writable_arrays"):  # built before it existed
        return None
    return Codec("compiled", _cbinary.encode, _cbinary.decode, _cbinary.writable_arrays)


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

writable_arrays: _Count = _IN_USE.writable_arrays
"""``writable_arrays(data) -> int``: how many big writable arrays ``encode(data, arrays)``
copies into the body only for being writable (read-only, they would go out of band). A server
hands such a reply over zero-copy when nobody else can reach them (``rda.business.server.
replies``)."""
