"""A reply's frames, and the hand-over of a get reply's writable arrays nobody else can reach.

The frames: :func:`reply_frames` and :func:`error_frames` repeat the request's id and names
(docs/protocol.md, "Application messages"); :func:`get_reply_frames` adds a get's DATA,
DATA_CONTEXT and ARRAY bodies. What the request runner answers each outcome with:

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
and the copy protects nobody. So, when a get is completed on the thread running its handler
and its Data holds big writable arrays (``binary.writable_arrays``), the runner asks twice:

1. at ``complete()``, :func:`held_only_by_the_handler`: is each such array reachable only
   through the reply and the locals of the frames running the handler (which end when it
   returns)? If not (the device keeps one), the reply is encoded at once and the arrays
   copied as they are then, as always: a write after ``complete()`` never reaches the client.
   If so, the reply is held until the handler returns;
2. after the handler returned, :func:`hand_over`: is the reply now the only holder? Each
   array that is, is made read-only (nobody can see the flag change: nobody else holds it)
   and so goes out of band like any read-only array, zero-copy; the others are copied. The
   wire format does not change.

"The only holder", by reference counts: the AcquiredData held by the caller alone, its Data
only by it (and by the handler's own AcquiredData, when ``complete`` stamped a copy of it and
only the frames' locals hold that one: it dies with them), the Data's value table only by the Data (nested Data and Data arrays by the same
rule, each level held only by the one above); the array only by its table, without weak
references, owning its memory: ``base`` None with ``OWNDATA``, or a chain of plain ndarrays
each held only by the view above it, ending in one that owns its memory or in an immutable
``bytes``. Anything else is copied: a device attribute, a module constant, a closure's cell, a
cached or ``copy()``-shared Data, a kept AcquiredData, a view of a buffer someone keeps, a
bytearray, mmap or ctypes base, an ndarray subclass, a traceback or log record holding a
frame. A reference nobody can see (a value on an evaluation stack, a C extension's) only ever
makes a count higher: the array is copied.

A local variable that a closure captures is a cell, held by the closure, which may outlive
the handler: never counted as the frame's (Python makes a captured name a cell in the whole
function, so such a handler's arrays under that name are copied).

What this changes for a handler: an array only its own locals held at ``complete()`` is sent
as it is when the handler returns (write to it after ``complete()`` and the client sees the
write); the reply leaves when the handler returns, not at ``complete()``.

``sys.getrefcount`` is exact in CPython (the GIL build); every count is taken of a local of
the function that checks it, so it sees the holders, that local and the call's argument
(:data:`_LOCAL`, measured at import, as is what reading ``f_locals`` adds).

The request objects and the runner are compiled (when built): ``complete``, ``settle`` and
``respond`` then have no frame, and the handler's evaluation stack holds what it passed
``complete`` while they run. So the request notes that argument (``requests.completed_with``)
and :func:`references_a_completion_hides` measures, once at import, through a real
``GetRequest``, a Python handler and a responder built like the runner's, the references
those calls hold where no frame shows them (:class:`Hidden`); the first question adds them to
the frames' count. They matter to the first question only: the second counts no frame.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from inspect import CO_OPTIMIZED
from types import FrameType
from typing import Any, NamedTuple

import numpy as np

from rda.business.common import AcquiredData
from rda.business.server.requests import SERVER_CLIENT, GetRequest, describe_error
from rda.serialization import binary
from rda.serialization.binary import DEFAULT_LIMITS, OUT_OF_BAND_MIN
from rda.serialization.data import Data, DataType
from rda.serialization.header import DataContext, Header, RequestType, encode_context
from rda.serialization.message import BodyKind, Message, encode_data_body, encode_exception
from rda.transport.api import Buffer
from rda.transport.protocol import Kind, encode_routed

__all__ = [
    "Hidden",
    "admin_reply_frames",
    "error_frames",
    "get_reply_frames",
    "hand_over",
    "held_only_by_the_handler",
    "references_a_completion_hides",
    "references_not_in_frames",
    "reply_frames",
]

_getrefcount = sys.getrefcount
_weakrefs = weakref.getweakrefcount
_NDARRAY = np.ndarray
_NUMERIC = frozenset(range(DataType.INT8_ARRAY, DataType.FLOAT64_ARRAY + 1))
_DATA_ARRAY = DataType.DATA_ARRAY
# Enum members read once (each read through the enum class costs a ``__getattr__`` hook on
# Python 3.11, ten times a module global's): every reply takes several.
_REPLY_KIND = Kind.REPLY
_REPLY = RequestType.REPLY
_GET = RequestType.GET
_DATA_CONTEXT, _REPLY_CONTEXT = BodyKind.DATA_CONTEXT, BodyKind.REPLY_CONTEXT


def reply_frames(
    header: Header, reply_type: RequestType, body: list[tuple[BodyKind, Buffer]] | None = None
) -> list[Buffer]:
    """The answer to the request with ``header``: it repeats the request's id and names."""
    h = header
    return encode_routed(
        _REPLY_KIND, reply_type, h.id, h.device, h.property, h.selector, body or ()
    )


