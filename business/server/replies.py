"""A reply's frames, and the hand-over of a get reply's writable arrays nobody else can reach.

The frames: :func:`reply_frames` and :func:`error_frames` repeat the request's id and names
(docs/protocol.md, "Application messages"); :func:`get_reply_frames` adds a get's DATA,
DATA_CONTEXT and ARRAY bodies. What ``Dispatch`` answers each outcome with:

=================  =====================================  =========================
what happened      reply                                   counted as
=================  =====================================  =========================
complete()         REPLY [DATA, DATA_CONTEXT, ARRAY...]    ok
                   / REPLY (a set)
fail() / raise     EXCEPTION [EXCEPTION]                   by the error's class
queue full         EXCEPTION OverloadError                 overload
deadline passed    EXCEPTION TimeoutError                  timeout
reject()           SUBSCRIBE_EXCEPTION [EXCEPTION]         by the error's class
policy denies      EXCEPTION / SUBSCRIBE_EXCEPTION          denied
                   NotAuthorizedError
=================  =====================================  =========================

"By the error's class" is :func:`~rda.business.server.outcomes.outcome_of`: ``not_found``,
``bad_request``, ... and ``handler_error`` only for an exception nobody typed (the server's
fault, also counted in ``handler_errors``).

The hand-over (docs/serialization.md, "Out of band"). A big read-only array goes out of band:
its own frame, sent zero-copy, libzmq reading it after ``send`` returned. A writable one is
copied into the DATA body at encode time, because whoever holds it could write to it while
libzmq is still sending it, and the client would get torn data. But the usual get handler
builds a fresh array, completes with it and returns: then nothing but the reply can reach it,
and the copy protects nobody. ``Dispatch`` holds such a reply back until the handler returns
(when it was completed on the thread running that handler) and asks :func:`hand_over`, which
decides by reference counts, per array, whether the reply is its only holder:

* the AcquiredData is held by the caller alone, its Data only by it, the Data's value table
  only by the Data (nested Data and Data arrays by the same rule, each level held only by
  the one above);
* the array is held only by its table, has no weak reference, and owns its memory: ``base``
  is None with ``OWNDATA``, or a chain of plain ndarrays each held only by the view above it
  and ending in one that owns its memory, or in an immutable ``bytes``.

Such an array is made read-only (nobody can see the flag change: nobody else holds it) and so
goes out of band like any read-only array; the wire format does not change. Anything else is
copied as before: a device attribute, a module constant, a closure's cell, a cached or
``copy()``-shared Data, a kept AcquiredData, a view of a buffer someone keeps, a bytearray,
mmap or ctypes base, an ndarray subclass, a reference from a traceback or a log record.

``sys.getrefcount`` is exact in CPython (the GIL build); every count below is taken of a
local variable of the function that checks it, so the references it sees are the holder's,
that local's and the call's argument (:data:`_LOCAL`, measured at import, not assumed).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np

from rda.business.common import AcquiredData
from rda.business.server.requests import describe_error
from rda.serialization import _binary
from rda.serialization._binary_format import DEFAULT_LIMITS, OUT_OF_BAND_MIN
from rda.serialization._data import Data, DataType
from rda.serialization._header import Header, RequestType, encode_context
from rda.serialization._message import BodyKind, encode_data_body, encode_exception
from rda.transport.api import Buffer
from rda.transport.protocol import Kind, encode_routed

__all__ = ["admin_reply_frames", "error_frames", "get_reply_frames", "hand_over", "reply_frames"]

_getrefcount = sys.getrefcount
_weakrefs = weakref.getweakrefcount
_NDARRAY = np.ndarray
_NUMERIC = frozenset(range(DataType.INT8_ARRAY, DataType.FLOAT64_ARRAY + 1))
_DATA_ARRAY = DataType.DATA_ARRAY


def reply_frames(
    header: Header, reply_type: RequestType, body: list[tuple[BodyKind, Buffer]] | None = None
) -> list[Buffer]:
    """The answer to the request with ``header``: it repeats the request's id and names."""
    h = header
    return encode_routed(Kind.REPLY, reply_type, h.id, h.device, h.property, h.selector, body or ())


