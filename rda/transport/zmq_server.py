"""The server transport: one dispatcher at a time over one ROUTER for every client.

The dispatcher (first the thread ``rda-server-dispatcher``; a standby takes the lead when a
handler it runs takes long: ``relay``) owns the ROUTER and its monitor, and takes replies and
notifications from other threads out of its bounded mailbox (``mailbox``; a producer blocks
at 2 x ``send_hwm`` messages). The protocol's rules (validation, handshake, heartbeats, the
per-peer outboxes, what is counted) are ``server_session.PeerTable``'s; this module moves
frames between it and the ROUTER and runs its timers. docs/transport.md has the details:

* slow clients: non-blocking sends with ``ROUTER_MANDATORY``; on EAGAIN a message waits in that
  peer's bounded, conflating outbox (``_outbox``) and is retried on POLLOUT, with a backoff
  because a ROUTER with healthy peers is nearly always writable;
* peer loss: heartbeat timeout, or at once when the monitor's DISCONNECTED carries the file
  descriptor the peer's CONNECT came from (``SRCFD``) and probe sends confirm that libzmq
  forgot the peer (EHOSTUNREACH); otherwise (inproc, unconfirmed) the heartbeat decides.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from rda.serialization.errors import TransportError
from rda.transport import _zmq_common as common
from rda.transport._outbox import RetryBackoff
from rda.transport.api import (
    Buffer,
    PeerStatistics,
    ServerHandler,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.curve import ServerCurve, ZapHandler, apply_server
from rda.transport.mailbox import Mailbox
from rda.transport.peer_info import connect_ack_info, rda_version
from rda.transport.protocol import Kind
from rda.transport.reasons import PEER_GONE
from rda.transport.relay import Relay
from rda.transport.server_session import HEARTBEAT_FRAMES, Peer, PeerTable
from rda.transport.state import ConnEvent

_DEFAULT_SETTINGS = TransportSettings()

__all__ = ["ZmqServerTransport"]

log = logging.getLogger("rda.transport.server")

# Mailbox items: (_SEND, routing id, frames, conflation key or None),
# (_PUBLISH, targets, tail, conflatable), (_DISCONNECT, routing id, None, None).
_SEND, _PUBLISH, _DISCONNECT = 0, 1, 2
# Re-probes of a peer whose connection the monitor reported closed: 1 ms doubling, 10 times.
_PROBE_FIRST, _PROBES = 0.001, 10
# Monitor events of a handshake that failed before ZAP could judge it (ZAP denials count there).
_GARBAGE_HANDSHAKE = frozenset(
    {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}
)
# Replies already handed to libzmq get this long to leave at close.
_CLOSE_LINGER_MS = 100
_CONNECT = int(Kind.CONNECT)
_NO_PROPERTIES: tuple[int, str | None] = (-1, None)


class ZmqServerTransport(common.DispatcherShell):
    """:class:`rda.transport.api.ServerTransport` over one ZeroMQ ROUTER.

    ``sndhwm`` is the ROUTER's per-peer ZeroMQ send high-water mark (messages libzmq buffers
    for one peer before its pipe reports full and the transport's own queue takes over).
    With ``curve`` the ROUTER is a CURVE server and its ZAP handler runs on the dispatcher
    (``curve``): the ZAP User-Id reaches ``on_peer_connected`` as
    ``client_info["authenticated_principal"]``.
    """

    def __init__(
        self,
        endpoint: str,
        handler: ServerHandler,
        settings: TransportSettings = _DEFAULT_SETTINGS,
        server_info: dict[str, Any] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sndhwm: int = 1000,
        curve: ServerCurve | None = None,
    ) -> None:
        super().__init__("server", settings, context, clock, log)
        self._requested = endpoint
        self._endpoint = endpoint
        info = connect_ack_info(socket.gethostname(), rda_version(), settings, server_info)
        self._sndhwm = sndhwm
        self._router: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._wire = _Wire(self._poller, clock)
        self._table = PeerTable(handler, settings, info, self._wire, clock, log)
        self._wire.table = self._table
        self._curve = curve
        self._zap: ZapHandler | None = None
        self._relay = Relay(self._lead, "rda-server-dispatcher", settings.handover_after)

    # ----------------------------------------------------------------- public, any thread

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def hands_over(self) -> bool:
        """True: a long handler on the dispatcher is handed over (``relay``)."""
        return self._settings.handover_after > 0

    def start(self) -> None:
        router = self._begin_start().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, self._sndhwm)
        # libzmq drops (and disconnects) a peer sending a frame above this, before Python
        # ever allocates it; decode_frames checks the whole message's size.
        router.setsockopt(zmq.MAXMSGSIZE, self._settings.max_message_size)
        try:
            if self._curve is not None:
                apply_server(router, self._curve)
                self._zap = ZapHandler(router.context, self._curve)
            router.bind(self._requested)
        except (zmq.ZMQError, TransportError) as exc:
            common.close_socket(router)
            if self._zap is not None:
                self._zap.close()
            self._closed = True
            self._term_context()
            if isinstance(exc, TransportError):
                raise
            raise TransportError(f"cannot bind {self._requested}: {exc}", exc.errno) from exc
        self._endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = router
        self._wire.router = router
        # Read once: pyzmq's Socket.__getattr__ makes each read of it a hook call.
        self._wire.handle = router.underlying
        self._monitor = (
            None if self._endpoint.startswith("inproc://") else common.open_monitor(router)
        )
        self._open_mailbox()
        self._poller.register(router, zmq.POLLIN)
        if self._monitor is not None:
            self._poller.register(self._monitor, zmq.POLLIN)
        if self._zap is not None:
            self._poller.register(self._zap.socket, zmq.POLLIN)
        self._start_thread()

    def send(self, peer: bytes, frames: Sequence[Buffer], conflate_key: int | None = None) -> None:
        if self._on_dispatcher():
            # A handler on the dispatcher: a standby may take the lead at any moment (relay.py).
            # acquire/release, not ``with`` (compiled: two bound methods and an ``__exit__``
            # call with three arguments less per reply).
            lock = self._relay.lock
            lock.acquire()
            try:
                if self._on_dispatcher():
                    self._table.send(peer, frames, conflate_key)
                    return
            finally:
                lock.release()
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.put((_SEND, peer, frames, conflate_key))

    def publish(
        self,
        targets: Sequence[tuple[bytes, int, Buffer]],
        tail: Sequence[Buffer],
        conflatable: bool = True,
    ) -> None:
        if not targets:
            return
        if self._on_dispatcher():
            with self._relay.lock:
                if self._on_dispatcher():
                    self._table.publish(targets, tail, conflatable)
                    return
        mailbox = self._mailbox
        if mailbox is not None:
            # Never blocks (api.ServerTransport.publish): the notifier paced itself first.
            mailbox.put((_PUBLISH, targets, tail, conflatable), wait=False)

    def disconnect(self, peer: bytes) -> None:
        if self._on_dispatcher():
            with self._relay.lock:
                if self._on_dispatcher():
                    self._table.disconnect(peer)
                    return
        if self._mailbox is not None:
            self._mailbox.put((_DISCONNECT, peer, None, None))

    def statistics(self) -> ServerTransportStatistics:
        denied = 0 if self._zap is None else self._zap.denied
        return self._table.statistics(denied + self._wire.handshake_failures, self._relay.handovers)

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        return self._table.peer_statistics()

    # --------------------------------------------------------------- dispatcher thread

    def _on_dispatcher(self) -> bool:
        return threading.get_ident() == self._relay.leader

    def _join_dispatcher(self, thread: threading.Thread, deadline: float) -> bool:
        return self._relay.join(deadline)

    def _run(self) -> None:
        self._relay.serve_first()

    def _lead(self) -> bool:
        """The dispatcher loop, on whichever thread leads: True once closed (after the
        shutdown), False when a standby took the lead while this thread ran a handler."""
        me = self._thread_id = threading.get_ident()
        relay = self._relay
        mailbox, router, monitor = self._mailbox, self._router, self._monitor
        zap = None if self._zap is None else self._zap.socket
        assert mailbox is not None and router is not None
        poll = self._poller.poll
        wire, table = self._wire, self._table
        try:
            while not self._closing:
                ready = poll(self._poll_timeout_ms())
                if len(ready) > 1 and ready[-1][0] is mailbox:
                    # Replies other threads completed go out before inline handlers answer
                    # the requests read now: an inline reply must not overtake them.
                    ready.insert(0, ready.pop())
                for sock, event in ready:
                    try:
                        if sock is router:
                            # Plain ints: ``IntFlag & IntFlag`` is a Python-level call
                            # and a new enum member per test (two per request).
                            if event & common.POLLIN:
                                self._drain_router(router)
                            if event & common.POLLOUT:
                                wire.retry_blocked()
                        elif sock is mailbox:
                            self._drain_mailbox(mailbox)
                        elif sock is monitor and monitor is not None:
                            wire.on_monitor(monitor)
                        elif sock is zap and self._zap is not None:
                            self._zap.drain()
                            self._poller.touch(self._zap.socket)  # replies may eat a wake-up
                    except zmq.ContextTerminated:
                        raise
                    except Exception:
                        # A bug must not take every client down: log it and keep serving.
                        self._internal_errors += 1
                        log.exception("server dispatcher: unexpected error; carrying on")
                    if relay.leader != me:
                        return False  # not one more socket operation: the lead moved on
                    if self._closing:
                        break
                now = self._clock()
                if now >= table.next_check:
                    table.heartbeat_round(now)
                if wire.retry_at is not None and now >= wire.retry_at:
                    wire.retry_at = None
                    wire.retry_blocked()
                if wire.probe_at is not None and now >= wire.probe_at:
                    wire.probe_suspects(now)
        except Exception:
            if relay.leader != me:
                return False
            log.exception("server dispatcher failed; closing the transport")
        self._shutdown()
        return True

    def _poll_timeout_ms(self) -> int:
        deadline = self._table.next_check
        wire = self._wire
        if wire.retry_at is not None:
            deadline = min(deadline, wire.retry_at)
        if wire.probe_at is not None:
            deadline = min(deadline, wire.probe_at)
        if deadline == float("inf"):
            return -1
        # As DispatcherShell._timeout_ms, inlined: one call less per wake-up.
        return max(0, int((deadline - self._clock()) * 1000.0) + 1)

    def _drain_mailbox(self, mailbox: Mailbox) -> None:
        take = mailbox.items.popleft
        # ``table.send`` is called in place, never bound to a local first: compiled, the table
        # is typed and the call is a C call, while Cython's wrapper for a bound cpdef method
        # leaves out the method's override-check argument (a gcc incompatible-pointer warning).
        table = self._table
        try:
            for _ in range(common.BATCH):
                try:
                    op, target, frames, key = take()
                except IndexError:
                    return
                if op == _SEND:
                    table.send(target, frames, key)
                elif op == _PUBLISH:
                    table.publish(target, frames, key)
                elif op == _DISCONNECT:
                    table.disconnect(target)
                if self._closing:
                    return
        finally:
            mailbox.taken()

    def _drain_router(self, router: zmq.Socket[bytes]) -> None:
        now = self._clock()
        table = self._table
        relay = self._relay
        curve = self._curve is not None
        # The direct receive keeps the GIL and builds no zmq.Frame (small frames are copied,
        # big ones kept zero-copy) and says "nothing waiting" without an exception
        # (docs/performance.md). A CONNECT comes with the message properties the handshake
        # needs (SRCFD, ZAP User-Id). On an error other than "nothing waiting" pyzmq receives
        # again and raises.
        direct, handle = common.direct_recv_routed, router.underlying
        for _ in range(common.BATCH):
            got: Any = None if direct is None else direct(handle, common.COPY_BELOW, _CONNECT)
            if direct is None or type(got) is int:
                got = common.recv_routed(router, _CONNECT)
            if got is None:
                self._poller.settle(router)
                return
            # (srcfd, User-Id) of a CONNECT, which comes as (frames, srcfd, user_id).
            fd, user_id = _NO_PROPERTIES
            if type(got) is tuple:
                got, fd, user_id = got
            rid = got[0]
            message = table.received(rid, None, got[1:], now, fd, user_id if curve else None)
            if message is not None:
                relay.begin()
                table.deliver(rid, message)
                if not relay.end():
                    return
            if self._closing:
                return

    def _shutdown(self) -> None:
        """Runs last on the dispatcher: report, close every socket, terminate our context."""
        self._closing = True
        self._table.close_all()
        self._close_mailbox()
        if self._zap is not None:
            self._zap.close()
        if self._router is not None:
            linger = min(_CLOSE_LINGER_MS, int(self._settings.close_timeout * 1000))
            common.close_monitored(self._router, self._monitor, linger)
        self._term_context()


class _Wire:
    """The ROUTER of a :class:`ZmqServerTransport` as the session rules see it, with what
    only a ROUTER needs (the leading dispatcher only):

    * slow peers: non-blocking sends with ``ROUTER_MANDATORY``; a full pipe leaves the
      message in the peer's outbox (the table's), retried on POLLOUT with a backoff, because
      a ROUTER with healthy peers is nearly always writable;
    * lost peers: the monitor's DISCONNECTED carries the file descriptor a peer's CONNECT
      came from (``SRCFD``); probe sends that ``ROUTER_MANDATORY`` refuses confirm that libzmq
      forgot the peer; otherwise (inproc, unconfirmed) the heartbeat decides;
    * handshakes that failed before ZAP could judge them, counted.
    """

    def __init__(self, poller: common.Selector, clock: Callable[[], float]) -> None:
        self.poller = poller
        self._clock = clock
        self.router: zmq.Socket[bytes] | None = None  # set at start
        self.handle = 0  # the router's libzmq socket (its ``underlying``), set at start
        self.table: PeerTable | None = None  # set once, right after it is made
        self.by_fd: dict[int, bytes] = {}
        self._pollout = False
        self.retry_at: float | None = None
        self._backoff = RetryBackoff()
        self._suspects: dict[bytes, int] = {}
        self.probe_at: float | None = None
        self.handshake_failures = 0

    # --- ServerWire ---

    def write(self, peer: Peer, frames: Sequence[Any]) -> bool | None:
        router = self.router
        assert router is not None and self.table is not None
        self.poller.touch(router)  # even a failed send may consume a wake-up signal
        try:
            common.send_routed(router, peer.rid, frames, self.handle)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self.table.drop(peer, PEER_GONE, ConnEvent.PEER_GONE)
            else:
                self.table.peer_log.log("failed sends", "send to a peer failed: %s", exc)
            return None
        return True

    def answer(self, rid: bytes, io: Any, frames: Sequence[Any]) -> bool:
        router = self.router
        assert router is not None
        self.poller.touch(router)
        try:
            common.send_routed(router, rid, frames, self.handle)
        except zmq.ZMQError:
            return False
        return True

    def want_writable(self) -> None:
        if not self._pollout and self.retry_at is None:
            self._set_pollout(True)

    def admitted(self, peer: Peer) -> None:
        fd = peer.fd
        if fd < 0:
            return
        assert self.table is not None
        previous = self.by_fd.get(fd)
        if previous is not None and previous != peer.rid and previous in self.table.peers:
            # Open connections never share a descriptor: the one that had it is closed (its
            # DISCONNECTED, read after this, would name the new peer).
            self._suspects[previous] = 0
            self.probe_suspects(self._clock())
        self.by_fd[fd] = peer.rid

    def forget(self, peer: Peer) -> None:
        if self.by_fd.get(peer.fd) == peer.rid:
            del self.by_fd[peer.fd]

    # --- what only a ROUTER needs ---

    def _set_pollout(self, on: bool) -> None:
        assert self.router is not None
        self._pollout = on
        self.poller.modify(self.router, zmq.POLLIN | (zmq.POLLOUT if on else 0))

    def retry_blocked(self) -> None:
        """Flush the blocked peers; back off when the ROUTER said writable but nothing moved."""
        table = self.table
        assert table is not None
        moved = table.retry_blocked()
        blocked = bool(table.blocked)
        if not blocked or moved:
            self._backoff.reset()
            if self._pollout != blocked:
                self._set_pollout(blocked)
        else:
            # Nothing moved although the ROUTER said writable (another peer's pipe has room):
            # wait a little before trying again instead of spinning.
            if self._pollout:
                self._set_pollout(False)
            self.retry_at = self._clock() + self._backoff.next_delay()

    def on_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        table = self.table
        assert table is not None
        while True:
            try:
                raw = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event, fd = common.decode_monitor_event(raw)
            if event in _GARBAGE_HANDSHAKE:
                # A peer that is not a CURVE client of ours (plain, garbage, wrong server key);
                # libzmq dropped it already, so it is only counted.
                self.handshake_failures += 1
                continue
            if event != zmq.EVENT_DISCONNECTED:
                continue
            rid = self.by_fd.get(fd)
            p = None if rid is None else table.peers.get(rid)
            if p is not None and p.fd == fd:
                self._suspects[p.rid] = 0
                self.probe_suspects(self._clock())

    def probe_suspects(self, now: float) -> None:
        """Confirm lost connections: the ROUTER refuses a send to a peer it has forgotten.
        libzmq forgets it a little after the monitor event, so a probe that still succeeds is
        repeated after 1, 2, 4 ... 512 ms; a peer still routable then is the heartbeat's."""
        table = self.table
        assert table is not None
        suspects = self._suspects
        for rid, attempt in list(suspects.items()):
            p = table.peers.get(rid)
            if p is None or not self._probe(p, now) or attempt >= _PROBES:
                del suspects[rid]
            else:
                suspects[rid] = attempt + 1
        self.probe_at = now + _PROBE_FIRST * 2 ** min(suspects.values()) if suspects else None

    def _probe(self, p: Peer, now: float) -> bool:
        """A heartbeat to a suspect; False when the ROUTER forgot it (then dropped)."""
        router = self.router
        assert router is not None and self.table is not None
        self.poller.touch(router)
        try:
            common.send_routed(router, p.rid, HEARTBEAT_FRAMES)
            p.heartbeat.last_sent = now
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self.table.drop(p, PEER_GONE, ConnEvent.PEER_GONE)
                return False
        return True
