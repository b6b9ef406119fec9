"""The client's request table: request ids, the requests waiting for their reply, their
deadlines, and how each one ends: exactly once, with the counters that ending changes.

Every request a ``ClientService`` sends takes an id from one counter (subscriptions take
theirs from it too) and has an entry here until it ends: by its reply, by its deadline, by the
loss of the connection it went on, or by the client closing. Two tables: requests sent through
the shared connections, whose deadlines are on the timer (:meth:`RequestTable.add`), and
requests on callers' lanes (lanes.py, :meth:`RequestTable.add_lane`), whose callers watch their
own deadline. A lane is taken only while the shared table is empty (``shared_waiting``), so a
request on a lane never overtakes one sent before it through the shared connection.

Exactly once: a request ends when its entry is removed, every removal happens under the
table's lock, and whoever removed the entry completes the request. The counters that an ending
changes (replies, errors, late replies, timeouts, disconnected requests, the round-trip
histograms) are updated in the same critical section: one lock acquisition per completion, and
no count is lost however many threads complete requests at once (the dispatcher, lane callers,
the timer, a closing thread). The request is completed (its caller woken) after the lock is
released.

Adding an entry takes no lock: one dict store, then a look at ``closed``. :meth:`close` sets
``closed`` (under the lock) before it removes the entries one at a time, so an entry stored as
the client closes is removed either by close or by the adder's own look, never by both nor by
neither. The adder's caller closes the same gap for a connection lost at that moment by
checking the connection again after adding (``ClientService``; :meth:`connection_lost` scans a
snapshot).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rda.business.client.replies import LaneCompletion, Pending, complete
from rda.business.client.statistics import ROUND_TRIP_TYPES
from rda.business.client.timer import Timer
from rda.business.histogram import CappedHistograms, HistogramSnapshot
from rda.serialization.errors import (
    DisconnectedError,
    NotAuthorizedError,
    RdaError,
    TimeoutError,
)
from rda.serialization.header import RequestType
from rda.serialization.message import Message
from rda.transport.reasons import HANDSHAKE_REFUSED, NEVER_CONNECTED, NOT_RDA

__all__ = ["RequestCounts", "RequestTable", "connection_ended", "disconnect_error"]

# Enum members read once: each ``RequestType.X`` (``BodyKind.X``, ``Kind.X``) read goes through
# the enum class's ``__getattr__`` hook on Python 3.11, ten times a module global's cost.
_EXCEPTION = RequestType.EXCEPTION


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """The request table's part of ``ClientStatistics`` (same names, same meanings)."""

    requests: int
    replies: int
    errors: int
    pending: int
    timeouts: int
    late_replies: int
    disconnected_requests: int
    round_trips: tuple[dict[str, HistogramSnapshot], dict[str, HistogramSnapshot]]


def disconnect_error(p: Pending, address: str, reason: str) -> RdaError:
    """The error a request ends with when the connection it went on is lost."""
    if reason.startswith(HANDSHAKE_REFUSED):
        # Retrying cannot help: the server does not accept this client (or its key).
        return NotAuthorizedError(f"{p.op} {p.device}/{p.property}: {address}: {reason}")
    if reason.startswith(NOT_RDA):
        # Not "lost": there never was an rda connection (a wrong port, another service).
        return DisconnectedError(f"{p.op} {p.device}/{p.property}: {reason}")
    return DisconnectedError(f"{p.op} {p.device}/{p.property}: {connection_ended(address, reason)}")


def connection_ended(address: str, reason: str) -> str:
    """How a connection to ``address`` ended, in words: ``could not connect`` when it never
    was up (nothing listens there), else ``lost``."""
    if reason in NEVER_CONNECTED:
        return f"could not connect to {address} ({reason})"
    return f"connection to {address} lost ({reason})"