def error_frames(header: Header, reply_type: RequestType, error: BaseException) -> list[Buffer]:
    frame = encode_exception(*describe_error(error))
    return reply_frames(header, reply_type, [(BodyKind.EXCEPTION, frame)])


def get_reply_frames(
    header: Header, result: AcquiredData, alarm: bytes | None = None
) -> list[Buffer]:
    """A get's REPLY: DATA, DATA_CONTEXT, then an ARRAY per big read-only array, then the
    alarm's REPLY_CONTEXT body when there is one (docs/protocol.md, "Alarms"). Raises what the
    codec refuses (ValueError, TypeError)."""
    body = encode_data_body(result.data)  # DATA, then any ARRAYs
    body.insert(1, (_DATA_CONTEXT, encode_context(result.context, 0)))
    if alarm is not None:
        body.append((_REPLY_CONTEXT, alarm))
    h = header  # reply_frames' frames, without its call: one per get
    return encode_routed(_REPLY_KIND, _REPLY, h.id, h.device, h.property, h.selector, body)


def admin_reply_frames(header: Header, result: Data) -> list[Buffer]:
    """An admin command's REPLY: its result as the DATA body (never out of band: admin
    results are small and the client's admin path decodes DATA alone)."""
    body = [(BodyKind.DATA, binary.encode(result))]
    h = header
    return encode_routed(Kind.REPLY, RequestType.REPLY, h.id, h.device, h.property, "", body)


def _references_of_a_local() -> int:
    probe = object()  # held by this local only
    return _getrefcount(probe)  # 2 on CPython 3.11: the local and the argument


# What getrefcount says of an object held by one local of the function that asks and nothing
# else: every other holder adds one.
_LOCAL = _references_of_a_local()


def _snapshot_references() -> int:
    probe = object()
    before = _getrefcount(probe)
    sys._getframe().f_locals  # noqa: B018 (read for its effect)
    return _getrefcount(probe) - before


# 1 when reading a frame's ``f_locals`` leaves a snapshot dict on the frame, holding each
# local once more until the frame ends (CPython 3.11, 3.12), 0 when it is a proxy (3.13).
_SNAPSHOT_KEPT = _snapshot_references()
_NO_FRAMES: dict[int, int] = {}


class Hidden(NamedTuple):
    """The references that the calls from a get's handler to its responder (``complete``,
    ``settle``, the runner's ``respond``, each compiled or not) hold where no frame's locals
    show them, by what they hold (:func:`references_a_completion_hides` measures them).

    ``result``: to the AcquiredData the responder gets, when ``complete`` made it (stamped a
    copy); ``same``: to it when it is what the handler passed; ``argument``: to what the
    handler passed (a ``Data``, or an AcquiredData ``complete`` stamped a copy of), e.g. the
    handler's evaluation stack, which holds a call's argument while a compiled method runs."""

    result: int
    same: int
    argument: int


