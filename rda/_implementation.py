"""``rda.implementation()``: which implementation of the hot path this process runs.

rda runs the same rules two ways: compiled (the Cython extensions built by ``pip install``:
the binary codec, the frame parser, direct libzmq calls, and the request path's modules
compiled from their own ``.py``, ``rda/_compiled_python.py``) or pure Python (no extension
built, or ``RDA_PURE_PYTHON=1`` in the environment before rda is imported). Each part chooses when
its module is imported; both give the same bytes and the same errors (the conformance suite
and the golden corpus run against both: ``tests/test_pure_python.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Implementation", "implementation"]


@dataclass(frozen=True, slots=True)
class Implementation:
    """``name``: "compiled" when every part is, "python" when none is, else "mixed";
    then each part: "compiled" or "python" (``python_modules``, the request path's modules
    compiled from their ``.py``: also "mixed" when only some run compiled)."""

    name: str
    codec: str
    frame_parser: str
    libzmq_calls: str
    pure_python_requested: bool
    python_modules: str


def implementation() -> Implementation:
    """The implementation in use (loads the codec, the request path's modules and zmq)."""
    from rda import _compiled_python
    from rda.serialization import binary
    from rda.transport import compiled

    parts = (binary.implementation, compiled.frame_parser(), compiled.libzmq_calls())
    modules = _compiled_python.compiled_modules()
    name = parts[0] if len({*parts, modules}) == 1 else "mixed"
    requested = os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0")
    return Implementation(name, *parts, requested, modules)
