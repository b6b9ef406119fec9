"""``ClientService``: the client runtime (docs/architecture.md, "How a get travels").

One transport (one dispatcher thread) per service and one connection per server endpoint,
opened on first use. Requests are multiplexed (seed 003): each gets a 64-bit id from a
per-service counter and waits in the pending table until the reply with that id arrives, so
one connection carries any number of concurrent requests. Each request has a deadline on the
service's timer thread; when it passes, the entry leaves the table and the caller gets
``rda.TimeoutError``; a reply arriving afterwards finds no entry and is dropped and counted
(``late_replies``), never handed to anyone else.

Nothing is decoded on the dispatcher: a reply completes its future with the undecoded message
and the conversion (body decoding, error mapping) happens in ``Future.result()``, in the
caller's thread. Subscriptions are in subscriptions.py, reconnection in reconnect.py.

Locking: ``_lock`` guards the endpoint and subscription bookkeeping; it is never held while
calling into the transport (``send``/``connect`` may block on a full pipe, and the dispatcher
takes ``_lock`` in its callbacks: holding it there could deadlock). The pending table is a dict
with atomic single-key operations; the one race that matters (a request registered on a
connection as it dies) is closed by re-checking the connection after registering.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from rda.business.client.access import AccessPoint, build_request_context, to_data
from rda.business.client.connections import ClientConnections
from rda.business.client.endpoints import Endpoint, admin_endpoint
from rda.business.client.history import HistoryCalls
from rda.business.client.lanes import NO_LANE, LaneCalls
from rda.business.client.reconnect import BackoffPolicy
from rda.business.client.replies import (
    Completion,
    Pending,
    ReplyFuture,
    ReplyWaiter,
    admin_result,
    complete,
    op_name,
)
from rda.business.client.statistics import ClientCounters, ClientStatistics
from rda.business.client.subscriptions import BackfillHook, Notification, Subscription
from rda.business.client.timer import Timer
from rda.business.config import Config
from rda.business.directory import Directory, default_directory, server_key_of
from rda.business.scheduler import GroupTaskScheduler
from rda.serialization import _binary
from rda.serialization._data import Data
from rda.serialization._header import RequestType
from rda.serialization._message import BodyKind, Buffer, Message
from rda.serialization.errors import (
    DisconnectedError,
    NoSuchDeviceError,
    NotAuthorizedError,
    RdaError,
    TimeoutError,
    TransportError,
)
from rda.transport._mailbox import Wakeup
from rda.transport.api import ClientHandler, ClientTransport, TransportSettings
from rda.transport.protocol import Kind, encode_routed
from rda.transport.reasons import HANDSHAKE_REFUSED, NOT_RDA

if TYPE_CHECKING:  # zmq stays unloaded for clients on the in-memory transport
    from rda.business.security import ClientSecurity
    from rda.transport._curve import ClientCurve

__all__ = ["AccessPoint", "ClientService", "Notification", "Subscription", "TransportFactory"]

log = logging.getLogger(__name__)

TransportFactory = Callable[[ClientHandler, TransportSettings, dict[str, Any]], ClientTransport]

_NOTIFICATIONS = frozenset(
    {RequestType.NOTIFICATION_DATA, RequestType.NOTIFICATION_EXC, RequestType.SUBSCRIBE_EXCEPTION}
)


def _zmq_transport(
    handler: ClientHandler,
    settings: TransportSettings,
    info: dict[str, Any],
    curve: ClientCurve | None = None,
) -> ClientTransport:
    # Imported here so that tests over the in-memory transport never load zmq's machinery.
    from rda.transport.zmq_client import ZmqClientTransport

    return ZmqClientTransport(handler, settings, info, curve=curve)


class _Handler:
    """The transport's view of the service: bound methods, no extra call per message."""

    __slots__ = ("on_connected", "on_disconnected", "on_message", "on_messages")

    def __init__(self, service: ClientService) -> None:
        self.on_connected = service._on_connected
        self.on_message = service._on_message
        self.on_messages = service._on_messages
        self.on_disconnected = service._on_disconnected