def held_only_by_the_handler(
    acquired: AcquiredData, stop: FrameType, hidden: Hidden, argument: object = None
) -> bool:
    """At ``complete()`` inside the handler: whether every big writable array of the reply is
    reachable only through the reply and the locals of the frames between here and ``stop``
    (``request.handler_caller``: the frame below the handler's, ``RequestRunner.run``'s or,
    the runner compiled, the Python frame that called it), which all end when the handler
    returns. Then the reply may wait for that return and be handed over (:func:`hand_over`);
    else it is encoded now, its arrays copied as they are at ``complete()``. False when
    ``stop`` is not on this thread's stack (the get was completed from another thread).
    ``argument``: what the handler passed ``complete`` (``requests.completed_with``);
    ``hidden``: what the calls between hold where no frame shows it, measured once by
    :func:`references_a_completion_hides` for the runner and request classes as built.

    Only this first question depends on ``hidden``: were it too high, a reply the device can
    still reach would wait for the handler's return and be copied then (:func:`hand_over`
    counts without frames or ``hidden``), never sent zero-copy while someone else holds it."""
    found = _frame_references(stop)
    if found is None:
        return False
    frames, wrappers = found
    _count_hidden(acquired, argument, hidden, frames, wrappers)
    _count_dying_wrappers(wrappers, frames)
    # ``acquired``: this parameter, and _walk's; the rest is in ``frames``.
    handed, left = _walk(acquired, 1, frames, freeze=False)
    return handed > 0 and not left


def _count_hidden(
    acquired: AcquiredData,
    argument: object,
    hidden: Hidden,
    frames: dict[int, int],
    wrappers: dict[int, AcquiredData],
) -> None:
    """Adds to ``frames`` the references to the reply and to ``argument`` that end when the
    handler returns without a frame showing them: ``hidden``'s, and our caller's parameter
    ``argument`` (:func:`held_only_by_the_handler`'s or :func:`references_not_in_frames`')."""
    key = id(acquired)
    if argument is acquired:
        frames[key] = frames.get(key, 0) + hidden.same + 1
        return
    frames[key] = frames.get(key, 0) + hidden.result
    if argument is None:
        return
    key = id(argument)
    frames[key] = frames.get(key, 0) + hidden.argument + 1
    if type(argument) is AcquiredData:
        wrappers[key] = argument  # stamped() copied it: it may die with the handler's call


def references_a_completion_hides(respond: Callable[[Any, Any, Any], None]) -> Hidden:
    """The references that the calls from a get handler's ``request.complete(x)`` to the
    responder ``respond(request, result, error)`` hold where no frame's locals show them
    (:class:`Hidden`): 0 for Python methods (their locals hold their arguments), more when
    compiled (a caller's evaluation stack, an extension's own argument handling). Measured
    through a real ``GetRequest`` and a Python handler, with ``respond`` built as the runner's
    (compiled or not with it) and answering what :func:`references_not_in_frames` says of
    ``result`` and ``requests.completed_with(request)`` from inside itself, as the runner's
    ``respond`` calls :func:`held_only_by_the_handler`. Never assumed: it depends on the
    Python and Cython that built them. Each count is the least over the ways a handler
    passes a value (a Data, an unstamped and a stamped AcquiredData): a count too low only
    copies a reply that could have gone zero-copy."""
    measured = _MEASURED
    measured.clear()
    request = GetRequest(Message(Header(_GET, 0, "", "", "")), SERVER_CLIENT, 0.0, respond)
    _complete_as_a_handler_does(request, Data(x=1))
    request = GetRequest(Message(Header(_GET, 0, "", "", "")), SERVER_CLIENT, 0.0, respond)
    _complete_as_a_handler_does(request, AcquiredData(Data(x=1)))
    request = GetRequest(Message(Header(_GET, 0, "", "", "")), SERVER_CLIENT, 0.0, respond)
    _complete_as_a_handler_does(request, AcquiredData(Data(x=1), DataContext(acq_stamp=1)))
    assert len(measured) == 3, "the responder did not measure every completion"
    (data_result, data_arg), (wrapper_result, wrapper_arg), (same, _) = measured
    measured.clear()
    return Hidden(min(data_result, wrapper_result), same, min(data_arg, wrapper_arg))