def error_frames(header: Header, reply_type: RequestType, error: BaseException) -> list[Buffer]:
    frame = encode_exception(*describe_error(error))
    return reply_frames(header, reply_type, [(BodyKind.EXCEPTION, frame)])


def get_reply_frames(header: Header, result: AcquiredData) -> list[Buffer]:
    """A get's REPLY: DATA, DATA_CONTEXT, then an ARRAY per big read-only array. Raises what
    the codec refuses (ValueError, TypeError)."""
    body = encode_data_body(result.data)  # DATA, then any ARRAYs
    body.insert(1, (BodyKind.DATA_CONTEXT, encode_context(result.context, 0)))
    return reply_frames(header, RequestType.REPLY, body)


def admin_reply_frames(header: Header, result: Data) -> list[Buffer]:
    """An admin command's REPLY: its result as the DATA body (never out of band: admin
    results are small and the client's admin path decodes DATA alone)."""
    body = [(BodyKind.DATA, _binary.encode(result))]
    h = header
    return encode_routed(Kind.REPLY, RequestType.REPLY, h.id, h.device, h.property, "", body)


def _references_of_a_local() -> int:
    probe = object()  # held by this local only
    return _getrefcount(probe)  # 2 on CPython 3.11: the local and the argument


# What getrefcount says of an object held by one local of the caller and nothing else; an
# object also held by one container reads one more.
_LOCAL = _references_of_a_local()
_ONE_HOLDER = _LOCAL + 1


def hand_over(acquired: AcquiredData) -> tuple[int, int]:
    """Make read-only each big writable array of ``acquired`` that nothing but it can reach
    (see the module docstring), so that the encoder sends it out of band without a copy.

    The caller must hold ``acquired`` in one local variable and pass that: its own reference
    is the one holder allowed. Returns (arrays handed over, arrays left to be copied)."""
    data = acquired.data
    total = _binary.writable_arrays(data)
    if not total:
        return 0, 0
    # ``acquired``: the caller's local, and this parameter (the local of the count).
    if _getrefcount(acquired) > _ONE_HOLDER or _getrefcount(data) > _ONE_HOLDER:
        return 0, total
    handed = _hand_over_data(data, 1)
    return handed, total - handed


def _hand_over_data(data: Data, depth: int) -> int:
    """The arrays of ``data`` (held only by its parent: checked there) handed over."""
    if depth > DEFAULT_LIMITS.max_depth:  # the encoder refuses the whole reply anyway
        return 0
    values = data._values
    if _getrefcount(values) > _ONE_HOLDER:  # a dict view or an iterator someone keeps
        return 0
    types = data._types
    handed = 0
    for name in list(values):
        v = values[name]
        cls = type(v)
        if cls is _NDARRAY:
            if (
                types[name] in _NUMERIC
                and v.flags.writeable
                and v.nbytes >= OUT_OF_BAND_MIN
                and v.flags.c_contiguous
                and _getrefcount(v) <= _ONE_HOLDER
                and not _weakrefs(v)
                and _owns_its_memory(v)
            ):
                v.flags.writeable = False
                handed += 1
        elif cls is Data:
            if _getrefcount(v) <= _ONE_HOLDER:
                handed += _hand_over_data(v, depth + 1)
        elif cls is list and types[name] is _DATA_ARRAY and _getrefcount(v) <= _ONE_HOLDER:
            for item in v:
                if type(item) is Data and _getrefcount(item) <= _ONE_HOLDER:
                    handed += _hand_over_data(item, depth + 1)
        del v
    return handed


def _owns_its_memory(array: Any) -> bool:
    """Whether ``array``'s memory is reachable only through it: it owns it, or each base
    down the chain is a plain ndarray held only by the view above it, ending in one that owns
    its memory or in an immutable ``bytes``."""
    view = array
    while True:
        base = view.base
        if base is None:
            return bool(view.flags.owndata)
        if _getrefcount(base) > _ONE_HOLDER:  # held by ``view`` and by the local ``base``
            return False
        if type(base) is bytes:
            return True
        if type(base) is not _NDARRAY or _weakrefs(base):
            return False  # a bytearray, mmap, memmap, ctypes or foreign buffer: not ours
        view = base
