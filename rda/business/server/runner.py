"""Running requests: a get, set or subscribe from its start to its encoded, sent answer.

:class:`RequestRunner` gets each request the dispatcher accepted (:meth:`~RequestRunner.start`)
and runs it at once on the dispatcher when its device is idle (the inline rule, ``InlineRule``:
``GroupTaskScheduler.run_inline``; a handler that takes long is handed over: the transport's
standby thread takes the dispatching meanwhile, rda.transport.relay), or submits it to a
worker in its device's group. Running it (:meth:`~RequestRunner.run`): check the client's
deadline, call the user callback, arm the deadline watcher if the callback returned without
answering. Whichever thread answers the request (``complete``/``fail``, a raised callback, a
full queue, the deadline watcher) calls :meth:`~RequestRunner.respond` through the request's
public completion interface (``settle``): the outcome is counted, the reply encoded
(rda.business.server.replies) and handed to the transport. Admin commands run here too, in
their own group (:meth:`~RequestRunner.start_admin`).

What happens to a subscription after it was accepted, and the IMMEDIATE updates after a set,
belong to the subscription lifecycle (rda.business.server.lifecycle): the runner tells it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from functools import partial

from rda.business.common import AcquiredData
from rda.business.scheduler import GroupTaskScheduler, InlineRule
from rda.business.server.devices import PropertyValidationError
from rda.business.server.outcomes import is_handler_fault, outcome_of
from rda.business.server.properties import PropertyTable, description_data
from rda.business.server.replies import (
    admin_reply_frames,
    error_frames,
    get_reply_frames,
    hand_over,
    held_only_by_the_handler,
    references_a_completion_hides,
    references_not_in_frames,
    reply_frames,
)
from rda.business.server.requests import (
    SERVER_CLIENT,
    ClientInfo,
    DeadlineWatcher,
    GetRequest,
    RequestReplyCallback,
    ServerError,
    ServerRequest,
    SetRequest,
    SubscriptionRequest,
    client_timeout,
    completed_with,
    timeout_error,
)
from rda.business.server.statistics import RequestCounters
from rda.business.server.subscriptions import SubscriptionCallback
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import (
    DecodeError,
    NoSuchDeviceError,
    OverloadError,
    RdaError,
    TimeoutError,
)
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.transport.api import Buffer, ServerTransport
from rda.transport.ratelog import RateLimitedLog

__all__ = ["ADMIN_GROUP", "TYPE_NAMES", "BoundAdminHandler", "RequestRunner"]

log = logging.getLogger("rda.server")

ADMIN_GROUP = "__admin__"
# The admin handler with its server already bound (runtime.py binds it), so that this module
# needs only the server's name and never imports runtime.py, which imports it.
BoundAdminHandler = Callable[[str, Data, ClientInfo], Data]
# (result, error) of a get the server makes itself: see RequestRunner.fetch.
Deliver = Callable[[AcquiredData | None, BaseException | None], None]

#: The request type's name as counted and labelled: ``get``, ``set``, ``subscribe``, ...
TYPE_NAMES = {t: t.name.lower() for t in RequestType}

_getframe = sys._getframe
# The request types, read once: on Python 3.11 each ``RequestType.GET`` read goes through the
# enum class's ``__getattr__`` hook, ten times a module global's cost, and a get took five.
_GET, _SET, _SUBSCRIBE = RequestType.GET, RequestType.SET, RequestType.SUBSCRIBE
_EXCEPTION, _SUBSCRIBE_EXCEPTION = RequestType.EXCEPTION, RequestType.SUBSCRIBE_EXCEPTION
_REQUEST_CLASSES: dict[RequestType, type[ServerRequest]] = {
    RequestType.GET: GetRequest,
    RequestType.SET: SetRequest,
    RequestType.SUBSCRIBE: SubscriptionRequest,
}


class RequestRunner:
    """Runs requests and answers them; one per started server (see the module docstring).

    ``accepted(request)`` is called when a subscribe was accepted in time, ``updated(device,
    property)`` after each successful set when IMMEDIATE updates are on (None: off): the
    subscription lifecycle's hooks.
    """

    def __init__(
        self,
        *,
        scheduler: GroupTaskScheduler,
        deadlines: DeadlineWatcher,
        counters: RequestCounters,
        request_reply: RequestReplyCallback,
        subscription: SubscriptionCallback,
        admin_handler: BoundAdminHandler | None,
        clock: Callable[[], float],
        default_timeout: float,
        inline: InlineRule | None = None,
        accepted: Callable[[ServerRequest], None],
        updated: Callable[[str, str], None] | None,
        properties: PropertyTable | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._deadlines = deadlines
        self._counters = counters
        self._rr = request_reply
        self._subs = subscription
        self._admin = admin_handler
        self._clock = clock
        self._default_timeout = default_timeout
        self._accepted = accepted
        self._updated = updated
        # The declared metadata; None when nothing is declared, so that gets and sets of such a
        # server take no step for it (one ``is None`` test each).
        self._properties = properties if properties else None
        self._described = properties
        # Gets and sets start on the dispatcher when their device is idle (InlineRule; a long
        # one is handed over: rda.transport.relay); Server narrows it for other transports.
        self.inline = inline if inline else None
        # Lines a client can cause (its requests make handlers fail): one per kind per second.
        self._log = RateLimitedLog(log, clock=clock)
        self._transport: ServerTransport | None = None
        # Set at stop: answers after that are dropped instead of sent to a closed transport.
        self.stopping = False
        # Bound once: each request carries them.
        self._respond = self.respond
        self._late = counters.late_completion
        self._run_task = self.run_answered

    def attach(self, transport: ServerTransport) -> None:
        """The transport the answers go to (it exists only once its handler does)."""
        self._transport = transport

    # -- starting: the dispatcher thread ----------------------------------------------------

    def start(self, message: Message, client: ClientInfo, received_at: float) -> None:
        """A GET, SET or SUBSCRIBE the dispatcher accepted: its request object (no decoding),
        run inline when the rule and the device's group allow, else queued for a worker (an
        overflow is answered ``OverloadError``, its body never decoded)."""
        header = message.header
        rtype = header.request_type
        # Positional: a keyword argument makes the class call build a dict for __init__.
        request = _REQUEST_CLASSES[rtype](message, client, received_at, self._respond, self._late)
        run = partial(self._run_task, request)
        inline = self.inline
        if (
            inline is not None
            and rtype is not _SUBSCRIBE
            and inline.allows(header.device, header.property)
            and self._scheduler.run_inline(header.device, run)
        ):
            return
        if not self._scheduler.submit(header.device, run, partial(self._overload, request)):
            self._overload(request)

    def start_admin(self, peer: bytes, message: Message, client: ClientInfo, at: float) -> None:
        """An ADMIN request: queued in its own group (never inline), so that it answers while
        every device group is busy."""
        task = partial(self.run_admin, peer, message, client, at)
        if not self._scheduler.submit(ADMIN_GROUP, task):
            header = message.header
            overload = OverloadError(f"admin queue full; {header.device!r} rejected")
            self.send_error(peer, header, RequestType.EXCEPTION, overload)
            self._counters.record("admin", "overload", self._clock() - at)

    # -- running: a worker, or the dispatcher when inline -----------------------------------

    def run(self, request: ServerRequest) -> None:
        """Check the deadline, call the user callback, arm the deadline watcher."""
        try:
            timeout = client_timeout(request.message)
        except DecodeError as exc:
            request.settle(None, exc)
            return
        if timeout is None:
            timeout = self._default_timeout
        deadline = request.received_at + timeout
        if self._clock() >= deadline:
            # The client gave up while this waited in the queue: running it would be a
            # surprise (a set applied after the caller saw a timeout).
            request.settle(None, timeout_error(request, timeout, queued=True))
            return
        # Known before the handler runs: a synchronous handler that runs past it answers late
        # (the watcher below is armed only when it returns), and respond must know.
        request.deadline = deadline
        # The message's header, not the request's ``header`` property: a Python call less.
        rtype = request.message.header.request_type
        try:
            if rtype is _GET:
                # The frame below the handler's (this one, or when this module is compiled and
                # has no frame, the Python frame that called into it): where the frames a reply
                # completed inside the handler may be held by end (respond: the zero-copy
                # hand-over); set only while the handler runs.
                request.handler_caller = _getframe()
                self._rr.get(request)  # type: ignore[arg-type]
            elif rtype is _SET:
                if self._properties is not None:
                    # Control limits of a callback server's property, before its callback.
                    self._properties.check_set(request.device, request.property, request.data)  # type: ignore[attr-defined]
                self._rr.set(request)  # type: ignore[arg-type]
            else:
                self._subs.subscribe(request)  # type: ignore[arg-type]
        except Exception as exc:
            self.handler_raised(request, exc)
        finally:
            request.handler_caller = None
        if request.held_reply is not None:
            self._send_held(request)
        self._arm(request, deadline, timeout)

    def run_answered(self, request: ServerRequest) -> None:
        """``run``, and if rda's own code on the way raises (not the handler's: ``run`` answers
        that), the client still gets an answer instead of waiting for its timeout: an error
        naming the failure, counted as the server's fault (``handler_error``), the traceback
        logged (at most one line a second)."""
        try:
            self.run(request)
        except Exception as exc:
            self._log.log(
                "internal errors",
                "%r: the server failed before answering",
                request,
                exc_info=True,
                level=logging.ERROR,
            )
            failure = ServerError(
                f"{request.device}/{request.property}: the server failed before answering "
                f"({type(exc).__name__}: {exc}); its log has the traceback"
            )
            request.settle(None, failure)

    def _send_held(self, request: ServerRequest) -> None:
        """The reply held back while its handler ran: its arrays nobody else can reach now go
        zero-copy, the rest are copied (replies.hand_over), and it leaves now."""
        held = request.held_reply
        request.held_reply = None
        assert held is not None
        copied = hand_over(held)[1]  # ``held`` must stay this frame's one reference
        if not copied and self._clock() < request.deadline:  # else respond counts it
            self._counters.array_reply(zero_copy=True)
        self.respond(request, held, None)

    def _arm(self, request: ServerRequest, deadline: float, timeout: float) -> None:
        if request.done:
            return
        expire = partial(self._expire, request, timeout)
        cancel = self._deadlines.add(deadline, expire)
        if not request.watch_deadline(cancel):
            cancel()

    def _expire(self, request: ServerRequest, timeout: float) -> None:
        request.settle(None, timeout_error(request, timeout, queued=False))

    def handler_raised(self, request: ServerRequest, exc: Exception) -> None:
        """A user callback raised: the client gets the error, counted by its class."""
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
        if not request.settle(None, exc):
            self._log.log("late errors", "%r: handler raised after answering: %r", request, exc)

    def _overload(self, request: ServerRequest) -> None:
        limit = self._scheduler.queue_limit
        request.settle(
            None,
            OverloadError(
                f"{request.device}: server overloaded ({limit} requests already queued for "
                f"this device); {request.header.request_type.name} {request.property} rejected"
            ),
        )

    def run_admin(self, peer: bytes, message: Message, client: ClientInfo, at: float) -> None:
        """An admin command, in the admin group: run, counted, answered."""
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
        # Counted before the answer leaves, as in respond.
        self._counters.record("admin", outcome, self._clock() - at)
        self._send(peer, frames)

    def describe(self, peer: bytes, header: Header, at: float) -> None:
        """A GET with the describe selector (docs/protocol.md, "Describe"): answered from the
        declared metadata at once, on the calling thread (no user code runs), counted as a
        get."""
        try:
            description = (
                self._described.describe(header.device, header.property)
                if self._described is not None
                else None
            )
            if description is None:
                raise NoSuchDeviceError(f"{header.device}: no such device")
            body: list[tuple[BodyKind, Buffer]] = [
                (BodyKind.DATA, binary.encode(description_data(description)))
            ]
            frames = reply_frames(header, RequestType.REPLY, body)
            outcome = "ok"
        except Exception as exc:
            outcome = outcome_of(exc)
            frames = error_frames(header, RequestType.EXCEPTION, exc)
        self._counters.record("get", outcome, self._clock() - at, header.device, header.property)
        self._send(peer, frames)

    def fetch(
        self,
        device: str,
        prop: str,
        selector: str,
        filters: Data | None,
        deliver: Deliver,
        started: Callable[[], None] | None = None,
    ) -> None:
        """A get the server makes itself (a FIRST or IMMEDIATE update, client
        ``SERVER_CLIENT``): run on a worker in the device's group like a client's, with the
        default timeout; ``deliver(result, error)`` gets its answer, nothing is sent;
        ``started()`` is called on the worker right before the get handler runs."""

        def answered(
            _: ServerRequest, result: AcquiredData | None, error: BaseException | None
        ) -> None:
            deliver(result, error)

        header = Header(RequestType.GET, 0, device, prop, selector)
        request = GetRequest(
            Message(header), SERVER_CLIENT, self._clock(), answered, filters=filters
        )

        def task() -> None:
            if started is not None:
                started()
            try:
                self._rr.get(request)
            except Exception as exc:
                self.handler_raised(request, exc)
            self._arm(request, request.received_at + self._default_timeout, self._default_timeout)

        if not self._scheduler.submit(device, task, partial(self._overload, request)):
            self._overload(request)

    # -- answers: any thread ----------------------------------------------------------------

    def respond(
        self, request: ServerRequest, result: AcquiredData | None, error: BaseException | None
    ) -> None:
        """The one answer of ``request`` (its responder: ``settle`` calls it once): counted,
        encoded, sent; then an accepted subscription is registered and a set's IMMEDIATE
        updates start."""
        header = request.message.header
        rtype = header.request_type
        now = self._clock()
        if now >= request.deadline and not isinstance(error, TimeoutError):
            self._late_answer(request, now)
            return
        peer = request.client.peer
        frames: list[Buffer] | None = None
        if error is not None:
            reply_type = _SUBSCRIBE_EXCEPTION if rtype is _SUBSCRIBE else _EXCEPTION
            frames = error_frames(header, reply_type, error)
            outcome = outcome_of(error)
        elif rtype is _GET:
            assert result is not None  # GetRequest.complete guarantees it
            if binary.writable_arrays(result.data):
                # Big writable arrays: copied now, unless completed inside the handler (on the
                # thread running it, below its runner's frame) and held by nothing its return
                # does not end (replies.py).
                caller = request.handler_caller
                if caller is not None and held_only_by_the_handler(
                    result, caller, _HIDDEN, completed_with(request)
                ):
                    request.held_reply = result
                    return
                self._counters.array_reply(zero_copy=False)
            try:
                alarm = None
                if self._properties is not None:
                    encoder = self._properties.encoder(header.device, header.property)
                    if encoder is not None:
                        alarm = encoder(result.data)
                frames = get_reply_frames(header, result, alarm)
            except Exception as exc:
                # A value the codec refuses (e.g. a cycle name over 64 KiB): the client still
                # gets an answer, and the handler's author a counted error.
                self._counters.handler_error()
                self._log.log(
                    "unencodable replies", "%r: reply not encodable", request, exc_info=True
                )
                frames = error_frames(header, _EXCEPTION, exc)
                outcome = "handler_error"
            else:
                outcome = "ok"
        elif rtype is _SET:
            frames = reply_frames(header, RequestType.REPLY)
            outcome = "ok"
        else:
            outcome = "ok"
        # Counted before the answer leaves: a client that has its reply finds it counted (the
        # worker would otherwise race the client's next look at the statistics).
        took = now - request.received_at
        self._counters.record(TYPE_NAMES[rtype], outcome, took, header.device, header.property)
        if frames is not None:
            self._send(peer, frames)
        if error is not None:
            return
        if rtype is _SET:
            if self._updated is not None:
                self._updated(header.device, header.property)
        elif rtype is _SUBSCRIBE:
            self._accepted(request)

    def _late_answer(self, request: ServerRequest, now: float) -> None:
        """A handler answered after the deadline (it ran past it): counted ``timeout`` and
        ``late_completions``, not sent to a client that gave up; one that set no deadline of
        its own (a subscribe) is still waiting and is told TimeoutError."""
        self._counters.late_completion()
        rtype = request.header.request_type
        took = now - request.received_at
        header = request.header
        self._counters.record(TYPE_NAMES[rtype], "timeout", took, header.device, header.property)
        self._log.log("late answers", "%r answered past its deadline: not sent", request)
        if request.message.timeout is None:
            sub = rtype is RequestType.SUBSCRIBE
            reply = RequestType.SUBSCRIBE_EXCEPTION if sub else RequestType.EXCEPTION
            error = timeout_error(request, request.deadline - request.received_at, queued=False)
            self.send_error(request.client.peer, request.header, reply, error)

    def send_error(
        self, peer: bytes, header: Header, reply_type: RequestType, error: BaseException
    ) -> None:
        """Answer the request with ``header`` with ``error`` (an EXCEPTION or a
        SUBSCRIBE_EXCEPTION), from any thread."""
        self._send(peer, error_frames(header, reply_type, error))

    def _send(self, peer: bytes, frames: list[Buffer]) -> None:
        transport = self._transport
        if transport is None or self.stopping:
            return
        try:
            transport.send(peer, frames)
        except Exception:
            self._log.log("unsent replies", "reply to %s not sent", peer.hex(), exc_info=True)


class _ResponderProbe:
    """Called as the requests call :meth:`RequestRunner.respond`, built the same way (both
    compiled or both not), and asking as it asks: what the calls from a handler's
    ``complete()`` to ``respond`` hide of its result and argument (replies.py)."""

    def respond(self, request: ServerRequest, result: object, error: object) -> None:
        references_not_in_frames(result, completed_with(request))


# The references to a get's result and to what its handler passed ``complete`` that the calls
# from the handler to ``respond`` hold where the zero-copy check sees no frame (replies.Hidden).
_HIDDEN = references_a_completion_hides(_ResponderProbe().respond)
