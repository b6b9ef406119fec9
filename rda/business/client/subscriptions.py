"""Client subscriptions: notifications, the bounded queue behind ``poll``, gap counting.

Notifications arrive on the transport's dispatcher thread. There the subscription does only
constant-time work: it reads the 8-byte sequence number at the start of the DATA_CONTEXT frame
(docs/protocol.md, "Application messages"), computes the gap, and hands the *undecoded*
message on: into the bounded queue read by ``poll``/iteration, or to the client scheduler
(group = subscription id, so one subscription's listener calls run in order and never on the
dispatcher). The body is decoded on first access of ``Notification.data``, in the consumer's
thread.

``Notification.gap`` counts the updates missed before this one: those the server's sequence
numbers say were never received (conflated towards a slow client, or lost), plus those this
client discarded because the queue was full (drop oldest). A ``FIRST`` update restarts the
sequence (the server numbers each subscription from 1 again after a re-subscribe), so it
never reports a gap.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from rda.business.client.statistics import ClientCounters
from rda.business.metadata import NO_ALARM, Alarm, Severity
from rda.serialization.data import Data
from rda.serialization.errors import (
    LocalProtocolError,
    RdaError,
    RemoteDecodeError,
    RemoteProtocolError,
    error_from_remote,
)
from rda.serialization.header import DataContext, RequestType, UpdateType
from rda.serialization.message import Message

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["HistoryChunk", "Notification", "Subscription", "alarm_of", "remote_error"]

log = logging.getLogger(__name__)

_UNSET: Any = object()

# Enum members read once: on Python 3.11 each read through the enum class (``UpdateType.X``)
# goes through its ``__getattr__`` hook, ten times a module global's cost, and every
# notification took three on the dispatcher (and one more for ``.data``).
_FIRST, _NOTIFICATION_DATA = UpdateType.FIRST, RequestType.NOTIFICATION_DATA
_SUBSCRIBE_EXCEPTION = RequestType.SUBSCRIBE_EXCEPTION

# What the queue and the scheduler carry: the undecoded message (or a locally made error), the
# gap the server's sequence numbers show, and the sequence number.
Payload = Message | RdaError  # or a Notification made locally (HISTORY, see history.py)
Entry = tuple[Any, int, int]
Submit = Callable[[str, Callable[[], None], Callable[[], None] | None], bool]


class BackfillHook(Protocol):
    """What a subscription made with ``backfill`` consults (``history.Backfill``)."""

    def attach(self, sub: Subscription, queue_size: int) -> None: ...

    def take(self, entry: Entry) -> bool: ...


def remote_error(device: str, prop: str, type_name: str, message: str) -> RdaError:
    """An EXCEPTION frame's error, its message naming the access point if the server's did not."""
    if device and device not in message:
        message = f"{device}/{prop}: {message}"
    return error_from_remote(type_name, message)


_SEVERITIES = {int(s): s for s in Severity}


def alarm_of(message: Message) -> Alarm:
    """The alarm a REPLY or notification carries (docs/protocol.md, "Alarms"): NONE when the
    server sent none; a severity this side does not know counts as INVALID; a malformed alarm
    body is INVALID too, naming the problem (the value itself may still be good)."""
    try:
        severity, text, field = message.alarm
    except RemoteDecodeError as bad:
        return Alarm(Severity.INVALID, f"malformed alarm: {bad}")
    if not severity:
        return NO_ALARM
    return Alarm(_SEVERITIES.get(severity, Severity.INVALID), text, field)


def _error_of(message: Message, device: str, prop: str) -> RdaError:
    """The error an error notification carries; never raises (a listener reads ``n.error``
    to learn whether the update failed, and a malformed error body is a failed update)."""
    try:
        exc = message.exception
    except RemoteDecodeError as bad:
        return RemoteDecodeError(f"{device}/{prop}: malformed error notification: {bad}")
    if exc is None:
        return RemoteProtocolError(
            f"{device}/{prop}: {message.header.request_type.name} without an EXCEPTION frame"
        )
    return remote_error(device, prop, exc[0], exc[1])


class Notification:
    """One update of a subscription. Immutable; ``.data`` is decoded on first access.

    ``.error`` is None for a value; otherwise the update carries no value and reading ``.data``
    raises that error. ``.gap`` is the number of updates missed just before this one, ``.seq``
    the server's sequence number (0 for locally made notifications such as a disconnection).
    """

    __slots__ = ("_context", "_data", "_error", "_message", "_name", "gap", "seq", "update_type")

    _message: Message | None
    _name: tuple[str, str]
    _data: Any
    _error: Any
    _context: Any
    gap: int
    seq: int
    update_type: UpdateType

    def __init__(
        self,
        data: Data | None = None,
        context: DataContext | None = None,
        update_type: UpdateType = UpdateType.NORMAL,
        error: RdaError | None = None,
        gap: int = 0,
        seq: int = 0,
    ) -> None:
        init = object.__setattr__
        init(self, "_message", None)
        init(self, "_name", ("", ""))
        init(self, "_data", data)
        init(self, "_context", context if context is not None else DataContext())
        init(self, "_error", error)
        init(self, "update_type", update_type)
        init(self, "gap", gap)
        init(self, "seq", seq)

    @classmethod
    def from_message(
        cls, message: Message, device: str, prop: str, gap: int, seq: int
    ) -> Notification:
        """A notification over an undecoded NOTIFICATION_* or SUBSCRIBE_EXCEPTION message."""
        return _from_message(message, (device, prop), gap, seq)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Notification is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Notification is immutable (cannot delete {name!r})")

    @property
    def error(self) -> RdaError | None:
        error = self._error
        if error is _UNSET:
            message = self._message
            assert message is not None
            error = None
            if message.header.request_type is not _NOTIFICATION_DATA:
                error = _error_of(message, *self._name)
            object.__setattr__(self, "_error", error)
        return error  # type: ignore[no-any-return]

    @property
    def alarm(self) -> Alarm:
        """The value's alarm state: what the server computed from the property's alarm
        limits (``Alarm.NONE`` when it sent none: in no alarm, no limits declared, or an older
        server); INVALID with the error's text for an error or a disconnection."""
        error = self.error
        if error is not None:
            return Alarm(Severity.INVALID, str(error))
        message = self._message
        return NO_ALARM if message is None else alarm_of(message)

    @property
    def data(self) -> Data:
        """The value; raises ``.error`` if this notification reports one."""
        error = self.error
        if error is not None:
            raise error
        data = self._data
        if data is _UNSET:
            message = self._message
            assert message is not None
            data = message.data
            if data is None:
                device, prop = self._name
                raise RemoteProtocolError(f"{device}/{prop}: notification without a DATA frame")
            object.__setattr__(self, "_data", data)
        if data is None:
            raise LocalProtocolError("notification carries no data")
        return data  # type: ignore[no-any-return]

    @property
    def context(self) -> DataContext:
        context = self._context
        if context is _UNSET:
            message = self._message
            assert message is not None
            context = message.context
            object.__setattr__(self, "_context", context)
        return context  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        what = f"error={self.error!r}" if self.error is not None else "data=..."
        return (
            f"Notification({what}, update_type={self.update_type.name}, gap={self.gap}, "
            f"seq={self.seq})"
        )


