# The compiled binary codec (_cbinary.pyx): the same contract as _binary's pure functions.
from collections.abc import Sequence
from typing import Any

from rda.serialization._binary_format import DecodeLimits
from rda.serialization.data import Data

OUT_OF_BAND_MIN: int
DIRECT_SLOTS: bool
STRING_CACHE_SLOTS: int
STRING_CACHE_MAX_BYTES: int

def encode(data: Data, arrays: list[Any] | None = None) -> bytes: ...
def decode(
    buffer: bytes | bytearray | memoryview,
    limits: DecodeLimits | None = None,
    arrays: Sequence[Any] = (),
) -> Data: ...
def writable_arrays(data: Data, depth: int = 1) -> int: ...
def set_default_limits(limits: DecodeLimits) -> None: ...
def string_cache_size() -> int: ...
