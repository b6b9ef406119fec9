"""The in-memory server transport: ``rda.transport.api.ServerTransport`` without sockets.

Same behaviour as the ZeroMQ server, same counters and reasons: a peer is dropped with
"heartbeat timeout", "peer gone" (the client's connection closed), "closed locally" or
"reconnected"; every bad message counts in ``decode_errors`` and protocol violations also in
``protocol_errors``; a version mismatch and a REQUEST before CONNECT are answered explicitly.
A peer whose pipe is full (``MemoryNetwork.stall_client``) gets its own bounded queue in which
a message with a conflation key replaces an older one with the same key (latest wins, counted).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.serialization.errors import DecodeError, ProtocolError
from rda.testing._dispatch import Dispatcher, Link, frames_size
from rda.transport._peers import (
    CLOSED_LOCALLY,
    HEARTBEAT_BEFORE_CONNECT,
    PEER_GONE,
    RECONNECT_FRAMES,
    RECONNECTED,
    BadInput,
    Peer,
    ServerCounters,
    connect_ack_info,
    heartbeat_round,
    peer_statistics,
    reject_connect_info,
    reject_request_before_connect,
    reject_undecodable,
)
from rda.transport._ratelog import RateLimitedLog
from rda.transport.api import (
    Buffer,
    PeerStatistics,
    ServerHandler,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.protocol import (
    Connect,
    Heartbeat,
    Incoming,
    decode_frames,
    encode_connect_ack,
    encode_heartbeat,
    join_tail,
)
from rda.transport.state import ConnEvent, ConnState, HeartbeatTracker, next_state

__all__ = ["MemoryServerTransport"]

# The client-info key of the identity a transport authenticated (the business layer's
# rda.business.server.requests.AUTHENTICATED_PRINCIPAL; spelt here, transports sit below it).
AUTHENTICATED_PRINCIPAL = "authenticated_principal"

log = logging.getLogger("rda.testing")


class Network(Protocol):
    """What a server transport uses of its ``MemoryNetwork`` (a protocol, so that this module
    does not import _memory.py, which imports it)."""

    clock: Callable[[], float]

    def _bump(self) -> None: ...

    def _forget(self, d: Dispatcher) -> None: ...

    def _bind(self, server: MemoryServerTransport) -> None: ...

    def _unbind(self, server: MemoryServerTransport) -> None: ...

    def _server_send(self, link: Link, frames: Sequence[Buffer]) -> bool: ...


_HEARTBEAT = encode_heartbeat(from_server=True)
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


@dataclass(slots=True, eq=False)
class _Peer(Peer):
    """The shared peer record (outbox, heartbeat, state) plus the connection it came on."""

    link: Link = field(kw_only=True)


class MemoryServerTransport(Dispatcher, ServerCounters):
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
            f"rda-memory-server-{next(_instances)}", network.clock, settings.send_hwm, network._bump
        )
        self._network = network
        self._endpoint = endpoint
        self._handler = handler
        self._peer_log = RateLimitedLog(log, clock=network.clock)
        self._settings = settings
        name = endpoint.removeprefix("mem://")
        self._info = connect_ack_info(name, "memory", settings, server_info)
        self._peers: dict[bytes, _Peer] = {}
        ServerCounters.__init__(self)

    # --- api.ServerTransport (any thread) ---

    @property
    def endpoint(self) -> str:
        return self._endpoint

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
        self._network._bind(self)
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
        return self._statistics(len(self._peers))

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        return peer_statistics(self._peers)

    # --- called by the network (any thread) ---

    def _link_arrival(self, link: Link, frames: list[memoryview], stamp: float) -> None:
        self._inbox.put_network(_Arrival(link, frames, stamp))

    def _link_closed(self, peer: bytes) -> None:
        self._inbox.put_network(_PeerGone(peer))

    def _link_writable(self, peer: bytes) -> None:
        self._inbox.put_network(_Writable(peer))

    # --- dispatcher thread ---

    def _handle(self, item: object) -> None:
        if isinstance(item, _Arrival):
            self._on_arrival(item)
        elif isinstance(item, _Out):
            self._send_to(item.peer, item.frames, item.key)
        elif isinstance(item, _Publish):
            for peer, sub, header in item.targets:
                key = sub if item.conflatable else None
                self._send_to(peer, join_tail(header, item.tail), key)
        elif isinstance(item, _Kick):
            p = self._peers.get(item.peer)
            if p is not None:
                self._drop(p, CLOSED_LOCALLY)
        elif isinstance(item, _PeerGone):
            p = self._peers.get(item.peer)
            if p is not None:
                self._drop(p, PEER_GONE, ConnEvent.PEER_GONE)
        elif isinstance(item, _Writable):
            p = self._peers.get(item.peer)
            if p is not None:
                self._flush(p)

    def _on_arrival(self, item: _Arrival) -> None:
        link = item.link
        if link.closed:
            return  # the connection closed while this was queued
        self._messages_in += 1
        self._bytes_in += frames_size(item.frames)
        p = self._peers.get(link.peer)
        try:
            event = decode_frames(
                item.frames, from_server=False, max_size=self._settings.max_message_size
            )
        except (DecodeError, ProtocolError) as exc:
            self._reject(link, reject_undecodable(exc, item.frames))
            return
        if p is not None:
            p.heartbeat.received(item.stamp)
        if isinstance(event, Incoming):
            if p is None:
                self._reject(link, reject_request_before_connect(event.message.header.id))
                return
            try:
                self._handler.on_message(p.rid, event.message)
            except Exception:
                self._handler_failed("on_message")
        elif isinstance(event, Connect):
            refused = reject_connect_info(event.info)
            if refused is not None:
                self._reject(link, refused)
                return
            self._on_connect(link, event.info, item.stamp)
        elif isinstance(event, Heartbeat) and p is None:
            self._reject(link, HEARTBEAT_BEFORE_CONNECT)

    def _on_connect(self, link: Link, info: dict[str, Any], stamp: float) -> None:
        old = self._peers.get(link.peer)
        if old is not None:
            self._drop(old, RECONNECTED)  # the same routing id introduced itself again
        s = self._settings
        hb = HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, stamp)
        p = _Peer(link.peer, info, hb, link=link, announced=True)
        p.state = next_state(ConnState.CONNECTING, ConnEvent.CONNECT_RECEIVED)
        self._peers[p.rid] = p
        self._send(p, encode_connect_ack(self._info), None)
        # As a CURVE transport does: the authenticated identity comes from the transport (here
        # the client transport object's attribute), never from what the client wrote.
        info = dict(info)
        info.pop(AUTHENTICATED_PRINCIPAL, None)
        principal = getattr(link.client, "authenticated_principal", None)
        if isinstance(principal, str) and principal:
            info[AUTHENTICATED_PRINCIPAL] = principal
        try:
            self._handler.on_peer_connected(p.rid, info)
        except Exception:
            self._handler_failed("on_peer_connected")

    def _reject(self, link: Link, bad: BadInput) -> None:
        """Drop a bad message as the ZeroMQ server does: count, log, answer if due."""
        self._count_bad_input(bad)
        self._peer_log.log(bad.kind, "dropped a bad message from peer %r: %s", link.peer, bad.error)
        for answer in (RECONNECT_FRAMES if bad.reconnect else None, bad.answer):
            if answer is None:
                continue
            # The sender may not be registered: best effort, never queued.
            if self._network._server_send(link, answer):
                self._messages_out += 1
                self._bytes_out += frames_size(answer)
            else:
                self._dropped += 1

    def _send_to(self, peer: bytes, frames: Sequence[Buffer], key: int | None) -> None:
        p = self._peers.get(peer)
        if p is None:
            self._dropped += 1  # the peer is gone; its on_peer_disconnected was delivered
            return
        self._send(p, frames, key)

    def _send(self, p: _Peer, frames: Sequence[Buffer], key: int | None) -> None:
        # Once something waits in the peer's outbox, newer messages queue behind it (order).
        if p.outbox or not self._write(p, frames):
            self._count_put(p.outbox.put(frames, key, self._settings.peer_queue_limit))

    def _write(self, p: _Peer, frames: Sequence[Buffer]) -> bool:
        if not self._network._server_send(p.link, frames):
            return False  # the pipe is full
        self._messages_out += 1
        self._bytes_out += frames_size(frames)
        p.heartbeat.sent(self._clock())
        return True

    def _flush(self, p: _Peer) -> None:
        while p.outbox and self._write(p, p.outbox.head()):
            p.outbox.pop()
            self._queue_depth -= 1

    def _check_timers(self, now: float) -> None:
        heartbeat_round(self._peers, now, self, self._ping, self._drop)

    def _ping(self, p: _Peer) -> bool:
        return self._write(p, _HEARTBEAT)

    def _next_deadline(self) -> float | None:
        return min((p.heartbeat.next_deadline() for p in self._peers.values()), default=None)

    def _drop(self, p: _Peer, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE) -> None:
        del self._peers[p.rid]
        p.state = next_state(p.state, event)
        # Unlike the ZeroMQ server, what waited for this peer also counts as dropped.
        lost = p.outbox.clear()
        self._dropped += lost
        self._queue_depth -= lost
        try:
            self._handler.on_peer_disconnected(p.rid, reason)
        except Exception:
            self._handler_failed("on_peer_disconnected")

    def _handler_failed(self, what: str) -> None:
        self._handler_errors += 1
        log.exception("server handler %s raised; the transport carries on", what)

    def _teardown(self, report: bool) -> None:
        if report:
            for p in list(self._peers.values()):
                self._drop(p, CLOSED_LOCALLY)
        self._peers.clear()
        self._network._unbind(self)