def _complete_as_a_handler_does(request: GetRequest, value: Any) -> None:
    # A get handler's call (Python, as user code is): the value a parameter of its frame.
    request.complete(value)


# (result, argument) per completion references_not_in_frames measured (import time only).
_MEASURED: list[tuple[int, int]] = []


def references_not_in_frames(result: object, argument: object) -> None:
    """Inside a responder that :func:`references_a_completion_hides` calls: records the
    references to ``result`` and to ``argument`` (``completed_with``) that neither the frames'
    locals between here and there, nor these parameters, nor the reply's own holds show."""
    stop = sys._getframe(1)
    while stop.f_code is not references_a_completion_hides.__code__:
        assert stop.f_back is not None, "called outside references_a_completion_hides"
        stop = stop.f_back
    found = _frame_references(stop)
    assert found is not None
    frames, wrappers = found
    del found
    wrappers.clear()  # it holds the frames' AcquiredData: counted here as if it did not
    nothing = Hidden(0, 0, 0)
    # The wrappers' rule is not applied: what the argument holds is not asked here.
    _count_hidden(result, argument, nothing, frames, {})  # type: ignore[arg-type]
    held_by_result = 1 if argument is getattr(result, "data", None) else 0
    # Each: a parameter of _residue, and its getrefcount's argument (_LOCAL); ``result``
    # also our parameter (``argument`` is counted in ``frames`` by _count_hidden).
    result_left = _residue(result, frames, 1)
    argument_left = 0 if argument is result else _residue(argument, frames, held_by_result)
    _MEASURED.append((result_left, argument_left))


def _residue(value: object, frames: dict[int, int], known: int) -> int:
    return _getrefcount(value) - _LOCAL - frames.get(id(value), 0) - known


def hand_over(acquired: AcquiredData) -> tuple[int, int]:
    """After the handler returned: make read-only each big writable array of ``acquired``
    that nothing but the reply can reach (see the module docstring), so that the encoder
    sends it out of band without a copy. The caller holds ``acquired`` in one local variable
    and passes that, its only other holder. Returns (arrays handed over, arrays to copy)."""
    # ``acquired``: the caller's local, this parameter, and _walk's.
    return _walk(acquired, 2, _NO_FRAMES, freeze=True)


def _frame_references(
    stop: FrameType,
) -> tuple[dict[int, int], dict[int, AcquiredData]] | None:
    """By ``id``, the references the locals of the frames from our caller's caller up to
    ``stop`` (excluded) hold, and the AcquiredData among those locals (for
    :func:`_count_dying_wrappers`); None when ``stop`` is not on this thread's stack.

    A plain local dies with its frame; a closure's cell may outlive it, so cells are not
    counted. Reading ``f_locals`` (a snapshot dict kept on the frame until Python 3.13) adds
    that dict's references, which die with the frame too: counted as well. Only function
    frames: the namespace of module, class or exec code may outlive it (None then)."""
    # First find ``stop`` without reading any locals: ``f_locals`` leaves a snapshot on the
    # frame (Python 3.11, 3.12), holding its locals until the frame ends, and a get completed
    # by another thread walks that thread's stack, long-lived frames ``stop`` is not among.
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame is not stop:
        frame = frame.f_back
    if frame is None:
        return None
    counts: dict[int, int] = {}
    wrappers: dict[int, AcquiredData] = {}
    frame = sys._getframe(2)
    while frame is not None and frame is not stop:
        code = frame.f_code
        if not code.co_flags & CO_OPTIMIZED:
            return None  # module, class or exec code: its namespace may outlive the frame
        cells = code.co_cellvars + code.co_freevars
        snapshot = frame.f_locals
        for name in list(snapshot):
            key = id(snapshot[name])  # the value itself is never bound here: no extra count
            n = (name not in cells) + _SNAPSHOT_KEPT
            if n:
                counts[key] = counts.get(key, 0) + n
            if type(snapshot[name]) is AcquiredData and name not in cells:
                wrappers[key] = snapshot[name]
        del snapshot
        frame = frame.f_back
    if frame is None:
        return None
    return counts, wrappers