class HistoryChunk(Notification):
    """Rows of the past as one ``pyarrow.Table``: what ``subscribe(backfill=...,
    backfill_columnar=True)`` delivers instead of a HISTORY notification per row
    (docs/client.md, "Backfill").

    ``.table`` has the columns of ``ClientService.history_table`` (``time``, the meta
    columns, one column per value field), its rows in acquisition-stamp order, following the
    rows of the chunk before it; ``.rows`` is their count. ``update_type`` is HISTORY and
    ``.context`` that of the last row. ``.data`` raises ``TypeError``: a chunk is many values,
    not one (a recorded error row is a row whose ``error`` column is set, not ``.error``).
    """

    __slots__ = ("table",)

    table: pa.Table

    def __init__(self, table: pa.Table) -> None:
        context = DataContext()
        if table.num_rows:
            last = table.num_rows - 1
            context = DataContext(
                table.column("cycle_name")[last].as_py() or "",
                table.column("cycle_stamp")[last].as_py() or 0,
                table.column("time")[last].value,
                table.column("selector")[last].as_py() or "",
            )
        super().__init__(None, context, UpdateType.HISTORY)
        object.__setattr__(self, "table", table)

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    @property
    def data(self) -> Data:
        raise TypeError(
            f"a HistoryChunk holds {self.rows} rows in .table (a pyarrow.Table), not one Data"
        )

    def __repr__(self) -> str:
        return f"HistoryChunk(rows={self.rows}, update_type=HISTORY)"


