"""What a server's user code sees: callbacks, requests, client info; and the deadline watcher.

A request object is created on the dispatcher thread (cheap: no decoding), handed to a worker
through the scheduler, given to a user callback, and answered exactly once: by ``complete`` /
``fail`` (from any thread, at any time), by the server when the callback raised, when the task
was dropped on overload, or when the client's deadline passed first. The first answer wins; a
later one is ignored and logged. That single rule is what lets a handler complete a request
from another thread long after the callback returned without racing the deadline watcher.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from rda.business.common import AcquiredData, stamped, stamped_data
from rda.business.driver import current_driver
from rda.business.policy import ANONYMOUS
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError, RemoteError, TimeoutError, wire_type
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.transport.ratelog import RateLimitedLog

__all__ = [
    "AUTHENTICATED_PRINCIPAL",
    "DECLARED_PRINCIPAL",
    "SERVER_CLIENT",
    "ClientInfo",
    "DeadlineWatcher",
    "GetRequest",
    "RequestReplyCallback",
    "ServerError",
    "ServerRequest",
    "SetRequest",
    "SubscriptionRejected",
    "SubscriptionRequest",
    "client_timeout",
    "completed_with",
    "describe_error",
    "new_request",
    "timeout_error",
]

log = logging.getLogger("rda.server")
# A client choosing short deadlines makes handlers answer late: one line per second at most.
_late_log = RateLimitedLog(log)

Clock = Callable[[], float]

# Keys of the client info a transport hands to ``on_peer_connected``: the identity the
# transport authenticated (set by the transport only, e.g. CURVE's ZAP User-Id), and the name
# a client declares in its CONNECT info (trusted only when the server is told to).
AUTHENTICATED_PRINCIPAL = "authenticated_principal"
DECLARED_PRINCIPAL = "principal"


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """Who sent a request: the routing id of its connection and what it said in CONNECT.

    ``principal`` is who the server believes the client is: the identity the transport
    authenticated (CURVE), or the name the client declared when the server trusts declared
    names, else ``""`` (anonymous). ``roles`` are that principal's roles in the server's
    authorization policy (empty without a policy); handlers may add their own checks on both.
    """

    peer: bytes
    application: str = ""
    user: str = ""
    host: str = ""
    pid: int = 0
    info: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    principal: str = ""
    roles: tuple[str, ...] = ()

    @property
    def peer_hex(self) -> str:
        return self.peer.hex()

    @property
    def authenticated(self) -> bool:
        """Whether the principal is the transport's authenticated identity (a CURVE key the
        server's clients directory lists), not a declared name."""
        return bool(self.principal) and self.info.get(AUTHENTICATED_PRINCIPAL) == self.principal

    @property
    def principal_name(self) -> str:
        """The principal for messages: ``anonymous`` for the empty one."""
        return self.principal or ANONYMOUS

    @classmethod
    def from_info(
        cls, peer: bytes, info: Mapping[str, Any], trust_declared: bool = False
    ) -> ClientInfo:
        """Build from a CONNECT info object; wrong-typed fields are ignored, never fatal.

        The principal is the transport's ``authenticated_principal`` (a client cannot put it
        there: the transport owns that key); the client's own ``principal`` counts only when
        ``trust_declared`` (test stands without CURVE).
        """
        pid = info.get("pid", 0)
        principal = info.get(AUTHENTICATED_PRINCIPAL)
        if not isinstance(principal, str) or not principal:
            declared = info.get(DECLARED_PRINCIPAL) if trust_declared else None
            principal = declared if isinstance(declared, str) else ""
        return cls(
            peer=peer,
            application=str(info.get("application", "")),
            user=str(info.get("user", "")),
            host=str(info.get("host", "")),
            pid=pid if isinstance(pid, int) else 0,
            info=dict(info),
            principal=principal,
        )


# The "client" of requests the server makes itself (FIRST and IMMEDIATE updates).
SERVER_CLIENT = ClientInfo(b"", application="rda-server")

_UNSET: Any = object()

# Makes the first answer of a request the only one (settle, watch_deadline). One for every
# request, not one each: it is held for three attribute operations, never around a call,
# and a request then costs no lock to make.
_ANSWER_LOCK = threading.Lock()

# (request, result, error): result is an AcquiredData for get, None otherwise; error None = ok.
Responder = Callable[["ServerRequest", AcquiredData | None, BaseException | None], None]


