"""The client side of the protocol, written once: every rule of a client connection, no I/O.

Both client transports (``zmq_client`` over DEALER sockets, the in-memory one of
``rda.testing``) run these rules; they only move frames and run timers (h11's way: the
protocol is one sans-I/O state machine that any I/O layer feeds). What lives here:

* :class:`ClientSessions`: the connections of one client transport. The I/O layer feeds it
  what happened (a connection opened, frames received, the pipe writable again, the socket
  gone, time passed) and it decides: the CONNECT/CONNECT_ACK handshake and its timeout,
  what may be sent before the ACK (the CONNECT only; requests wait, in order), heartbeats
  and their timeout, RECONNECT, the back-pressure on senders when too much waits
  (``pause_intake``), which bad input is counted and logged (at most one line per kind per
  second), and which events the business layer gets (``ClientHandler``). It holds the
  counters behind ``statistics()``. Its only way out is a :class:`ClientWire` (write frames,
  release a connection, pause the intake) and the handler.
* :class:`LaneSession`: the rules of one direct lane (a blocking caller's own connection,
  ``rda.transport.api.DirectLane``): when to introduce itself again, which received message
  is the awaited reply, what a refusal or a RECONNECT means.

Threading: a :class:`ClientSessions` is touched by its transport's dispatcher only; a
:class:`LaneSession` by its lane's owner thread only.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.serialization.errors import DecodeError, ProtocolError, TransportError
from rda.serialization.header import HEADER_FIXED, RequestType
from rda.serialization.message import Message
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransportStatistics,
    TransportSettings,
    batch_receiver,
    request_check,
)
from rda.transport.protocol import (
    ConnectAck,
    Heartbeat,
    Incoming,
    Kind,
    Reconnect,
    decode_frames,
    decode_from_server,
    encode_connect,
    encode_heartbeat,
)
from rda.transport.ratelog import RateLimitedLog
from rda.transport.reasons import (
    CLOSED_LOCALLY,
    FORGOTTEN,
    HEARTBEAT_TIMEOUT,
    NO_CONNECT_ACK,
    lost_reason,
    refused_reason,
)
from rda.transport.state import ConnEvent, ConnState, HeartbeatAction, HeartbeatTracker, next_state

__all__ = ["ClientSession", "ClientSessions", "ClientWire", "LaneSession"]

HEARTBEAT_FRAMES = encode_heartbeat(from_server=False)

# Requests a client abandons at its deadline: never sent once abandoned (``_expired``).
_EXPIRABLE = frozenset({RequestType.GET, RequestType.SET})
# Enum members read once: each ``ConnState.X`` (``Kind.X``) read goes through the enum class's
# ``__getattr__`` hook on Python 3.11, ten times a module global's cost.
_CONNECTING, _CONNECTED = ConnState.CONNECTING, ConnState.CONNECTED
_REQUEST = Kind.REQUEST


@dataclass(slots=True, eq=False)
class ClientSession:
    """One connection of a client transport, as the rules see it; ``io`` is the I/O layer's
    own record of it (its socket, its link)."""

    id: int
    endpoint: str
    heartbeat: HeartbeatTracker
    connect_deadline: float
    io: Any = None
    state: ConnState = ConnState.CONNECTING
    # The CONNECT went out: until the ACK nothing else may.
    connect_sent: bool = False
    # The server's heartbeat timeout (its CONNECT_ACK): how long it remembers a silent lane.
    server_timeout: float = 10.0
    # Messages waiting for the CONNECT_ACK, or for the pipe to drain (a full pipe).
    backlog: deque[Sequence[Any]] = field(default_factory=deque)


class ClientWire(Protocol):
    """What the rules ask of a client transport's I/O layer (dispatcher thread only)."""

    def write(self, session: ClientSession, frames: Sequence[Any]) -> bool | None:
        """Send one message now, without blocking: True when sent; False when the pipe is
        full (the rules keep the message, and the I/O layer calls
        :meth:`ClientSessions.writable` once there is room); None when the send failed for
        good, after the I/O layer ended the session with :meth:`ClientSessions.drop`."""
        ...

    def want_writable(self, session: ClientSession, on: bool) -> None:
        """Tell (or stop telling) the rules when ``session``'s pipe has room again."""
        ...

    def release(self, session: ClientSession) -> None:
        """The connection is over: close what the I/O layer holds for it."""
        ...

    def pause_intake(self, paused: bool) -> None:
        """Stop (or resume) taking messages from user threads: they block (back-pressure)."""
        ...


