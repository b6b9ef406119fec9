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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rda.serialization._header import Header, RequestType
from rda.serialization._message import BodyKind, encode_exception
from rda.serialization.errors import DecodeError, ProtocolError
from rda.testing._dispatch import Dispatcher, Link, frames_size
from rda.transport.api import Buffer, ServerHandler, ServerTransportStatistics, TransportSettings
from rda.transport.protocol import (
    Connect,
    Heartbeat,
    Incoming,
    Kind,
    UnsupportedVersion,
    decode_frames,
    encode_connect_ack,
    encode_heartbeat,
    encode_message,
)
from rda.transport.state import ConnEvent, ConnState, HeartbeatAction, HeartbeatTracker, next_state

if TYPE_CHECKING:
    from rda.testing._memory import MemoryNetwork

__all__ = ["MemoryServerTransport"]

log = logging.getLogger("rda.testing")
_HEARTBEAT = encode_heartbeat(from_server=True)
_REPLY_KIND = bytes([Kind.REPLY])
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
class _Peer:
    id: bytes
    link: Link
    heartbeat: HeartbeatTracker
    state: ConnState = ConnState.CONNECTED
    # Messages waiting for the pipe to drain: [frames, conflation key or None].
    queue: deque[list[Any]] = field(default_factory=deque)
    keyed: dict[int, list[Any]] = field(default_factory=dict)


