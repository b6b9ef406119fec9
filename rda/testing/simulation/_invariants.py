"""The invariants users rely on, checked as the simulation runs (each with a name).

Observers sit where a user sits: a subscription's listener, a request's future, the values
a device published. What they see is compared with what the servers did; a broken invariant
is recorded at once (a listener runs inside the client's scheduler, which would swallow an
exception) and raised by the simulation right after the step that broke it.

Names (docs/testing.md, "Invariants"):

* ``first-after-subscribe``: a subscription's first value, and its first value after each
  error (a lost connection), is a FIRST update;
* ``sequence-increases``: within one epoch (from a FIRST on) sequence numbers increase;
* ``received-plus-gaps``: within one epoch each update's value is the one published right
  after the previous update's value plus the gap it reports: nothing missed without a count;
  only the first update after a FIRST may count more than it missed (updates published
  while the FIRST's get ran, which the FIRST may already show), never fewer;
* ``nothing-after-unsubscribe``: no notification after ``Subscription.close()`` returned;
* ``exactly-once``: every request ends once (reply, error or timeout), by its deadline, and
  not as a timeout before it (time is the monotonic clock's: a wall-clock step must not end
  a request early);
* ``no-reply-after-timeout``: no value reaches the user after the request's timeout;
* ``set-then-get``: a get started after a set was acknowledged (and no other set started
  since) returns that set's value, or that of a set which ended in doubt and was applied
  later, having left its client before it ended (``Checker._applied_late``);
* ``rbac``: a set reaches its handler only if a policy in force since the request arrived
  allows it (checked by the simulation's device, which knows the policies it put in force);
* ``no-internal-error``: nothing in rda logs an error the faults did not cause;
* ``bounded``: with the faults over, no request pending in a client, and every client and
  server holds exactly the subscriptions still open (``Simulation._bounded``);
* ``progress``: with the faults over, every open subscription has the last published value,
  and the run ends (no livelock);
* ``heartbeat``: a connection is dropped as silent only when a fault silenced one of its
  ends (``Simulation._heartbeats``): a wall-clock step must not stall a heartbeat;
* ``monotonic-durations``: the durations a server reports (admin ``info``'s ``uptime``,
  ``clients``' ``connected_for``) agree with the simulated time since it started, whatever
  its wall clock did.
"""

from __future__ import annotations

import heapq
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rda.business.client.subscriptions import Notification
from rda.serialization.header import UpdateType
from rda.testing.simulation._model import InvariantBroken

__all__ = ["AdminWatch", "Checker", "InjectedFault", "RequestWatch", "SubWatch"]


class InjectedFault(RuntimeError):
    """What a handler raises when the simulation injects a handler error."""


@dataclass(slots=True, eq=False)
class SubWatch:
    """One subscription as its user sees it."""

    checker: Checker
    label: str
    client: str
    key: tuple[str, str]  # (device, property) published with a counter ``k``
    subscription: Any = None
    closed: bool = False
    epoch: bool = False
    last_k: int = -1
    last_seq: int = 0
    received: int = 0
    gaps: int = 0
    errors: int = 0
    last_error: str = ""  # the class of the last error it heard of
    # The next update is the first after a FIRST: its gap may count updates the FIRST
    # already showed (published while the FIRST's get ran: the server cannot tell).
    after_first: bool = False
    seam_overcounted: int = 0

    def listener(self, n: Notification) -> None:
        checker = self.checker
        if self.closed:
            checker.broken("nothing-after-unsubscribe", f"{self.label} got {n!r} after close()")
            return
        if n.error is not None:
            self.errors += 1
            self.last_error = type(n.error).__name__
            # A FIRST that carries the server's failed get opens the epoch without a value;
            # any other error (a lost connection) ends it.
            self.epoch = n.update_type is UpdateType.FIRST
            self.last_k, self.last_seq = -1, n.seq
            return
        k = int(n.data["k"])
        self.received += 1
        if n.update_type is UpdateType.FIRST:
            self.epoch = True
            self.after_first = True
            self.last_k, self.last_seq = k, n.seq
            return
        if not self.epoch:
            checker.broken(
                "first-after-subscribe",
                f"{self.label}: a {n.update_type.name} update (k={k}, seq={n.seq}) before "
                "any FIRST of this epoch",
            )
            return
        if n.seq <= self.last_seq:
            checker.broken(
                "sequence-increases", f"{self.label}: seq {n.seq} after seq {self.last_seq}"
            )
        expected = self.last_k + n.gap + 1
        seam = self.after_first
        self.after_first = False
        if seam and self.last_k < k < expected:
            # Counted, not missing, right after the FIRST: allowed (docs/client.md).
            self.seam_overcounted += expected - k
        elif k != expected and self.last_k >= 0:
            checker.broken(
                "received-plus-gaps",
                f"{self.label}: after k={self.last_k} got k={k} reporting gap={n.gap} "
                f"(seq {self.last_seq} -> {n.seq}): {k - expected} update(s) "
                + ("missing without a count" if k > expected else "counted but not missing"),
            )
        self.gaps += n.gap
        self.last_k, self.last_seq = k, n.seq