class ServerRequest:
    """Common part of get, set and subscribe requests.

    ``device``, ``property``, ``selector`` come from the already parsed header; ``filters``
    and ``timeout`` decode the REQUEST_CONTEXT frame on first access (in the worker, never on
    the dispatcher). ``received_at`` is the server clock when the dispatcher got the message.
    """

    __slots__ = (
        "_argument",
        "_filters",
        "_on_answer",
        "_on_late",
        "_responder",
        "client",
        "deadline",
        "handler_caller",
        "held_reply",
        "message",
        "received_at",
    )

    def __init__(
        self,
        message: Message,
        client: ClientInfo,
        received_at: float,
        responder: Responder,
        on_late: Callable[[], None] | None = None,
        filters: Data | None = _UNSET,
    ) -> None:
        self.message = message
        self.client = client
        self.received_at = received_at
        self._responder: Responder | None = responder
        self._filters = filters
        # Set by the server when a deadline is registered, so the answer can cancel it.
        self._on_answer: Callable[[], None] | None = None
        # Counts answers that came too late (the server's statistics).
        self._on_late = on_late
        # When the client gives up (server clock), set by the runner before the handler runs:
        # an answer after it is counted ``timeout`` and not sent (RequestRunner.respond).
        self.deadline = float("inf")
        # The runner's, for a get's zero-copy reply (rda.business.server.replies): the frame
        # below this get's handler while it runs (the runner's, or the Python frame that
        # called the compiled runner; None otherwise), where the frames a reply completed
        # inside the handler can be held by end; and the reply held back until the handler
        # returns.
        self.handler_caller: FrameType | None = None
        self.held_reply: AcquiredData | None = None
        # What a get's handler passed ``complete()``, while its answer is settled (else
        # None): the zero-copy hand-over counts its holders (completed_with).
        self._argument: object = None

    def __repr__(self) -> str:
        h = self.header
        state = "answered" if self.done else "pending"
        return f"<{type(self).__name__} {h.device}/{h.property} selector={h.selector!r} {state}>"

    @property
    def header(self) -> Header:
        return self.message.header

    @property
    def id(self) -> int:
        return self.message.header.id

    @property
    def device(self) -> str:
        return self.message.header.device

    @property
    def selector(self) -> str:
        return self.message.header.selector

    @property
    def filters(self) -> Data | None:
        if self._filters is _UNSET:
            self._filters = self.message.filters
        filters: Data | None = self._filters
        return filters

    @property
    def timeout(self) -> float | None:
        """The client's deadline for this request in seconds (None if it sent none)."""
        return self.message.timeout

    @property
    def done(self) -> bool:
        return self._responder is None

    # Last in the class body: once defined, the name ``property`` here means this accessor.
    @property
    def property(self) -> str:
        return self.message.header.property

    # -- the server's side of answering (the runner; handlers call complete/fail) --------------

    def settle(self, result: AcquiredData | None, error: BaseException | None) -> bool:
        """Deliver the one answer; False (and nothing sent) when one was already given.

        What ``complete``/``fail`` call, and what the runner calls when the handler raised,
        the queue was full or the deadline passed."""
        # acquire/release, not ``with``: compiled, ``with`` makes two bound methods and calls
        # ``__exit__`` with three arguments, once per get.
        _ANSWER_LOCK.acquire()
        try:
            responder = self._responder
            self._responder = None
            on_answer = self._on_answer
            self._on_answer = None
        finally:
            _ANSWER_LOCK.release()
        if responder is None:
            return False
        if on_answer is not None:
            on_answer()
        responder(self, result, error)
        return True

    def watch_deadline(self, cancel: Callable[[], None]) -> bool:
        """Attach a deadline's cancel function (called by the answer); False (the caller
        cancels) if already answered."""
        with _ANSWER_LOCK:
            if self._responder is None:
                return False
            self._on_answer = cancel
            return True

    def _late(self, what: str) -> None:
        if self._on_late is not None:
            self._on_late()
        _late_log.log(
            "late answers", "%r: %s ignored, the request was already answered", self, what
        )


class _Completable(ServerRequest):
    __slots__ = ()

    def fail(self, error: str | BaseException) -> None:
        """Answer with an EXCEPTION. A string becomes a remote error with that message; an
        rda error keeps its type at the client (e.g. ``NoSuchDeviceError``)."""
        exc = error if isinstance(error, BaseException) else ServerError(str(error))
        if not self.settle(None, exc):
            self._late("fail()")


class ServerError(Exception):
    """``request.fail("message")``: the client gets ``RemoteError("ServerError", message)``."""