# Notification.from_message runs once per notification a consumer reads: the slots are set
# through their descriptors, what object.__setattr__ finds after a lookup in the type
# (docs/performance.md, "The client's request path").
_new_notification = object.__new__
_set_message, _set_name, _set_data, _set_context, _set_error, _set_update, _set_gap, _set_seq = (
    vars(Notification)[slot].__set__
    for slot in ("_message", "_name", "_data", "_context", "_error", "update_type", "gap", "seq")
)


def _from_message(message: Message, name: tuple[str, str], gap: int, seq: int) -> Notification:
    self: Notification = _new_notification(Notification)
    _set_message(self, message)
    _set_name(self, name)
    _set_data(self, _UNSET)
    _set_context(self, _UNSET)
    _set_error(self, _UNSET)
    _set_update(self, message.header.update_type)
    _set_gap(self, gap)
    _set_seq(self, seq)
    return self


def _plain(entry: Entry) -> bool:
    """A value or a published error, not a FIRST nor a locally reported error (an outage)."""
    payload = entry[0]
    if isinstance(payload, Message):
        return payload.header.update_type is not _FIRST
    if isinstance(payload, HistoryChunk):
        # Many rows: dropped, they would count as one missed update. Kept like a marker.
        return False
    if isinstance(payload, Notification):
        return payload.error is None and payload.update_type is not _FIRST
    return False


