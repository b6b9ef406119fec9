"""A subscription's life on the server: accepted, first update, updates after sets, ended.

:class:`SubscriptionLifecycle` turns what happens to subscriptions into registry changes and
user notifications, in this order:

- accepted (``SubscriptionRequest.accept``, reported by the request runner): the subscriber
  is registered (``SubscriptionRegistry.add``; ``source_added`` when its source is new), then
  the server gets the value (``RequestRunner.fetch``) and sends it as this subscriber's FIRST
  update (``SubscriptionSource.send_first``; an error notification if the get failed), which
  activates it; what is published to it from the moment that get's handler runs until its
  FIRST goes out is counted as missed (``SubscriptionSource.first_started``);
- a set succeeded (with IMMEDIATE updates on): one get per source of the property, each sent
  to its subscribers as an IMMEDIATE update;
- ended, by an UNSUBSCRIBE or because its client departed (disconnect, heartbeat timeout,
  close): ``unsubscribe`` for each subscription, then ``source_removed`` for each source left
  without subscribers, in the device's group, in this order.

The user callbacks (``SubscriptionCallback``) run on workers in the device's group; one that
raises is counted in ``handler_errors`` and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from rda.business.common import AcquiredData
from rda.business.scheduler import GroupTaskScheduler
from rda.business.server.requests import ClientInfo, ServerRequest
from rda.business.server.statistics import RequestCounters
from rda.business.server.subscriptions import (
    SubscriptionCallback,
    SubscriptionRegistry,
    SubscriptionSource,
    UnsubscribeRequest,
)
from rda.serialization.data import Data
from rda.serialization.header import UpdateType
from rda.transport.ratelog import RateLimitedLog

__all__ = ["Fetch", "SubscriptionLifecycle"]

log = logging.getLogger("rda.server")

# (device, property, selector, filters, deliver, started): a get the server makes itself,
# whose answer goes to deliver(result, error); started() is called just before the get
# handler runs, or never (RequestRunner.fetch).
Fetch = Callable[
    [
        str,
        str,
        str,
        Data | None,
        Callable[[AcquiredData | None, BaseException | None], None],
        Callable[[], None] | None,
    ],
    None,
]


class SubscriptionLifecycle:
    """See the module docstring; one per started server. Until :meth:`attach` gave it the
    registry, there are no subscriptions and every event is ignored."""

    def __init__(
        self,
        *,
        scheduler: GroupTaskScheduler,
        counters: RequestCounters,
        subscription: SubscriptionCallback,
        clock: Callable[[], float],
    ) -> None:
        self._scheduler = scheduler
        self._counters = counters
        self._subs = subscription
        self._registry: SubscriptionRegistry | None = None
        self._fetch: Fetch | None = None
        self._log = RateLimitedLog(log, clock=clock)

    def attach(self, registry: SubscriptionRegistry, fetch: Fetch) -> None:
        """The registry (it needs the transport, which needs the dispatcher first) and how
        the server gets a value for a FIRST or IMMEDIATE update."""
        self._registry = registry
        self._fetch = fetch

    # -- peers: the dispatcher thread -------------------------------------------------------

    def peer_connected(self, peer: bytes) -> None:
        if self._registry is not None:
            self._registry.peer_connected(peer)

    def peer_departed(self, peer: bytes, client: ClientInfo) -> None:
        """A departed client ends each of its subscriptions as an UNSUBSCRIBE would: a
        server keeping per-subscriber state hears of every one (issue 12)."""
        registry = self._registry
        if registry is None:
            return
        for sub_id, source, emptied in registry.remove_peer(peer):
            self._ended(source, sub_id, client, emptied)

    def unsubscribe(self, peer: bytes, sub_id: int, client: ClientInfo) -> None:
        """An UNSUBSCRIBE (one that overtook its queued SUBSCRIBE makes that one refused)."""
        registry = self._registry
        if registry is None:
            return
        removed = registry.remove(peer, sub_id)
        if removed is None:
            return
        source, emptied = removed
        self._ended(source, sub_id, client, emptied)

    # -- requests: whichever thread answered ------------------------------------------------

    def accepted(self, request: ServerRequest) -> None:
        """A subscribe was accepted in time: register it, then its FIRST update."""
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

        # From the moment the get handler runs, what is published to this subscriber before
        # its FIRST goes out is counted as missed: the FIRST may not show it.
        self._produce(source, first, partial(source.first_started, peer, sub_id))

    def updated(self, device: str, prop: str) -> None:
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
        started: Callable[[], None] | None = None,
    ) -> None:
        fetch = self._fetch
        if fetch is not None:
            fetch(source.device, source.property, source.selector, source.filters, deliver, started)

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