class GetRequest(_Completable):
    """A get: answer with ``complete(AcquiredData(...))`` (a bare ``Data`` is accepted too).

    A value without an acquisition stamp (no ``DataContext``, or ``acq_stamp == 0``) is
    stamped with the wall-clock time of the ``complete`` call (docs/server.md)."""

    __slots__ = ()

    def complete(self, acquired: AcquiredData | Data | None = None) -> None:
        if acquired is None:
            if not self.settle(
                None, ValueError(f"{self.device}/{self.property}: get completed without data")
            ):
                self._late("complete()")
            return
        answer = stamped_data(acquired) if isinstance(acquired, Data) else stamped(acquired)
        # The runner's zero-copy hand-over counts the holders of what the handler passed,
        # which, this method compiled, no frame shows (completed_with).
        self._argument = acquired
        try:
            settled = self.settle(answer, None)
        finally:
            self._argument = None
        if not settled:
            self._late("complete()")


def completed_with(request: ServerRequest) -> object:
    """While a get's ``complete(x)`` settles its answer (its responder runs): ``x``; else None.
    The runner's zero-copy hand-over counts its holders (rda.business.server.replies)."""
    return request._argument


class SetRequest(_Completable):
    """A set: ``data`` is decoded on first access; answer with ``complete()`` or ``fail()``."""

    __slots__ = ()

    @property
    def data(self) -> Data:
        data = self.message.data
        if data is None:
            # The set carried no DATA frame: say so instead of handing the handler a None.
            raise ValueError(f"{self.device}/{self.property}: set request carries no data")
        return data

    def complete(self, acquired: AcquiredData | Data | None = None) -> None:
        """Acknowledge the set (any argument is ignored: a set reply has no body)."""
        if not self.settle(None, None):
            self._late("complete()")


class SubscriptionRequest(ServerRequest):
    """A subscribe: ``accept()`` registers the subscriber (and sends it a FIRST update);
    ``reject(reason)`` answers SUBSCRIBE_EXCEPTION. Either may be called later, from any thread."""

    __slots__ = ()

    def accept(self) -> None:
        if not self.settle(None, None):
            self._late("accept()")

    def reject(self, reason: str | BaseException) -> None:
        exc = reason if isinstance(reason, BaseException) else SubscriptionRejected(str(reason))
        if not self.settle(None, exc):
            self._late("reject()")


class SubscriptionRejected(Exception):
    """``request.reject("reason")`` with a plain string."""


class RequestReplyCallback:
    """Serve get and set. The defaults answer NoSuchDeviceError naming the access point."""

    def get(self, request: GetRequest) -> None:
        raise NoSuchDeviceError(f"{request.device}/{request.property}: no get handler")

    def set(self, request: SetRequest) -> None:
        raise NoSuchDeviceError(f"{request.device}/{request.property}: no set handler")


def describe_error(error: BaseException) -> tuple[str, str]:
    """(type name, message) for an EXCEPTION frame. rda error types travel under their own
    name so the client re-creates them, decode and protocol errors under the name that says
    whose fault (``wire_type``); a ``RemoteError`` (say, relayed from another server) keeps the
    type it carries."""
    if isinstance(error, RemoteError):
        return error.type, error.message
    return wire_type(error), str(error)


def new_request(
    message: Message,
    client: ClientInfo,
    received_at: float,
    responder: Responder,
    on_late: Callable[[], None] | None = None,
) -> ServerRequest:
    """The request object for GET, SET or SUBSCRIBE (dispatcher thread: no decoding)."""
    rtype = message.header.request_type
    if rtype is RequestType.GET:
        return GetRequest(message, client, received_at, responder, on_late=on_late)
    if rtype is RequestType.SET:
        return SetRequest(message, client, received_at, responder, on_late=on_late)
    if rtype is RequestType.SUBSCRIBE:
        return SubscriptionRequest(message, client, received_at, responder, on_late=on_late)
    raise ValueError(f"no request object for {rtype.name}")


# REQUEST_CONTEXT frame bytes -> the client's timeout. A client sends the same few frames over
# and over (its default timeout, no filters: the client encodes each such frame once), so the
# worker decodes each distinct one once instead of running the binary codec for every request.
_TIMEOUTS: dict[bytes, float | None] = {}
_TIMEOUTS_MAX = 256
_TIMEOUT_FRAME_MAX = 64
# Read once: each ``BodyKind.X`` read goes through the enum class's ``__getattr__`` hook on
# Python 3.11 (ten times a module global's cost).
_REQUEST_CONTEXT = BodyKind.REQUEST_CONTEXT