class _Inbox:
    """The bounded queue behind ``poll``: drop-oldest on overflow, the drops carried as a gap."""

    def __init__(self, capacity: int, counters: ClientCounters) -> None:
        self.capacity = capacity
        self._counters = counters
        self._lock = threading.Lock()
        # Made by the first poll that waits: a Condition is ~1 KiB (its __dict__ of bound
        # lock methods), more than the rest of a subscription, and iterator-less consumers
        # (listeners, poll_nowait, rda.aio) never wait.
        self._cond: threading.Condition | None = None
        self._waiting = 0  # threads blocked in get(): put notifies only when someone waits
        self._items: deque[Entry] = deque()
        self._carry = 0  # updates dropped since the last one handed out
        # Newcomers dropped because only FIRSTs and errors were queued (``_overflow``):
        # counted on the next entry queued.
        self._tail_carry = 0
        self._room: threading.Condition | None = None  # made by the first put_wait that waits
        self._closed = False
        self.waker: Callable[[], None] | None = None

    def put(self, entry: Entry) -> None:
        """Dispatcher thread, once per notification: the bare lock (a C-level ``with``), and
        ``Condition.notify`` (Python code) only when a ``poll`` is actually waiting."""
        dropped = 0
        with self._lock:
            if self._closed:
                return
            items = self._items
            was_empty = not items
            if len(items) >= self.capacity:
                dropped = self._overflow(entry)
            else:
                items.append(self._carried(entry) if self._tail_carry else entry)
            if self._waiting:
                assert self._cond is not None
                self._cond.notify()
        if dropped:
            self._counters.add_dropped(dropped)
        if was_empty and self.waker is not None:
            self.waker()

    def put_many(self, entries: list[Entry]) -> None:
        """Dispatcher thread, once per subscription per drained batch: what ``put`` does for
        each entry, in order, under one lock; then one ``notify`` for the waiting pollers and
        at most one waker call (if the queue was empty before the first entry, the consumer
        may be asleep; otherwise it has not drained the queue yet and needs no signal)."""
        dropped = 0
        with self._lock:
            if self._closed:
                return
            items = self._items
            was_empty = not items
            room = self.capacity - len(items)
            if len(entries) <= room and not self._tail_carry:
                items.extend(entries)
            else:
                # Drop oldest, exactly as the same entries put one by one would.
                for entry in entries:
                    if len(items) >= self.capacity:
                        dropped += self._overflow(entry)
                    else:
                        items.append(self._carried(entry) if self._tail_carry else entry)
            if self._waiting:
                assert self._cond is not None
                self._cond.notify(len(entries))
        if dropped:
            self._counters.add_dropped(dropped)
        if was_empty and self.waker is not None:
            self.waker()

    def _overflow(self, entry: Entry) -> int:
        """The queue is full and ``entry`` comes (lock held): drop the oldest plain update,
        never a FIRST or an error while a plain update can go instead, since those mark where
        a sequence starts or stopped (a consumer must see the FIRST of every subscription
        epoch; found by rda.testing.simulation). The dropped update and
        what it had missed are added to the gap of the entry that followed it. Returns 1."""
        items = self._items
        index = next((i for i, item in enumerate(items) if _plain(item)), None)
        if index is None:
            if _plain(entry):
                # Nothing plain to drop but the newcomer: it goes, counted on the next one.
                self._tail_carry += entry[1] + 1
                return 1
            index = 0  # only markers: the oldest goes (a newer marker follows it)
        _, old_gap, _ = items[index]
        del items[index]
        if index == 0:
            # The dropped update and whatever it had missed before it.
            self._carry += old_gap + 1
        elif index < len(items):
            payload, gap, seq = items[index]
            items[index] = (payload, gap + old_gap + 1, seq)
        else:
            payload, gap, seq = entry
            entry = (payload, gap + old_gap + 1, seq)
        items.append(self._carried(entry) if self._tail_carry else entry)
        return 1

    def _carried(self, entry: Entry) -> Entry:
        """``entry`` with the newcomers dropped before it added to its gap (lock held)."""
        payload, gap, seq = entry
        gap += self._tail_carry
        self._tail_carry = 0
        return payload, gap, seq

    def put_wait(self, entry: Entry) -> bool:
        """Put without dropping: wait while the queue is full (the history rows of a backfill,
        paced by the consumer). False if the queue was closed meanwhile."""
        with self._lock:
            while len(self._items) >= self.capacity and not self._closed:
                if self._room is None:
                    self._room = threading.Condition(self._lock)
                self._room.wait(0.5)
            if self._closed:
                return False
            was_empty = not self._items
            self._items.append(entry)
            if self._waiting:
                assert self._cond is not None
                self._cond.notify()
        if was_empty and self.waker is not None:
            self.waker()
        return True

    def get(self, timeout: float | None) -> Entry | None:
        """The oldest entry, waiting up to ``timeout`` (None: forever); None if closed or none."""
        with self._lock:
            items = self._items
            if not items and not self._closed and timeout != 0:
                cond = self._cond
                if cond is None:
                    self._cond = cond = threading.Condition(self._lock)
                self._waiting += 1
                try:
                    cond.wait_for(lambda: items or self._closed, timeout)
                finally:
                    self._waiting -= 1
            if not items:
                return None
            payload, gap, seq = items.popleft()
            if self._room is not None:
                self._room.notify()
            if self._carry:
                gap += self._carry
                self._carry = 0
            return payload, gap, seq

    def close(self, discard: bool) -> None:
        with self._lock:
            self._closed = True
            if discard:
                self._items.clear()
            if self._cond is not None:
                self._cond.notify_all()
            if self._room is not None:
                self._room.notify_all()
        if self.waker is not None:
            self.waker()

    def __len__(self) -> int:
        return len(self._items)


