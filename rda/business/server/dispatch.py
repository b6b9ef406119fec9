"""The server's request/reply plumbing: from the transport's callback to the encoded answer.

:class:`Dispatch` is the transport's ``ServerHandler``. Its ``on_*`` methods run on the
dispatcher thread: look the peer up, build a request, run a get or set at once when its
device is idle (``run_inline``; a long one is handed over) or submit it to a worker
(``_run``); whichever thread answers the request encodes the answer (``_respond``).

What each outcome is answered with and how it is counted, and when a get reply is held until
its handler returns (to send big writable arrays without a copy): rda.business.server.replies.

Authorization (the RBAC gate, :class:`~rda.business.policy.AccessGate`) is checked in
``on_message`` on the dispatcher thread, from the parsed header alone: a denied request is
answered there, never reaches the scheduler or a handler, and its body is never decoded.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from _thread import get_ident
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from rda.business.common import AcquiredData
from rda.business.policy import AccessGate, Denial
from rda.business.scheduler import GroupTaskScheduler, InlineRule
from rda.business.server.devices import PropertyValidationError
from rda.business.server.outcomes import is_handler_fault, outcome_of
from rda.business.server.replies import (
    admin_reply_frames,
    error_frames,
    get_reply_frames,
    hand_over,
    held_only_by_the_handler,
    reply_frames,
)
from rda.business.server.requests import (
    SERVER_CLIENT,
    ClientInfo,
    DeadlineWatcher,
    GetRequest,
    RequestReplyCallback,
    ServerRequest,
    client_timeout,
    new_request,
    timeout_error,
)
from rda.business.server.statistics import RequestCounters
from rda.business.server.subscriptions import (
    SubscriptionCallback,
    SubscriptionRegistry,
    SubscriptionSource,
    UnsubscribeRequest,
)
from rda.serialization import _binary
from rda.serialization._data import Data
from rda.serialization._header import Header, RequestType, UpdateType
from rda.serialization._message import Message
from rda.serialization.errors import (
    DecodeError,
    NoSuchDeviceError,
    OverloadError,
    RdaError,
    RemoteProtocolError,
    TimeoutError,
)
from rda.transport._ratelog import RateLimitedLog
from rda.transport.api import Buffer, ServerTransport

__all__ = ["ADMIN_GROUP", "BoundAdminHandler", "Dispatch", "PeerState"]

log = logging.getLogger("rda.server")

ADMIN_GROUP = "__admin__"
# The admin handler with its server already bound (runtime.py binds it), so that this module
# needs only the server's name and never imports runtime.py, which imports it.
BoundAdminHandler = Callable[[str, Data, ClientInfo], Data]

_TYPE_NAMES = {t: t.name.lower() for t in RequestType}
_REQUESTS = frozenset({RequestType.GET, RequestType.SET, RequestType.SUBSCRIBE})
_CHECKED = _REQUESTS | {RequestType.ADMIN}


@dataclass(slots=True)
class PeerState:
    client: ClientInfo
    connected_since: float
    last_heard: float
    # A client's direct lane (its blocking calls' own connection): a session for requests,
    # not another client, so not listed or counted as one.
    lane: bool = False


class Dispatch:
    """Routes requests to workers and answers them; one per started :class:`Server`."""

    def __init__(
        self,
        *,
        gate: AccessGate,
        scheduler: GroupTaskScheduler,
        deadlines: DeadlineWatcher,
        counters: RequestCounters,
        request_reply: RequestReplyCallback,
        subscription: SubscriptionCallback,
        admin_handler: BoundAdminHandler | None,
        clock: Callable[[], float],
        default_timeout: float,
        immediate_updates: bool,
        trust_declared: bool = False,
        inline_handlers: InlineRule | None = None,
    ) -> None:
        self._gate = gate
        self._scheduler = scheduler
        self._deadlines = deadlines
        self._counters = counters
        self._rr = request_reply
        self._subs = subscription
        self._admin = admin_handler
        self._clock = clock
        self._default_timeout = default_timeout
        self._immediate = immediate_updates
        # Gets and sets start on the dispatcher when their device is idle (InlineRule; a long
        # one is handed over: rda.transport._relay); Server narrows it for other transports.
        self.inline = inline_handlers if inline_handlers else None
        self._peers: dict[bytes, PeerState] = {}
        self._peers_lock = threading.Lock()
        self._trust_declared = trust_declared
        # Lines a client can cause (its requests make handlers fail): one per kind per second.
        self._log = RateLimitedLog(log, clock=clock)
        self._transport: ServerTransport | None = None
        self._registry: SubscriptionRegistry | None = None
        # Set at stop: answers after that are dropped instead of sent to a closed transport.
        self.stopping = False

    def attach(self, transport: ServerTransport, registry: SubscriptionRegistry) -> None:
        self._transport = transport
        self._registry = registry

    def peers(self) -> list[tuple[bytes, PeerState]]:
        """The connected clients (lanes left out)."""
        with self._peers_lock:
            return [(peer, state) for peer, state in self._peers.items() if not state.lane]

    def refresh_roles(self) -> None:
        """After the gate's policy changed: give connected clients their roles under it (a
        request already in flight keeps the ClientInfo it was built with)."""
        with self._peers_lock:
            for state in self._peers.values():
                state.client = self._with_roles(state.client)

    def _with_roles(self, client: ClientInfo) -> ClientInfo:
        roles = self._gate.roles_of(client.principal)
        return client if roles == client.roles else dataclasses.replace(client, roles=roles)

    # -- ServerHandler: the dispatcher thread ------------------------------------------------

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        now = time.time()
        client = ClientInfo.from_info(peer, client_info, self._trust_declared)
        state = PeerState(self._with_roles(client), now, now, client_info.get("lane") is True)
        with self._peers_lock:
            self._peers[peer] = state
        if not state.lane:
            self._counters.connection(opened=True)
        if self._registry is not None:
            self._registry.peer_connected(peer)

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        with self._peers_lock:
            state = self._peers.pop(peer, None)
        if state is not None and not state.lane:
            self._counters.connection(opened=False)
        if self._registry is None:
            return
        # A departed client (disconnect, heartbeat timeout, close) ends each of its
        # subscriptions as an UNSUBSCRIBE would: a server keeping per-subscriber state hears of
        # every one (issue 12).
        client = state.client if state is not None else ClientInfo(peer)
        for sub_id, source, emptied in self._registry.remove_peer(peer):
            self._ended(source, sub_id, client, emptied)

    def on_message(self, peer: bytes, message: Message) -> None:
        received_at = self._clock()
        state = self._peers.get(peer)
        if state is not None:
            state.last_heard = time.time()
            client = state.client
        else:
            client = ClientInfo(peer)
        header = message.header
        rtype = header.request_type
        gate = self._gate
        if gate.authorizer is not None and rtype in _CHECKED:
            # From the header alone: a denied request is never queued nor decoded.
            denial = (
                gate.check_admin(client, header.device)
                if rtype is RequestType.ADMIN
                else gate.check(client, _TYPE_NAMES[rtype], header.device, header.property)
            )
            if denial is not None:
                self._deny(peer, header, denial, received_at)
                return
        if rtype in _REQUESTS:
            request = new_request(
                message, client, received_at, self._respond, self._counters.late_completion
            )
            run = partial(self._run, request)
            inline = self.inline
            if (
                inline is not None
                and rtype is not RequestType.SUBSCRIBE
                and inline.allows(header.device, header.property)
                and self._scheduler.run_inline(header.device, run)
            ):
                return
            if not self._scheduler.submit(header.device, run, partial(self._overload, request)):
                self._overload(request)
        elif rtype is RequestType.ADMIN:
            task = partial(self._run_admin, peer, message, client, received_at)
            if not self._scheduler.submit(ADMIN_GROUP, task):
                overload = OverloadError(f"admin queue full; {header.device!r} rejected")
                self._send_error(peer, header, RequestType.EXCEPTION, overload)
                self._counters.record("admin", "overload", self._clock() - received_at)
        elif rtype is RequestType.UNSUBSCRIBE:
            self._unsubscribe(peer, header, client)
        else:
            error = RemoteProtocolError(f"{rtype.name} is not a request a client may send")
            self._send_error(peer, header, RequestType.EXCEPTION, error)

    def _deny(self, peer: bytes, header: Header, denial: Denial, received_at: float) -> None:
        """Answer, count and log a request the gate refused."""
        rtype = header.request_type
        if rtype is RequestType.ADMIN:
            device_label, prop = None, header.device
        else:
            device_label, prop = header.device, header.property
        reply_type = (
            RequestType.SUBSCRIBE_EXCEPTION
            if rtype is RequestType.SUBSCRIBE
            else RequestType.EXCEPTION
        )
        self._counters.denied(denial.principal, denial.operation)
        took = self._clock() - received_at
        self._counters.record(_TYPE_NAMES[rtype], "denied", took, device_label, prop)
        self._send_error(peer, header, reply_type, denial.error)
        self._gate.log_denial(denial, peer)

    # -- workers -----------------------------------------------------------------------------

    def _run(self, request: ServerRequest) -> None:
        """Worker: check the deadline, call the user callback, arm the deadline watcher."""
        try:
            timeout = client_timeout(request.message)
        except DecodeError as exc:
            request._answer(None, exc)
            return
        if timeout is None:
            timeout = self._default_timeout
        deadline = request.received_at + timeout
        if self._clock() >= deadline:
            # The client gave up while this waited in the queue: running it would be a
            # surprise (a set applied after the caller saw a timeout).
            request._answer(None, timeout_error(request, timeout, queued=True))
            return
        # Known before the handler runs: a synchronous handler that runs past it answers late
        # (the watcher below is armed only when it returns), and _respond must know.
        request.deadline = deadline
        rtype = request.header.request_type
        try:
            if rtype is RequestType.GET:
                # A complete() on this thread while the handler runs may be held (_respond).
                request._runner = get_ident()
                self._rr.get(request)  # type: ignore[arg-type]
            elif rtype is RequestType.SET:
                self._rr.set(request)  # type: ignore[arg-type]
            else:
                self._subs.subscribe(request)  # type: ignore[arg-type]
        except Exception as exc:
            self._handler_raised(request, exc)
        finally:
            request._runner = 0
        if request._held is not None:
            self._send_held(request)
        self._arm(request, deadline, timeout)

    def _send_held(self, request: ServerRequest) -> None:
        """The reply held back while its handler ran: its arrays nobody else can reach now go
        zero-copy, the rest are copied (replies.hand_over), and it leaves now."""
        held = request._held
        request._held = None
        assert held is not None
        copied = hand_over(held)[1]  # ``held`` must stay this frame's one reference
        if not copied and self._clock() < request.deadline:  # else _respond counts it
            self._counters.array_reply(zero_copy=True)
        self._respond(request, held, None)

    def _arm(self, request: ServerRequest, deadline: float, timeout: float) -> None:
        if request.done:
            return
        expire = partial(self._expire, request, timeout)
        cancel = self._deadlines.add(deadline, expire)
        if not request._arm(cancel):
            cancel()

    def _expire(self, request: ServerRequest, timeout: float) -> None:
        request._answer(None, timeout_error(request, timeout, queued=False))

    def _handler_raised(self, request: ServerRequest, exc: Exception) -> None:
        # A typed client error (unknown property, refused value) is the client's outcome, not
        # a server fault: only the rest moves the handler-error counter.
        if is_handler_fault(exc):
            self._counters.handler_error()
        # The client gets the error and the counter moves; the log is for whoever debugs the
        # handler, so the traceback goes at INFO, and expected errors (rda's own, a value
        # refused by a schema) at DEBUG.
        if isinstance(exc, RdaError | PropertyValidationError):
            log.debug("%r: handler raised %r", request, exc)
        else:
            self._log.log(
                "handler errors", "%r: handler raised", request, exc_info=True, level=logging.INFO
            )
        if not request._answer(None, exc):
            self._log.log("late errors", "%r: handler raised after answering: %r", request, exc)

    def _overload(self, request: ServerRequest) -> None:
        limit = self._scheduler.queue_limit
        request._answer(
            None,
            OverloadError(
                f"{request.device}: server overloaded ({limit} requests already queued for "
                f"this device); {request.header.request_type.name} {request.property} rejected"
            ),
        )

    def _run_admin(self, peer: bytes, message: Message, client: ClientInfo, at: float) -> None:
        header = message.header
        try:
            if self._admin is None:
                raise NoSuchDeviceError("no admin interface")
            args = message.data if message.data is not None else Data()
            result = self._admin(header.device, args, client)
            frames = admin_reply_frames(header, result)
            outcome = "ok"
        except Exception as exc:
            outcome = outcome_of(exc)
            if outcome == "handler_error":
                self._log.log(
                    "admin errors", "admin command %r raised", header.device, exc_info=True
                )
                self._counters.handler_error()
            frames = error_frames(header, RequestType.EXCEPTION, exc)
        # Counted before the answer leaves, as in _respond.
        self._counters.record("admin", outcome, self._clock() - at)
        self._send(peer, frames)

    # -- answers: any thread -----------------------------------------------------------------

    def _respond(
        self, request: ServerRequest, result: AcquiredData | None, error: BaseException | None
    ) -> None:
        header = request.header
        rtype = header.request_type
        now = self._clock()
        if now >= request.deadline and not isinstance(error, TimeoutError):
            self._late_answer(request, now)
            return
        peer = request.client.peer
        frames: list[Buffer] | None = None
        if error is not None:
            reply_type = (
                RequestType.SUBSCRIBE_EXCEPTION
                if rtype is RequestType.SUBSCRIBE
                else RequestType.EXCEPTION
            )
            frames = error_frames(header, reply_type, error)
            outcome = outcome_of(error)
        elif rtype is RequestType.GET:
            assert result is not None  # GetRequest.complete guarantees it
            if _binary.writable_arrays(result.data):
                # Big writable arrays: copied now, unless completed on the thread running the
                # handler and held by nothing its return does not end (replies.py).
                if request._runner == get_ident() and held_only_by_the_handler(
                    result, self._run.__code__
                ):
                    request._held = result
                    return
                self._counters.array_reply(zero_copy=False)
            try:
                frames = get_reply_frames(header, result)
            except Exception as exc:
                # A value the codec refuses (e.g. a cycle name over 64 KiB): the client still
                # gets an answer, and the handler's author a counted error.
                self._counters.handler_error()
                self._log.log(
                    "unencodable replies", "%r: reply not encodable", request, exc_info=True
                )
                frames = error_frames(header, RequestType.EXCEPTION, exc)
                outcome = "handler_error"
            else:
                outcome = "ok"
        elif rtype is RequestType.SET:
            frames = reply_frames(header, RequestType.REPLY)
            outcome = "ok"
        else:
            outcome = "ok"
        # Counted before the answer leaves: a client that has its reply finds it counted (the
        # worker would otherwise race the client's next look at the statistics).
        took = now - request.received_at
        self._counters.record(_TYPE_NAMES[rtype], outcome, took, header.device, header.property)
        if frames is not None:
            self._send(peer, frames)
        if error is not None:
            return
        if rtype is RequestType.SET:
            if self._immediate:
                self._updates(header.device, header.property)
        elif rtype is RequestType.SUBSCRIBE:
            self._accepted(request)

    def _late_answer(self, request: ServerRequest, now: float) -> None:
        """A handler answered after the deadline (it ran past it): counted ``timeout`` and
        ``late_completions``, not sent to a client that gave up; one that set no deadline of
        its own (a subscribe) is still waiting and is told TimeoutError."""
        self._counters.late_completion()
        rtype = request.header.request_type
        took = now - request.received_at
        header = request.header
        self._counters.record(_TYPE_NAMES[rtype], "timeout", took, header.device, header.property)
        self._log.log("late answers", "%r answered past its deadline: not sent", request)
        if request.message.timeout is None:
            sub = rtype is RequestType.SUBSCRIBE
            reply = RequestType.SUBSCRIBE_EXCEPTION if sub else RequestType.EXCEPTION
            error = timeout_error(request, request.deadline - request.received_at, queued=False)
            self._send_error(request.client.peer, request.header, reply, error)

    def _send_error(
        self, peer: bytes, header: Header, reply_type: RequestType, error: BaseException
    ) -> None:
        self._send(peer, error_frames(header, reply_type, error))

    def _send(self, peer: bytes, frames: list[Buffer]) -> None:
        transport = self._transport
        if transport is None or self.stopping:
            return
        try:
            transport.send(peer, frames)
        except Exception:
            self._log.log("unsent replies", "reply to %s not sent", peer.hex(), exc_info=True)

    # -- subscriptions -----------------------------------------------------------------------

    def _accepted(self, request: ServerRequest) -> None:
        registry = self._registry
        if registry is None:
            return
        peer = request.client.peer
        added = registry.add(
            peer,
            request.id,
            request.client,
            request.device,
            request.property,
            request.selector,
            request.filters,
        )
        if added is None:
            return  # the client left or unsubscribed meanwhile
        source, created = added
        if created:
            try:
                self._subs.source_added(source)
            except Exception:
                self._counters.handler_error()
                log.exception("%r: source_added raised", source)
        sub_id = request.id

        def first(result: AcquiredData | None, error: BaseException | None) -> None:
            source.send_first(peer, sub_id, result, error)

        self._produce(source, first)

    def _updates(self, device: str, prop: str) -> None:
        """IMMEDIATE updates after a set, one get per source of (device, property)."""
        registry = self._registry
        if registry is None:
            return
        for source in registry.find(device, prop):
            self._produce(source, partial(_deliver_immediate, source))

    def _produce(
        self,
        source: SubscriptionSource,
        deliver: Callable[[AcquiredData | None, BaseException | None], None],
    ) -> None:
        """Run the get handler for a source in its device group; ``deliver`` gets the result."""

        def answered(
            _: ServerRequest, result: AcquiredData | None, error: BaseException | None
        ) -> None:
            deliver(result, error)

        header = Header(RequestType.GET, 0, source.device, source.property, source.selector)
        request = GetRequest(
            Message(header), SERVER_CLIENT, self._clock(), answered, filters=source.filters
        )

        def task() -> None:
            try:
                self._rr.get(request)
            except Exception as exc:
                self._handler_raised(request, exc)
            self._arm(request, request.received_at + self._default_timeout, self._default_timeout)

        if not self._scheduler.submit(source.device, task, partial(self._overload, request)):
            self._overload(request)

    def _unsubscribe(self, peer: bytes, header: Header, client: ClientInfo) -> None:
        registry = self._registry
        if registry is None:
            return
        removed = registry.remove(peer, header.id)
        if removed is None:
            return
        source, emptied = removed
        self._ended(source, header.id, client, emptied)

    def _ended(
        self, source: SubscriptionSource, sub_id: int, client: ClientInfo, emptied: bool
    ) -> None:
        """``unsubscribe`` for one ended subscription, then ``source_removed`` if it was the
        source's last (both in the device's group: in this order)."""
        request = UnsubscribeRequest(
            source.device, source.property, source.selector, source.filters, client, sub_id, source
        )
        self._submit_callback(source.device, self._subs.unsubscribe, request)
        if emptied:
            self._submit_callback(source.device, self._subs.source_removed, source)

    def _submit_callback(self, group: str, callback: Callable[[Any], None], arg: Any) -> None:
        """User notification callbacks run on a worker, in the device's order."""

        def task() -> None:
            try:
                callback(arg)
            except Exception:
                self._counters.handler_error()
                log.exception("subscription callback %r raised", callback)

        if not self._scheduler.submit(group, task):
            self._log.log(
                "skipped callbacks", "%s: queue full, %r not called for %r", group, callback, arg
            )


def _deliver_immediate(
    source: SubscriptionSource, result: AcquiredData | None, error: BaseException | None
) -> None:
    if result is not None:
        source.notify(result, UpdateType.IMMEDIATE)
    else:
        source.notify_error(error or RuntimeError("no update"), UpdateType.IMMEDIATE)
