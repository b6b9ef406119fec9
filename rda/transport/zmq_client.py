"""The client transport: one dispatcher thread over one DEALER per server connection.

Threading (docs/architecture.md, RDA3 paper "Dispatcher Thread"): the thread named
``rda-client-dispatcher`` owns every zmq socket of this transport. User threads reach it through
a bounded mailbox (``mailbox``: a deque of Python objects, 2 x ``send_hwm`` messages, and a
wake-up descriptor written only while the dispatcher sleeps), so a flooding producer blocks.
Calls made *on* the dispatcher thread (from a handler) skip the mailbox and act directly: that
is both the fastest path and the only one that cannot deadlock on a full mailbox.

The protocol's rules (handshake, heartbeats, RECONNECT, what waits for the ACK or for a full
pipe, back-pressure, bad input) are ``client_session.ClientSessions``'; this module moves
frames between it and the sockets and runs its timers. Handlers run on the dispatcher after
only the header was parsed; they must be fast and never block (hand the message to a
scheduler). The transport never reconnects: a connection that is lost (monitor event,
heartbeat timeout, refused handshake, ``connect_timeout``) is reported once through
``on_disconnected`` and its DEALER closed; the business layer calls ``connect`` again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from rda.serialization.errors import TransportError
from rda.transport import _zmq_common as common
from rda.transport._handshake import handshake_failure
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransportStatistics,
    TransportSettings,
    Waker,
)
from rda.transport.client_session import ClientSession, ClientSessions
from rda.transport.curve import ClientCurve, apply_client
from rda.transport.lanes import REFRESH_SHARE, LanePool, PooledLane
from rda.transport.mailbox import Mailbox
from rda.transport.peer_info import connect_info, rda_version
from rda.transport.reasons import HANDSHAKE_REFUSED
from rda.transport.state import ConnState
from rda.transport.zmq_lane import open_lanes

_DEFAULT_SETTINGS = TransportSettings()

__all__ = ["ZmqClientTransport", "default_client_info"]

log = logging.getLogger("rda.transport.client")

# Mailbox items: (operation, connection id, frames or endpoint or None).
_SEND, _CONNECT, _DISCONNECT = 0, 1, 2
_get_ident = threading.get_ident


def default_client_info() -> dict[str, Any]:
    """What CONNECT tells the server about this process."""
    return connect_info(rda_version())


@dataclass(slots=True, eq=False)
class _Sockets:
    """A connection's DEALER and its monitor (None for inproc://); ``handle``, the DEALER's
    ``underlying`` libzmq socket, read once (a pyzmq ``Socket`` attribute read goes through its
    ``__getattr__`` hook): every send passes it."""

    sock: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes] | None
    handle: int


class ZmqClientTransport(common.DispatcherShell):
    """:class:`rda.transport.api.ClientTransport` over ZeroMQ DEALER sockets.

    With ``curve`` every DEALER is a CURVE client (``curve``); a refused security handshake
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
        self._bursty = False  # the last drain found more than one message
        self._curve = curve
        self._info = default_client_info()
        if client_info:
            self._info.update(client_info)
        self._ids = itertools.count(1)
        self._wire = _Wire(self._poller)
        self._sessions = ClientSessions(handler, settings, self._info, self._wire, clock, log)
        self._wire.sessions = self._sessions
        self._by_socket = self._wire.by_socket
        self._by_monitor = self._wire.by_monitor
        # Wake-ups handed to ``wake_later`` on the dispatcher, set before it polls again.
        self._wakes: list[Waker] = []
        self._lanes: LanePool | None = None

    # ----------------------------------------------------------------- public, any thread

    def start(self) -> None:
        context = self._begin_start()
        self._lanes = open_lanes(context, self._settings, self._info, self._curve)
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
        # ``_on_dispatcher()`` inline, once per request: compiled, the thread id is a C slot.
        if _get_ident() == self._thread_id:
            self._sessions.send(connection, frames)
            return
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.put((_SEND, connection, frames))

    def disconnect(self, connection: int) -> None:
        if self._on_dispatcher():
            self._sessions.disconnect(connection)
        elif self._mailbox is not None:
            self._mailbox.put((_DISCONNECT, connection, None))

    def statistics(self) -> ClientTransportStatistics:
        lanes = self._lanes
        return self._sessions.statistics(None if lanes is None else lanes.counts())

    def lane(self, connection: int) -> PooledLane | None:
        """The calling thread's own lane (zmq_lane) to the server of ``connection``, while
        that connection is established; None otherwise (then use :meth:`send`)."""
        # A dict read: safe from any thread under the GIL.
        c = self._sessions.sessions.get(connection)
        lanes = self._lanes
        if c is None or c.state is not ConnState.CONNECTED or lanes is None or self._closing:
            return None
        return lanes.of_thread(c.endpoint, connection, c.server_timeout * REFRESH_SHARE)

    def wake_later(self, waker: Waker) -> None:
        """Set ``waker`` (a caller waits on it for a reply) once the dispatcher is done with
        what is ready, right before it polls again; from any other thread, at once.

        For a handler completing a blocking request: a caller woken in the middle of the
        dispatcher's work (the next receive releases the GIL, and so does freeing a frame)
        competes with it for the GIL; set right before the poll, the caller runs while the
        dispatcher waits, usually finding its next request already in the mailbox.
        """
        if self._on_dispatcher() and not self._closing:
            self._wakes.append(waker)
        else:
            waker.set()

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
        sessions = self._sessions
        try:
            while not self._closing:
                if self._wakes:
                    # Before the poll decides to sleep: a woken caller's next request, put
                    # while we wait for the GIL, is then found without a wake-up signal.
                    self._set_wakes()
                for sock, event in poll(self._timeout_ms(sessions.next_timer)):
                    try:
                        if sock is mailbox:
                            self._drain_mailbox(mailbox)
                        elif (c := self._by_socket.get(sock)) is not None:
                            if event & common.POLLIN:
                                self._drain_dealer(c)
                            if event & common.POLLOUT and c.id in sessions.sessions:
                                sessions.writable(c)
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
                if sessions.sessions and self._clock() >= sessions.next_timer:
                    sessions.check_timers(self._clock())
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
        sessions = self._sessions
        try:
            for _ in range(common.BATCH):
                # Test, then take (we are the only consumer): an emptied deque's IndexError
                # cost an exception per wake-up.
                if not items:
                    return
                op, conn, payload = take()
                if op == _SEND:
                    sessions.send(conn, payload)
                elif op == _CONNECT:
                    self._open(conn, payload)
                elif op == _DISCONNECT:
                    sessions.disconnect(conn)
                if self._closing or not self._poller.watching_mailbox:
                    return
        finally:
            mailbox.taken()

    def _open(self, conn: int, endpoint: str) -> None:
        assert self._context is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # The transport never reconnects by itself (docs/architecture.md): a lost connection
        # is closed.
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
                self._sessions.failed_to_open(conn, f"{HANDSHAKE_REFUSED}: {exc}")
                return
        monitor = None if endpoint.startswith("inproc://") else common.open_monitor(sock)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            common.close_monitored(sock, monitor)
            self._sessions.failed_to_open(conn, f"cannot connect to {endpoint}: {exc}")
            return
        io = _Sockets(sock, monitor, sock.underlying)
        # Registered before the session opens: its CONNECT may have to wait for POLLOUT
        # (with IMMEDIATE it cannot go before the TCP connection exists).
        self._poller.register(sock, zmq.POLLIN)
        if monitor is not None:
            self._poller.register(monitor, zmq.POLLIN)
        session = self._sessions.open(conn, endpoint, io)
        if session.id in self._sessions.sessions:  # not already failed on its first send
            self._by_socket[sock] = session
            if monitor is not None:
                self._by_monitor[monitor] = session

    def _drain_dealer(self, c: ClientSession) -> None:
        """Receive up to BATCH messages.

        A handler that takes batches (api.BatchClientHandler) gets every REPLY of this
        drain in one call after the last receive: consumers are woken once per batch, and
        not while this thread still makes GIL-releasing receive calls. Only while messages
        come faster than they are handled (ZeroMQ's batching rule): after a drain that found
        one message, the first reply of the next is handed over at once, before the receive
        that ends the drain, so a caller woken by it can send its next request meanwhile
        (with the reply held back, the dispatcher went to sleep first: 2 polls per get, not 1).
        """
        sock = c.io.sock
        sessions = self._sessions
        now = self._clock()
        bursty = self._bursty
        # Its methods are called on ``sessions`` itself, not bound once: the compiled build
        # (zmq_client.pxd types it) then calls ClientSessions' C entry points.
        recv_direct, handle = common.direct_recv, sock.underlying
        frames: list[Any] | int | None = None
        n = 0
        try:
            while n < common.BATCH:
                # Small frames copied, big ones zero-copy (common.COPY_BELOW). The direct
                # receive keeps the GIL (_direct_zmq); on an error other than "nothing
                # waiting" (an errno) pyzmq receives again and raises its own exception.
                if recv_direct is not None:
                    frames = recv_direct(handle, common.COPY_BELOW)
                if recv_direct is None or isinstance(frames, int):
                    frames = common.recv_copied(sock)
                if frames is None:
                    self._poller.settle(sock)
                    break
                n += 1
                message = sessions.received(c, frames, now)
                if message is not None:
                    if bursty:
                        sessions.hold(c, message)
                    else:
                        # Sparse flow: hand the first one over now; any more found in this
                        # drain are a burst and are held for one call.
                        sessions.deliver(c, message)
                        bursty = True
                if self._closing or c.id not in sessions.sessions:
                    break
        finally:
            sessions.end_batch()
        self._bursty = n > 1

    def _on_monitor(self, c: ClientSession, monitor: zmq.Socket[bytes]) -> None:
        while True:
            try:
                raw = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event, value = common.decode_monitor_event(raw)
            failed = handshake_failure(event, value, c.endpoint, self._curve is not None)
            if failed is not None:
                self._sessions.gone(c, failed)
                return
            if event in common.GONE_EVENTS:
                self._sessions.gone(c)
                return

    def _shutdown(self) -> None:
        """Runs last on the dispatcher: report, close every socket, terminate our context."""
        self._closing = True
        self._set_wakes()
        self._sessions.close_all()
        if self._lanes is not None:
            # Callers in a lane were woken by the failure of their requests (business layer).
            self._lanes.close(self._settings.close_timeout)
        self._close_mailbox()
        self._term_context()


