"""Snapshots of a running server, and the cheap counters behind them.

Every snapshot is a frozen dataclass: the admin commands and the Prometheus
collector read these, the hot path never calls a metrics library. Counting takes one lock and a
few integer increments per answered request (:class:`RequestCounters`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from rda.business.histogram import DURATION_BUCKETS, OTHER, Histogram, HistogramSnapshot, bucket_of
from rda.business.scheduler import SchedulerStatistics
from rda.transport.api import ServerTransportStatistics

__all__ = [
    "DENIED_PRINCIPALS",
    "DURATION_BUCKETS",
    "FAILURES",
    "OTHER",
    "OUTCOMES",
    "REQUEST_TYPES",
    "ClientSnapshot",
    "DeviceSnapshot",
    "HistogramSnapshot",
    "RequestCounters",
    "ServerStatistics",
    "SourceSnapshot",
]

#: How a request can end (the ``outcome`` label): ``outcomes.outcome_of`` maps an exception to
#: one of them; every (type, outcome) series exists from the start.
OUTCOMES: tuple[str, ...] = (
    "ok",
    "not_found",
    "bad_request",
    "denied",
    "overload",
    "timeout",
    "handler_error",
    "disconnected",
)
#: The outcomes that are not ``ok``.
FAILURES: frozenset[str] = frozenset(OUTCOMES[1:])
#: Most principals with denial series of their own (the overflow bucket is ``other``): a
#: clients directory of thousands of keys must not become thousands of series.
DENIED_PRINCIPALS = 100
#: The request types the server counts (lower case ``RequestType`` names).
REQUEST_TYPES: tuple[str, ...] = ("get", "set", "subscribe", "admin")


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    """Requests to one (device, property) pair: answered, failed (any outcome but ``ok``), and
    their durations. The pair (:data:`OTHER`, :data:`OTHER`) holds every request past the cap
    (and those to pairs that never answered ``ok``: a client's typo never gets a series)."""

    device: str
    property: str
    requests: int
    errors: int
    durations: HistogramSnapshot


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    """One connected client. ``peer`` is the hex routing id; ``connected_since`` and
    ``last_heard`` are wall-clock times (``time.time()``), ``connected_for`` is seconds on the
    server's monotonic clock (right across a step of the wall clock)."""

    peer: str
    info: dict[str, object]
    connected_since: float
    last_heard: float
    subscriptions: int
    connected_for: float = 0.0
    # From the transport: messages waiting for this client's pipe, and what its full pipe
    # cost it (notifications replaced by newer ones; messages dropped at the queue limit).
    queue_depth: int = 0
    conflated: int = 0
    dropped: int = 0
    # Who the server believes it is ("" = anonymous) and its roles under the policy in force.
    principal: str = ""
    roles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceSnapshot:
    """One subscription source, keyed by (device, property, selector, filters).

    ``notifications_sent`` counts messages handed to the transport (one per subscriber per
    update); ``errors_sent`` the NOTIFICATION_EXC among them; ``conflated``/``dropped`` what
    slow subscribers lost (the "why is my subscription blind?" view). ``last_update`` is the
    ``time.time()`` of the last ``notify``/``notify_error``, None before the first.
    """

    device: str
    property: str
    selector: str
    filters: dict[str, object] | None
    subscribers: int
    notifications_sent: int
    errors_sent: int
    last_update: float | None
    # Summed over this source's subscribers: updates a slow subscriber never saw because a
    # newer one replaced them (conflated) or its queue was full (dropped).
    conflated: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """Everything a server counts.

    ``requests`` is keyed by (request type in lower case: "get", "set", "subscribe", "admin";
    outcome in :data:`OUTCOMES`), every pair present from the start. ``durations`` holds one
    histogram per request type, from receipt by the dispatcher to the answer. ``devices`` holds
    the same per (device, property) pair for the first ``device_limit`` pairs that answered
    ``ok``, then the :data:`OTHER` bucket. ``handler_errors`` counts exceptions raised by user
    callbacks that are not a typed client error (``outcomes.outcome_of`` says
    ``handler_error``: a handler that raised still got an EXCEPTION reply); ``late_completions``
    counts ``complete``/``fail`` calls on a request that was already answered (for instance
    after its deadline). ``denied`` counts requests the authorization policy refused, keyed by
    (principal, operation), e.g. ("alice", "set") or ("anonymous", "admin:disconnect"), with
    both values bounded by the server's own configuration (the RBAC gate labels a declared
    principal the policy does not list ``other``, an unknown admin command ``admin:unknown``).
    ``connections_accepted``/``connections_closed`` count client connections (lanes apart).
    ``zero_copy_replies``/``copied_replies`` count get replies holding big writable arrays
    (64 KiB and more): sent without copying them, because the handler returned and nothing
    but the reply could reach them, or with a copy of at least one (the device kept it, or
    another thread completed the get; docs/server.md, "Big arrays without a copy").
    ``directory``: where the server registered and the state of that (etcd: registered,
    unreachable, replaced, overwritten...); ``directory_keys_overwritten``: how many of its
    etcd keys another wrote over to point elsewhere (0 when every key is its own). ``properties_in_alarm``: how many properties with declared alarm
    limits are in alarm now, by severity (``minor``, ``major``, ``invalid``; every key present),
    from the last value each sent.
    """

    transport: ServerTransportStatistics
    scheduler: SchedulerStatistics
    requests: dict[tuple[str, str], int]
    durations: dict[str, HistogramSnapshot]
    subscriptions: int
    sources: int
    notifications_sent: int
    handler_errors: int
    late_completions: int
    clients: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    denied: dict[tuple[str, str], int] = field(default_factory=dict)
    devices: tuple[DeviceSnapshot, ...] = ()
    device_limit: int = 0
    connections_accepted: int = 0
    connections_closed: int = 0
    directory: str = ""  # where the server is registered, and how that stands
    directory_keys_overwritten: int = 0
    zero_copy_replies: int = 0
    copied_replies: int = 0
    properties_in_alarm: dict[str, int] = field(default_factory=dict)


class _Count:
    """One (type, outcome) count: incremented in place, where an int in the dict took a new
    int and a dict store per answered request."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class _Pair:
    __slots__ = ("durations", "errors", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.durations = Histogram()


class RequestCounters:
    """Outcome counts and duration histograms per request type and per (device, property)
    pair, under one lock.

    Every (type, outcome) pair and every type's histogram exist from the start, so a series
    never appears late (Prometheus' ``increase`` would miss its first increments). A
    (device, property) pair gets its own figures once it answered ``ok`` and while fewer than
    ``device_limit`` pairs have them; the rest is counted in the :data:`OTHER` pair.
    """

    def __init__(self, device_limit: int = 200) -> None:
        self._lock = threading.Lock()
        self._requests = {(t, o): _Count() for t in REQUEST_TYPES for o in OUTCOMES}
        self._durations = {t: Histogram() for t in REQUEST_TYPES}
        self._handler_errors = 0
        self._late = 0
        self._denied: dict[tuple[str, str], int] = {}
        self._principals: set[str] = {OTHER}
        self._device_limit = device_limit
        self._pairs: dict[tuple[str, str], _Pair] = {}
        self._other = _Pair()
        self._accepted = 0
        self._closed = 0
        self._zero_copy = 0
        self._copied = 0

    @property
    def device_limit(self) -> int:
        return self._device_limit

    def record(
        self,
        request_type: str,
        outcome: str,
        duration: float | None,
        device: str | None = None,
        prop: str = "",
    ) -> None:
        """Count one answered request; ``duration`` None means "not timed" (no histogram);
        ``device`` None means "no device" (admin requests)."""
        key = (request_type, outcome)
        # acquire/release, not ``with``: compiled, ``with`` makes two bound methods and calls
        # ``__exit__`` with three arguments, once per answered request.
        lock = self._lock
        lock.acquire()
        try:
            count = self._requests.get(key)
            if count is None:
                count = self._requests[key] = _Count()
            count.n += 1
            index = 0
            if duration is not None:
                if duration < 0.0:
                    duration = 0.0
                index = bucket_of(duration)
                histogram = self._durations.get(request_type)
                if histogram is None:
                    histogram = self._durations[request_type] = Histogram()
                histogram.add(index, duration)
            if device is None:
                return
            pair = self._pairs.get((device, prop))
            if pair is None:
                # Only a pair the server answered ok for earns a series (a name a client made
                # up never does), and only up to the cap.
                if outcome == "ok" and len(self._pairs) < self._device_limit:
                    pair = self._pairs[(device, prop)] = _Pair()
                else:
                    pair = self._other
            pair.requests += 1
            if outcome != "ok":
                pair.errors += 1
            if duration is not None:
                pair.durations.add(index, duration)
        finally:
            lock.release()

    def tracked(self) -> set[tuple[str, str]]:
        """The (device, property) pairs that have figures of their own."""
        with self._lock:
            return set(self._pairs)

    def devices(self) -> tuple[DeviceSnapshot, ...]:
        """Per-pair figures, sorted, the :data:`OTHER` pair last."""
        with self._lock:
            pairs = sorted(self._pairs.items())
            pairs.append(((OTHER, OTHER), self._other))
            return tuple(
                DeviceSnapshot(d, p, c.requests, c.errors, c.durations.snapshot())
                for (d, p), c in pairs
            )

    def connection(self, opened: bool) -> None:
        with self._lock:
            if opened:
                self._accepted += 1
            else:
                self._closed += 1

    def connections(self) -> tuple[int, int]:
        """(accepted, closed) client connections."""
        with self._lock:
            return self._accepted, self._closed

    def array_reply(self, zero_copy: bool) -> None:
        """Count one get reply with big writable arrays: sent without copying them (nobody
        else could reach them), or with a copy of at least one."""
        with self._lock:
            if zero_copy:
                self._zero_copy += 1
            else:
                self._copied += 1

    def array_replies(self) -> tuple[int, int]:
        """(zero_copy_replies, copied_replies)."""
        with self._lock:
            return self._zero_copy, self._copied

    def denied(self, principal: str, operation: str) -> None:
        """Count one request refused by the policy (its outcome is counted by ``record``).
        The caller bounds both values by the server's configuration (policy, clients
        directory, admin commands); past :data:`DENIED_PRINCIPALS` principals, ``other``."""
        with self._lock:
            if principal not in self._principals:
                if len(self._principals) < DENIED_PRINCIPALS:
                    self._principals.add(principal)
                else:
                    principal = OTHER
            key = (principal, operation)
            self._denied[key] = self._denied.get(key, 0) + 1

    def denials(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._denied)

    def handler_error(self) -> None:
        with self._lock:
            self._handler_errors += 1

    def late_completion(self) -> None:
        with self._lock:
            self._late += 1

    def count(self, request_type: str, outcome: str) -> int:
        with self._lock:
            count = self._requests.get((request_type, outcome))
            return 0 if count is None else count.n

    def snapshot(
        self,
    ) -> tuple[dict[tuple[str, str], int], dict[str, HistogramSnapshot], int, int]:
        """(requests, durations, handler_errors, late_completions), copied under the lock."""
        with self._lock:
            return (
                {key: count.n for key, count in self._requests.items()},
                {name: h.snapshot() for name, h in self._durations.items()},
                self._handler_errors,
                self._late,
            )
