"""The server transport: one dispatcher at a time over one ROUTER for every client.

The dispatcher (first the thread ``rda-server-dispatcher``; a standby takes the lead when a
handler it runs takes long: ``_relay``) owns the ROUTER and its monitor, and takes replies and
notifications from other threads out of its bounded mailbox (``_mailbox``; a producer blocks
at 2 x ``send_hwm`` messages). docs/transport.md has the details:

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

from rda.serialization.errors import DecodeError, ProtocolError, TransportError
from rda.transport import _zmq_common as common
from rda.transport._curve import ServerCurve, ZapHandler, apply_server, authenticated_info
from rda.transport._mailbox import Mailbox
from rda.transport._outbox import RetryBackoff
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
    probe_round,
    rda_version,
    reject_connect_info,
    reject_request_before_connect,
    reject_undecodable,
)
from rda.transport._ratelog import RateLimitedLog
from rda.transport._relay import Relay
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
    Kind,
    decode_frames,
    encode_connect_ack,
    encode_heartbeat,
    join_tail,
)
from rda.transport.state import ConnEvent, ConnState, HeartbeatTracker, next_state

_DEFAULT_SETTINGS = TransportSettings()

__all__ = ["ZmqServerTransport"]

log = logging.getLogger("rda.transport.server")

# Mailbox items: (_SEND, routing id, frames, conflation key or None),
# (_PUBLISH, targets, tail, conflatable), (_DISCONNECT, routing id, None, None).
_SEND, _PUBLISH, _DISCONNECT = 0, 1, 2
_HEARTBEAT_FRAMES = encode_heartbeat(from_server=True)
# Re-probes of a peer whose connection the monitor reported closed: 1 ms doubling, 10 times.
_PROBE_FIRST, _PROBES = 0.001, 10
# Monitor events of a handshake that failed before ZAP could judge it (ZAP denials count there).
_GARBAGE_HANDSHAKE = frozenset(
    {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}
)
# Replies already handed to libzmq get this long to leave at close.
_CLOSE_LINGER_MS = 100
# Routing ids of peers whose connection was confirmed closed, remembered (oldest forgotten
# first) so that their last messages, still in the ROUTER when the monitor's verdict came
# first, are dropped and counted instead of answered as "REQUEST before CONNECT".
_GONE_REMEMBERED = 4096
_CONNECT = int(Kind.CONNECT)
_NO_PROPERTIES: tuple[int, str | None] = (-1, None)


class ZmqServerTransport(common.DispatcherShell, ServerCounters):
    """:class:`rda.transport.api.ServerTransport` over one ZeroMQ ROUTER.

    ``sndhwm`` is the ROUTER's per-peer ZeroMQ send high-water mark (messages libzmq buffers
    for one peer before its pipe reports full and the transport's own queue takes over).
    With ``curve`` the ROUTER is a CURVE server and its ZAP handler runs on the dispatcher
    (``_curve``): the ZAP User-Id reaches ``on_peer_connected`` as
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
        self._handler = handler
        self._info = connect_ack_info(socket.gethostname(), rda_version(), settings, server_info)
        self._sndhwm = sndhwm
        self._router: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._peers: dict[bytes, Peer] = {}
        self._lanes = 0  # peers that are clients' direct lanes
        self._by_fd: dict[int, bytes] = {}
        self._blocked: dict[bytes, Peer] = {}
        self._pollout = False
        self._retry_at: float | None = None
        self._backoff = RetryBackoff()
        self._next_check = float("inf")
        self._suspects: dict[bytes, int] = {}
        self._gone: dict[bytes, None] = {}  # insertion-ordered: see _GONE_REMEMBERED
        self._probe_at: float | None = None
        self._curve = curve
        self._zap: ZapHandler | None = None
        self._relay = Relay(self._lead, "rda-server-dispatcher", settings.handover_after)
        # Every line a remote peer can cause goes through it: one per kind per second.
        self._peer_log = RateLimitedLog(log, clock=clock)
        ServerCounters.__init__(self)

    # ----------------------------------------------------------------- public, any thread

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def hands_over(self) -> bool:
        """True: a long handler on the dispatcher is handed over (``_relay``, Dispatch.attach)."""
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
            # A handler on the dispatcher: a standby may take the lead at any moment (_relay).
            with self._relay.lock:
                if self._on_dispatcher():
                    self._deliver(peer, frames, conflate_key)
                    return
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
                    for peer, sub, header in targets:
                        self._deliver(peer, join_tail(header, tail), sub if conflatable else None)
                    return
        mailbox = self._mailbox
        if mailbox is not None:
            # Never blocks (api.ServerTransport.publish): the notifier paced itself first.
            mailbox.put((_PUBLISH, targets, tail, conflatable), wait=False)

    def disconnect(self, peer: bytes) -> None:
        if self._on_dispatcher():
            with self._relay.lock:
                if self._on_dispatcher():
                    self._drop_rid(peer, CLOSED_LOCALLY)
                    return
        if self._mailbox is not None:
            self._mailbox.put((_DISCONNECT, peer, None, None))

    def statistics(self) -> ServerTransportStatistics:
        denied = 0 if self._zap is None else self._zap.denied
        self._auth_failures = denied + self._handshake_failures
        lanes = self._lanes
        return self._statistics(len(self._peers) - lanes, lanes, self._relay.handovers)

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        return peer_statistics(self._peers)

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
                                self._retry_blocked()
                        elif sock is mailbox:
                            self._drain_mailbox(mailbox)
                        elif sock is monitor and monitor is not None:
                            self._on_monitor(monitor)
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
                if now >= self._next_check:
                    self._check_heartbeats(now)
                if self._retry_at is not None and now >= self._retry_at:
                    self._retry_at = None
                    self._retry_blocked()
                if self._probe_at is not None and now >= self._probe_at:
                    self._probe_suspects(now)
        except Exception:
            if relay.leader != me:
                return False
            log.exception("server dispatcher failed; closing the transport")
        self._shutdown()
        return True

    def _poll_timeout_ms(self) -> int:
        deadline = self._next_check
        if self._retry_at is not None:
            deadline = min(deadline, self._retry_at)
        if self._probe_at is not None:
            deadline = min(deadline, self._probe_at)
        if deadline == float("inf"):
            return -1
        # As DispatcherShell._timeout_ms, inlined: one call less per wake-up.
        return max(0, int((deadline - self._clock()) * 1000.0) + 1)

    def _drain_mailbox(self, mailbox: Mailbox) -> None:
        take = mailbox.items.popleft
        try:
            for _ in range(common.BATCH):
                try:
                    op, target, frames, key = take()
                except IndexError:
                    return
                if op == _SEND:
                    self._deliver(target, frames, key)
                elif op == _PUBLISH:
                    for peer, sub, header in target:
                        self._deliver(peer, join_tail(header, frames), sub if key else None)
                elif op == _DISCONNECT:
                    self._drop_rid(target, CLOSED_LOCALLY)
                if self._closing:
                    return
        finally:
            mailbox.taken()

    def _deliver(self, rid: bytes, frames: Sequence[Any], key: int | None) -> None:
        """Send now, or queue behind the peer's full pipe; never blocks."""
        p = self._peers.get(rid)
        if p is None:
            self._dropped += 1  # the peer is gone; its on_peer_disconnected was delivered
            return
        if p.outbox or not self._write(p, frames):
            self._enqueue(p, frames, key)

    def _write(self, p: Peer, frames: Sequence[Any]) -> bool:
        """True when sent (or when the peer turned out gone); False on a full pipe."""
        assert self._router is not None
        self._poller.touch(self._router)  # even a failed send may consume a wake-up signal
        try:
            common.send_routed(self._router, p.rid, frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self._drop(p, PEER_GONE, ConnEvent.PEER_GONE)
            else:
                self._peer_log.log("failed sends", "send to a peer failed: %s", exc)
                self._dropped += 1
            return True
        self._messages_out += 1
        self._bytes_out += sum(map(len, frames))
        p.heartbeat.last_sent = self._clock()
        return True

    def _enqueue(self, p: Peer, frames: Sequence[Any], key: int | None) -> None:
        result = p.outbox.put(frames, key, self._settings.peer_queue_limit)
        if self._count_put(result) and p.rid not in self._blocked:
            self._blocked[p.rid] = p
            if not self._pollout and self._retry_at is None:
                self._set_pollout(True)

    def _set_pollout(self, on: bool) -> None:
        assert self._router is not None
        self._pollout = on
        self._poller.modify(self._router, zmq.POLLIN | (zmq.POLLOUT if on else 0))

    def _retry_blocked(self) -> None:
        moved = False
        for p in list(self._blocked.values()):
            outbox = p.outbox
            while outbox and p.rid in self._peers:
                if not self._write(p, outbox.head()) or p.rid not in self._peers:
                    break  # still full, or the peer turned out gone (outbox already freed)
                outbox.pop()
                self._queue_depth -= 1
                moved = True
            if not outbox:
                self._blocked.pop(p.rid, None)
        if not self._blocked or moved:
            self._backoff.reset()
            if self._pollout != bool(self._blocked):
                self._set_pollout(bool(self._blocked))
        else:
            # Nothing moved although the ROUTER said writable (another peer's pipe has room):
            # wait a little before trying again instead of spinning.
            if self._pollout:
                self._set_pollout(False)
            self._retry_at = self._clock() + self._backoff.next_delay()

    def _drain_router(self, router: zmq.Socket[bytes]) -> None:
        max_size = self._settings.max_message_size
        now = self._clock()
        # The direct receive keeps the GIL and builds no zmq.Frame (small frames are copied,
        # big ones kept zero-copy) and says "nothing waiting" without an exception: 0.5
        # instead of 2.1 us per message, 0.7 instead of 3.5 us for the receive that ends a
        # drain. A CONNECT comes with the message properties _on_connect needs (SRCFD, ZAP
        # User-Id). On an error other than "nothing waiting" pyzmq receives again and raises.
        direct, handle = common.direct_recv_routed, router.underlying
        for _ in range(common.BATCH):
            got: Any = None if direct is None else direct(handle, common.COPY_BELOW, _CONNECT)
            if direct is None or type(got) is int:
                got = common.recv_routed(router, _CONNECT)
            if got is None:
                self._poller.settle(router)
                return
            # (srcfd, User-Id) of a CONNECT, which comes as (frames, srcfd, user_id).
            handshake: tuple[int, str | None] = _NO_PROPERTIES
            if type(got) is tuple:
                got, handshake = got[0], got[1:]
            rid = got[0]
            frames = got[1:]
            self._messages_in += 1
            self._bytes_in += sum(map(len, frames))
            p = self._peers.get(rid)
            if p is not None:
                p.heartbeat.last_received = now
            try:
                event = decode_frames(frames, from_server=False, max_size=max_size)
            except (DecodeError, ProtocolError) as exc:
                self._reject(rid, reject_undecodable(exc, frames))
                continue
            if p is None and type(event) is not Connect and rid in self._gone:
                # A message the peer sent before its connection closed, read after the
                # monitor had us drop it: nobody is there to answer; not the peer's fault.
                self._dropped += 1
                continue
            if type(event) is Incoming:
                if p is None:
                    self._reject(rid, reject_request_before_connect(event.message.header.id))
                    continue
                self._relay.begin()
                try:
                    self._handler.on_message(rid, event.message)
                except Exception:
                    self._handler_failed("on_message")
                if not self._relay.end():
                    return
            elif type(event) is Connect:
                refused = reject_connect_info(event.info)
                if refused is not None:
                    self._reject(rid, refused)
                    continue
                fd, user_id = handshake
                info = event.info
                if "authenticated_principal" in info or self._curve is not None:
                    info = authenticated_info(info, user_id, self._curve is not None)
                self._on_connect(rid, info, fd, now)
            elif type(event) is Heartbeat and p is None:
                self._reject(rid, HEARTBEAT_BEFORE_CONNECT)
            if self._closing:
                return

    def _reject(self, rid: bytes, bad: BadInput) -> None:
        """Drop a bad message: count, log, answer (best effort, never queued) if due."""
        self._count_bad_input(bad)
        self._peer_log.log(bad.kind, "dropped a bad message from peer %s: %s", rid.hex(), bad.error)
        for answer in (RECONNECT_FRAMES if bad.reconnect else None, bad.answer):
            if answer is None:
                continue
            assert self._router is not None
            self._poller.touch(self._router)
            try:
                common.send_routed(self._router, rid, answer)
                self._messages_out += 1
            except zmq.ZMQError:
                self._dropped += 1

    def _on_connect(self, rid: bytes, info: dict[str, Any], fd: int, now: float) -> None:
        self._gone.pop(rid, None)  # a client with a fixed routing id, back on a new connection
        old = self._peers.get(rid)
        if old is not None:
            # The same routing id introduced itself again: report the old session over.
            self._drop(old, RECONNECTED)
        s = self._settings
        hb = HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, now)
        p = Peer(rid, info, hb, fd, lane=info.get("lane") is True)
        p.state = next_state(ConnState.CONNECTING, ConnEvent.CONNECT_RECEIVED)
        self._peers[rid] = p
        if p.lane:
            self._lanes += 1
        if fd >= 0:
            previous = self._by_fd.get(fd)
            if previous is not None and previous != rid and previous in self._peers:
                # Open connections never share a descriptor: the one that had it is closed
                # (its DISCONNECTED, read after this, would name the new peer).
                self._suspects[previous] = 0
                self._probe_suspects(now)
            self._by_fd[fd] = rid
        self._next_check = min(self._next_check, p.heartbeat.next_deadline())
        ack = encode_connect_ack(self._info)
        if not self._write(p, ack):
            self._enqueue(p, ack, None)
        if rid in self._peers:
            p.announced = True
            try:
                self._handler.on_peer_connected(rid, info)
            except Exception:
                self._handler_failed("on_peer_connected")

    def _on_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        while True:
            try:
                raw = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event, fd = common.decode_monitor_event(raw)
            if event in _GARBAGE_HANDSHAKE:
                # A peer that is not a CURVE client of ours (plain, garbage, wrong server key);
                # libzmq dropped it already, so it is only counted.
                self._handshake_failures += 1
                continue
            if event != zmq.EVENT_DISCONNECTED:
                continue
            rid = self._by_fd.get(fd)
            p = None if rid is None else self._peers.get(rid)
            if p is not None and p.fd == fd:
                self._suspects[p.rid] = 0
                self._probe_suspects(self._clock())

    def _probe_suspects(self, now: float) -> None:
        """Confirm lost connections: the ROUTER refuses a send to a peer it has forgotten.
        libzmq forgets it a little after the monitor event, so a probe that still succeeds is
        repeated after 1, 2, 4 ... 512 ms; a peer still routable then is the heartbeat's."""
        probe = self._probe
        self._probe_at = probe_round(self._suspects, self._peers, probe, _PROBE_FIRST, _PROBES, now)

    def _probe(self, p: Peer, now: float) -> bool:
        """A heartbeat to a suspect; False when the ROUTER forgot it (then dropped)."""
        assert self._router is not None
        self._poller.touch(self._router)
        try:
            common.send_routed(self._router, p.rid, _HEARTBEAT_FRAMES)
            p.heartbeat.last_sent = now
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self._drop(p, PEER_GONE, ConnEvent.PEER_GONE)
                return False
        return True

    def _check_heartbeats(self, now: float) -> None:
        self._next_check = heartbeat_round(self._peers, now, self, self._ping, self._drop)
        self._peer_log.flush()

    def _ping(self, p: Peer) -> bool:
        return self._write(p, _HEARTBEAT_FRAMES)

    def _drop_rid(self, rid: bytes, reason: str) -> None:
        p = self._peers.get(rid)
        if p is not None:
            self._drop(p, reason)

    def _drop(self, p: Peer, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE) -> None:
        if self._peers.get(p.rid) is not p:
            return
        del self._peers[p.rid]
        if event is ConnEvent.PEER_GONE:
            self._gone[p.rid] = None
            if len(self._gone) > _GONE_REMEMBERED:
                del self._gone[next(iter(self._gone))]
        if p.lane:
            self._lanes -= 1
        p.state = next_state(p.state, event)
        if self._by_fd.get(p.fd) == p.rid:
            del self._by_fd[p.fd]
        # What was still queued for the peer is lost with it: count it, never lose silently.
        lost = p.outbox.clear()
        self._queue_depth -= lost
        self._dropped += lost
        self._blocked.pop(p.rid, None)
        if not p.announced:
            return
        try:
            self._handler.on_peer_disconnected(p.rid, reason)
        except Exception:
            self._handler_failed("on_peer_disconnected")

    def _shutdown(self) -> None:
        """Runs last on the dispatcher: report, close every socket, terminate our context."""
        self._closing = True
        for p in list(self._peers.values()):
            self._drop(p, CLOSED_LOCALLY)
        self._close_mailbox()
        self._peer_log.flush()
        if self._zap is not None:
            self._zap.close()
        if self._router is not None:
            linger = min(_CLOSE_LINGER_MS, int(self._settings.close_timeout * 1000))
            common.close_monitored(self._router, self._monitor, linger)
        self._term_context()