class _Wire:
    """The DEALER sockets of a :class:`ZmqClientTransport` as the session rules see them
    (dispatcher thread only): it owns the maps from sockets to sessions."""

    __slots__ = ("by_monitor", "by_socket", "poller", "sessions")

    def __init__(self, poller: common.Selector) -> None:
        self.poller = poller
        self.by_socket: dict[zmq.Socket[bytes], ClientSession] = {}
        self.by_monitor: dict[zmq.Socket[bytes], ClientSession] = {}
        self.sessions: ClientSessions | None = None  # set once, right after it is made

    def write(self, session: ClientSession, frames: Sequence[Any]) -> bool | None:
        io: _Sockets = session.io
        sock = io.sock
        self.poller.touch(sock)  # even a failed send may consume a wake-up signal
        try:
            common.send_frames(sock, frames, False, io.handle)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            assert self.sessions is not None
            self.sessions.drop(session, f"send failed: {exc}")
            return None
        return True

    def want_writable(self, session: ClientSession, on: bool) -> None:
        self.poller.modify(session.io.sock, zmq.POLLIN | (zmq.POLLOUT if on else 0))

    def release(self, session: ClientSession) -> None:
        io: _Sockets = session.io
        self.by_socket.pop(io.sock, None)
        self.poller.unregister(io.sock)
        if io.monitor is not None:
            self.by_monitor.pop(io.monitor, None)
            self.poller.unregister(io.monitor)
        common.close_monitored(io.sock, io.monitor)

    def pause_intake(self, paused: bool) -> None:
        self.poller.watch_mailbox(not paused)
