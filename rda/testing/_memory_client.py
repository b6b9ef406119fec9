"""The in-memory client transport: ``rda.transport.api.ClientTransport`` without sockets.

It speaks the real wire protocol (``rda.transport.protocol``) over :class:`~rda.testing._dispatch.
Link` objects instead of DEALER sockets, and reports what the ZeroMQ client reports, with the
same reasons: "closed locally", "heartbeat timeout", "server closed the connection" (the socket
monitor's prompt notice), "connection refused or closed" (lost before the ACK), "no CONNECT_ACK
within connect_timeout" and "refused by the server: ...".
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.serialization._message import Message
from rda.serialization.errors import DecodeError, ProtocolError
from rda.testing._dispatch import Dispatcher, Link, frames_size
from rda.transport._peers import (
    CLOSED_LOCALLY,
    FORGOTTEN,
    HEARTBEAT_TIMEOUT,
    NO_CONNECT_ACK,
    ClientCounters,
    connect_info,
    lost_reason,
    refused_reason,
)
from rda.transport._ratelog import RateLimitedLog
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransportStatistics,
    TransportSettings,
    batch_receiver,
)
from rda.transport.protocol import (
    ConnectAck,
    Heartbeat,
    Incoming,
    Reconnect,
    decode_frames,
    encode_connect,
    encode_heartbeat,
)
from rda.transport.state import ConnEvent, ConnState, HeartbeatAction, HeartbeatTracker, next_state

__all__ = ["MemoryClientTransport"]

log = logging.getLogger("rda.testing")


class Network(Protocol):
    """What a client transport uses of its ``MemoryNetwork`` (a protocol, so that this module
    does not import _memory.py, which imports it)."""

    clock: Callable[[], float]

    def _bump(self) -> None: ...

    def _forget(self, d: Dispatcher) -> None: ...

    def _open_link(self, endpoint: str, client: Any, conn: int) -> Link: ...

    def _close_link(self, link: Link) -> None: ...

    def _client_send(self, link: Link, frames: Sequence[Buffer]) -> None: ...


_HEARTBEAT = encode_heartbeat(from_server=False)
_instances = itertools.count(1)


@dataclass(slots=True)
class _Open:
    conn: int
    endpoint: str


@dataclass(slots=True)
class _Send:
    conn: int
    frames: list[Buffer]


@dataclass(slots=True)
class _Disconnect:
    conn: int


@dataclass(slots=True)
class _Arrival:
    conn: int
    frames: list[memoryview]
    stamp: float


@dataclass(slots=True)
class _Gone:
    conn: int


@dataclass(slots=True, eq=False)
class _Connection:
    id: int
    link: Link
    connect_deadline: float
    state: ConnState = ConnState.CONNECTING
    heartbeat: HeartbeatTracker | None = None
    pending: list[list[Buffer]] = field(default_factory=list)


class MemoryClientTransport(Dispatcher, ClientCounters):
    """A client transport on a :class:`~rda.testing.MemoryNetwork`; see ``rda.transport.api``.

    Build it with ``network.client(handler, settings, client_info)``, then ``start()``.
    """

    def __init__(
        self,
        network: Network,
        handler: ClientHandler,
        settings: TransportSettings,
        client_info: dict[str, Any] | None,
        authenticated_principal: str | None = None,
    ) -> None:
        super().__init__(
            f"rda-memory-client-{next(_instances)}", network.clock, settings.send_hwm, network._bump
        )
        self._network = network
        self._handler = handler
        self._peer_log = RateLimitedLog(log, clock=network.clock)
        self._settings = settings
        self._info = connect_info("memory")
        self._info.update(client_info or {})
        # Plays ZAP's role: the memory server hands this to its handler as the transport's
        # ``authenticated_principal``, whatever the CONNECT info says.
        self.authenticated_principal = authenticated_principal
        self._ids = itertools.count(1)
        self._conns: dict[int, _Connection] = {}
        self._routing: dict[int, bytes] = {}
        self._on_messages = batch_receiver(handler)
        # Replies held back for ``on_messages`` until the end of the batch (one connection).
        self._arrived: list[Message] = []
        self._arrived_conn = 0
        ClientCounters.__init__(self)

    # --- api.ClientTransport (any thread) ---

    def start(self) -> None:
        self._start_thread()

    def connect(self, endpoint: str) -> int:
        conn = next(self._ids)
        self._post(_Open(conn, endpoint))
        return conn

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        self._post(_Send(connection, list(frames)))

    def disconnect(self, connection: int) -> None:
        self._post(_Disconnect(connection))

    def close(self, timeout: float | None = None) -> None:
        self._stop(self._settings.close_timeout if timeout is None else timeout, kill=False)

    def statistics(self) -> ClientTransportStatistics:
        return self._statistics(len(self._conns))

    def routing_id(self, connection: int) -> bytes | None:
        """The peer id the server sees for ``connection`` (None before the dispatcher opened it)."""
        return self._routing.get(connection)

    # --- called by the network (any thread) ---

    def _link_receive(self, conn: int, frames: list[memoryview], stamp: float) -> None:
        self._inbox.put_network(_Arrival(conn, frames, stamp))

    def _link_gone(self, conn: int) -> None:
        self._inbox.put_network(_Gone(conn))

    # --- dispatcher thread ---

    def _handle(self, item: object) -> None:
        if isinstance(item, _Arrival):
            self._on_arrival(item)
        elif isinstance(item, _Send):
            c = self._conns.get(item.conn)
            if c is None:
                return  # a dead connection: its on_disconnected was or will be delivered
            if c.state is ConnState.CONNECTING:
                c.pending.append(item.frames)
                self._queued += 1
            else:
                self._transmit(c, item.frames)
        elif isinstance(item, _Open):
            self._open(item)
        elif isinstance(item, _Disconnect):
            c = self._conns.get(item.conn)
            if c is not None:
                self._drop(c, CLOSED_LOCALLY)
        elif isinstance(item, _Gone):
            c = self._conns.get(item.conn)
            if c is not None:
                self._drop(c, lost_reason(c.state), ConnEvent.PEER_GONE)

    def _open(self, item: _Open) -> None:
        link = self._network._open_link(item.endpoint, self, item.conn)
        now = self._clock()
        c = _Connection(item.conn, link, now + self._settings.connect_timeout)
        self._conns[c.id] = c
        self._routing[c.id] = link.peer
        self._transmit(c, encode_connect(self._info))

    def _on_arrival(self, item: _Arrival) -> None:
        c = self._conns.get(item.conn)
        if c is None:
            return  # arrived after we dropped the connection
        self._messages_in += 1
        self._bytes_in += frames_size(item.frames)
        try:
            event = decode_frames(
                item.frames, from_server=True, max_size=self._settings.max_message_size
            )
        except (DecodeError, ProtocolError) as exc:
            self._decode_errors += 1
            self._peer_log.log(
                "bad messages", "dropped a bad message on connection %d: %s", c.id, exc
            )
            return
        if c.heartbeat is not None:
            c.heartbeat.received(item.stamp)
        if isinstance(event, Incoming):
            if c.state is not ConnState.CONNECTED:
                self._decode_errors += 1
                self._peer_log.log(
                    "early replies", "REPLY before CONNECT_ACK on connection %d dropped", c.id
                )
                return
            if self._on_messages is not None:
                # As the ZeroMQ client: a batch-taking handler gets the replies of one batch
                # (of one connection) in one call, after the batch.
                if self._arrived_conn != c.id:
                    self._end_batch()
                    self._arrived_conn = c.id
                self._arrived.append(event.message)
                return
            try:
                self._handler.on_message(c.id, event.message)
            except Exception:
                self._handler_failed("on_message")
        elif isinstance(event, ConnectAck):
            self._on_ack(c, event.info, item.stamp)
        elif isinstance(event, Reconnect) and c.state is ConnState.CONNECTED:
            self._drop(c, FORGOTTEN, ConnEvent.RECONNECT_RECEIVED)  # as the ZeroMQ client
        elif not isinstance(event, Heartbeat) or c.state is not ConnState.CONNECTED:
            self._decode_errors += 1

    def _end_batch(self) -> None:
        arrived = self._arrived
        if not arrived:
            return
        self._arrived = []
        assert self._on_messages is not None
        try:
            self._on_messages(self._arrived_conn, arrived)
        except Exception:
            self._handler_failed("on_messages")

    def _on_ack(self, c: _Connection, info: dict[str, Any], stamp: float) -> None:
        self._end_batch()  # replies held back are older than this connection event
        if c.state is not ConnState.CONNECTING:
            self._decode_errors += 1  # a second ACK: ignore it
            return
        if "error" in info:
            self._drop(c, refused_reason(info["error"]), ConnEvent.ACK_REFUSED)
            return
        c.state = next_state(c.state, ConnEvent.ACK_RECEIVED)
        s = self._settings
        c.heartbeat = HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, stamp)
        pending, c.pending = c.pending, []
        for frames in pending:
            self._transmit(c, frames)
        try:
            self._handler.on_connected(c.id, info)
        except Exception:
            self._handler_failed("on_connected")

    def _transmit(self, c: _Connection, frames: Sequence[Buffer]) -> None:
        self._network._client_send(c.link, frames)
        self._messages_out += 1
        self._bytes_out += frames_size(frames)
        if c.heartbeat is not None:
            c.heartbeat.sent(self._clock())

    def _check_timers(self, now: float) -> None:
        for c in list(self._conns.values()):
            if c.heartbeat is None:
                if now >= c.connect_deadline:
                    self._drop(c, NO_CONNECT_ACK, ConnEvent.HEARTBEAT_TIMEOUT)
                continue
            action = c.heartbeat.check(now)
            if action is HeartbeatAction.EXPIRED:
                self._heartbeat_timeouts += 1
                self._drop(c, HEARTBEAT_TIMEOUT, ConnEvent.HEARTBEAT_TIMEOUT)
            elif action is HeartbeatAction.SEND:
                self._transmit(c, _HEARTBEAT)

    def _next_deadline(self) -> float | None:
        deadlines = [
            c.connect_deadline if c.heartbeat is None else c.heartbeat.next_deadline()
            for c in self._conns.values()
        ]
        return min(deadlines, default=None)

    def _drop(self, c: _Connection, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE) -> None:
        self._end_batch()  # replies held back arrived before the connection was lost
        del self._conns[c.id]
        self._routing.pop(c.id, None)
        c.state = next_state(c.state, event)
        self._network._close_link(c.link)
        self._disconnects += 1
        try:
            self._handler.on_disconnected(c.id, reason)
        except Exception:
            self._handler_failed("on_disconnected")

    def _handler_failed(self, what: str) -> None:
        self._handler_errors += 1
        log.exception("client handler %s raised; the transport carries on", what)

    def _teardown(self, report: bool) -> None:
        for c in list(self._conns.values()):
            if report:
                self._drop(c, CLOSED_LOCALLY)
            else:
                self._conns.pop(c.id)
                self._network._close_link(c.link)
        self._network._forget(self)
