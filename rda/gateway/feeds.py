"""One rda subscription per (device, property, selector), shared by every PV built on it.

The first PV of a feed that gets a pvAccess client opens the rda subscription (its ``FIRST``
update becomes the PVs' first value); the last PV to lose its clients ends it. Every PV of
the property (the structure PV and its field PVs, for one selector) reads the same
subscription, so any number of EPICS clients on any number of those PVs cost the rda server
one subscriber.

Each notification is turned once into an :class:`Update` (value, stamps, alarm, gap count)
on the subscription's listener thread, and handed to each attached view in turn; a view
attached to a running feed gets the latest update at once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification, Subscription
from rda.gateway import metadata
from rda.serialization.data import Data
from rda.serialization.errors import RdaError
from rda.serialization.header import DataContext

__all__ = ["Feed", "FeedTable", "Update", "View"]

log = logging.getLogger("rda.gateway")


@dataclass(frozen=True, slots=True)
class Update:
    """One rda notification as every PV of its feed shows it."""

    data: Data | None  # the value; on an error the last value (None before any)
    context: DataContext
    alarm: metadata.AlarmState
    gaps: int  # updates missed since the feed opened (rda's counted gaps), never reset
    description: metadata.Description
    failed: bool = False  # an error or a lost connection: ``alarm`` says which


class View(Protocol):
    """A PV that shows a feed's updates."""

    def show(self, update: Update) -> None: ...


class Feed:
    """One rda subscription fanned out to the views (PVs) attached to it."""

    def __init__(self, client: ClientService, key: tuple[str, str, str]) -> None:
        self.key = key
        self._client = client
        self._lock = threading.Lock()
        # Held while updates are shown, so a view attached meanwhile gets the latest update
        # before any later one, never after it.
        self._show_lock = threading.Lock()
        self._views: list[View] = []
        self._last: Update | None = None
        self._gaps = 0
        self.updates = 0
        self._description: metadata.Description = None
        self._described = False
        device, prop, selector = key
        self._sub: Subscription = client.access_point(device, prop).subscribe(
            selector=selector or None, listener=self._deliver
        )

    def _deliver(self, n: Notification) -> None:
        # The subscription's listener thread: one call at a time, in order.
        if not self._described and n.error is None:
            # Once, on the first value: the description is the server's, so ask after it
            # answered (a failure leaves the PVs without limits and units, and is retried
            # with the next feed of this property).
            self._described = True
            try:
                self._description = metadata.describe(self._client, self.key[0], self.key[1])
            except RdaError as exc:
                log.info("%s/%s: no description (%s)", self.key[0], self.key[1], exc)
        data: Data | None = None
        alarm = metadata.notification_alarm(n)
        if n.error is None:
            try:
                data = n.data
            except RdaError as exc:  # an undecodable value is shown as that error
                alarm = metadata.error_alarm(exc)
        with self._lock:
            self._gaps += n.gap
            self.updates += 1
            if data is None:
                # Keep showing the last value, now INVALID (docs/gateway.md).
                last = None if self._last is None else self._last.data
                update = Update(last, n.context, alarm, self._gaps, self._description, True)
            else:
                update = Update(data, n.context, alarm, self._gaps, self._description)
            self._last = update
            views = list(self._views)
        with self._show_lock:
            for view in views:
                _show(view, update, self.key)

    def attach(self, view: View) -> None:
        with self._show_lock:
            with self._lock:
                self._views.append(view)
                last = self._last
            if last is not None:
                _show(view, last, self.key)

    def detach(self, view: View) -> bool:
        """Detach ``view``; True when no view is left (the caller closes the feed)."""
        with self._lock:
            if view in self._views:
                self._views.remove(view)
            return not self._views

    @property
    def gaps(self) -> int:
        return self._gaps

    def close(self) -> None:
        self._sub.close()


def _show(view: View, update: Update, key: tuple[str, str, str]) -> None:
    try:
        view.show(update)
    except Exception:  # one PV's failure must not starve the others
        log.exception("gateway: PV update failed for %s", key)


class FeedTable:
    """The open feeds by key; a feed lives while a view is attached to it."""

    def __init__(self, client: ClientService) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._feeds: dict[tuple[str, str, str], Feed] = {}
        self.opened = 0
        self._closed = False

    def attach(self, key: tuple[str, str, str], view: View) -> Feed | None:
        """Attach ``view`` to the feed of ``key``, opening the rda subscription if it is the
        first; None once the table is closed."""
        with self._lock:
            if self._closed:
                return None
            feed = self._feeds.get(key)
            if feed is None:
                feed = Feed(self._client, key)
                self._feeds[key] = feed
                self.opened += 1
        feed.attach(view)
        return feed

    def detach(self, key: tuple[str, str, str], view: View) -> None:
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None or not feed.detach(view):
                return
            del self._feeds[key]
        feed.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._feeds)

    def gaps(self) -> int:
        with self._lock:
            return sum(f.gaps for f in self._feeds.values())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            feed.close()
