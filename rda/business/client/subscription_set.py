"""The client's subscription set: which subscription an arriving notification belongs to,
the SUBSCRIBE and UNSUBSCRIBE requests, and the scheduler that runs listeners.

:class:`Subscriptions` is held by a ``ClientService``. It keeps the live subscriptions by id
(the id a notification carries) and routes each NOTIFICATION_* and SUBSCRIBE_EXCEPTION to its
``Subscription`` (subscriptions.py), on the dispatcher thread; a notification for an id it does
not know (a subscription closed meanwhile) is counted as late by the request table. Which
endpoint a subscription is on, and when its SUBSCRIBE is (re)sent, is decided by the
connections (connections.py: on subscribe, on every CONNECT_ACK, when a device moves); the frames
go out from here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rda.business.client.access import build_request_context
from rda.business.client.requests import RequestTable
from rda.business.client.statistics import ClientCounters
from rda.business.client.subscriptions import BackfillHook, Notification, Subscription
from rda.business.scheduler import GroupTaskScheduler
from rda.serialization.data import Data
from rda.serialization.errors import OverloadError, TimeoutError
from rda.serialization.header import RequestType
from rda.serialization.message import BodyKind, Message
from rda.transport.api import ClientTransport
from rda.transport.protocol import Kind, encode_routed

__all__ = ["Subscriptions"]

# SUBSCRIBE_EXCEPTION errors that say "not now" rather than "no": the device's queue was full
# (OverloadError), the server answered past its deadline (TimeoutError, after a pause).
_PASSING = (OverloadError, TimeoutError)

# Read once (an enum member read through its class is a ``__getattr__`` hook call on
# Python 3.11): ``route`` compares every notification's request type with it.
_SUBSCRIBE_EXCEPTION = RequestType.SUBSCRIBE_EXCEPTION


class Subscriptions:
    """The live subscriptions of a client service (see the module docstring).

    ``detach(sub)`` takes a closed subscription off its endpoint and returns the live
    connection its SUBSCRIBE went on (``Connections.detach``); ``retry(sub, conn)`` sends a
    SUBSCRIBE the server turned away for a while again later
    (``Connections.resubscribe_later``); ``workers`` and ``queue_limit`` size the listener
    scheduler, made on first use.
    """

    def __init__(
        self,
        transport: ClientTransport,
        requests: RequestTable,
        counters: ClientCounters,
        detach: Callable[[Subscription], int | None],
        workers: int,
        queue_limit: int,
        retry: Callable[[Subscription, int], None] | None = None,
    ) -> None:
        self._transport = transport
        self._requests = requests
        self._counters = counters
        self._detach = detach
        self._retry = retry
        self._workers = workers
        self._queue_limit = queue_limit
        # Guards the table's changes and the scheduler's creation; ``route`` reads the table
        # without it (one dict lookup per notification).
        self._lock = threading.Lock()
        self._subs: dict[int, Subscription] = {}
        self._scheduler: GroupTaskScheduler | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._subs)

    def live(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs.values())

    @property
    def scheduler(self) -> GroupTaskScheduler | None:
        """The listener scheduler, once a listener (or a backfill) needed it."""
        return self._scheduler

    def new(
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
        """A subscription with a fresh id (from the request-id counter), in the set."""
        sub = Subscription(
            self._requests.new_id(), endpoint, device, prop, selector, filters, listener,
            queue_size, self._counters, self.submit, self.unsubscribe, backfill,
        )  # fmt: skip
        with self._lock:
            self._subs[sub.id] = sub
        return sub

    def discard(self, sub: Subscription) -> bool:
        """Take ``sub`` out of the set; False if it was not there."""
        with self._lock:
            return self._subs.pop(sub.id, None) is not None

    def route(self, message: Message, staged: list[Subscription] | None, connection: int) -> None:
        """A NOTIFICATION_* or SUBSCRIBE_EXCEPTION arrived on ``connection`` (dispatcher
        thread): hand it to its subscription; ``staged`` collects the subscriptions to flush
        after a batch. One from another connection than the subscription's (its old server,
        before it read the UNSUBSCRIBE of a move) is dropped and counted as late: taking it
        would interleave two servers' sequences and count false gaps."""
        sub = self._subs.get(message.header.id)
        if sub is None or sub.connection != connection:
            self._requests.count_late()
            return
        if message.header.request_type is _SUBSCRIBE_EXCEPTION:
            retry = self._retry
            if retry is not None:
                error = Notification.from_message(message, sub.device, sub.property, 0, 0).error
                if isinstance(error, _PASSING):
                    # Not a refusal but a server too busy to take it now: the user hears of
                    # it once (as of a lost connection), the SUBSCRIBE goes again later.
                    if staged is not None:
                        sub.flush()  # what came before it is delivered before it
                    sub.deliver_error(error)
                    retry(sub, connection)
                    return
            self._forget(sub)  # rejected by the server: nothing to unsubscribe
        sub.deliver_message(message, staged)

    def send_subscribe(self, sub: Subscription, conn: int) -> None:
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

    def unsubscribe(self, sub: Subscription) -> None:
        """``sub`` was closed by its user: leave the set, and tell the server if its
        SUBSCRIBE went on a connection that is still up."""
        if self._closed:
            return
        conn = self._forget(sub)
        if conn is not None:
            self.send_unsubscribe(sub, conn)

    def send_unsubscribe(self, sub: Subscription, conn: int) -> None:
        """End ``sub`` on the server at ``conn`` (closed by its user, or moved elsewhere)."""
        frames = encode_routed(
            Kind.REQUEST, RequestType.UNSUBSCRIBE, sub.id, sub.device, sub.property, sub.selector
        )
        self._transport.send(conn, frames)

    def submit(
        self, group: str, task: Callable[[], None], on_drop: Callable[[], None] | None
    ) -> bool:
        """Run ``task`` on the listener scheduler in ``group`` (made on first use); False once
        the client is closing."""
        scheduler = self._scheduler
        if scheduler is None:
            with self._lock:
                if self._closed:
                    return False
                if self._scheduler is None:
                    self._scheduler = GroupTaskScheduler(
                        workers=self._workers,
                        queue_limit=self._queue_limit,
                        policy="drop_oldest",
                        name="rda-client-listener",
                    )
                scheduler = self._scheduler
        return scheduler.submit(group, task, on_drop)

    def close(self) -> GroupTaskScheduler | None:
        """End every subscription at once (the client closes); returns the listener scheduler
        for the caller to close. Idempotent."""
        with self._lock:
            self._closed = True
            subs = list(self._subs.values())
            self._subs.clear()
            scheduler = self._scheduler
        for sub in subs:
            sub.terminate()
        return scheduler

    def _forget(self, sub: Subscription) -> int | None:
        """Drop ``sub`` from the set and its endpoint; the live connection its SUBSCRIBE went
        on, if it was still in the set."""
        found = self.discard(sub)
        conn = self._detach(sub)
        return conn if found else None