class ClientSessions:
    """Every connection of one client transport, and the rules they follow.

    Call from the dispatcher thread only. ``clock`` is the transport's clock (monotonic, or a
    ``FakeClock`` in tests); ``log`` is where lines about the peers go (rate-limited).
    """

    def __init__(
        self,
        handler: ClientHandler,
        settings: TransportSettings,
        info: dict[str, Any],
        wire: ClientWire,
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self._handler = handler
        self._on_messages = batch_receiver(handler)
        self._awaits = request_check(handler)
        self._settings = settings
        self._max_size = settings.max_message_size  # read per message received
        self._hello = encode_connect(info)
        self._wire = wire
        self._clock = clock
        self._log = log
        # Every line a server can cause goes through it: one per kind per second.
        self._peer_log = RateLimitedLog(log, clock=clock)
        self.sessions: dict[int, ClientSession] = {}
        # Replies held for one on_messages call (``hold``), all of one connection.
        self._held: list[Message] = []
        self._held_session: ClientSession | None = None
        # The earliest time ``check_timers`` may have something to do (may be early, never
        # late: traffic only moves a connection's deadlines later).
        self.next_timer = float("inf")
        self._backlog_total = 0
        self._intake_paused = False
        # The counters behind statistics(); written here only (one thread).
        self.messages_in = 0
        self.messages_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.connected = 0
        self.heartbeat_timeouts = 0
        self.decode_errors = 0
        self.disconnects = 0
        self.queued = 0  # messages sent before CONNECT_ACK (they waited for it)
        self.expired_unsent = 0  # of those, gets and sets dropped: their request had ended
        self.handler_errors = 0

    def statistics(
        self, lane_counts: tuple[int, list[int]] | None = None
    ) -> ClientTransportStatistics:
        """The counters, with the lanes' (``LanePool.counts()``: open lanes, and their
        messages and bytes in and out, decode errors and stale replies) added in."""
        lanes, (m_in, m_out, b_in, b_out, errors, stale) = lane_counts or (0, [0] * 6)
        return ClientTransportStatistics(
            messages_in=self.messages_in + m_in,
            messages_out=self.messages_out + m_out,
            bytes_in=self.bytes_in + b_in,
            bytes_out=self.bytes_out + b_out,
            connections=self.connected,
            heartbeat_timeouts=self.heartbeat_timeouts,
            decode_errors=self.decode_errors + errors,
            disconnects=self.disconnects,
            queued_until_connected=self.queued,
            expired_unsent=self.expired_unsent,
            handler_errors=self.handler_errors,
            lanes=lanes,
            lane_stale_replies=stale,
        )

    # ------------------------------------------------------------------ opening and sending

    def open(self, conn: int, endpoint: str, io: Any) -> ClientSession:
        """A connection is being made (its socket or link is ``io``): the CONNECT goes first,
        as soon as the pipe takes it, and only it until the CONNECT_ACK."""
        now = self._clock()
        s = self._settings
        session = ClientSession(
            conn,
            endpoint,
            HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, now),
            now + s.connect_timeout,
            io,
        )
        self.sessions[conn] = session
        self.next_timer = min(self.next_timer, session.connect_deadline)
        self._push_backlog(session, self._hello)
        self.flush(session)
        return session

    def failed_to_open(self, conn: int, reason: str) -> None:
        """The connection could not even be attempted (bad endpoint, bad keys)."""
        self.disconnects += 1
        self._notify_disconnected(conn, reason)

    def send(self, conn: int, frames: Sequence[Any]) -> None:
        """A message for the server of ``conn``; on a dead connection a silent no-op (its
        ``on_disconnected`` was or will be delivered)."""
        session = self.sessions.get(conn)
        if session is None:
            return
        if session.state is _CONNECTING:
            self.queued += 1
            self._push_backlog(session, frames)
        elif session.backlog or not self._write(session, frames):
            # The pipe is full (or older messages wait): keep the order, retry when writable.
            self._push_backlog(session, frames)
            if session.id in self.sessions:
                self._wire.want_writable(session, True)

    def writable(self, session: ClientSession) -> None:
        """``session``'s pipe has room again."""
        self.flush(session)

    def flush(self, session: ClientSession) -> None:
        """Send the backlog while the pipe takes it; before the ACK only the CONNECT may go."""
        backlog = session.backlog
        while backlog:
            if session.state is _CONNECTING and session.connect_sent:
                break  # the queued requests wait for CONNECT_ACK
            frames = backlog[0]
            if self._expired(frames):
                backlog.popleft()
                self._backlog_total -= 1
                self.expired_unsent += 1
                continue
            if not self._write(session, frames):
                if session.id in self.sessions:
                    self._wire.want_writable(session, True)
                return
            backlog.popleft()
            self._backlog_total -= 1
            session.connect_sent = True
        if session.id in self.sessions:
            self._wire.want_writable(session, False)
        self._resume_intake()

    def _expired(self, frames: Sequence[Any]) -> bool:
        """A GET or SET whose request the business layer no longer waits for (it waited in
        the backlog, for the CONNECT_ACK or a full pipe, past its deadline): never sent
        (``request_check``). Only the backlog pays this check, never a direct send."""
        awaits = self._awaits
        if awaits is None or not frames:
            return False
        first = frames[0]
        if len(first) < 1 + HEADER_FIXED.size or first[0] != _REQUEST:
            return False
        _, rtype, _, _, rid, _, _, _ = HEADER_FIXED.unpack_from(first, 1)
        return rtype in _EXPIRABLE and not awaits(rid)

    def _write(self, session: ClientSession, frames: Sequence[Any]) -> bool:
        ok = self._wire.write(session, frames)
        if ok:
            self.messages_out += 1
            size = 0
            for frame in frames:  # compiled, a C loop (as in ``received``)
                size += len(frame)
            self.bytes_out += size
            session.heartbeat.last_sent = self._clock()
            return True
        return ok is None  # failed for good: nothing is left to retry

    def _push_backlog(self, session: ClientSession, frames: Sequence[Any]) -> None:
        session.backlog.append(frames)
        self._backlog_total += 1
        if self._backlog_total >= self._settings.peer_queue_limit and not self._intake_paused:
            # Stop taking messages from user threads: they block (back-pressure).
            self._intake_paused = True
            self._wire.pause_intake(True)

    def _resume_intake(self) -> None:
        if self._intake_paused and self._backlog_total < self._settings.peer_queue_limit // 2 + 1:
            self._intake_paused = False
            self._wire.pause_intake(False)

    # ------------------------------------------------------------------------- receiving

    def received(self, session: ClientSession, frames: Sequence[Any], now: float) -> Message | None:
        """One message from the server of ``session``; returns a REPLY for the business
        layer (hand it over with :meth:`deliver`), or None when the rules dealt with it."""
        self.messages_in += 1
        size = 0
        for frame in frames:  # compiled, a C loop (``sum(map(len, ...))`` made two objects)
            size += len(frame)
        self.bytes_in += size
        # Any message is proof of life, even one we then drop.
        session.heartbeat.last_received = now
        try:
            event = decode_from_server(frames, self._max_size)
        except (DecodeError, ProtocolError) as exc:
            self.decode_errors += 1
            self._peer_log.log(
                "bad messages", "dropped a bad message from %s: %s", session.endpoint, exc
            )
            return None
        if type(event) is Incoming:
            if session.state is _CONNECTED:
                return event.message
            self.decode_errors += 1
            self._peer_log.log(
                "early replies", "%s sent a REPLY before CONNECT_ACK; dropped", session.endpoint
            )
        elif type(event) is ConnectAck:
            self._acknowledged(session, event.info)
        elif type(event) is Reconnect:
            if session.state is _CONNECTED:
                # The server dropped us (we were paused past its heartbeat timeout): report the
                # connection lost now, so the business layer connects and subscribes again.
                self.drop(session, FORGOTTEN, ConnEvent.RECONNECT_RECEIVED)
        elif type(event) is not Heartbeat:
            self.decode_errors += 1  # a client-side kind: the server breaks the protocol
        return None

    def _acknowledged(self, session: ClientSession, info: dict[str, Any]) -> None:
        if self._held:
            self.end_batch()  # replies held back are older than this connection event
        if session.state is not _CONNECTING:
            # A second ACK changes nothing, but a server that sends one breaks the protocol.
            self.decode_errors += 1
            self._peer_log.log("repeated ACKs", "%s sent CONNECT_ACK twice", session.endpoint)
            return
        error = info.get("error")
        if error is not None:
            self.drop(session, refused_reason(error), ConnEvent.ACK_REFUSED)
            return
        session.state = next_state(session.state, ConnEvent.ACK_RECEIVED)
        timeout = info.get("heartbeat_timeout")
        if isinstance(timeout, int | float) and timeout > 0:
            session.server_timeout = float(timeout)
        self.next_timer = min(self.next_timer, session.heartbeat.next_deadline())
        self.connected += 1
        try:
            self._handler.on_connected(session.id, info)
        except Exception:
            self._handler_failed("on_connected")
        # What waited for the ACK goes out now, before what on_connected sent (it queued).
        if session.id in self.sessions:
            self.flush(session)

    def deliver(self, session: ClientSession, message: Message) -> None:
        """Hand one REPLY to the business layer now (after any held ones)."""
        if self._held:
            self.end_batch()
        if self._on_messages is not None:
            try:
                self._on_messages(session.id, [message])
            except Exception:
                self._handler_failed("on_messages")
            return
        try:
            self._handler.on_message(session.id, message)
        except Exception:
            self._handler_failed("on_message")

    def hold(self, session: ClientSession, message: Message) -> None:
        """Keep a REPLY for the batch that :meth:`end_batch` hands over (to a handler that
        takes batches; any other gets it now). A batch holds one connection's replies, in
        arrival order; a connection event hands the held ones over first, so the business
        layer never sees them reordered against it."""
        if self._on_messages is None:
            self.deliver(session, message)
            return
        if self._held and self._held_session is not session:
            self.end_batch()
        self._held_session = session
        self._held.append(message)

    def end_batch(self) -> None:
        """Hand the held replies over in one ``on_messages`` call."""
        held = self._held
        if not held:
            return
        self._held = []
        session = self._held_session
        assert self._on_messages is not None and session is not None
        try:
            self._on_messages(session.id, held)
        except Exception:
            self._handler_failed("on_messages")

    # ---------------------------------------------------------------------- time and loss

    def check_timers(self, now: float) -> float:
        """Connect timeouts and heartbeats; returns (and keeps) the next deadline."""
        next_timer = float("inf")
        for session in list(self.sessions.values()):
            if session.state is _CONNECTING:
                if now >= session.connect_deadline:
                    self.drop(session, NO_CONNECT_ACK, ConnEvent.HEARTBEAT_TIMEOUT)
                else:
                    next_timer = min(next_timer, session.connect_deadline)
                continue
            action = session.heartbeat.check(now)
            if action is HeartbeatAction.EXPIRED:
                self.heartbeat_timeouts += 1
                self.drop(session, HEARTBEAT_TIMEOUT, ConnEvent.HEARTBEAT_TIMEOUT)
                continue
            if (
                action is HeartbeatAction.SEND
                and not session.backlog
                and not self._write(session, HEARTBEAT_FRAMES)
            ):
                session.heartbeat.last_sent = now  # pipe full: the server is busy, not idle
            if session.id in self.sessions:
                next_timer = min(next_timer, session.heartbeat.next_deadline())
        self.next_timer = next_timer
        self._peer_log.flush()
        return next_timer

    def gone(self, session: ClientSession, reason: str | None = None) -> None:
        """The connection closed under us (socket monitor, link closed); ``reason`` when the
        I/O layer knows better (a refused security handshake)."""
        self.drop(session, reason or lost_reason(session.state), ConnEvent.PEER_GONE)

    def disconnect(self, conn: int) -> None:
        """Close one connection on the business layer's request."""
        session = self.sessions.get(conn)
        if session is not None:
            self.drop(session, CLOSED_LOCALLY)

    def drop(
        self, session: ClientSession, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE
    ) -> None:
        """End ``session``: release its I/O, report it once."""
        if self.sessions.pop(session.id, None) is None:
            return
        if self._held:
            self.end_batch()  # replies held back arrived before the connection was lost
        if session.state is _CONNECTED:
            self.connected -= 1
        session.state = next_state(session.state, event)
        self._backlog_total -= len(session.backlog)
        session.backlog.clear()
        self._wire.release(session)
        self._resume_intake()
        self.disconnects += 1
        self._notify_disconnected(session.id, reason)

    def close_all(self) -> None:
        """The transport closes: every connection ends "closed locally"."""
        for session in list(self.sessions.values()):
            self.drop(session, CLOSED_LOCALLY)
        self._peer_log.flush()

    def discard_all(self) -> None:
        """The process died (a test's kill): every connection's I/O is released, nobody is
        told."""
        for session in list(self.sessions.values()):
            del self.sessions[session.id]
            self._wire.release(session)
        self._held = []
        self._backlog_total = 0

    def _notify_disconnected(self, conn: int, reason: str) -> None:
        try:
            self._handler.on_disconnected(conn, reason)
        except Exception:
            self._handler_failed("on_disconnected")

    def _handler_failed(self, what: str) -> None:
        # The dispatcher must survive any business-layer bug: log, count, carry on.
        self.handler_errors += 1
        self._log.exception("client handler %s raised; the transport carries on", what)


