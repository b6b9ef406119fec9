"""Snapshots of a running server, and the cheap counters behind them.

Every snapshot is a frozen dataclass (STYLE.md 12): the admin commands and the Prometheus
collector read these, the hot path never calls a metrics library. Counting takes one lock and a
few integer increments per answered request (:class:`RequestCounters`).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

from rda.business.scheduler import SchedulerStatistics
from rda.transport.api import ServerTransportStatistics

__all__ = [
    "DURATION_BUCKETS",
    "OUTCOMES",
    "ClientSnapshot",
    "HistogramSnapshot",
    "RequestCounters",
    "ServerStatistics",
    "SourceSnapshot",
]

# Upper bounds (seconds) of the request-duration histogram; Prometheus' usual latency ladder
# stretched down to 100 µs because an in-memory get answers in well under a millisecond.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# How a request can end; the second half of the ``ServerStatistics.requests`` keys.
# "denied": refused by the authorization policy before any handler ran.
OUTCOMES: tuple[str, ...] = ("ok", "error", "timeout", "overload", "rejected", "denied")


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Durations of one request type. ``counts`` are per bucket, not cumulative; the last
    entry counts durations above the largest bound (+Inf)."""

    buckets: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    """One connected client. ``peer`` is the hex routing id; times are ``time.time()``."""

    peer: str
    info: dict[str, object]
    connected_since: float
    last_heard: float
    subscriptions: int
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
    outcome in :data:`OUTCOMES`). ``durations`` holds one histogram per request type, from
    receipt by the dispatcher to the answer. ``handler_errors`` counts exceptions raised by
    user callbacks (a handler that raised still got an EXCEPTION reply); ``late_completions``
    counts ``complete``/``fail`` calls on a request that was already answered (for instance
    after its deadline). ``denied`` counts requests the authorization policy refused, keyed by
    (principal, operation), e.g. ("alice", "set") or ("anonymous", "admin:disconnect").
    ``directory``: where the server registered and the state of that (etcd: registered,
    unreachable, replaced...).
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
    directory: str = ""  # where the server is registered, and how that stands


class _Histogram:
    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        # bisect_left: a duration equal to a bound belongs to that bound's bucket (le=bound).
        self.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(DURATION_BUCKETS, tuple(self.counts), self.sum, self.count)


class RequestCounters:
    """Outcome counts and duration histograms per request type, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        self._durations: dict[str, _Histogram] = {}
        self._handler_errors = 0
        self._late = 0
        self._denied: dict[tuple[str, str], int] = {}

    def record(self, request_type: str, outcome: str, duration: float | None) -> None:
        """Count one answered request; ``duration`` None means "not timed" (no histogram)."""
        key = (request_type, outcome)
        with self._lock:
            self._requests[key] = self._requests.get(key, 0) + 1
            if duration is not None:
                histogram = self._durations.get(request_type)
                if histogram is None:
                    histogram = self._durations[request_type] = _Histogram()
                histogram.observe(max(0.0, duration))

    def denied(self, principal: str, operation: str) -> None:
        """Count one request refused by the policy (its outcome is counted by ``record``)."""
        key = (principal, operation)
        with self._lock:
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
            return self._requests.get((request_type, outcome), 0)

    def snapshot(
        self,
    ) -> tuple[dict[tuple[str, str], int], dict[str, HistogramSnapshot], int, int]:
        """(requests, durations, handler_errors, late_completions), copied under the lock."""
        with self._lock:
            return (
                dict(self._requests),
                {name: h.snapshot() for name, h in self._durations.items()},
                self._handler_errors,
                self._late,
            )
