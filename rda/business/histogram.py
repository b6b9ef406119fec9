"""Latency histograms counted with plain integers, for the server's and the client's statistics.

A Prometheus histogram needs per-bucket counts, a sum and a count; keeping them in a list and
two numbers costs one ``bisect`` and three increments per observation, with no metrics library
on the message path. The owner guards a :class:`Histogram` with its own lock;
:class:`HistogramSnapshot` is the frozen copy the collectors read. :class:`CappedHistograms`
keeps one histogram per label value for at most ``limit`` values, then an ``other`` one.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

__all__ = [
    "DURATION_BUCKETS",
    "OTHER",
    "CappedHistograms",
    "Histogram",
    "HistogramSnapshot",
    "bucket_of",
]

# Upper bounds (seconds); Prometheus' usual latency ladder stretched down to 100 µs because an
# in-memory get answers in well under a millisecond.
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

#: The label value of everything past a cap: (device, property) pairs beyond
#: ``Config.metrics_devices``, principals the policy does not list, ...
OTHER = "other"


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Observed durations. ``counts`` are per bucket, not cumulative; the last entry counts
    durations above the largest bound (+Inf)."""

    buckets: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


def bucket_of(seconds: float) -> int:
    # bisect_left: a duration equal to a bound belongs to that bound's bucket (le=bound).
    return bisect.bisect_left(DURATION_BUCKETS, seconds)


class Histogram:
    """Mutable counts; not thread-safe on its own (its owner holds a lock)."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.add(bucket_of(seconds), seconds)

    def add(self, index: int, seconds: float) -> None:
        """Count ``seconds`` in bucket ``index`` (``bucket_of(seconds)``, computed once by a
        caller that files one duration in several histograms)."""
        self.counts[index] += 1
        self.sum += seconds
        self.count += 1

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(DURATION_BUCKETS, tuple(self.counts), self.sum, self.count)


class CappedHistograms:
    """Histograms keyed by a fixed set of kinds and, for at most ``limit`` names, by name.

    The client's round trips: one histogram per request type (all present from the start) and
    one per device for the first ``limit`` devices, later ones in :data:`OTHER`. Thread-safe.
    """

    def __init__(
        self, kinds: tuple[str, ...], limit: int, lock: threading.Lock | None = None
    ) -> None:
        # ``lock``: an owner's lock to share (the client's request table), so that the owner
        # records a round trip with the rest of a completion under one acquisition (``add``).
        self._lock = lock if lock is not None else threading.Lock()
        self._kinds = {kind: Histogram() for kind in kinds}
        self._names: dict[str, Histogram] = {}
        self._other = Histogram()
        self.limit = limit

    def observe(self, kind: str, name: str, seconds: float) -> None:
        with self._lock:
            self.add(kind, name, seconds)

    def add(self, kind: str, name: str, seconds: float) -> None:
        """``observe`` for a caller that holds the lock (the one given to the constructor)."""
        if seconds < 0.0:
            seconds = 0.0
        index = bucket_of(seconds)
        histogram = self._kinds.get(kind)
        if histogram is not None:
            histogram.add(index, seconds)
        named = self._names.get(name)
        if named is None:
            if len(self._names) < self.limit:
                named = self._names[name] = Histogram()
            else:
                named = self._other
        named.add(index, seconds)

    def snapshot(self) -> tuple[dict[str, HistogramSnapshot], dict[str, HistogramSnapshot]]:
        """(per kind, per name with :data:`OTHER` last)."""
        with self._lock:
            kinds = {kind: h.snapshot() for kind, h in self._kinds.items()}
            names = {name: h.snapshot() for name, h in sorted(self._names.items())}
            names[OTHER] = self._other.snapshot()
        return kinds, names
