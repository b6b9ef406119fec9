"""``ClientService``: the client runtime (docs/architecture.md, "How a get travels").

One transport (one dispatcher thread) per service and one connection per server endpoint,
opened on first use. Requests are multiplexed: each gets a 64-bit id and waits in
the request table until the reply with that id arrives, so one connection carries any number
of concurrent requests. Each request has a deadline; when it passes, the caller gets
``rda.TimeoutError``, and a reply arriving afterwards is dropped and counted
(``late_replies``), never handed to anyone else.

Nothing is decoded on the dispatcher: a reply completes its future with the undecoded message
and the conversion (body decoding, error mapping) happens in ``Future.result()``, in the
caller's thread.

The service holds its parts and wires them together; each owns its state and its lock:

- ``RequestTable`` (requests.py): ids, pending requests, deadlines (with the timer thread),
  completion and its counters;
- ``Connections`` (connections.py): endpoints, connections, reconnection, directory moves;
- ``Subscriptions`` (subscription_set.py): the live subscriptions, notification routing,
  the listener scheduler;
- ``LaneCaller`` (lanes.py): blocking calls on the caller's own lane;
- history.py: history queries, made of gets through ``access_point``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from rda.business.client import history as history_queries
from rda.business.client.access import AccessPoint, build_request_context, to_data
from rda.business.client.connections import Connections
from rda.business.client.endpoints import admin_endpoint
from rda.business.client.future import ReplyFuture
from rda.business.client.history import TimeLike
from rda.business.client.lanes import NO_LANE, LaneCaller
from rda.business.client.reconnect import BackoffPolicy
from rda.business.client.replies import (
    Completion,
    Pending,
    ReplyWaiter,
    admin_result,
    op_name,
)
from rda.business.client.requests import RequestTable
from rda.business.client.statistics import ClientCounters, ClientStatistics
from rda.business.client.subscription_set import Subscriptions
from rda.business.client.subscriptions import BackfillHook, Notification, Subscription
from rda.business.config import Config
from rda.business.directory import Directory, default_directory, server_key_of
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError, NoSuchDeviceError, RdaError, TransportError
from rda.serialization.header import RequestType
from rda.serialization.message import BodyKind, Buffer, Message
from rda.transport.api import ClientHandler, ClientTransport, TransportSettings
from rda.transport.protocol import Kind, encode_routed

if TYPE_CHECKING:  # zmq stays unloaded for clients on the in-memory transport
    import pyarrow as pa

    from rda.business.security import ClientSecurity
    from rda.transport.curve import ClientCurve

__all__ = ["AccessPoint", "ClientService", "Notification", "Subscription", "TransportFactory"]

log = logging.getLogger(__name__)

TransportFactory = Callable[[ClientHandler, TransportSettings, dict[str, Any]], ClientTransport]

_NOTIFICATIONS = frozenset(
    {RequestType.NOTIFICATION_DATA, RequestType.NOTIFICATION_EXC, RequestType.SUBSCRIBE_EXCEPTION}
)
# Enum members read once: each ``RequestType.X`` (``BodyKind.X``, ``Kind.X``) read goes through
# the enum class's ``__getattr__`` hook on Python 3.11, ten times a module global's cost.
_REQUEST, _ADMIN = Kind.REQUEST, RequestType.ADMIN


def _zmq_transport(
    handler: ClientHandler,
    settings: TransportSettings,
    info: dict[str, Any],
    curve: ClientCurve | None = None,
) -> ClientTransport:
    # Imported here so that tests over the in-memory transport never load zmq's machinery.
    from rda.transport.zmq_client import ZmqClientTransport

    return ZmqClientTransport(handler, settings, info, curve=curve)


class _Inbound:
    """The transport's view of the service (an ``api.BatchClientHandler``): connection events
    go to the connections, replies to the request table, notifications to the subscriptions.
    Made before the transport and given the parts before the transport starts (``attach``)."""

    __slots__ = ("_awaits", "_connections", "_requests", "_route")

    def attach(
        self, connections: Connections, requests: RequestTable, subscriptions: Subscriptions
    ) -> None:
        self._connections = connections
        # The table itself, not its bound ``reply``: compiled, ``reply`` is then a C call.
        self._requests = requests
        self._awaits = requests.waiting
        self._route = subscriptions.route

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self._connections.on_connected(connection, server_info)

    def on_disconnected(self, connection: int, reason: str) -> None:
        self._connections.on_disconnected(connection, reason)

    def awaits(self, request_id: int) -> bool:
        """Whether a shared-connection request still waits for its reply (the transport
        sends nothing the table gave up on: ``transport.api.request_check``)."""
        return self._awaits(request_id)

    def on_message(self, connection: int, message: Message) -> None:
        if message.header.request_type in _NOTIFICATIONS:
            self._route(message, None, connection)
        else:
            self._requests.reply(message)

    def on_messages(self, connection: int, messages: Sequence[Message]) -> None:
        """A drained batch (api.BatchClientHandler): notifications are staged per
        subscription and each subscription's queue is filled, and its consumer woken, once at
        the end; replies complete as they come. One message's failure does not cost the
        others: the first is re-raised afterwards (the transport counts it), later ones are
        logged."""
        staged: list[Subscription] = []
        failed: Exception | None = None
        route = self._route
        for message in messages:
            try:
                if message.header.request_type in _NOTIFICATIONS:
                    route(message, staged, connection)
                else:
                    # Through the typed slot: compiled, a C call into the table.
                    self._requests.reply(message)
            except Exception as exc:
                failed = _batch_failure(failed, exc)
        for sub in staged:
            try:
                sub.flush()
            except Exception as exc:
                failed = _batch_failure(failed, exc)
        if failed is not None:
            raise failed


def _batch_failure(first: Exception | None, exc: Exception) -> Exception:
    if first is None:
        return exc
    log.error("handling a message of a batch failed", exc_info=exc)
    return first


class ClientService:
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
        # Read per request: a pydantic model's attribute read goes through its ``__getattr__``
        # hook; the config is immutable (and ``config`` read-only once compiled).
        self._request_timeout: float = self.config.request_timeout
        self.directory = directory if directory is not None else default_directory(self.config)
        self._clock = clock if clock is not None else time.monotonic
        self._closing = False
        self._close_lock = threading.Lock()  # one close() does the work
        self._counters = ClientCounters()
        # A fake clock cannot be slept on: the timer re-reads it every 10 ms of real time.
        self._requests = RequestTable(
            self._clock, self.config.metrics_devices, max_wait=None if clock is None else 0.01
        )
        # Every future's ``on_cancel``: bound once, not per request.
        self._abandon = self._requests.abandon
        factory = transport_factory if transport_factory is not None else _zmq_transport
        if security is not None:
            if transport_factory is not None:
                self._requests.timer.close()
                raise RdaError("security (CURVE) needs the ZeroMQ transport, not a custom one")
            known = self.directory
            curve = security.curve(lambda endpoint: server_key_of(known, endpoint))
            factory = functools.partial(_zmq_transport, curve=curve)
        info = dict(client_info or {})
        # A declared name (config: RDA_PRINCIPAL); a server believes it only when it trusts
        # declared names, otherwise the transport's authenticated identity counts.
        declared = principal if principal is not None else self.config.principal
        if declared:
            info["principal"] = declared
        inbound = _Inbound()
        try:
            self._transport = factory(inbound, self.config.transport_settings(), info)
        except BaseException:
            self._requests.timer.close()
            raise
        self._subscriptions = Subscriptions(
            self._transport,
            self._requests,
            self._counters,
            # Connections (made next) take the subscriptions; this is the way back: a closed
            # subscription is taken off its endpoint (Connections.detach).
            lambda sub: self._connections.detach(sub),
            workers=self.config.workers,
            queue_limit=self.config.queue_limit,
            retry=lambda sub, conn: self._connections.resubscribe_later(sub, conn),
        )
        self._connections = Connections(
            self.directory,
            self._transport,
            self._requests,
            self._subscriptions,
            self._counters,
            BackoffPolicy(initial=self.config.reconnect_initial, maximum=self.config.reconnect_max),
            self._clock,
            rng_seed=rng_seed,
            owns_directory=directory is None,
        )
        self._resolved = self._connections.resolved
        self._lanes = LaneCaller(
            self._transport,
            self._requests,
            self._connections,
            self._clock,
            self.config.direct_calls,
        )
        inbound.attach(self._connections, self._requests, self._subscriptions)
        try:
            self._transport.start()
            self._connections.watch_directory()
        except BaseException:
            self._requests.timer.close()
            raise

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<ClientService {state}, {len(self._connections)} server(s), {self.directory!r}>"

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
            endpoint = admin_endpoint(self.directory, target)
        except NoSuchDeviceError as exc:
            failed: Future[Data] = Future()
            failed.set_exception(exc)
            return failed
        body: list[tuple[BodyKind, Buffer]] = [
            (BodyKind.DATA, binary.encode(to_data(args, f"admin {command}")))
        ]
        return self.request(
            RequestType.ADMIN, endpoint, command, "", "", body, timeout, admin_result
        )

    def endpoint_of(self, device: str) -> str:
        """The endpoint serving ``device``: resolved through the directory on first use, then
        kept, and resolved again whenever its connection is lost (the device may have moved)."""
        address = self._resolved(device)  # once per request: no Python frame when known
        if address is not None:
            return address
        return self._connections.resolve(device)

    def statistics(self) -> ClientStatistics:
        c = self._counters
        r = self._requests.counts()
        servers, connections = self._connections.statistics(self._clock())
        return ClientStatistics(
            transport=self._transport.statistics(),
            requests=r.requests,
            replies=r.replies,
            errors=r.errors,
            pending=r.pending,
            timeouts=r.timeouts,
            late_replies=r.late_replies,
            disconnected_requests=r.disconnected_requests,
            subscriptions=len(self._subscriptions),
            notifications=c.notifications,
            gaps=c.gaps,
            dropped=c.dropped,
            listener_errors=c.listener_errors,
            connections=connections,
            reconnects=c.reconnects,
            servers=servers,
            round_trips=r.round_trips,
            directory=self._connections.directory_state(),
        )

    def close(self, timeout: float = 2.0) -> None:
        """Fail pending requests, end subscriptions, stop every thread. Idempotent, bounded."""
        with self._close_lock:
            if self._closing:
                return
            self._closing = True
        self._connections.close()
        self._requests.close()
        scheduler = self._subscriptions.close()
        deadline = time.monotonic() + timeout
        self._transport.close(timeout)
        if scheduler is not None:
            scheduler.close(max(0.0, deadline - time.monotonic()))
        self._requests.timer.close(max(0.0, deadline - time.monotonic()))
        self._connections.close_directory()

    @property
    def closed(self) -> bool:
        return self._closing

    # -- history (history.py) ----------------------------------------------------------------

    def history(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> list[Notification]:
        """The recorded updates of ``device/prop`` with ``start <= acq_stamp < end``, as
        ``rda.Notification`` s (``update_type`` HISTORY) in acquisition-stamp order, at most
        ``limit``. ``start``/``end``: ns, datetimes, or timedeltas relative to now (``end``
        None: now). For large windows iterate :meth:`history_iter` instead of holding a list."""
        return list(self.history_iter(device, prop, start, end, selector, limit, timeout))

    def history_iter(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
        chunk_rows: int = history_queries.CHUNK_ROWS,
    ) -> Iterator[Notification]:
        """:meth:`history`, lazily: the next chunk is asked for when this one is consumed."""
        return history_queries.history_iter(
            self.access_point, device, prop, start, end, selector, limit, timeout, chunk_rows
        )

    def history_table(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
        chunk_rows: int = history_queries.TABLE_CHUNK_ROWS,
    ) -> pa.Table:
        """The recorded rows of ``device/prop`` with ``start <= acq_stamp < end`` as one
        ``pyarrow.Table`` in acquisition-stamp order (needs pyarrow, the ``pipeline`` extra):
        ``time``, the stamps, cycle, selector, ``recorder_id``, ``seq``, ``error``, what else
        the recorder stored (update type, alarm severity), then one column per field of the
        value (docs/history.md, "Columnar history"). The chunks' Arrow buffers are used as
        received, so ``.to_pandas()`` and polars copy only what Arrow must."""
        return history_queries.history_table(
            self.access_point, device, prop, start, end, selector, limit, timeout, chunk_rows
        )

    def history_batches(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
        chunk_rows: int = history_queries.TABLE_CHUNK_ROWS,
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`history_table` as ``pyarrow.RecordBatch`` es, lazily: the next chunk is asked
        for when the batches of this one have been consumed."""
        return history_queries.history_batches(
            self.access_point, device, prop, start, end, selector, limit, timeout, chunk_rows
        )

    def backfill_rows(
        self,
        device: str,
        prop: str,
        selector: str | None,
        start: int,
        until: int,
        columnar: bool = False,
    ) -> Iterator[Notification]:
        """For ``subscribe(backfill=...)``: the rows of ``[start, until)`` with the seam wait
        (``Backfill`` turns a failure into one error notification); ``columnar``: as
        ``HistoryChunk`` s."""
        return history_queries.backfill_rows(
            self.access_point, device, prop, selector, start, until, columnar
        )

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
        lanes = self._lanes
        if lanes.enabled:
            result = lanes.call(
                op,
                endpoint,
                device,
                prop,
                selector,
                body,
                self._request_timeout if timeout is None else timeout,
                convert,
            )
            if result is not NO_LANE:
                return result
        waiter = ReplyWaiter(convert, lanes.wake_later)
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
            timeout = self._request_timeout
        name = op_name(op)
        if self._closing:
            fut.set_exception(DisconnectedError(f"{name} {device}/{prop}: client closed"))
            return
        requests, connections = self._requests, self._connections
        requests.count_request()
        ep = connections.get(endpoint) or connections.endpoint(endpoint)
        # The usual request: its endpoint connected, no call into the connections.
        conn = ep.connection
        if conn is None:
            if ep.was_connected and op is not _ADMIN:
                # The connection was lost and nothing is re-opening it yet: the device may
                # have moved, so ask the directory before dialling the old address again.
                connections.follow_moves(ep)
                ep = connections.endpoint(connections.current(device, endpoint))
            try:
                conn = connections.connection(ep)
            except TransportError:
                if not self._closing:
                    raise
                conn = None  # closed while we were connecting
        if conn is None:
            fut.set_exception(DisconnectedError(f"{name} {device}/{prop}: client closed"))
            return
        rid = requests.add(Pending(fut, conn, name, device, prop, timeout, self._clock()))
        if not rid:
            return  # the client closed meanwhile: ended
        if isinstance(fut, ReplyFuture):
            fut.on_cancel = self._abandon
            fut.key = rid
        if ep.connection != conn:
            # The connection died between choosing it and registering: its on_disconnected
            # may have scanned the table before our entry was there.
            requests.disconnected(rid, ep.address, ep.last_reason or "connection lost")
            return
        frames = encode_routed(_REQUEST, op, rid, device, prop, selector, body)
        self._transport.send(conn, frames)

    def request_context(self, timeout: float | None, filters: Data | None) -> bytes:
        """The REQUEST_CONTEXT frame for a request with this deadline and filters."""
        if timeout is None:
            timeout = self._request_timeout
        return build_request_context(int(timeout * 1000), filters)

    # -- subscriptions (subscription_set.py, connections.py) --------------------------------

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
        if self._closing:
            raise DisconnectedError(f"subscribe {device}/{prop}: client closed")
        sub = self._subscriptions.new(
            endpoint, device, prop, selector, filters, listener, queue_size, backfill
        )
        conn = self._connections.attach(sub)
        if conn is not None:
            self._subscriptions.send_subscribe(sub, conn)
        return sub
