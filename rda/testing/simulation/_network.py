"""The simulated network: a ``MemoryNetwork`` whose messages travel with seeded delays.

Each connection (a ``Link``) has two FIFO queues, one per direction, as TCP keeps the order
within a connection; when each message arrives, and which connection's message arrives next
among those due, is the simulation's (seeded) choice. Faults are those ZeroMQ over TCP can
produce: delay; a reset (both ends hear it, what was in flight is lost); a partition (TCP
holds what is sent, both ways, until it heals, and a close is not heard: only heartbeats
can tell; a connection dropped meanwhile loses what it held); a full pipe towards one
client (the server's per-peer queue fills, conflates and drops, counted).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rda.serialization.header import RequestType
from rda.testing import MemoryNetwork
from rda.transport.api import Buffer
from rda.transport.protocol import Incoming, Kind, decode_frames

__all__ = ["Flight", "SimNetwork"]

TO_SERVER = 0
TO_CLIENT = 1


@dataclass(slots=True, eq=False)
class Flight:
    """The messages in flight on one connection in one direction."""

    link: Any
    direction: int
    items: deque[tuple[float, list[bytes]]] = field(default_factory=deque)
    last: float = 0.0


class SimNetwork(MemoryNetwork):
    """See the module docstring. ``delay()`` draws each message's transit time."""

    def __init__(self, clock: Callable[[], float], delay: Callable[[], float]) -> None:
        super().__init__(clock)
        self.delay = delay
        self.flights: dict[tuple[int, int], Flight] = {}
        self.links: list[Any] = []
        self.sim_partitioned: set[str] = set()
        self.sim_stalled: set[bytes] = set()
        self.lost = 0
        self._ids: dict[int, int] = {}
        self.sets_sent: dict[tuple[bytes, int], float] = {}  # (peer, request id) -> when

    # --- what the transports call ---

    def open_link(self, endpoint: str, client: Any, conn: int) -> Any:
        link = super().open_link(endpoint, client, conn)
        self.links.append(link)
        return link

    def client_send(self, link: Any, frames: Sequence[Buffer]) -> None:
        if link.closed:
            return
        if frames and bytes(frames[0][:1]) == _REQUEST:
            event = decode_frames(frames, from_server=False)
            if type(event) is Incoming and event.message.header.request_type is RequestType.SET:
                # When a set left its client: one that ended in doubt (timed out) may still
                # be applied later if it had (``set-then-get``).
                self.sets_sent[(link.peer, event.message.header.id)] = self.clock()
        self._queue(link, TO_SERVER, frames)

    def server_send(self, link: Any, frames: Sequence[Buffer]) -> bool:
        if link.peer in self.sim_stalled and not link.closed:
            return False
        if not link.closed:
            self._queue(link, TO_CLIENT, frames)
        return True

    def _queue(self, link: Any, direction: int, frames: Sequence[Buffer]) -> None:
        key = (id(link), direction)
        flight = self.flights.get(key)
        if flight is None:
            flight = self.flights[key] = Flight(link, direction)
        due = max(self.clock() + self.delay(), flight.last)
        flight.last = due
        flight.items.append((due, [bytes(f) for f in frames]))

    # --- what the simulation calls ---

    def due(self, now: float) -> list[Flight]:
        """Connections whose next message has arrived by ``now`` (in a stable order)."""
        out = []
        cut = self.sim_partitioned
        for key, flight in list(self.flights.items()):
            if not flight.items:
                del self.flights[key]
            elif flight.items[0][0] <= now and flight.link.endpoint not in cut:
                out.append(flight)
        return out

    def next_deadline(self) -> float | None:
        cut = self.sim_partitioned
        heads = [
            f.items[0][0] for f in self.flights.values() if f.items and f.link.endpoint not in cut
        ]
        return min(heads) if heads else None

    def deliver(self, flight: Flight) -> None:
        """The next message of ``flight`` arrives (or is lost, on a closed or cut connection)."""
        _, frames = flight.items.popleft()
        link = flight.link
        if link.closed:
            self.lost += 1
            return
        views = [memoryview(f) for f in frames]
        if flight.direction == TO_SERVER:
            if link.server is None:
                link.waiting.append(views)
            else:
                link.server.link_arrival(link, views, self.clock())
        else:
            link.client.link_receive(link.conn, views, self.clock())
        self.bump()

    def live_links(self) -> list[Any]:
        self.links = [link for link in self.links if not link.closed]
        return self.links

    def reset(self, link: Any) -> None:
        """A connection reset: both ends hear it at once; what was in flight is lost."""
        for direction in (TO_SERVER, TO_CLIENT):
            flight = self.flights.pop((id(link), direction), None)
            if flight is not None:
                self.lost += len(flight.items)
        self.close_link(link)
        link.client.link_gone(link.conn)

    def partition(self, endpoint: str) -> None:
        super().partition(endpoint)
        self.sim_partitioned.add(endpoint)

    def heal(self, endpoint: str) -> None:
        super().heal(endpoint)
        self.sim_partitioned.discard(endpoint)

    def stall_client(self, peer: bytes) -> None:
        super().stall_client(peer)
        self.sim_stalled.add(peer)

    def unstall_client(self, peer: bytes) -> None:
        self.sim_stalled.discard(peer)
        super().unstall_client(peer)


_REQUEST = bytes([Kind.REQUEST])


def uniform_delay(rng: random.Random, low: float, high: float) -> Callable[[], float]:
    return lambda: rng.uniform(low, high)
