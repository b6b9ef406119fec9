"""The client transport: one dispatcher thread over one DEALER per server connection.

Threading (docs/architecture.md, RDA3 paper "Dispatcher Thread"): the thread named
``rda-client-dispatcher`` owns every zmq socket of this transport. User threads reach it through
a bounded mailbox (``_mailbox``: a deque of Python objects, 2 x ``send_hwm`` messages, and a
wake-up descriptor written only while the dispatcher sleeps), so a flooding producer blocks.
Calls made *on* the dispatcher thread (from a handler) skip the mailbox and act directly: that
is both the fastest path and the only one that cannot deadlock on a full mailbox.

Handlers run on the dispatcher after only the header was parsed; they must be fast and never
block (hand the message to a scheduler). The transport never reconnects: a connection that is
lost (monitor event, heartbeat timeout, refused handshake, ``connect_timeout``) is reported once
through ``on_disconnected`` and its DEALER closed; the business layer calls ``connect`` again.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from rda.serialization._message import Message
from rda.serialization.errors import DecodeError, ProtocolError, TransportError
from rda.transport import _zmq_common as common
from rda.transport._curve import ClientCurve, apply_client
from rda.transport._handshake import handshake_failure
from rda.transport._mailbox import Mailbox, Wakeup
from rda.transport._peers import (
    CLOSED_LOCALLY,
    FORGOTTEN,
    HANDSHAKE_REFUSED,
    HEARTBEAT_TIMEOUT,
    NO_CONNECT_ACK,
    ClientCounters,
    connect_info,
    lost_reason,
    rda_version,
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
from rda.transport.zmq_lane import Lane, Lanes

_DEFAULT_SETTINGS = TransportSettings()

__all__ = ["ZmqClientTransport", "default_client_info"]

log = logging.getLogger("rda.transport.client")

# Mailbox items: (operation, connection id, frames or endpoint or None).
_SEND, _CONNECT, _DISCONNECT = 0, 1, 2
_HEARTBEAT_FRAMES = encode_heartbeat(from_server=False)


def default_client_info() -> dict[str, Any]:
    """What CONNECT tells the server about this process."""
    return connect_info(rda_version())


@dataclass(slots=True, eq=False)
class _Connection:
    id: int
    endpoint: str
    sock: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes] | None
    heartbeat: HeartbeatTracker
    connect_deadline: float
    state: ConnState = ConnState.CONNECTING
    connect_sent: bool = False
    # The server's heartbeat timeout (its CONNECT_ACK): how long it remembers a silent lane.
    server_timeout: float = 10.0
    # Messages waiting for CONNECT_ACK, or for the DEALER's pipe to drain (EAGAIN).
    backlog: deque[Sequence[Any]] = field(default_factory=deque)


class ZmqClientTransport(common.DispatcherShell, ClientCounters):
    """:class:`rda.transport.api.ClientTransport` over ZeroMQ DEALER sockets.

    With ``curve`` every DEALER is a CURVE client (``_curve``); a refused security handshake
    is reported as a disconnection whose reason starts with ``HANDSHAKE_REFUSED``.
    """

    def __init__(
        self,
        handler: ClientHandler,
        settings: TransportSettings = _DEFAULT_SETTINGS,
        client_info: dict[str, Any] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        curve: ClientCurve | None = None,
    ) -> None:
        super().__init__("client", settings, context, clock, log)
        self._handler = handler
        self._on_messages = batch_receiver(handler)
        self._bursty = False  # the last drain found more than one message
        self._curve = curve
        self._info = default_client_info()
        if client_info:
            self._info.update(client_info)
        self._ids = itertools.count(1)
        self._conns: dict[int, _Connection] = {}
        self._by_socket: dict[zmq.Socket[bytes], _Connection] = {}
        self._by_monitor: dict[zmq.Socket[bytes], _Connection] = {}
        self._backlog_total = 0
        self._mailbox_paused = False
        ClientCounters.__init__(self)
        self._next_timer = float("inf")
        self._connected = 0
        # Wake-ups handed to ``wake_later`` on the dispatcher, set before it polls again.
        self._wakes: list[Wakeup] = []
        self._lanes: Lanes | None = None
        # What a server sends can make us log: one line per kind per second (``_ratelog``).
        self._peer_log = RateLimitedLog(log, clock=clock)

    # ----------------------------------------------------------------- public, any thread

    def start(self) -> None:
        context = self._begin_start()
        self._lanes = Lanes(context, self._settings, self._info, self._curve)
        self._open_mailbox()
        self._start_thread()

    def connect(self, endpoint: str) -> int:
        conn = next(self._ids)
        if self._on_dispatcher():
            self._open(conn, endpoint)
        elif not self._mailbox_or_raise().put((_CONNECT, conn, endpoint)):
            raise TransportError("the transport is closed")
        return conn

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        if self._on_dispatcher():
            c = self._conns.get(connection)
            if c is not None:
                self._send_on(c, frames)
            return
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.put((_SEND, connection, frames))

    def disconnect(self, connection: int) -> None:
        if self._on_dispatcher():
            self._drop_id(connection, CLOSED_LOCALLY)
        elif self._mailbox is not None:
            self._mailbox.put((_DISCONNECT, connection, None))

    def statistics(self) -> ClientTransportStatistics:
        stats = self._statistics(self._connected)
        if self._lanes is None:
            return stats
        lanes, (m_in, m_out, b_in, b_out, errors, stale) = self._lanes.counts()
        return dataclasses.replace(
            stats,
            messages_in=stats.messages_in + m_in,
            messages_out=stats.messages_out + m_out,
            bytes_in=stats.bytes_in + b_in,
            bytes_out=stats.bytes_out + b_out,
            decode_errors=stats.decode_errors + errors,
            lanes=lanes,
            lane_stale_replies=stale,
        )

    def lane(self, connection: int) -> Lane | None:
        """The calling thread's own lane (zmq_lane) to the server of ``connection``, while
        that connection is established; None otherwise (then use :meth:`send`)."""
        c = self._conns.get(connection)  # a dict read: safe from any thread under the GIL
        lanes = self._lanes
        if c is None or c.state is not ConnState.CONNECTED or lanes is None or self._closing:
            return None
        return lanes.of_thread(c.endpoint, connection, c.server_timeout * 0.5)

    def wake_later(self, wakeup: Wakeup) -> None:
        """Set ``wakeup`` (a caller waits on it for a reply) once the dispatcher is done with
        what is ready, right before it polls again; from any other thread, at once.

        For a handler completing a blocking request: a caller woken in the middle of the
        dispatcher's work (the next receive releases the GIL, and so does freeing a frame)
        competes with it for the GIL; set right before the poll, the caller runs while the
        dispatcher waits, usually finding its next request already in the mailbox.
        """
        if self._on_dispatcher() and not self._closing:
            self._wakes.append(wakeup)
        else:
            wakeup.set()

    # ------------------------------------------------------------------ helpers

    def _mailbox_or_raise(self) -> Mailbox:
        if self._mailbox is None:
            raise TransportError("the transport is not started")
        return self._mailbox

    # --------------------------------------------------------------- dispatcher thread

    def _run(self) -> None:
        self._thread_id = threading.get_ident()
        mailbox = self._mailbox
        assert mailbox is not None
        poll = self._poller.poll
        try:
            while not self._closing:
                if self._wakes:
                    # Before the poll decides to sleep: a woken caller's next request, put
                    # while we wait for the GIL, is then found without a wake-up signal.
                    self._set_wakes()
                for sock, event in poll(self._timeout_ms(self._next_timer)):
                    try:
                        if sock is mailbox:
                            self._drain_mailbox(mailbox)
                        elif (c := self._by_socket.get(sock)) is not None:
                            if event & common.POLLIN:
                                self._drain_dealer(c)
                            if event & common.POLLOUT and c.id in self._conns:
                                self._flush(c)
                        elif (c := self._by_monitor.get(sock)) is not None:
                            self._on_monitor(c, sock)
                    except zmq.ContextTerminated:
                        raise
                    except Exception:
                        # A bug must not take every connection down: log it and carry on.
                        self._internal_errors += 1
                        log.exception("client dispatcher: unexpected error; carrying on")
                    if self._closing:
                        break
                if self._conns and self._clock() >= self._next_timer:
                    self._check_timers()
        except Exception:
            log.exception("client dispatcher failed; closing the transport")
        finally:
            self._shutdown()

    def _set_wakes(self) -> None:
        wakes = self._wakes
        self._wakes = []
        for wakeup in wakes:
            wakeup.set()

    def _drain_mailbox(self, mailbox: Mailbox) -> None:
        items = mailbox.items
        take = items.popleft
        try:
            for _ in range(common.BATCH):
                # Test, then take (we are the only consumer): an emptied deque's IndexError
                # cost an exception per wake-up.
                if not items:
                    return
                op, conn, payload = take()
                if op == _SEND:
                    c = self._conns.get(conn)
                    if c is not None:
                        self._send_on(c, payload)
                elif op == _CONNECT:
                    self._open(conn, payload)
                elif op == _DISCONNECT:
                    self._drop_id(conn, CLOSED_LOCALLY)
                if self._closing or self._mailbox_paused:
                    return
        finally:
            mailbox.taken()

    def _open(self, conn: int, endpoint: str) -> None:
        assert self._context is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # The transport never reconnects by itself (docs/architecture.md): a lost connection is closed.
        sock.setsockopt(zmq.RECONNECT_IVL, -1)
        sock.setsockopt(zmq.ROUTING_ID, b"c" + uuid.uuid4().bytes)
        sock.setsockopt(zmq.MAXMSGSIZE, self._settings.max_message_size)
        # Queue only towards a completed connection, so EAGAIN (not a silent libzmq buffer)
        # tells the dispatcher that the server does not keep up.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        if self._curve is not None:
            try:
                apply_client(sock, self._curve, endpoint)
            except TransportError as exc:
                common.close_socket(sock)
                self._disconnects += 1
                self._notify_disconnected(conn, f"{HANDSHAKE_REFUSED}: {exc}")
                return
        monitor = None if endpoint.startswith("inproc://") else common.open_monitor(sock)
        now = self._clock()
        s = self._settings
        c = _Connection(
            conn,
            endpoint,
            sock,
            monitor,
            HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, now),
            now + s.connect_timeout,
        )
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            common.close_monitored(sock, monitor)
            self._disconnects += 1
            self._notify_disconnected(conn, f"cannot connect to {endpoint}: {exc}")
            return
        self._conns[conn] = c
        self._next_timer = min(self._next_timer, c.connect_deadline)
        self._by_socket[sock] = c
        self._poller.register(sock, zmq.POLLIN)
        if monitor is not None:
            self._by_monitor[monitor] = c
            self._poller.register(monitor, zmq.POLLIN)
        # With IMMEDIATE the CONNECT cannot be sent before the TCP connection exists; it waits
        # at the head of the backlog and goes out on the first POLLOUT.
        self._push_backlog(c, encode_connect(self._info))
        self._flush(c)

    def _push_backlog(self, c: _Connection, frames: Sequence[Any]) -> None:
        c.backlog.append(frames)
        self._backlog_total += 1
        if self._backlog_total >= self._settings.peer_queue_limit and not self._mailbox_paused:
            # Stop taking messages from user threads: they block on the full mailbox
            # (back-pressure).
            self._mailbox_paused = True
            self._poller.watch_mailbox(False)

    def _send_on(self, c: _Connection, frames: Sequence[Any]) -> None:
        if c.state is ConnState.CONNECTING:
            self._queued += 1
            self._push_backlog(c, frames)
        elif c.backlog or not self._write(c, frames):
            # The DEALER's pipe is full (or older messages wait): keep the order, retry on
            # POLLOUT.
            self._push_backlog(c, frames)
            if c.id in self._conns:
                self._poller.modify(c.sock, zmq.POLLIN | zmq.POLLOUT)

    def _write(self, c: _Connection, frames: Sequence[Any]) -> bool:
        """One non-blocking send; False when the DEALER's pipe is full."""
        self._poller.touch(c.sock)  # even a failed send may consume a wake-up signal
        try:
            common.send_frames(c.sock, frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self._drop(c, f"send failed: {exc}")
            return True
        self._messages_out += 1
        self._bytes_out += sum(map(len, frames))
        c.heartbeat.last_sent = self._clock()
        return True

    def _flush(self, c: _Connection) -> None:
        """Send the backlog while the DEALER accepts; before the ACK only CONNECT may go."""
        while c.backlog:
            if c.state is ConnState.CONNECTING and c.connect_sent:
                break  # the queued requests wait for CONNECT_ACK
            if not self._write(c, c.backlog[0]):
                if c.id in self._conns:
                    self._poller.modify(c.sock, zmq.POLLIN | zmq.POLLOUT)
                return
            c.backlog.popleft()
            self._backlog_total -= 1
            c.connect_sent = True
        if c.id in self._conns:
            self._poller.modify(c.sock, zmq.POLLIN)
        self._resume_mailbox()

    def _resume_mailbox(self) -> None:
        if self._mailbox_paused and self._backlog_total < self._settings.peer_queue_limit // 2 + 1:
            self._mailbox_paused = False
            self._poller.watch_mailbox(True)

    def _drain_dealer(self, c: _Connection) -> None:
        # A handler that takes batches (api.BatchClientHandler) gets every REPLY of this
        # drain in one call after the last receive: consumers are woken once per batch, and
        # not while this thread still makes GIL-releasing receive calls. Only while messages
        # come faster than they are handled (seed 000, "Batching"): after a drain that found
        # one message, the first reply of the next is handed over at once, before the receive
        # that ends the drain, so a caller woken by it can send its next request meanwhile
        # (with the reply held back, the dispatcher went to sleep first: 2 polls per get, not 1).
        batch: list[Message] | None = [] if self._on_messages is not None else None
        received = 0
        try:
            received = self._drain_into(c, batch)
        finally:
            if batch:
                self._deliver_batch(c, batch)
        self._bursty = received > 1

    def _deliver_batch(self, c: _Connection, batch: list[Message]) -> None:
        assert self._on_messages is not None
        try:
            self._on_messages(c.id, batch)
        except Exception:
            self._handler_failed("on_messages")

    def _drain_into(self, c: _Connection, batch: list[Message] | None) -> int:
        """Receive up to BATCH messages; returns how many."""
        sock = c.sock
        max_size = self._settings.max_message_size
        now = self._clock()
        bursty = self._bursty
        recv_direct, handle = common.direct_recv, sock.underlying
        frames: list[Any] | int | None = None
        for n in range(common.BATCH):
            # Small frames copied, big ones zero-copy (common.COPY_BELOW). The direct receive
            # keeps the GIL (_direct_zmq); on an error other than "nothing waiting" (an errno)
            # pyzmq receives again and raises its own exception.
            if recv_direct is not None:
                frames = recv_direct(handle, common.COPY_BELOW)
            if recv_direct is None or isinstance(frames, int):
                frames = common.recv_copied(sock)
            if frames is None:
                self._poller.settle(sock)
                return n
            self._messages_in += 1
            self._bytes_in += sum(map(len, frames))
            c.heartbeat.last_received = now
            try:
                event = decode_frames(frames, from_server=True, max_size=max_size)
            except (DecodeError, ProtocolError) as exc:
                self._decode_errors += 1
                self._peer_log.log(
                    "bad messages", "dropped a bad message from %s: %s", c.endpoint, exc
                )
                continue
            if type(event) is Incoming:
                if c.state is ConnState.CONNECTED:
                    if batch is not None:
                        if bursty:
                            batch.append(event.message)
                        else:
                            # Sparse flow: hand the first one over now; any more found in
                            # this drain are a burst and are batched.
                            self._deliver_batch(c, [event.message])
                            bursty = True
                    else:
                        try:
                            self._handler.on_message(c.id, event.message)
                        except Exception:
                            self._handler_failed("on_message")
                else:
                    self._decode_errors += 1
                    self._peer_log.log(
                        "early replies", "%s sent a REPLY before CONNECT_ACK; dropped", c.endpoint
                    )
            elif type(event) is ConnectAck:
                self._on_ack(c, event.info)
            elif type(event) is Reconnect and c.state is ConnState.CONNECTED:
                # The server dropped us (we were paused past its heartbeat timeout): report
                # the connection lost now, so the business layer connects and subscribes again.
                self._drop(c, FORGOTTEN, ConnEvent.RECONNECT_RECEIVED)
            elif type(event) is not Heartbeat:
                self._decode_errors += 1
            if self._closing or c.id not in self._conns:
                return n + 1
        return common.BATCH

    def _on_ack(self, c: _Connection, info: dict[str, Any]) -> None:
        if c.state is not ConnState.CONNECTING:
            return  # a duplicate ACK changes nothing
        error = info.get("error")
        if error is not None:
            c.state = next_state(c.state, ConnEvent.ACK_REFUSED)
            self._drop(c, refused_reason(error))
            return
        c.state = next_state(c.state, ConnEvent.ACK_RECEIVED)
        timeout = info.get("heartbeat_timeout")
        if isinstance(timeout, int | float) and timeout > 0:
            c.server_timeout = float(timeout)
        self._next_timer = min(self._next_timer, c.heartbeat.next_deadline())
        self._connected += 1
        try:
            self._handler.on_connected(c.id, info)
        except Exception:
            self._handler_failed("on_connected")
        if c.id in self._conns:
            self._flush(c)

    def _on_monitor(self, c: _Connection, monitor: zmq.Socket[bytes]) -> None:
        while True:
            try:
                raw = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event, value = common.decode_monitor_event(raw)
            failed = handshake_failure(event, value, c.endpoint, self._curve is not None)
            if failed is not None:
                self._drop(c, failed, ConnEvent.PEER_GONE)
                return
            if event in common.GONE_EVENTS:
                self._drop(c, lost_reason(c.state), ConnEvent.PEER_GONE)
                return

    def _check_timers(self) -> None:
        """Connect timeouts and heartbeats; also recomputes the next deadline.

        Traffic only ever moves a connection's deadlines later, so the cached ``_next_timer``
        may be early (a harmless extra check) but never late.
        """
        now = self._clock()
        next_timer = float("inf")
        for c in list(self._conns.values()):
            if c.state is ConnState.CONNECTING:
                if now >= c.connect_deadline:
                    self._drop(c, NO_CONNECT_ACK, ConnEvent.HEARTBEAT_TIMEOUT)
                else:
                    next_timer = min(next_timer, c.connect_deadline)
                continue
            action = c.heartbeat.check(now)
            if action is HeartbeatAction.EXPIRED:
                self._heartbeat_timeouts += 1
                self._drop(c, HEARTBEAT_TIMEOUT, ConnEvent.HEARTBEAT_TIMEOUT)
                continue
            if (
                action is HeartbeatAction.SEND
                and not c.backlog
                and not self._write(c, _HEARTBEAT_FRAMES)
            ):
                c.heartbeat.last_sent = now  # pipe full: the server is busy, not idle
            if c.id in self._conns:
                next_timer = min(next_timer, c.heartbeat.next_deadline())
        self._next_timer = next_timer

    def _drop_id(self, conn: int, reason: str) -> None:
        c = self._conns.get(conn)
        if c is not None:
            self._drop(c, reason)

    def _drop(self, c: _Connection, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE) -> None:
        if self._conns.pop(c.id, None) is None:
            return
        if c.state is ConnState.CONNECTED:
            self._connected -= 1
        c.state = next_state(c.state, event)
        self._close_connection(c)
        self._disconnects += 1
        self._notify_disconnected(c.id, reason)

    def _close_connection(self, c: _Connection) -> None:
        self._backlog_total -= len(c.backlog)
        c.backlog.clear()
        self._by_socket.pop(c.sock, None)
        self._poller.unregister(c.sock)
        if c.monitor is not None:
            self._by_monitor.pop(c.monitor, None)
            self._poller.unregister(c.monitor)
        common.close_monitored(c.sock, c.monitor)
        self._resume_mailbox()

    def _notify_disconnected(self, conn: int, reason: str) -> None:
        try:
            self._handler.on_disconnected(conn, reason)
        except Exception:
            self._handler_failed("on_disconnected")

    def _shutdown(self) -> None:
        """Runs last on the dispatcher: report, close every socket, terminate our context."""
        self._closing = True
        self._set_wakes()
        for c in list(self._conns.values()):
            self._drop(c, CLOSED_LOCALLY)
        if self._lanes is not None:
            # Callers in a lane were woken by the failure of their requests (business layer).
            self._lanes.close(self._settings.close_timeout)
        self._close_mailbox()
        self._term_context()