class RequestTable:
    """Ids, pending requests, deadlines and completion (see the module docstring).

    ``clock`` is the client's clock; ``max_wait`` makes the timer thread re-read a clock it
    cannot sleep on (a fake one); ``device_limit`` caps the per-device round-trip histograms.
    The table's timer (:attr:`timer`) also runs the client's other delayed work (reconnection
    attempts, directory moves).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        device_limit: int = 200,
        max_wait: float | None = None,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # ``next`` on an itertools.count is atomic: ids need no lock.
        self._ids = itertools.count(1)
        self._made = itertools.count()
        # ``new_id()``: an id that is not a request's (a subscription's). ``count_request()``:
        # count a request about to be made (in ``requests``; a lane request is counted by
        # ``add_lane``). The counters' own ``__next__``: no Python frame on the request path.
        self.new_id: Callable[[], int] = self._ids.__next__
        self.count_request: Callable[[], int] = self._made.__next__
        self._shared: dict[int, Pending] = {}
        # Requests on lanes: apart from ``_shared``, whose emptiness says "nothing sent through
        # the shared connections is in flight".
        self._lane: dict[int, Pending] = {}
        # Set once by close(); read without the lock (see the module docstring).
        self.closed = False
        # The number of requests sent through a shared connection still waiting (a lane is
        # taken only when it is 0): the table's own ``__len__``, no Python frame per call.
        self.shared_waiting: Callable[[], int] = self._shared.__len__
        # Counters, written under ``_lock`` only.
        self._replies = 0
        self._errors = 0
        self._late = 0
        self._timeouts = 0
        self._disconnected = 0
        self._round_trips = CappedHistograms(ROUND_TRIP_TYPES, device_limit, self._lock)
        self.timer = Timer(
            clock, max_wait=max_wait, expire=self.expire, live=self._shared.__contains__
        )

    # -- ids and entries ---------------------------------------------------------------------

    def add(self, pending: Pending) -> int:
        """Register a request sent through a shared connection, with its deadline on the
        timer: its id; 0 when the client closed meanwhile (the request is then ended: client
        closed). The caller counted it with ``count_request`` when it set out to make it."""
        rid = next(self._ids)
        self._shared[rid] = pending
        if self.closed:
            self._end_closed(rid)
            return 0
        # No handle to cancel: an ending removes the entry, and the timer skips a dead key.
        self.timer.deadline(pending.sent_at + pending.timeout, rid)
        return rid

    def add_lane(self, pending: Pending) -> int:
        """Register a request on a caller's lane (its caller watches the deadline): its id,
        counted in ``requests``; 0 when the client closed meanwhile (the request is then
        ended: client closed)."""
        next(self._made)
        rid = next(self._ids)
        self._lane[rid] = pending
        if self.closed:
            self._end_closed(rid)
            return 0
        return rid

    # -- endings -----------------------------------------------------------------------------

    def waiting(self, rid: int) -> bool:
        """Request ``rid`` still waits in the shared table (not answered, expired, failed)."""
        return rid in self._shared

    def reply(self, message: Message) -> None:
        """A REPLY or EXCEPTION arrived on a shared connection (dispatcher thread)."""
        # acquire/release, not ``with``: compiled, ``with`` makes two bound methods and calls
        # ``__exit__`` with three arguments, once per reply.
        lock = self._lock
        lock.acquire()
        try:
            p = self._shared.pop(message.header.id, None)
            if p is None:
                self._late += 1  # ended already (deadline, cancel): dropped
                return
            elapsed = self._clock() - p.sent_at
            if elapsed > p.timeout:
                # Its deadline passed before the timer ran (a paused or starved process):
                # it ends as at its deadline; no value reaches a user after its timeout.
                self._late += 1
                self._timeouts += 1
                late = True
            else:
                late = False
                if message.header.request_type is _EXCEPTION:
                    self._errors += 1
                else:
                    self._replies += 1
                self._round_trips.add(p.op, p.device, elapsed)
        finally:
            lock.release()
        complete(p.future, _timeout_error(p) if late else message)

    def lane_reply(self, rid: int, message: Message, done: LaneCompletion) -> Message:
        """The reply a caller read on its lane: the message, or, when the request ended
        meanwhile (deadline, disconnection, close), that outcome (raised)."""
        with self._lock:
            p = self._lane.pop(rid, None)
            if p is None:
                self._late += 1
            else:
                if message.header.request_type is _EXCEPTION:
                    self._errors += 1
                else:
                    self._replies += 1
                self._round_trips.add(p.op, p.device, self._clock() - p.sent_at)
                return message
        outcome = done.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None  # whoever removed the entry recorded an outcome
        return outcome

    def count_late(self) -> None:
        """An answer for an id nothing waits for (a notification of an ended subscription, or
        one from the server a subscription moved away from)."""
        with self._lock:
            self._late += 1

    def expire(self, rid: int) -> None:
        """Request ``rid``'s deadline passed (the timer, or a lane caller): it ends with
        ``rda.TimeoutError``, unless it ended already."""
        with self._lock:
            p = self._take(rid)
            if p is None:
                return
            self._timeouts += 1
        complete(p.future, _timeout_error(p))

    def abandon(self, rid: int) -> None:
        """The caller cancelled its future: forget the request (a reply is then late)."""
        with self._lock:
            self._shared.pop(rid, None)

    def disconnected(self, rid: int, address: str, reason: str) -> None:
        """Request ``rid``'s connection to ``address`` was lost (``reason``)."""
        with self._lock:
            p = self._take(rid)
            if p is None:
                return
            self._disconnected += 1
        complete(p.future, disconnect_error(p, address, reason))

    def connection_lost(self, connection: int, address: str, reason: str) -> None:
        """End every request, shared or on a lane, that went on ``connection``."""
        lost: list[Pending] = []
        with self._lock:
            for table in (self._shared, self._lane):
                # A snapshot: adders store without the lock; one that stores after it sees the
                # connection gone and ends its request itself.
                for rid, p in list(table.items()):
                    if p.connection == connection:
                        del table[rid]
                        lost.append(p)
            self._disconnected += len(lost)
        for p in lost:
            complete(p.future, disconnect_error(p, address, reason))

    def close(self) -> None:
        """End every pending request: the client closes. Idempotent."""
        ended: list[Pending] = []
        with self._lock:
            self.closed = True
            for table in (self._shared, self._lane):
                # One entry at a time (popitem is atomic): an entry stored meanwhile is taken
                # by a later round, or by its adder, who sees ``closed``.
                while table:
                    ended.append(table.popitem()[1])
            self._disconnected += len(ended)
        for p in ended:
            complete(p.future, self._closed_error(p))

    def _end_closed(self, rid: int) -> None:
        with self._lock:
            p = self._take(rid)
            if p is None:
                return  # close took it
            self._disconnected += 1
        complete(p.future, self._closed_error(p))

    @staticmethod
    def _closed_error(p: Pending) -> RdaError:
        return DisconnectedError(f"{p.op} {p.device}/{p.property}: client closed")

    def _take(self, rid: int) -> Pending | None:
        # Lock held.
        p = self._shared.pop(rid, None)
        if p is None:
            p = self._lane.pop(rid, None)
        return p

    # -- statistics ---------------------------------------------------------------------------

    def counts(self) -> RequestCounts:
        """The counters and the requests in flight (read together under the lock), and the
        round-trip histograms."""
        with self._lock:
            counts = (
                # The count is readable only through its repr, "count(N)".
                int(repr(self._made)[6:-1]),
                self._replies,
                self._errors,
                len(self._shared) + len(self._lane),
                self._timeouts,
                self._late,
                self._disconnected,
            )
        return RequestCounts(*counts, round_trips=self._round_trips.snapshot())


def _timeout_error(p: Pending) -> TimeoutError:
    return TimeoutError(
        f"{p.op} {p.device}/{p.property}: no reply within {p.timeout:g} s (request abandoned)"
    )