@dataclass(slots=True, eq=False)
class RequestWatch:
    """One request as its user sees it."""

    label: str
    client: str
    issued: float
    timeout: float
    ends: int = 0
    outcome: str = ""
    value: Any = None
    ended_at: float = -1.0
    paused: bool = False  # its client was paused meanwhile: its deadline moves with the pause
    set_key: tuple[str, str] | None = None
    set_value: int | None = None
    get_key: tuple[str, str] | None = None
    certain: int | None = None  # the value a get must return (set-then-get), if known
    generation: int = 0


@dataclass(slots=True, eq=False)
class AdminWatch(RequestWatch):
    """An admin command: a request, whose reply carries durations to check."""

    command: str = ""
    server: Any = None  # the SimServer asked
    lives: int = 0  # its incarnation when asked
    started: float = 0.0  # when that incarnation started (simulated, monotonic)

    def check_reply(self, checker: Checker, reply: Any, now: float) -> None:
        """``monotonic-durations``, when the incarnation asked is the one that answered."""
        s = self.server
        if s.lives != self.lives or s.down:
            return  # restarted meanwhile: which incarnation answered is not known
        longest = now - self.started + 1e-6
        if self.command == "info":
            uptime = float(reply["uptime"])
            shortest = self.issued - self.started - 1e-6
            if not shortest <= uptime <= longest:
                checker.broken(
                    "monotonic-durations",
                    f"{self.label}: uptime {uptime:.6f} s, but the server started "
                    f"{self.issued - self.started:.6f} s before the request and "
                    f"{now - self.started:.6f} s before the reply",
                )
        elif self.command == "clients":
            for row in reply["clients"]:
                connected_for = float(row["connected_for"])
                if not 0.0 <= connected_for <= longest:
                    checker.broken(
                        "monotonic-durations",
                        f"{self.label}: a client connected for {connected_for:.6f} s, but "
                        f"the server started {now - self.started:.6f} s ago",
                    )


@dataclass(slots=True)
class _SetState:
    """What is known of one settable property's value."""

    value: int | None = 0  # None: unknown (a set ended unacknowledged, or sets overlapped)
    open_sets: int = 0
    generation: int = 0  # bumped by each set started (a get started before it may see either)
    last_ack: int | None = None
    doubtful: bool = False  # since the last quiet moment: overlapping or unacknowledged sets


