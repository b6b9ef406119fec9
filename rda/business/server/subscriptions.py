"""Subscription sources: who listens to what, and the fan-out of notifications.

A :class:`SubscriptionSource` exists for every (device, property, selector, filters) that has at
least one subscriber; the :class:`SubscriptionRegistry` owns them. ``notify`` encodes the DATA
frame once and hands the transport one ``publish`` per distinct sequence number.

Why "per distinct sequence number" and not strictly one ``publish``: docs/protocol.md makes
``seq`` per subscriber (from 1, +1 per notification sent to that subscriber) and it travels in
the DATA_CONTEXT frame, which ``publish`` shares between targets. Subscribers that joined
together share a seq forever (the usual case: one ``publish`` for all of them); one that joined
later gets its own. The DATA frame, the expensive part, is encoded once either way; the context
frame is one ``struct.pack`` per group.

Locks (never held while calling user code):

- ``SubscriptionSource._send_lock`` is held from seq assignment to the end of the ``publish``
  hand-off, so concurrent ``notify`` calls reach the wire in seq order. It may wait on the
  transport's back-pressure, so nothing else is ever acquired while holding it except
- ``SubscriptionSource._lock``: the subscriber table; held for a few dictionary operations.
- ``SubscriptionRegistry._lock``: the source and peer tables; may take a source's ``_lock``
  inside it, never a ``_send_lock``. So the dispatcher thread (disconnects, unsubscribes) only
  ever waits for short critical sections and can always drain the back-pressure a notifier
  is waiting on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from threading import Lock
from typing import Protocol

from rda.business import driver
from rda.business.common import AcquiredData
from rda.business.server.requests import ClientInfo, SubscriptionRequest, describe_error
from rda.business.server.statistics import SourceSnapshot
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import (
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    encode_context,
    encode_header,
)
from rda.serialization.message import BodyKind, encode_data_body, encode_exception
from rda.transport.api import Buffer, PeerStatistics, ServerTransport
from rda.transport.protocol import encode_tail

__all__ = [
    "AlarmRule",
    "SourceKey",
    "SubscriptionCallback",
    "SubscriptionRegistry",
    "SubscriptionSource",
    "UnsubscribeRequest",
]

log = logging.getLogger("rda.server")

# (device, property, selector, binary-encoded filters or b"")
SourceKey = tuple[str, str, str, bytes]

# Looked up at call time (not bound at import) so that tests can count encodings.
_encode_data = encode_data_body

# Enum members read once: on Python 3.11 each read through the enum class (``BodyKind.X``)
# goes through its ``__getattr__`` hook, ten times a module global's cost, and every
# notification took four.
_DATA_CONTEXT, _REPLY_CONTEXT = BodyKind.DATA_CONTEXT, BodyKind.REPLY_CONTEXT
_NOTIFICATION_DATA, _NOTIFICATION_EXC = RequestType.NOTIFICATION_DATA, RequestType.NOTIFICATION_EXC
_NORMAL = UpdateType.NORMAL

# A value's bodies before the DATA_CONTEXT: DATA and its ARRAYs (then an alarm's
# REPLY_CONTEXT), or one EXCEPTION.
Bodies = list[tuple[BodyKind, Buffer]]


class AlarmRule(Protocol):
    """A property's alarm rule (``rda.business.server.properties.AlarmEncoder``): a protocol
    here so that this module does not import the table, which imports the devices."""

    def __call__(self, data: Data) -> bytes | None: ...

    def error(self) -> None: ...


def _tail(bodies: Bodies, context: bytes) -> list[Buffer]:
    """The notification after its header, encoded once for every subscriber of one seq:
    its DATA (or EXCEPTION) body, the DATA_CONTEXT, then the ARRAY bodies DATA refers to (frames
    of their own, shared by every subscriber)."""
    if len(bodies) == 1:
        return encode_tail((bodies[0], (_DATA_CONTEXT, context)))
    return encode_tail([bodies[0], (_DATA_CONTEXT, context), *bodies[1:]])


def filters_key(filters: Data | None) -> bytes:
    return b"" if filters is None else bytes(binary.encode(filters))


class _Subscriber:
    __slots__ = ("active", "client", "headers", "id", "missed", "peer", "seq")

    def __init__(self, peer: bytes, sub_id: int, client: ClientInfo) -> None:
        self.peer = peer
        self.id = sub_id
        self.client = client
        self.seq = 0
        # Inactive until its FIRST update went out: nothing may overtake the FIRST.
        self.active = False
        # Updates published while inactive, counted from the moment the FIRST's get handler
        # runs (-1: not yet running; what was published before it, the FIRST shows).
        self.missed = -1
        self.headers: dict[tuple[RequestType, UpdateType], bytes] = {}


class SubscriptionSource:
    """All subscribers of one (device, property, selector, filters); see the module docstring.

    ``notify`` and ``notify_error`` may be called from any thread, at any time, also while
    subscribers come and go; on a source whose subscribers are all gone they do nothing.
    """

    def __init__(
        self,
        device: str,
        property: str,
        selector: str,
        filters: Data | None,
        key: SourceKey,
        transport: ServerTransport,
    ) -> None:
        self.device = device
        self.property = property
        self.selector = selector
        self.filters = filters
        self.key = key
        self._transport = transport
        self._lock = Lock()
        self._send_lock = Lock()
        self._subscribers: dict[tuple[bytes, int], _Subscriber] = {}
        self._closed = False
        self.notifications_sent = 0
        self.errors_sent = 0
        self.last_update: float | None = None
        # The property's alarm rule, when it declares alarm limits (set by the registry):
        # values in, the alarm's REPLY_CONTEXT body out (None: not in alarm, nothing sent).
        self.alarm: AlarmRule | None = None

    def __repr__(self) -> str:
        return (
            f"<SubscriptionSource {self.device}/{self.property} selector={self.selector!r} "
            f"subscribers={len(self._subscribers)}>"
        )

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    # -- publishing --------------------------------------------------------------------------

    def notify(
        self, acquired: AcquiredData | Data, update_type: UpdateType = UpdateType.NORMAL
    ) -> None:
        """Send a value to every subscriber (encoded once). NORMAL updates are conflatable.

        A value without an acquisition stamp is stamped with the time of this call."""
        if self._closed or not self._subscribers:
            return
        # Back-pressure before the ordering lock, never under it (ServerTransport.publish).
        self._transport.wait_for_room()
        if isinstance(acquired, Data):
            data, context = acquired, _NO_CONTEXT
        else:
            data, context = acquired.data, acquired.context
        bodies = _encode_data(data)
        alarm = self.alarm
        if alarm is not None:
            frame = alarm(data)
            if frame is not None:
                bodies.append((_REPLY_CONTEXT, frame))
        # common.stamped's rule without two new frozen objects per update (a third of a
        # notification's cost on the server: docs/performance.md, "Stamping a notification on
        # the wire"): the stamp goes straight on the wire.
        stamp = context.acq_stamp or driver.wall_time_ns()
        self._fan_out(_NOTIFICATION_DATA, update_type, bodies, context, stamp)

    def notify_error(
        self, error: BaseException | str, update_type: UpdateType = UpdateType.NORMAL
    ) -> None:
        """Send a NOTIFICATION_EXC to every subscriber (the client sees ``.error`` set)."""
        if self._closed or not self._subscribers:
            return
        self._transport.wait_for_room()
        exc = error if isinstance(error, BaseException) else RuntimeError(error)
        bodies: Bodies = [(BodyKind.EXCEPTION, encode_exception(*describe_error(exc)))]
        if self.alarm is not None:
            self.alarm.error()  # the client makes the INVALID alarm of an error itself
        self._fan_out(
            RequestType.NOTIFICATION_EXC, update_type, bodies, _NO_CONTEXT, driver.wall_time_ns()
        )

    def _fan_out(
        self,
        rtype: RequestType,
        update_type: UpdateType,
        bodies: Bodies,
        context: DataContext,
        acq_stamp: int,
    ) -> None:
        conflatable = update_type is _NORMAL
        key = (rtype, update_type)
        with self._send_lock:
            # Subscribers by the seq they are at (usually one group): each group shares a tail.
            groups: dict[int, list[tuple[bytes, int, Buffer]]] = {}
            sent = 0
            with self._lock:
                for sub in self._subscribers.values():
                    if not sub.active:
                        if sub.missed >= 0:
                            sub.missed += 1
                        continue
                    sent += 1
                    sub.seq = seq = sub.seq + 1
                    header = sub.headers.get(key)
                    if header is None:
                        header = self._header(sub, rtype, update_type)
                    group = groups.get(seq)
                    if group is None:
                        groups[seq] = [(sub.peer, sub.id, header)]
                    else:
                        group.append((sub.peer, sub.id, header))
                if not sent:
                    return
                self._count(rtype, sent)
            for seq, targets in groups.items():
                tail = _tail(bodies, encode_context(context, seq, acq_stamp))
                self._publish(targets, tail, conflatable)

    def first_started(self, peer: bytes, sub_id: int) -> None:
        """The get for this subscriber's FIRST is about to run: from now until the FIRST goes
        out, each update published to the source is counted as missed by it.

        Why from here and not from the subscription's registration: what was published
        before the get handler ran, the FIRST shows (a get reads the current value); what is
        published while it runs or after it completed, the FIRST may not (a handler may read
        first and complete later, from another thread)."""
        with self._lock:
            sub = self._subscribers.get((peer, sub_id))
            if sub is not None and not sub.active:
                sub.missed = 0

    def send_first(
        self, peer: bytes, sub_id: int, acquired: AcquiredData | None, error: BaseException | None
    ) -> bool:
        """The FIRST update of one subscriber (the answer of the server's get for it, or its
        error); activates it: no other update reaches it before this one.

        False when the subscriber left meanwhile (nothing sent)."""
        rtype = RequestType.NOTIFICATION_DATA
        bodies: Bodies = []
        context = _now_context()
        if acquired is not None:
            try:
                bodies = _encode_data(acquired.data)
                encode_context(acquired.context)  # refuses what the wire cannot carry
                context = acquired.context
                if self.alarm is not None:
                    frame = self.alarm(acquired.data)
                    if frame is not None:
                        bodies.append((BodyKind.REPLY_CONTEXT, frame))
            except Exception as encode_error:
                # The subscriber must get its FIRST in any case, or it would wait forever.
                error, acquired = encode_error, None
        if acquired is None:
            failure = error if error is not None else RuntimeError("no first update")
            rtype = RequestType.NOTIFICATION_EXC
            bodies = [(BodyKind.EXCEPTION, encode_exception(*describe_error(failure)))]
        self._transport.wait_for_room()
        with self._send_lock:
            with self._lock:
                sub = self._subscribers.get((peer, sub_id))
                if sub is None or sub.active or self._closed:
                    return False
                sub.seq += 1
                seq = sub.seq
                # What was published while its get ran is missed: the next update's seq
                # skips it, so the client counts it as a gap (never a silent loss).
                sub.seq += max(sub.missed, 0)
                sub.active = True
                target = (sub.peer, sub.id, self._header(sub, rtype, UpdateType.FIRST))
                self._count(rtype, 1)
            tail = _tail(bodies, encode_context(context, seq))
            self._publish([target], tail, False)
        return True

    def _header(self, sub: _Subscriber, rtype: RequestType, update_type: UpdateType) -> bytes:
        # Per subscriber only because the id differs; cached, a header rarely changes.
        frame = sub.headers.get((rtype, update_type))
        if frame is None:
            flags = (
                HeaderFlags.CONFLATABLE if update_type is UpdateType.NORMAL else HeaderFlags.NONE
            )
            frame = encode_header(
                Header(rtype, sub.id, self.device, self.property, self.selector, update_type, flags)
            )
            sub.headers[(rtype, update_type)] = frame
        return frame

    def _count(self, rtype: RequestType, sent: int) -> None:
        # Caller holds self._lock.
        self.notifications_sent += sent
        if rtype is _NOTIFICATION_EXC:
            self.errors_sent += sent
        self.last_update = driver.wall_time()

    def _publish(
        self, targets: Sequence[tuple[bytes, int, Buffer]], tail: Sequence[Buffer], conflate: bool
    ) -> None:
        try:
            self._transport.publish(targets, tail, conflate)
        except Exception:
            # A closed transport at shutdown, typically; the notifier must not crash for it.
            log.warning("%r: publish to %d subscriber(s) failed", self, len(targets), exc_info=True)

    # -- membership (the registry's: it keeps the source and peer tables in step) ------------

    def add_subscriber(self, peer: bytes, sub_id: int, client: ClientInfo) -> None:
        """A new subscriber, inactive until its FIRST update (``send_first``)."""
        with self._lock:
            self._subscribers[(peer, sub_id)] = _Subscriber(peer, sub_id, client)

    def remove_subscriber(self, peer: bytes, sub_id: int) -> bool:
        """Drop one subscriber; True when the source is now empty."""
        with self._lock:
            self._subscribers.pop((peer, sub_id), None)
            return not self._subscribers

    def close(self) -> None:
        """The server stops: every subscriber is forgotten and later updates do nothing."""
        with self._lock:
            self._closed = True
            self._subscribers.clear()

    def snapshot(self, peers: Mapping[bytes, PeerStatistics] | None = None) -> SourceSnapshot:
        """The source's counters; with the transport's ``peer_statistics()``, also what its
        subscribers lost to conflation and full queues (keyed by subscription id)."""
        conflated = dropped = 0
        with self._lock:
            if peers:
                for peer, sub_id in self._subscribers:
                    stats = peers.get(peer)
                    if stats is not None:
                        conflated += stats.conflated_by_key.get(sub_id, 0)
                        dropped += stats.dropped_by_key.get(sub_id, 0)
            return SourceSnapshot(
                device=self.device,
                property=self.property,
                selector=self.selector,
                filters=None if self.filters is None else dict(self.filters.to_dict()),
                subscribers=len(self._subscribers),
                notifications_sent=self.notifications_sent,
                errors_sent=self.errors_sent,
                last_update=self.last_update,
                conflated=conflated,
                dropped=dropped,
            )


_NO_CONTEXT = DataContext()


def _now_context() -> DataContext:
    return DataContext(acq_stamp=driver.wall_time_ns())


class SubscriptionRegistry:
    """Sources by key, subscriptions by peer, and which peers are alive.

    A peer is registered alive when it connects and marked gone on disconnect; ``add`` refuses
    subscribers of a gone peer, and an UNSUBSCRIBE that overtook its SUBSCRIBE (the subscribe
    still queued) is remembered so the late ``add`` is refused too: no subscriber can leak.
    """

    def __init__(
        self,
        transport: ServerTransport,
        alarms: Callable[[str, str], AlarmRule | None] | None = None,
    ) -> None:
        self._transport = transport
        # (device, property) -> the property's alarm rule (None: no alarm limits declared).
        self._alarms = alarms
        self._lock = Lock()
        self._sources: dict[SourceKey, SubscriptionSource] = {}
        self._by_peer: dict[bytes, dict[int, SubscriptionSource]] = {}
        self._cancelled: dict[bytes, set[int]] = {}
        self._removed_sent = 0
        self._closed = False

    def peer_connected(self, peer: bytes) -> None:
        with self._lock:
            if not self._closed:
                self._by_peer.setdefault(peer, {})

    def add(
        self,
        peer: bytes,
        sub_id: int,
        client: ClientInfo,
        device: str,
        property: str,
        selector: str,
        filters: Data | None,
    ) -> tuple[SubscriptionSource, bool] | None:
        """Register a subscriber (inactive until its FIRST); returns (source, created) or
        None when the peer is gone or already cancelled this subscription."""
        key: SourceKey = (device, property, selector, filters_key(filters))
        with self._lock:
            subs = self._by_peer.get(peer)
            if subs is None or self._closed:
                return None
            cancelled = self._cancelled.get(peer)
            if cancelled is not None and sub_id in cancelled:
                cancelled.discard(sub_id)
                return None
            old = subs.get(sub_id)
            if old is not None:
                # A client re-using a live subscription id replaces the old subscription.
                self._detach(old, peer, sub_id)
            source = self._sources.get(key)
            created = source is None
            if source is None:
                source = SubscriptionSource(
                    device, property, selector, filters, key, self._transport
                )
                if self._alarms is not None:
                    source.alarm = self._alarms(device, property)
                self._sources[key] = source
            source.add_subscriber(peer, sub_id, client)
            subs[sub_id] = source
            return source, created

    def remove(self, peer: bytes, sub_id: int) -> tuple[SubscriptionSource, bool] | None:
        """End one subscription: (source, source now empty) or None if it was not (yet)
        registered, in which case a later ``add`` of it is refused."""
        with self._lock:
            subs = self._by_peer.get(peer)
            if subs is None:
                return None
            source = subs.pop(sub_id, None)
            if source is None:
                self._cancelled.setdefault(peer, set()).add(sub_id)
                return None
            return source, self._detach(source, peer, sub_id)

    def remove_peer(self, peer: bytes) -> list[tuple[int, SubscriptionSource, bool]]:
        """Forget a departed peer: ``(subscription id, source, source now empty)`` for each of
        its subscriptions, in the order they were made. Under the lock, so a subscription is
        ended here or by ``remove``, never by both."""
        with self._lock:
            subs = self._by_peer.pop(peer, None)
            self._cancelled.pop(peer, None)
            if not subs:
                return []
            return [(sub_id, s, self._detach(s, peer, sub_id)) for sub_id, s in subs.items()]

    def _detach(self, source: SubscriptionSource, peer: bytes, sub_id: int) -> bool:
        # Caller holds self._lock.
        if not source.remove_subscriber(peer, sub_id):
            return False
        if self._sources.get(source.key) is source:
            del self._sources[source.key]
            self._removed_sent += source.notifications_sent
            return True
        return False

    def sources(self) -> list[SubscriptionSource]:
        with self._lock:
            return list(self._sources.values())

    def find(self, device: str, property: str) -> list[SubscriptionSource]:
        """Every source of (device, property), whatever its selector and filters."""
        with self._lock:
            return [
                s for s in self._sources.values() if s.device == device and s.property == property
            ]

    def subscriptions_of(self, peer: bytes) -> int:
        with self._lock:
            return len(self._by_peer.get(peer, ()))

    def counts(self) -> tuple[int, int, int]:
        """(subscriptions, sources, notifications sent since start)."""
        with self._lock:
            subscriptions = sum(len(s) for s in self._by_peer.values())
            sent = self._removed_sent + sum(s.notifications_sent for s in self._sources.values())
            return subscriptions, len(self._sources), sent

    def close(self) -> list[SubscriptionSource]:
        """Stop: every source goes quiet; returns them (for ``source_removed``)."""
        with self._lock:
            self._closed = True
            sources = list(self._sources.values())
            self._sources.clear()
            self._by_peer.clear()
            self._cancelled.clear()
        for source in sources:
            source.close()
        return sources


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    """Given to ``SubscriptionCallback.unsubscribe`` when a subscription ends (an UNSUBSCRIBE,
    or its client departed: ``id`` is the subscription's id either way)."""

    device: str
    property: str
    selector: str
    filters: Data | None
    client: ClientInfo
    id: int
    source: SubscriptionSource | None = None


class SubscriptionCallback:
    """Decide on subscriptions and hear about sources; the default accepts everything."""

    def subscribe(self, request: SubscriptionRequest) -> None:
        request.accept()

    def unsubscribe(self, request: UnsubscribeRequest) -> None:
        """Called once for each ended subscription: the client unsubscribed, closed, was
        disconnected or timed out (heartbeat); before ``source_removed`` of its source."""

    def source_added(self, source: SubscriptionSource) -> None:
        """The first subscriber of (device, property, selector, filters) arrived."""

    def source_removed(self, source: SubscriptionSource) -> None:
        """The last subscriber of a source left (unsubscribed or disconnected)."""
