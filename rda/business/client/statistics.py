"""Counters of a client service and their frozen snapshot.

The counters of requests (replies, errors, late replies, timeouts, disconnected requests, round
trips) are the request table's (requests.py), written under its lock as each request ends.
:class:`ClientCounters` holds the others. Most have a single writer (the dispatcher thread:
notifications, gaps); reconnects are written under the connections' lock; counters written
from several threads (listener errors from the workers, drops) are bumped under one small lock,
and only on those rare paths, never per message.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from rda.business.histogram import HistogramSnapshot
from rda.transport.api import ClientTransportStatistics

__all__ = [
    "ROUND_TRIP_TYPES",
    "ClientCounters",
    "ClientStatistics",
    "ServerConnectionStatistics",
]

#: Request types whose round trips are timed (a subscription's answer is its first update).
ROUND_TRIP_TYPES: tuple[str, ...] = ("get", "set", "admin")


@dataclass(frozen=True, slots=True)
class ServerConnectionStatistics:
    """One server endpoint as a client service sees it.

    ``state``:

    - ``"connecting"``: the first connection is being opened (no handshake yet);
    - ``"connected"``: the handshake is done;
    - ``"reconnecting"``: the connection was lost and is re-established in the background
      (exponential back-off), devices being resolved again through the directory first;
    - ``"disconnected"``: lost, and nothing needs it back (only admin requests used it); the
      next request connects.
    - ``"refused"``: the server refused this client's security handshake (``last_reason``
      says how); its subscriptions ended with ``NotAuthorizedError`` and nothing retries in
      the background; the next request dials again.

    ``reconnects`` counts connections re-established after a loss, ``connects`` every
    connection opened (attempts included); ``devices`` are the devices the client reaches
    there; ``last_reason`` says why the last connection was lost ("" if never);
    ``disconnected_seconds`` is the time spent reconnecting: without the connection after
    losing it while something wanted it back (until it came back, or until now).
    """

    endpoint: str
    state: str
    reconnects: int = 0
    connects: int = 0
    devices: tuple[str, ...] = ()
    subscriptions: int = 0
    last_reason: str = ""
    disconnected_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A snapshot of a ``ClientService``.

    ``pending`` and ``subscriptions`` are current values; the rest count since creation.
    ``late_replies``: replies that arrived after their request timed out, and notifications
    of a subscription ended or moved to another server (dropped).
    ``gaps``: updates the server's sequence numbers say were missed (conflated or lost).
    ``dropped``: notifications this client discarded because a subscription's queue was full.
    ``connections``: server endpoints with a connection open or being opened.
    ``servers``: the state of each server endpoint in use (see ``ServerConnectionStatistics``).
    ``round_trips``: (per request type, per device up to ``Config.metrics_devices`` then
    ``other``) histograms of the time from sending a request to its reply.
    """

    transport: ClientTransportStatistics = field(default_factory=ClientTransportStatistics)
    requests: int = 0
    replies: int = 0
    errors: int = 0
    pending: int = 0
    timeouts: int = 0
    late_replies: int = 0
    disconnected_requests: int = 0
    subscriptions: int = 0
    notifications: int = 0
    gaps: int = 0
    dropped: int = 0
    listener_errors: int = 0
    connections: int = 0
    reconnects: int = 0
    servers: tuple[ServerConnectionStatistics, ...] = ()
    round_trips: tuple[dict[str, HistogramSnapshot], dict[str, HistogramSnapshot]] = ({}, {})
    directory: str = ""  # the state of a directory with one (etcd: watch synced or stale)


class ClientCounters:
    """The mutable counters behind :class:`ClientStatistics` other than the request table's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Dispatcher-only writers.
        self.notifications = 0
        self.gaps = 0
        # Written under the connections' lock (connections.Connections.on_connected).
        self.reconnects = 0
        # Several writers: use the add_* methods.
        self.dropped = 0
        self.listener_errors = 0

    def add_listener_error(self) -> None:
        with self._lock:
            self.listener_errors += 1

    def add_dropped(self, n: int = 1) -> None:
        # Listener tasks are dropped from the scheduler on the submitting thread, and a closing
        # service drops them from its own thread: not only the dispatcher.
        with self._lock:
            self.dropped += n
