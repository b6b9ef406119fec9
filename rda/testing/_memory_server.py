"""The in-memory server transport: ``rda.transport.api.ServerTransport`` without sockets.

It runs the server protocol's rules of the ZeroMQ transport itself
(``rda.transport.server_session.PeerTable``: validation and its answers, the handshake,
heartbeats, per-peer outboxes with conflation, the counters and reasons) over links instead of
a ROUTER, and hands a long handler over to a standby thread as the ZeroMQ server does
(``hands_over``), so a business layer on a ``MemoryNetwork`` runs its handlers inline as in
production. A peer whose pipe is full (``MemoryNetwork.stall_client``) gets its own bounded
queue in which a message with a conflation key replaces an older one with the same key.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rda.testing._dispatch import Dispatcher, Link
from rda.transport.api import (
    Buffer,
    PeerStatistics,
    ServerHandler,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.peer_info import AUTHENTICATED_PRINCIPAL, connect_ack_info
from rda.transport.reasons import PEER_GONE
from rda.transport.server_session import Peer, PeerTable
from rda.transport.state import ConnEvent

__all__ = ["AUTHENTICATED_PRINCIPAL", "MemoryServerTransport"]

log = logging.getLogger("rda.testing")


class Network(Protocol):
    """What a server transport uses of its ``MemoryNetwork`` (a protocol, so that this module
    does not import _memory.py, which imports it)."""

    clock: Callable[[], float]

    def bump(self) -> None: ...

    def forget(self, d: Dispatcher) -> None: ...

    def bind(self, server: MemoryServerTransport) -> None: ...

    def unbind(self, server: MemoryServerTransport) -> None: ...

    def server_send(self, link: Link, frames: Sequence[Buffer]) -> bool: ...


_instances = itertools.count(1)


@dataclass(slots=True)
class _Out:
    peer: bytes
    frames: list[Buffer]
    key: int | None


@dataclass(slots=True)
class _Publish:
    targets: list[tuple[bytes, int, Buffer]]
    tail: list[Buffer]
    conflatable: bool


@dataclass(slots=True)
class _Kick:
    peer: bytes


@dataclass(slots=True)
class _Arrival:
    link: Link
    frames: list[memoryview]
    stamp: float


@dataclass(slots=True)
class _PeerGone:
    peer: bytes


@dataclass(slots=True)
class _Writable:
    peer: bytes


class MemoryServerTransport(Dispatcher):
    """A server transport on a :class:`~rda.testing.MemoryNetwork`; see ``rda.transport.api``.

    Build it with ``network.server(name, handler, settings, server_info)``, then ``start()``;
    ``endpoint`` is ``"mem://<name>"``. :meth:`kill` simulates the process dying.
    """

    def __init__(
        self,
        network: Network,
        endpoint: str,
        handler: ServerHandler,
        settings: TransportSettings,
        server_info: dict[str, Any] | None,
    ) -> None:
        super().__init__(
            f"rda-memory-server-{next(_instances)}",
            network.clock,
            settings.send_hwm,
            network.bump,
            settings.handover_after,
        )
        self._network = network
        self._endpoint = endpoint
        self._handler = handler
        self._settings = settings
        name = endpoint.removeprefix("mem://")
        self._info = connect_ack_info(name, "memory", settings, server_info)
        self._wire = _LinkWire(network)
        self._table = PeerTable(handler, settings, self._info, self._wire, network.clock, log)

    # --- api.ServerTransport (any thread) ---

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def hands_over(self) -> bool:
        """True: a long handler is handed over to a standby thread, as on ZeroMQ."""
        return self._settings.handover_after > 0

    @property
    def handler(self) -> ServerHandler:
        return self._handler

    @property
    def settings(self) -> TransportSettings:
        return self._settings

    @property
    def server_info(self) -> dict[str, Any]:
        return dict(self._info)

    def start(self) -> None:
        self._network.bind(self)
        self._start_thread()

    def send(self, peer: bytes, frames: Sequence[Buffer], conflate_key: int | None = None) -> None:
        self._post(_Out(peer, list(frames), conflate_key))

    def publish(
        self,
        targets: Sequence[tuple[bytes, int, Buffer]],
        tail: Sequence[Buffer],
        conflatable: bool = True,
    ) -> None:
        self._post(_Publish(list(targets), list(tail), conflatable), wait=False)

    def disconnect(self, peer: bytes) -> None:
        self._post(_Kick(peer))

    def close(self, timeout: float | None = None) -> None:
        self._stop(self._settings.close_timeout if timeout is None else timeout, kill=False)

    def kill(self) -> None:
        """Die abruptly, like a killed process: queued work is lost, no handler is called,
        every client's connection closes (they see "server closed the connection" at once)."""
        self._stop(self._settings.close_timeout, kill=True)

    def statistics(self) -> ServerTransportStatistics:
        return self._table.statistics(handovers=self.handovers)

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        return self._table.peer_statistics()

    # --- called by the network (any thread) ---

    def link_arrival(self, link: Link, frames: list[memoryview], stamp: float) -> None:
        self._inbox.put_network(_Arrival(link, frames, stamp))

    def link_closed(self, peer: bytes) -> None:
        self._inbox.put_network(_PeerGone(peer))

    def link_writable(self, peer: bytes) -> None:
        self._inbox.put_network(_Writable(peer))

    # --- dispatcher thread ---

    def _handle(self, item: object) -> None:
        table = self._table
        if isinstance(item, _Arrival):
            link = item.link
            if link.closed:
                return  # the connection closed while this was queued
            # As a CURVE transport does: the authenticated identity comes from the transport
            # (here the client transport object's attribute), never from what the client wrote.
            principal = getattr(link.client, AUTHENTICATED_PRINCIPAL, None)
            if not isinstance(principal, str) or not principal:
                principal = None
            message = table.received(link.peer, link, item.frames, item.stamp, -1, principal)
            if message is not None:
                self._begin_handler()
                table.deliver(link.peer, message)
                self._end_handler()
        elif isinstance(item, _Out):
            table.send(item.peer, item.frames, item.key)
        elif isinstance(item, _Publish):
            table.publish(item.targets, item.tail, item.conflatable)
        elif isinstance(item, _Kick):
            table.disconnect(item.peer)
        elif isinstance(item, _PeerGone):
            p = table.peers.get(item.peer)
            if p is not None:
                table.drop(p, PEER_GONE, ConnEvent.PEER_GONE)
        elif isinstance(item, _Writable):
            p = table.peers.get(item.peer)
            if p is not None:
                table.flush(p)

    def _check_timers(self, now: float) -> None:
        self._table.heartbeat_round(now)

    def _next_deadline(self) -> float | None:
        deadline = self._table.next_check
        return None if deadline == float("inf") or not self._table.peers else deadline

    def _teardown(self, report: bool) -> None:
        if report:
            self._table.close_all()
        self._table.peers.clear()
        self._network.unbind(self)


class _LinkWire:
    """The links of a :class:`MemoryServerTransport` as the session rules see them."""

    __slots__ = ("_network",)

    def __init__(self, network: Network) -> None:
        self._network = network

    def write(self, peer: Peer, frames: Sequence[Any]) -> bool | None:
        return self._network.server_send(peer.io, frames)  # False: stalled, the pipe is full

    def answer(self, rid: bytes, io: Any, frames: Sequence[Any]) -> bool:
        # The sender may not be registered: best effort, never queued.
        return self._network.server_send(io, frames)

    def want_writable(self) -> None:
        return  # the network reports a stalled pipe's room itself (``link_writable``)

    def admitted(self, peer: Peer) -> None:
        return

    def forget(self, peer: Peer) -> None:
        return