def client_timeout(message: Message) -> float | None:
    """The client's timeout of a request (None: it sent none); DecodeError for a bad frame."""
    frame = message.frame(_REQUEST_CONTEXT)
    if frame is None or len(frame) > _TIMEOUT_FRAME_MAX:
        return message.timeout
    key = bytes(frame)
    try:
        return _TIMEOUTS[key]
    except KeyError:
        pass
    timeout = message.timeout  # raises DecodeError for a bad frame: nothing is cached then
    if len(_TIMEOUTS) < _TIMEOUTS_MAX:
        _TIMEOUTS[key] = timeout
    return timeout


def timeout_error(request: ServerRequest, timeout: float, queued: bool) -> TimeoutError:
    """The TimeoutError of a request the server did not answer by its deadline."""
    where = "waited in the queue past" if queued else "was not completed within"
    return TimeoutError(
        f"{request.device}/{request.property}: {request.header.request_type.name} {where} "
        f"the client's deadline of {timeout:.3g} s"
    )


class _Entry:
    __slots__ = ("callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False


class DeadlineWatcher:
    """One thread and a heap: runs a callback when its deadline (on ``clock``) has passed.

    ``cancel`` only marks an entry (O(1)); cancelled entries are skipped when they surface and
    the heap is compacted when they outnumber the live ones. The thread sleeps until the
    earliest deadline but at most ``max_wait`` seconds of real time, so an injected fake clock
    that jumps ahead is noticed; ``run_due()`` checks at once (what tests with a fake clock call).
    """

    def __init__(
        self, clock: Clock = time.monotonic, name: str = "rda-deadlines", max_wait: float = 0.5
    ) -> None:
        self._clock = clock
        self._max_wait = max_wait
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Entry]] = []
        self._counter = itertools.count()
        self._cancelled = 0
        self._closed = False
        self.name = name
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._started = False
        # A simulation's driver runs the due callbacks itself (rda.business.driver).
        self._driver = current_driver()

    def start(self) -> None:
        with self._cond:
            if self._started or self._closed:
                return
            self._started = True
        if self._driver is not None:
            self._driver.adopt(self)
            return
        self._thread.start()

    def add(self, deadline: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Schedule ``callback``; returns a cancel function (cheap, idempotent)."""
        entry = _Entry(deadline, callback)
        with self._cond:
            if self._closed:
                return _noop
            earliest = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, next(self._counter), entry))
            if earliest:
                self._cond.notify()
        return lambda: self._cancel(entry)

    def _cancel(self, entry: _Entry) -> None:
        with self._cond:
            if entry.cancelled:
                return
            entry.cancelled = True
            self._cancelled += 1
            if self._cancelled > 1024 and self._cancelled * 2 > len(self._heap):
                self._heap = [item for item in self._heap if not item[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def wake(self) -> None:
        """Re-check the earliest deadline now (a fake clock calls this when it advances)."""
        with self._cond:
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._heap) - self._cancelled

    def _pop_due(self, now: float) -> list[_Entry]:
        due: list[_Entry] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.cancelled:
                self._cancelled -= 1
            else:
                # Marked so that a cancel arriving now is a no-op, not a miscount.
                entry.cancelled = True
                due.append(entry)
        return due

    def run_due(self) -> int:
        """Run every callback whose deadline has passed, in this thread; returns how many."""
        with self._cond:
            due = self._pop_due(self._clock())
        for entry in due:
            _run(entry.callback)
        return len(due)

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._closed:
                        return
                    due = self._pop_due(self._clock())
                    if due:
                        break
                    if self._heap:
                        wait = min(self._max_wait, max(0.0, self._heap[0][0] - self._clock()))
                        cond.wait(wait)
                    else:
                        cond.wait()
            for entry in due:
                _run(entry.callback)

    def close(self, timeout: float = 2.0) -> None:
        """Idempotent: forget every deadline and join the thread."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify_all()
        if self._driver is not None:
            if self._started:
                self._driver.release(self)
        elif self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- driven (rda.business.driver) -------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest live deadline (cancelled entries on top are dropped first)."""
        with self._cond:
            heap = self._heap
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
                self._cancelled -= 1
            return heap[0][0] if heap else None

    def ready(self) -> bool:
        # Read without the lock (a driver's one thread; asked before every step): a cancelled
        # entry on top may say True, and the step then only drops it.
        heap = self._heap
        return bool(heap) and heap[0][0] <= self._clock()

    def step(self) -> None:
        self.run_due()


def _noop() -> None:
    return None


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        log.exception("deadline callback raised")