class Subscription:
    """A live subscription to ``(device, property, selector, filters)``.

    Without a listener, read notifications with ``poll(timeout)`` or by iterating; with one,
    the listener receives each notification on the client scheduler. ``close()`` sends
    UNSUBSCRIBE (idempotent). The subscription survives disconnections (each reported as a
    notification whose ``.error`` is a ``DisconnectedError``) and is re-established when the
    connection comes back, starting again with a ``FIRST`` update. It ends when the server
    rejects it (a notification with ``.error``, then iteration stops), or when it or the
    client service is closed.
    """

    def __init__(
        self,
        sub_id: int,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        filters: Data | None,
        listener: Callable[[Notification], object] | None,
        queue_size: int,
        counters: ClientCounters,
        submit: Submit,
        on_close: Callable[[Subscription], None],
        backfill: BackfillHook | None = None,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        self.id = sub_id
        self.endpoint = endpoint
        self.device = device
        self.property = prop
        self.selector = selector
        self.filters = filters
        self.listener = listener
        self._counters = counters
        self._submit = submit
        self._on_close = on_close
        self._group = f"sub-{sub_id}"
        self._inbox = _Inbox(queue_size, counters)
        self._lock = threading.Lock()
        if listener is not None:
            # A listener reads the same bounded queue as poll: one scheduler task per burst
            # (the queue turned non-empty), not one per notification.
            self._inbox.waker = self._wake_listener
        self._expected = 0  # next sequence number expected; 0: unknown (FIRST pending)
        self._ended = False  # no more notifications will come
        self._closed = False  # closed by the user or the service: discard what is queued
        self._in_outage = False  # a disconnection was reported and nothing came since
        # Notifications of the transport's current batch not yet delivered (dispatcher only;
        # None between batches, so an idle subscription holds no list).
        self._batch: list[Entry] | None = None
        self.received = 0
        # The connection the SUBSCRIBE was last sent on; owned by the client service.
        self.connection: int | None = None
        self._backfill = backfill
        if backfill is not None:
            backfill.attach(self, queue_size)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._ended else "live"
        sel = f"@{self.selector}" if self.selector else ""
        return f"<Subscription {self.id} {self.device}/{self.property}{sel} {state}>"

    @property
    def closed(self) -> bool:
        """True once no further notification will be delivered."""
        return self._ended

    # -- consumer side ---------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Notification | None:
        """The next notification, waiting up to ``timeout`` seconds (None: until one comes).

        Returns None when the time is up, or at once when the subscription has ended and its
        queue is drained.
        """
        self._check_pollable()
        return self._make(self._inbox.get(timeout))

    def poll_nowait(self) -> Notification | None:
        """The next queued notification, or None without waiting."""
        self._check_pollable()
        return self._make(self._inbox.get(0))

    def set_wakeup(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` (on the dispatcher thread: it must be fast and thread-safe) when a
        notification lands in an empty queue and when the subscription ends. For event-loop
        integration (``rda.aio``); then drain with ``poll_nowait``."""
        self._check_pollable()
        self._inbox.waker = callback

    def __iter__(self) -> Iterator[Notification]:
        return self

    def __next__(self) -> Notification:
        notification = self.poll(None)
        if notification is None:
            raise StopIteration
        return notification

    def close(self) -> None:
        """Unsubscribe and stop delivery; idempotent, safe from a listener."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ended = True
        self._inbox.close(discard=True)
        self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_pollable(self) -> None:
        if self.listener is not None:
            raise RuntimeError(
                f"subscription to {self.device}/{self.property} delivers to its listener; "
                "poll and iteration serve subscriptions made without one"
            )

    def _make(self, entry: Entry | None) -> Notification | None:
        if entry is None:
            return None
        payload, gap, seq = entry
        if isinstance(payload, Message):
            return _from_message(payload, (self.device, self.property), gap, seq)
        if isinstance(payload, Notification):
            return payload
        return Notification(error=payload, gap=gap, seq=seq)

    # -- dispatcher side (the client service calls these) ----------------------------------

    def deliver_message(self, message: Message, staged: list[Subscription] | None = None) -> None:
        """A NOTIFICATION_* or SUBSCRIBE_EXCEPTION for this subscription (dispatcher thread).

        With ``staged`` (a batch, see ``ClientService._on_messages``) the notification waits
        in this subscription's batch, and the subscription is added to ``staged`` once, until
        the service calls :meth:`flush` at the end of the batch; gaps and counters are
        counted here either way."""
        if self._ended:
            return
        self._in_outage = False
        header = message.header
        seq = message.peek_seq()
        gap = 0
        if header.update_type is _FIRST or self._expected == 0:
            pass  # a (re)started sequence: nothing to compare with
        elif seq > self._expected:
            gap = seq - self._expected
            self._counters.gaps += gap
        if seq:
            self._expected = seq + 1
        self.received += 1
        self._counters.notifications += 1
        if self._backfill is not None and self._backfill.take((message, gap, seq)):
            return
        if staged is None:
            self._deliver((message, gap, seq))
        else:
            batch = self._batch
            if batch is None:
                self._batch = batch = []
                staged.append(self)
            batch.append((message, gap, seq))
        if header.request_type is _SUBSCRIBE_EXCEPTION:
            self.flush()  # what came before the end is delivered before it
            self.end()

    def flush(self) -> None:
        """Deliver the staged batch (dispatcher thread): into the queue under one lock with
        one wake-up, or to the scheduler in order, one task each (the first wakes a worker;
        the rest normally queue behind it in the subscription's group without a wake-up)."""
        batch = self._batch
        if batch is None:
            return
        self._batch = None
        self._inbox.put_many(batch)

    def deliver_error(self, error: RdaError) -> None:
        """A locally detected problem (e.g. disconnection); the subscription lives on."""
        if self._ended or self._in_outage:
            return
        # Reported once per outage, not once per failed reconnection attempt.
        self._in_outage = True
        # Whatever comes next is a FIRST of a new sequence (re-subscribe) or unknown.
        self._expected = 0
        if self._backfill is not None and self._backfill.take((error, 0, 0)):
            return
        self._deliver((error, 0, 0))

    def fail(self, error: RdaError) -> None:
        """A final error (the server refuses this client): delivered, then the end."""
        if self._ended:
            return
        self._in_outage = False
        self._deliver((error, 0, 0))
        self.end()

    def terminate(self) -> None:
        """The client service is closing: stop at once, discarding what is queued."""
        with self._lock:
            self._closed = True
            self._ended = True
        self._inbox.close(discard=True)

    def end(self) -> None:
        """No more notifications: queued ones can still be read, then iteration stops."""
        with self._lock:
            self._ended = True
        self._inbox.close(discard=False)

    # -- backfill (history.Backfill calls these from its task in this subscription's group) --

    def run_in_group(self, task: Callable[[], None]) -> bool:
        """Run ``task`` on the client scheduler in this subscription's group (listener order)."""
        return self._submit(self._group, task, None)

    def emit(self, entry: Entry) -> None:
        """Deliver now, from a task of this subscription's group: a listener is called here,
        in order; a queue is waited on while full (the consumer paces the history)."""
        if self.listener is None:
            self._inbox.put_wait(entry)
            return
        notification = self._make(entry)
        if notification is not None and not self._closed:
            self._call_listener(notification)

    def count_dropped(self) -> None:
        self._counters.add_dropped()

    def _deliver(self, entry: Entry) -> None:
        self._inbox.put(entry)

    def _wake_listener(self) -> None:
        """The queue turned non-empty (or ended): run the listener over it on the scheduler.

        A refused submission (the client is closing) loses nothing that would be delivered;
        an evicted one neither: the drain task queued after it finds the same entries."""
        self._submit(self._group, self._drain_to_listener, None)

    def _drain_to_listener(self) -> None:
        """Scheduler task: every queued notification to the listener, in order. A put that
        finds the queue empty while this runs queues another drain behind it (same group)."""
        inbox = self._inbox
        while not self._closed:
            notification = self._make(inbox.get(0))
            if notification is None:
                return
            self._call_listener(notification)

    def _call_listener(self, notification: Notification) -> None:
        listener = self.listener
        assert listener is not None
        try:
            listener(notification)
        except Exception:
            self._counters.add_listener_error()
            log.exception(
                "listener of subscription %s to %s/%s raised; the subscription continues",
                self.id,
                self.device,
                self.property,
            )