class ClientService(ClientConnections, LaneCalls, HistoryCalls):
    """Get, set and subscribe to ``(device, property)`` access points of rda servers.

    ``directory`` resolves device names to endpoints (default: ``default_directory(config)``);
    ``config`` gives timeouts, heartbeats and the reconnection back-off. For tests,
    ``transport_factory`` replaces the ZeroMQ transport and ``clock`` the monotonic clock.
    ``security`` (``rda.security.ClientSecurity``): every connection CURVE-encrypted and
    authenticated; a server refusing this client's key fails requests with NotAuthorizedError.
    ``principal`` (default ``config.principal``, ``RDA_PRINCIPAL``): the name declared to
    servers, used only by one that trusts declared names. A context manager, or call close().
    """

    def __init__(
        self,
        directory: Directory | None = None,
        config: Config | None = None,
        *,
        transport_factory: TransportFactory | None = None,
        clock: Callable[[], float] | None = None,
        client_info: Mapping[str, Any] | None = None,
        rng_seed: int | None = None,
        security: ClientSecurity | None = None,
        principal: str | None = None,
    ) -> None:
        self.config = config if config is not None else Config()
        self.directory = directory if directory is not None else default_directory(self.config)
        self._clock = clock if clock is not None else time.monotonic
        self._policy = BackoffPolicy(
            initial=self.config.reconnect_initial, maximum=self.config.reconnect_max
        )
        self._rng_seed = rng_seed
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._request_count = itertools.count()
        self._pending: dict[int, Pending] = {}
        self._endpoints: dict[str, Endpoint] = {}
        # device -> the endpoint serving it, as last resolved (see ``endpoint_of``).
        self._device_endpoints: dict[str, str] = {}
        self._by_connection: dict[int, Endpoint] = {}
        # Transport events for a connection id not yet registered (a transport may report
        # before ``connect`` returns to us); replayed on registration.
        self._early: dict[int, list[Callable[[], None]]] = {}
        # Connections opened by a thread that lost the race to connect an endpoint; their
        # events are ignored.
        self._discarded: set[int] = set()
        self._subs: dict[int, Subscription] = {}
        self._counters = ClientCounters(self.config.metrics_devices)
        self._closing = False
        self._scheduler: GroupTaskScheduler | None = None
        # A fake clock cannot be slept on: re-read it every 10 ms of real time.
        self._timer = Timer(
            self._clock,
            max_wait=None if clock is None else 0.01,
            expire=self._expire,
            live=self._pending.__contains__,
        )
        factory = transport_factory if transport_factory is not None else _zmq_transport
        if security is not None:
            if transport_factory is not None:
                raise RdaError("security (CURVE) needs the ZeroMQ transport, not a custom one")
            directory = self.directory
            curve = security.curve(lambda endpoint: server_key_of(directory, endpoint))
            factory = functools.partial(_zmq_transport, curve=curve)
        info = dict(client_info or {})
        # A declared name (config: RDA_PRINCIPAL); a server believes it only when it trusts
        # declared names, otherwise the transport's authenticated identity counts.
        declared = principal if principal is not None else self.config.principal
        if declared:
            info["principal"] = declared
        self._transport = factory(_Handler(self), self.config.transport_settings(), info)
        # A transport that defers waking a blocking caller until its dispatcher is about to
        # poll again (ZmqClientTransport.wake_later); other transports wake at once.
        self._wake_later: Callable[[Wakeup], None] | None = getattr(
            self._transport, "wake_later", None
        )
        self._init_lanes(self.config.direct_calls)
        try:
            self._transport.start()
            self._watch_directory(owns=directory is None)
        except BaseException:
            self._timer.close()
            raise

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<ClientService {state}, {len(self._endpoints)} server(s), {self.directory!r}>"

    def __enter__(self) -> ClientService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API ------------------------------------------------------------------------

    def access_point(self, device: str, prop: str) -> AccessPoint:
        """The access point ``device/prop``; the device is resolved on first use."""
        return AccessPoint(self, device, prop)

    def admin(self, target: str, command: str, timeout: float | None = None, **args: Any) -> Data:
        """Run an admin command on a server and return its reply.

        ``target`` is an endpoint (contains "://"), else a device name (resolved through the
        directory), else the name of a server registered in a file directory.
        """
        result: Data = self.admin_async(target, command, timeout, **args).result()
        return result

    def admin_async(
        self, target: str, command: str, timeout: float | None = None, **args: Any
    ) -> Future[Data]:
        """``admin`` returning a future."""
        try:
            endpoint = self._admin_endpoint(target)
        except NoSuchDeviceError as exc:
            failed: Future[Data] = Future()
            failed.set_exception(exc)
            return failed
        body: list[tuple[BodyKind, Buffer]] = [
            (BodyKind.DATA, _binary.encode(to_data(args, f"admin {command}")))
        ]
        return self.request(
            RequestType.ADMIN, endpoint, command, "", "", body, timeout, admin_result
        )

    def endpoint_of(self, device: str) -> str:
        """The endpoint serving ``device``: resolved through the directory on first use, then
        kept, and resolved again whenever its connection is lost (the device may have moved)."""
        address = self._device_endpoints.get(device)
        if address is not None:
            return address
        address = self.directory.resolve(device)
        with self._lock:
            # A concurrent first use may have resolved it already: one answer for everybody.
            address = self._device_endpoints.setdefault(device, address)
            self._endpoint_locked(address).devices.add(device)
        return address

    def statistics(self) -> ClientStatistics:
        c, now = self._counters, self._clock()
        with self._lock:
            endpoints = list(self._endpoints.values())
            servers = tuple(ep.snapshot(now) for ep in endpoints)
        return ClientStatistics(
            transport=self._transport.statistics(),
            requests=self._requests_made(),
            replies=c.replies,
            errors=c.errors,
            pending=len(self._pending) + len(self._lane_pending),
            timeouts=c.timeouts,
            late_replies=c.late_replies,
            disconnected_requests=c.disconnected_requests,
            subscriptions=len(self._subs),
            notifications=c.notifications,
            gaps=c.gaps,
            dropped=c.dropped,
            listener_errors=c.listener_errors,
            connections=sum(1 for ep in endpoints if ep.connection is not None),
            reconnects=c.reconnects,
            servers=servers,
            round_trips=c.round_trips.snapshot(),
            directory=self._directory_state(),
        )

    def close(self, timeout: float = 2.0) -> None:
        """Fail pending requests, end subscriptions, stop every thread. Idempotent, bounded."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            pending = [*self._pending.values(), *self._lane_pending.values()]
            self._pending.clear()
            self._lane_pending.clear()
            subs = list(self._subs.values())
            self._subs.clear()
            for ep in self._endpoints.values():
                if ep.retry is not None:
                    ep.retry.cancel()
                ep.subs.clear()
            scheduler = self._scheduler
        for p in pending:
            self._fail(p, DisconnectedError(f"{p.op} {p.device}/{p.property}: client closed"))
        for sub in subs:
            sub.terminate()
        deadline = time.monotonic() + timeout
        self._transport.close(timeout)
        if scheduler is not None:
            scheduler.close(max(0.0, deadline - time.monotonic()))
        self._timer.close(max(0.0, deadline - time.monotonic()))
        self._close_directory()

    @property
    def closed(self) -> bool:
        return self._closing

    # -- requests (AccessPoint calls these) ------------------------------------------------

    def request(
        self,
        op: RequestType,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        body: list[tuple[BodyKind, Buffer]],
        timeout: float | None,
        convert: Callable[[Message], Any],
    ) -> Future[Any]:
        """Send one request to ``endpoint``; the future completes with ``convert(reply)``."""
        fut = ReplyFuture(convert)
        self._send_request(fut, op, endpoint, device, prop, selector, body, timeout)
        return fut

    def call(
        self,
        op: RequestType,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        body: list[tuple[BodyKind, Buffer]],
        timeout: float | None,
        convert: Callable[[Message], Any],
    ) -> Any:
        """``request(...).result()`` for a caller that blocks anyway, without a Future: on the
        calling thread's own lane where it may take one (client_lanes)."""
        if self._lanes_on:
            result = self._lane_call(
                op,
                endpoint,
                device,
                prop,
                selector,
                body,
                self.config.request_timeout if timeout is None else timeout,
                convert,
            )
            if result is not NO_LANE:
                return result
        waiter = ReplyWaiter(convert, self._wake_later)
        self._send_request(waiter, op, endpoint, device, prop, selector, body, timeout)
        return waiter.result()

    def _send_request(
        self,
        fut: Completion,
        op: RequestType,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        body: list[tuple[BodyKind, Buffer]],
        timeout: float | None,
    ) -> None:
        if timeout is None:
            timeout = self.config.request_timeout
        name = op_name(op)
        if self._closing:
            fut.set_exception(DisconnectedError(f"{name} {device}/{prop}: client closed"))
            return
        rid = next(self._ids)
        next(self._request_count)
        ep = self._endpoint(endpoint)
        if ep.connection is None and ep.was_connected and op is not RequestType.ADMIN:
            # The connection was lost and nothing is re-opening it yet: the device may have
            # moved, so ask the directory before dialling the old address again.
            self._follow_moves(ep)
            ep = self._endpoint(self._device_endpoints.get(device, endpoint))
        try:
            conn = self._connection(ep)
        except TransportError:
            if not self._closing:
                raise
            conn = None  # closed while we were connecting
        if conn is None:
            fut.set_exception(DisconnectedError(f"{name} {device}/{prop}: client closed"))
            return
        self._pending[rid] = Pending(fut, conn, name, device, prop, timeout, now := self._clock())
        # No handle to cancel: a reply takes the entry out of _pending, and the timer skips it.
        self._timer.deadline(now + timeout, rid)
        if isinstance(fut, ReplyFuture):
            fut.on_cancel = self._abandon
            fut.key = rid
        if ep.connection != conn:
            # The connection died between choosing it and registering: its on_disconnected
            # may have scanned the table before our entry was there.
            self._disconnected(rid, ep.address, ep.last_reason or "connection lost")
            return
        frames = encode_routed(Kind.REQUEST, op, rid, device, prop, selector, body)
        self._transport.send(conn, frames)

    def request_context(self, timeout: float | None, filters: Data | None) -> bytes:
        """The REQUEST_CONTEXT frame for a request with this deadline and filters."""
        if timeout is None:
            timeout = self.config.request_timeout
        return build_request_context(int(timeout * 1000), filters)

    def _requests_made(self) -> int:
        # ``next`` on an itertools.count is atomic (no lock on the hot path); the count is
        # readable only through its repr, "count(N)".
        return int(repr(self._request_count)[6:-1])

    def _expire(self, rid: int) -> None:
        p = self._take_pending(rid)
        if p is None:
            return
        self._counters.add_timeout()
        error = TimeoutError(
            f"{p.op} {p.device}/{p.property}: no reply within {p.timeout:g} s (request abandoned)"
        )
        complete(p.future, error)

    def _abandon(self, rid: int) -> None:
        self._pending.pop(rid, None)

    def _disconnected(self, rid: int, address: str, reason: str) -> None:
        p = self._take_pending(rid)
        if p is not None:
            self._fail(p, self._disconnect_error(p, address, reason))

    def _disconnect_error(self, p: Pending, address: str, reason: str) -> RdaError:
        if reason.startswith(HANDSHAKE_REFUSED):
            # Retrying cannot help: the server does not accept this client (or its key).
            return NotAuthorizedError(f"{p.op} {p.device}/{p.property}: {address}: {reason}")
        if reason.startswith(NOT_RDA):
            # Not "lost": there never was an rda connection (a wrong port, another service).
            return DisconnectedError(f"{p.op} {p.device}/{p.property}: {reason}")
        return DisconnectedError(
            f"{p.op} {p.device}/{p.property}: connection to {address} lost ({reason})"
        )

    def _fail(self, p: Pending, error: RdaError) -> None:
        if isinstance(error, DisconnectedError):
            self._counters.disconnected_requests += 1
        complete(p.future, error)

    def _on_message(self, connection: int, message: Message) -> None:
        self._handle(message, None)

    def _on_messages(self, connection: int, messages: Sequence[Message]) -> None:
        """A drained batch (api.BatchClientHandler): notifications are staged per
        subscription and each subscription's queue is filled, and its consumer woken, once at
        the end; replies complete as they come. One message's failure does not cost the
        others: the first is re-raised afterwards (the transport counts it), later ones are
        logged."""
        staged: list[Subscription] = []
        failed: Exception | None = None
        handle = self._handle
        for message in messages:
            try:
                handle(message, staged)
            except Exception as exc:
                failed = self._batch_failure(failed, exc)
        for sub in staged:
            try:
                sub.flush()
            except Exception as exc:
                failed = self._batch_failure(failed, exc)
        if failed is not None:
            raise failed

    @staticmethod
    def _batch_failure(first: Exception | None, exc: Exception) -> Exception:
        if first is None:
            return exc
        log.error("handling a message of a batch failed", exc_info=exc)
        return first

    def _handle(self, message: Message, staged: list[Subscription] | None) -> None:
        header = message.header
        if header.request_type in _NOTIFICATIONS:
            sub = self._subs.get(header.id)
            if sub is None:
                self._counters.late_replies += 1
                return
            if header.request_type is RequestType.SUBSCRIBE_EXCEPTION:
                self._forget(sub)
            sub.deliver_message(message, staged)
            return
        p = self._pending.pop(header.id, None)
        if p is None:
            self._counters.late_replies += 1
            return
        if header.request_type is RequestType.EXCEPTION:
            self._counters.errors += 1
        else:
            self._counters.replies += 1
        self._counters.round_trips.observe(p.op, p.device, self._clock() - p.sent_at)
        complete(p.future, message)

    # -- subscriptions ----------------------------------------------------------------------

    def subscribe(
        self,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        filters: Data | None,
        listener: Callable[[Notification], object] | None,
        queue_size: int,
        backfill: BackfillHook | None = None,
    ) -> Subscription:
        sub = Subscription(
            next(self._ids), endpoint, device, prop, selector, filters, listener, queue_size,
            self._counters, self._submit, self._unsubscribe, backfill,
        )  # fmt: skip
        if self._closing:
            raise DisconnectedError(f"subscribe {device}/{prop}: client closed")
        ep = self._endpoint(endpoint)
        with self._lock:
            self._subs[sub.id] = sub
            ep.subs[sub.id] = sub
        conn = self._connection(ep)
        if conn is None:
            raise DisconnectedError(f"subscribe {device}/{prop}: client closed")
        with self._lock:
            send = ep.connection == conn and sub.connection != conn
            if send:
                sub.connection = conn
        if send:
            self._send_subscribe(sub, conn)
        return sub

    def _send_subscribe(self, sub: Subscription, conn: int) -> None:
        body = [(BodyKind.REQUEST_CONTEXT, build_request_context(None, sub.filters))]
        frames = encode_routed(
            Kind.REQUEST,
            RequestType.SUBSCRIBE,
            sub.id,
            sub.device,
            sub.property,
            sub.selector,
            body,
        )
        self._transport.send(conn, frames)

    def _forget(self, sub: Subscription) -> int | None:
        """Drop ``sub`` from the tables; returns the live connection its SUBSCRIBE went on."""
        with self._lock:
            found = self._subs.pop(sub.id, None)
            ep = self._endpoints.get(sub.endpoint)
            conn = None
            if ep is not None:
                ep.subs.pop(sub.id, None)
                conn = ep.connection
        if found is None or conn is None or sub.connection != conn:
            return None
        return conn

    def _unsubscribe(self, sub: Subscription) -> None:
        if self._closing:
            return
        conn = self._forget(sub)
        if conn is not None:
            frames = encode_routed(
                Kind.REQUEST,
                RequestType.UNSUBSCRIBE,
                sub.id,
                sub.device,
                sub.property,
                sub.selector,
            )
            self._transport.send(conn, frames)

    def _submit(
        self, group: str, task: Callable[[], None], on_drop: Callable[[], None] | None
    ) -> bool:
        scheduler = self._scheduler
        if scheduler is None:
            with self._lock:
                if self._closing:
                    return False
                if self._scheduler is None:
                    self._scheduler = GroupTaskScheduler(
                        workers=self.config.workers,
                        queue_limit=self.config.queue_limit,
                        policy="drop_oldest",
                        name="rda-client-listener",
                    )
                scheduler = self._scheduler
        return scheduler.submit(group, task, on_drop)

    # -- admin target --------------------------------------------------------------------

    def _admin_endpoint(self, target: str) -> str:
        return admin_endpoint(self.directory, target)