def _count_dying_wrappers(wrappers: dict[int, AcquiredData], counts: dict[int, int]) -> None:
    """``request.complete(AcquiredData(data))`` (docs/server.md's way): ``complete`` stamps a
    new AcquiredData sharing ``data``, and the handler's one, a local of ``complete``, still
    holds ``data`` too. An AcquiredData that only the frames' locals hold dies with them, and
    so does its reference to its Data: that reference counts as the frames' own."""
    for key in list(wrappers):
        wrapper = wrappers.pop(key)
        # Held by the frames (``counts``) and the local ``wrapper``.
        if _getrefcount(wrapper) <= counts.get(key, 0) + _LOCAL:
            data_key = id(wrapper.data)
            counts[data_key] = counts.get(data_key, 0) + 1
        del wrapper


def _walk(
    acquired: AcquiredData, callers: int, frames: dict[int, int], freeze: bool
) -> tuple[int, int]:
    """(arrays nobody else reaches, arrays someone else may) among the reply's big writable
    ones; with ``freeze``, the first are made read-only. ``callers``: the references to
    ``acquired`` the calling functions hold; ``frames``: those other frames hold, by id."""
    data = acquired.data
    total = binary.writable_arrays(data)
    if not total:
        return 0, 0
    if _getrefcount(acquired) > callers + frames.get(id(acquired), 0) + _LOCAL:
        return 0, total
    if _getrefcount(data) > 1 + frames.get(id(data), 0) + _LOCAL:
        return 0, total
    handed = _walk_data(data, 1, frames, freeze)
    return handed, total - handed


def _walk_data(data: Data, depth: int, frames: dict[int, int], freeze: bool) -> int:
    """The arrays of ``data`` (whose own holders its parent checked) nobody else reaches;
    each value is held by the table, by the frames, and by the one local that counts it."""
    if depth > DEFAULT_LIMITS.max_depth:  # the encoder refuses the whole reply anyway
        return 0
    values = data._values
    if _getrefcount(values) > 1 + frames.get(id(values), 0) + _LOCAL:
        return 0  # a dict view or an iterator someone keeps
    types = data._types
    handed = 0
    for name in list(values):
        v = values[name]
        one = 1 + frames.get(id(v), 0) + _LOCAL
        cls = type(v)
        if cls is _NDARRAY:
            if (
                types[name] in _NUMERIC
                and v.flags.writeable
                and v.nbytes >= OUT_OF_BAND_MIN
                and v.flags.c_contiguous
                and _getrefcount(v) <= one
                and not _weakrefs(v)
                and _owns_its_memory(v, frames)
            ):
                if freeze:
                    v.flags.writeable = False
                handed += 1
        elif cls is Data:
            if _getrefcount(v) <= one:
                handed += _walk_data(v, depth + 1, frames, freeze)
        elif cls is list and types[name] is _DATA_ARRAY and _getrefcount(v) <= one:
            handed += _walk_items(v, depth, frames, freeze)
        del v
    return handed


def _walk_items(items: list[Any], depth: int, frames: dict[int, int], freeze: bool) -> int:
    """A Data array's share of :func:`_walk_data` (each item held by the list)."""
    handed = 0
    for item in items:
        if type(item) is Data and _getrefcount(item) <= 1 + frames.get(id(item), 0) + _LOCAL:
            handed += _walk_data(item, depth + 1, frames, freeze)
    return handed


def _owns_its_memory(array: Any, frames: dict[int, int]) -> bool:
    """Whether ``array``'s memory is reachable only through it: it owns it, or each base
    down the chain is a plain ndarray held only by the view above it (and the frames), ending
    in one that owns its memory or in an immutable ``bytes``."""
    view = array
    while True:
        base = view.base
        if base is None:
            return bool(view.flags.owndata)
        # Held by ``view`` (its base) and by the local ``base``.
        if _getrefcount(base) > 1 + frames.get(id(base), 0) + _LOCAL:
            return False
        if type(base) is bytes:
            return True
        if type(base) is not _NDARRAY or _weakrefs(base):
            return False  # a bytearray, mmap, memmap, ctypes or foreign buffer: not ours
        view = base