class LaneSession:
    """The rules of one direct lane (``rda.transport.api.DirectLane``), without its socket.

    A lane is a session of its own at the server (a CONNECT with ``"lane": True``); the server
    does not heartbeat it and forgets it quietly when idle, so a lane idle for
    ``refresh_after`` introduces itself again with the request (no extra round trip). Used by
    the lane's owner thread only; its counters are summed into the transport's statistics.
    """

    __slots__ = (
        "address",
        "bytes_in",
        "bytes_out",
        "decode_errors",
        "hello",
        "last_used",
        "max_size",
        "messages_in",
        "messages_out",
        "refresh_after",
        "stale",
    )

    def __init__(
        self, address: str, hello: Sequence[Buffer], refresh_after: float, max_size: int
    ) -> None:
        self.address = address
        self.hello = hello  # our CONNECT, with "lane": True
        self.refresh_after = refresh_after
        self.max_size = max_size
        self.last_used = -float("inf")  # forces the first call's CONNECT
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        self.decode_errors = 0
        self.stale = 0  # replies to earlier, abandoned requests, read and dropped

    def needs_hello(self, now: float) -> bool:
        """True when the next request must be preceded by the CONNECT (new, or possibly
        forgotten by the server)."""
        return now - self.last_used > self.refresh_after

    def sent(self, frames: Sequence[Buffer], now: float, with_hello: bool) -> None:
        self.messages_out += 2 if with_hello else 1
        self.bytes_out += sum(map(len, frames))
        self.last_used = now

    def received(
        self, frames: Sequence[Any], request_id: int, log: RateLimitedLog
    ) -> Message | None:
        """One message read while waiting for ``request_id``: the reply, or None to go on
        waiting. Raises ``TransportError`` when the server refused the lane."""
        self.messages_in += 1
        self.bytes_in += sum(map(len, frames))
        try:
            event = decode_frames(frames, from_server=True, max_size=self.max_size)
        except (DecodeError, ProtocolError) as exc:
            self.decode_errors += 1
            log.log("bad messages", "dropped a bad message from %s: %s", self.address, exc)
            return None
        if type(event) is Incoming:
            message = event.message
            if message.header.id == request_id:
                return message
            self.stale += 1
        elif type(event) is ConnectAck and "error" in event.info:
            raise TransportError(f"{self.address} refused the lane: {event.info['error']}")
        elif type(event) is Reconnect:
            self.last_used = -float("inf")  # forgotten: the next call introduces itself
        # A CONNECT_ACK or a heartbeat: nothing to do.
        return None

    def counts(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.messages_in,
            self.messages_out,
            self.bytes_in,
            self.bytes_out,
            self.decode_errors,
            self.stale,
        )