class MemoryServerTransport(Dispatcher):
    """A server transport on a :class:`~rda.testing.MemoryNetwork`; see ``rda.transport.api``.

    Build it with ``network.server(name, handler, settings, server_info)``, then ``start()``;
    ``endpoint`` is ``"mem://<name>"``. :meth:`kill` simulates the process dying.
    """

    def __init__(
        self,
        network: MemoryNetwork,
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
        self._settings = settings
        self._info: dict[str, Any] = {
            "name": endpoint.removeprefix("mem://"),
            "version": "memory",
            "heartbeat_interval": settings.heartbeat_interval,
            "heartbeat_timeout": settings.heartbeat_timeout,
        }
        self._info.update(server_info or {})
        self._peers: dict[bytes, _Peer] = {}
        self._messages_in = self._messages_out = self._bytes_in = self._bytes_out = 0
        self._heartbeat_timeouts = self._decode_errors = self._protocol_errors = 0
        self._queue_depth = self._conflated = self._dropped = self._handler_errors = 0

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
        self._post(_Publish(list(targets), list(tail), conflatable))

    def disconnect(self, peer: bytes) -> None:
        self._post(_Kick(peer))

    def close(self, timeout: float | None = None) -> None:
        self._stop(self._settings.close_timeout if timeout is None else timeout, kill=False)

    def kill(self) -> None:
        """Die abruptly, like a killed process: queued work is lost, no handler is called,
        every client's connection closes (they see "server closed the connection" at once)."""
        self._stop(self._settings.close_timeout, kill=True)

    def statistics(self) -> ServerTransportStatistics:
        return ServerTransportStatistics(
            messages_in=self._messages_in,
            messages_out=self._messages_out,
            bytes_in=self._bytes_in,
            bytes_out=self._bytes_out,
            peers=len(self._peers),
            heartbeat_timeouts=self._heartbeat_timeouts,
            decode_errors=self._decode_errors,
            protocol_errors=self._protocol_errors,
            peer_queue_depth=self._queue_depth,
            notifications_conflated=self._conflated,
            messages_dropped=self._dropped,
            handler_errors=self._handler_errors,
        )

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
                self._send_to(peer, [_REPLY_KIND, header, *item.tail], key)
        elif isinstance(item, _Kick):
            p = self._peers.get(item.peer)
            if p is not None:
                self._drop(p, "closed locally")
        elif isinstance(item, _PeerGone):
            p = self._peers.get(item.peer)
            if p is not None:
                self._drop(p, "peer gone", ConnEvent.PEER_GONE)
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
        except UnsupportedVersion as exc:
            self._bad_input(link.peer, exc, protocol=True)
            if exc.request_id is not None:
                self._send_exception(link, exc.request_id, exc)
            elif bytes(item.frames[0]) == bytes([Kind.CONNECT]):
                self._send_raw(link, encode_connect_ack({"error": str(exc)}))
            return
        except ProtocolError as exc:
            self._bad_input(link.peer, exc, protocol=True)
            return
        except DecodeError as exc:
            self._bad_input(link.peer, exc, protocol=False)
            return
        if p is not None:
            p.heartbeat.received(item.stamp)
        if isinstance(event, Incoming):
            if p is None:
                err = ProtocolError("REQUEST before CONNECT: send CONNECT first")
                self._bad_input(link.peer, err, protocol=True)
                self._send_exception(link, event.message.header.id, err)
                return
            try:
                self._handler.on_message(p.id, event.message)
            except Exception:
                self._handler_failed("on_message")
        elif isinstance(event, Connect):
            self._on_connect(link, event.info, item.stamp)
        elif isinstance(event, Heartbeat) and p is None:
            self._bad_input(link.peer, ProtocolError("HEARTBEAT before CONNECT"), protocol=True)

    def _on_connect(self, link: Link, info: dict[str, Any], stamp: float) -> None:
        old = self._peers.get(link.peer)
        if old is not None:
            self._drop(old, "reconnected")  # the same routing id introduced itself again
        s = self._settings
        hb = HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, stamp)
        p = _Peer(link.peer, link, hb, next_state(ConnState.CONNECTING, ConnEvent.CONNECT_RECEIVED))
        self._peers[p.id] = p
        self._send(p, encode_connect_ack(self._info), None)
        try:
            self._handler.on_peer_connected(p.id, info)
        except Exception:
            self._handler_failed("on_peer_connected")

    def _bad_input(self, peer: bytes, exc: Exception, protocol: bool) -> None:
        # As the ZeroMQ server: every dropped message is a decode error; protocol violations
        # are also counted on their own.
        self._decode_errors += 1
        if protocol:
            self._protocol_errors += 1
        log.warning("dropped a bad message from peer %r: %s", peer, exc)

    def _send_exception(self, link: Link, request_id: int, exc: ProtocolError) -> None:
        body = [(BodyKind.EXCEPTION, encode_exception("ProtocolError", str(exc)))]
        self._send_raw(
            link, encode_message(Kind.REPLY, Header(RequestType.EXCEPTION, request_id), body)
        )

    def _send_raw(self, link: Link, frames: Sequence[Buffer]) -> None:
        """Answer a peer that is not registered: best effort, never queued."""
        if self._network._server_send(link, frames):
            self._messages_out += 1
            self._bytes_out += frames_size(frames)
        else:
            self._dropped += 1

    def _send_to(self, peer: bytes, frames: Sequence[Buffer], key: int | None) -> None:
        p = self._peers.get(peer)
        if p is None:
            self._dropped += 1  # the peer is gone; its on_peer_disconnected was delivered
            return
        self._send(p, frames, key)

    def _send(self, p: _Peer, frames: Sequence[Buffer], key: int | None) -> None:
        # Once something waits in the peer's queue, newer messages queue behind it (order).
        if p.queue or not self._write(p, frames):
            self._enqueue(p, frames, key)

    def _write(self, p: _Peer, frames: Sequence[Buffer]) -> bool:
        if not self._network._server_send(p.link, frames):
            return False  # the pipe is full
        self._messages_out += 1
        self._bytes_out += frames_size(frames)
        p.heartbeat.sent(self._clock())
        return True

    def _enqueue(self, p: _Peer, frames: Sequence[Buffer], key: int | None) -> None:
        if key is not None:
            entry = p.keyed.get(key)
            if entry is not None:
                entry[0] = frames  # latest wins, in the older one's place
                self._conflated += 1
                return
        if len(p.queue) >= self._settings.peer_queue_limit:
            self._dropped += 1
            return
        entry = [frames, key]
        p.queue.append(entry)
        self._queue_depth += 1
        if key is not None:
            p.keyed[key] = entry

    def _flush(self, p: _Peer) -> None:
        while p.queue and self._write(p, p.queue[0][0]):
            entry = p.queue.popleft()
            self._queue_depth -= 1
            key = entry[1]
            if key is not None and p.keyed.get(key) is entry:
                del p.keyed[key]

    def _check_timers(self, now: float) -> None:
        for p in list(self._peers.values()):
            action = p.heartbeat.check(now)
            if action is HeartbeatAction.EXPIRED:
                self._heartbeat_timeouts += 1
                self._drop(p, "heartbeat timeout", ConnEvent.HEARTBEAT_TIMEOUT)
            elif action is HeartbeatAction.SEND:
                sent = not p.queue and self._write(p, _HEARTBEAT)
                if not sent:  # a full pipe takes no heartbeat; call it sent, or we would spin
                    p.heartbeat.sent(now)

    def _next_deadline(self) -> float | None:
        return min((p.heartbeat.next_deadline() for p in self._peers.values()), default=None)

    def _drop(self, p: _Peer, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE) -> None:
        del self._peers[p.id]
        p.state = next_state(p.state, event)
        self._dropped += len(p.queue)
        self._queue_depth -= len(p.queue)
        p.queue.clear()
        p.keyed.clear()
        try:
            self._handler.on_peer_disconnected(p.id, reason)
        except Exception:
            self._handler_failed("on_peer_disconnected")

    def _handler_failed(self, what: str) -> None:
        self._handler_errors += 1
        log.exception("server handler %s raised; the transport carries on", what)

    def _teardown(self, report: bool) -> None:
        if report:
            for p in list(self._peers.values()):
                self._drop(p, "closed locally")
        self._peers.clear()
        self._network._unbind(self)