class Checker:
    """Collects what observers saw; ``check()`` raises the first broken invariant."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.failures: list[InvariantBroken] = []
        self.subs: list[SubWatch] = []
        self.requests: list[RequestWatch] = []
        self._deadlines: list[tuple[float, int, RequestWatch]] = []
        self._order = 0
        self.sets: dict[tuple[str, str], _SetState] = {}
        self.ended = 0
        self.notifications = 0
        # set-then-get's knowledge of the servers: each property's values in the order they
        # were applied, and when the set carrying each value left its client.
        self.applied: dict[tuple[str, str], list[int]] = {}
        self.set_sent: dict[int, float | None] = {}
        self.set_watches: dict[int, RequestWatch] = {}
        self.late_sets = 0  # sets applied after their user saw them time out (legit, counted)

    def broken(self, name: str, message: str) -> None:
        self.failures.append(InvariantBroken(name, message, self.clock()))

    def check(self) -> None:
        if self.failures:
            raise self.failures[0]
        now = self.clock()
        heap = self._deadlines
        while heap and heap[0][0] < now:
            _, _, watch = heapq.heappop(heap)
            if watch.ends == 0 and not watch.paused:
                self.broken(
                    "exactly-once",
                    f"{watch.label} (timeout {watch.timeout} s, issued at {watch.issued:.6f}) "
                    "has not ended by its deadline",
                )
                raise self.failures[0]

    # --- requests ---

    def request(self, watch: RequestWatch, future: Future[Any]) -> None:
        self.requests.append(watch)
        if watch.set_key is not None:
            assert watch.set_value is not None
            self.set_watches[watch.set_value] = watch
            state = self.sets.setdefault(watch.set_key, _SetState())
            if state.open_sets:
                state.doubtful = True  # applied in an order nobody can know
            state.open_sets += 1
            state.generation += 1
        if watch.get_key is not None:
            state = self.sets.setdefault(watch.get_key, _SetState())
            if state.open_sets == 0 and state.value is not None:
                watch.certain = state.value
                watch.generation = state.generation
        self._order += 1
        # A little after the deadline: the client's timer fires at it, in some step.
        heapq.heappush(self._deadlines, (watch.issued + watch.timeout + 1e-3, self._order, watch))
        future.add_done_callback(lambda f: self._ended(watch, f))

    def _ended(self, watch: RequestWatch, future: Future[Any]) -> None:
        now = self.clock()
        watch.ends += 1
        self.ended += 1
        if watch.ends > 1:
            self.broken("exactly-once", f"{watch.label} ended {watch.ends} times")
            return
        watch.ended_at = now
        error = future.exception()
        watch.outcome = "ok" if error is None else type(error).__name__
        late = now > watch.issued + watch.timeout + 1e-9
        if isinstance(error, TimeoutError) and now < watch.issued + watch.timeout - 1e-9:
            self.broken(
                "exactly-once",
                f"{watch.label}: ended as a timeout at t={now:.6f}, before its deadline "
                f"{watch.issued + watch.timeout:.6f} ({error})",
            )
        if error is None and late:
            self.broken(
                "no-reply-after-timeout",
                f"{watch.label}: a value at t={now:.6f}, after its deadline "
                f"{watch.issued + watch.timeout:.6f}",
            )
        if watch.set_key is not None:
            state = self.sets[watch.set_key]
            state.open_sets -= 1
            if error is None:
                state.last_ack = watch.set_value
            else:
                state.doubtful = True  # it may or may not have been applied
            if state.open_sets == 0:
                state.value = None if state.doubtful else state.last_ack
                state.doubtful = False
        if isinstance(watch, AdminWatch) and error is None:
            watch.check_reply(self, future.result(), now)
        if watch.get_key is not None and error is None and watch.certain is not None:
            state = self.sets[watch.get_key]
            got = int(future.result().data["v"])
            if state.generation == watch.generation and got != watch.certain:
                if self._applied_late(watch.get_key, got, watch.certain):
                    self.late_sets += 1
                    return
                self.broken(
                    "set-then-get",
                    f"{watch.label} returned v={got}, but the last acknowledged set wrote "
                    f"v={watch.certain} and no set started since",
                )

    def set_applied(self, key: tuple[str, str], value: int, sent: float | None) -> None:
        """A server's handler applied ``value`` (its set left its client at ``sent``)."""
        self.applied.setdefault(key, []).append(value)
        self.set_sent.setdefault(value, sent)

    def _applied_late(self, key: tuple[str, str], got: int, acknowledged: int) -> bool:
        """A set that ended in doubt (its user saw an error, a timeout) was applied after the
        acknowledged one: legit when it had left its client before it ended, held in a
        connection meanwhile (a partition, transit), which no client can recall and no
        server can tell from a fresh one. One sent after it ended would be a bug (a request
        ended is never sent: ``ClientSessions.flush``)."""
        late = self.set_watches.get(got)
        order = self.applied.get(key, [])
        if late is None or late.ends == 0 or late.outcome == "ok" or got not in order:
            return False
        sent = self.set_sent.get(got)
        if sent is None or sent > late.ended_at:
            return False
        after = len(order) - 1 - order[::-1].index(got)
        before = len(order) - 1 - order[::-1].index(acknowledged) if acknowledged in order else -1
        return after > before

    def pause_began(self, client: str) -> None:
        for watch in self.requests:
            if watch.client == client and watch.ends == 0:
                watch.paused = True

    def unfinished(self) -> list[RequestWatch]:
        return [w for w in self.requests if w.ends == 0]


class LogWatch(logging.Handler):
    """Errors logged by rda that no injected fault explains (``no-internal-error``)."""

    def __init__(self, checker: Checker) -> None:
        super().__init__(logging.ERROR)
        self.checker = checker
        self.explained = 0

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, InjectedFault):
            self.explained += 1
            return
        self.checker.broken(
            "no-internal-error",
            f"{record.name}: {record.getMessage()}"
            + (f" ({type(exc).__name__}: {exc})" if exc is not None else ""),
        )


@dataclass(slots=True)
class Totals:
    """What one run did (for the report)."""

    steps: int = 0
    simulated: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
