"""History over rda: ``client.history(...)`` and the fetch behind ``subscribe(backfill=...)``.

The client never reads a store: it asks the **history server** that runs beside a recorder
(``rda record ... --serve``). That server registers the device ``history:<DEVICE>`` (globs
allowed) in the directory, so the recorder covering ``PS1/Acquisition`` is found by resolving
``history:PS1`` like any device (docs/history.md, "History as a service"; a
``StaticDirectory({"history:*": "tcp://host:port"})`` names one explicitly).

A query is a sequence of gets on ``history:DEVICE/PROPERTY``: each returns one chunk (at most
``chunk_rows`` rows, columns plus a Data array of values) and the next is asked with the last
row as cursor only once the caller has consumed the previous one. That is the flow control: a
slow consumer slows the reads; nothing piles up on either side.

Errors: no recorder covers the signal (the directory has no ``history:`` entry, or the server
does not record it) or its server cannot be reached: :class:`HistoryUnavailableError` (with the
cause chained); a policy refusal stays ``NotAuthorizedError``.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rda.business import driver
from rda.business.client.subscriptions import Entry, HistoryChunk, Notification, Subscription
from rda.serialization.data import Data, DataType
from rda.serialization.errors import (
    DisconnectedError,
    HistoryUnavailableError,
    NoSuchDeviceError,
    NotAuthorizedError,
    RdaError,
    TimeoutError,
    TransportError,
    error_from_remote,
)
from rda.serialization.header import DataContext, RequestType, UpdateType
from rda.serialization.message import Message

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "HISTORY_PREFIX",
    "Backfill",
    "backfill_rows",
    "field_column",
    "history_batches",
    "history_chunks",
    "history_iter",
    "history_table",
    "shape_table",
    "to_ns",
    "value_columns",
]

log = logging.getLogger(__name__)

HISTORY_PREFIX = "history:"
CHUNK_ROWS = 5000  # rows per chunk for Notifications (a chunk's rows become objects at once)
TABLE_CHUNK_ROWS = 1_000_000  # for tables: as many as the server sends (it caps by bytes)
CHUNK_FORMAT = "arrow"  # the query's ``format``: the reply is an Arrow IPC stream
SEAM_WAIT_MS = 2000  # how long the server may wait for the recorder to reach the seam

TimeLike = int | datetime.datetime | datetime.timedelta | None


def to_ns(value: TimeLike, now: int, what: str) -> int:
    """A time as ns since the epoch: an int (ns), an aware datetime (naive: UTC), a timedelta
    (relative to now, e.g. ``-timedelta(minutes=5)``), or None (now)."""
    if value is None:
        return now
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected ns, a datetime or a timedelta, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime.timedelta):
        return now + value // datetime.timedelta(microseconds=1) * 1000
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        return (value - epoch) // datetime.timedelta(microseconds=1) * 1000
    raise TypeError(f"{what}: expected ns, a datetime or a timedelta, got {value!r}")


def _row_error(text: str) -> RdaError:
    kind, sep, message = text.partition(": ")
    return error_from_remote(kind, message) if sep else error_from_remote("RemoteError", text)


def chunk_notifications(chunk: pa.Table) -> list[Notification]:
    """The HISTORY notifications of one chunk (its Arrow table as sent), in order."""
    from rda.business.client.arrow_rows import rows_to_data

    count = chunk.num_rows
    stamps = chunk.column("acq_stamp").to_numpy().tolist()
    cycles = chunk.column("cycle_stamp").fill_null(0).to_numpy().tolist()
    names = chunk.column("cycle_name").fill_null("").to_pylist()
    selectors = chunk.column("selector").fill_null("").to_pylist()
    errors = chunk.column("error").to_pylist()
    values = rows_to_data(chunk.column("data")) if "data" in chunk.schema.names else [None] * count
    out = []
    for i in range(count):
        context = DataContext(names[i], cycles[i], stamps[i], selectors[i])
        if errors[i]:
            out.append(Notification(None, context, UpdateType.HISTORY, _row_error(errors[i])))
        else:
            value = values[i]
            out.append(
                Notification(Data() if value is None else value, context, UpdateType.HISTORY)
            )
    return out


# Meta columns of a chunk and of ``history_table`` (docs/history.md, "The chunk"); a value
# field of one of these names is renamed ``data.<name>`` in the table.
META_COLUMNS = ("acq_stamp", "cycle_stamp", "cycle_name", "selector", "recorder_id", "seq", "error")


def field_column(field: str) -> str:
    """The column of value field ``field`` in a ``history_table``: its name, or
    ``data.<name>`` for a field named like a meta column."""
    return f"data.{field}" if field in META_COLUMNS or field == "time" else field


def value_columns(table: pa.Table) -> list[str]:
    """The columns of a ``history_table`` that hold the value's fields (in the value's order)."""
    meta = table.schema.metadata or {}
    return list(json.loads(meta.get(b"rda.fields", b"[]")))


def shape_table(chunk: pa.Table) -> pa.Table:
    """A chunk as ``history_table`` returns it: ``time`` (``timestamp[ns, UTC]``, the
    acquisition stamp) first, the chunk's meta columns, then one column per top-level field
    of the value (the ``data`` struct flattened, zero-copy), a field with declared units
    carrying them as its Arrow field metadata ``units`` (and the table's ``rda.units``)."""
    import pyarrow as pa

    arrays = [chunk.column("acq_stamp").cast(pa.timestamp("ns", tz="UTC"))]
    fields = [pa.field("time", pa.timestamp("ns", tz="UTC"), nullable=False)]
    for field in chunk.schema:
        if field.name != "data":
            arrays.append(chunk.column(field.name))
            fields.append(field)
    values: list[str] = []
    units = json.loads((chunk.schema.metadata or {}).get(b"rda.units", b"{}"))
    if "data" in chunk.schema.names and pa.types.is_struct(chunk.schema.field("data").type):
        data = chunk.column("data")
        for child, field in zip(data.flatten(), data.type, strict=True):
            if units.get(field.name):
                field = field.with_metadata({**(field.metadata or {}), b"units": units[field.name]})
            field = field.with_name(field_column(field.name))
            arrays.append(child)
            fields.append(field)
            values.append(field.name)
    metadata = dict(chunk.schema.metadata or {})
    metadata[b"rda.fields"] = json.dumps(values).encode()
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata))


# What the functions below make their gets with: ``ClientService.access_point``.
PointOf = Callable[[str, str], Any]


def _window(start: TimeLike, end: TimeLike, limit: int | None) -> tuple[int, int]:
    now = driver.wall_time_ns()
    first = to_ns(start, now, "start")
    last = to_ns(end, now, "end")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return first, last


def history_iter(
    point_of: PointOf,
    device: str,
    prop: str,
    start: TimeLike,
    end: TimeLike = None,
    selector: str | None = None,
    limit: int | None = None,
    timeout: float | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> Iterator[Notification]:
    """``ClientService.history_iter``: the recorded updates of ``device/prop``, lazily (the
    next chunk is asked for when this one is consumed)."""
    first, last = _window(start, end, limit)
    chunks = history_chunks(
        point_of, device, prop, selector, first, last, limit, timeout, None, chunk_rows
    )
    return _notifications(chunks)


def _notifications(chunks: Iterator[pa.Table]) -> Iterator[Notification]:
    for chunk in chunks:
        yield from chunk_notifications(chunk)


def history_batches(
    point_of: PointOf,
    device: str,
    prop: str,
    start: TimeLike,
    end: TimeLike = None,
    selector: str | None = None,
    limit: int | None = None,
    timeout: float | None = None,
    chunk_rows: int = TABLE_CHUNK_ROWS,
) -> Iterator[pa.RecordBatch]:
    """``ClientService.history_batches``: the rows as ``pyarrow.RecordBatch`` es with the
    columns of :func:`shape_table`, lazily (the next chunk is asked for when the batches of
    this one are consumed)."""
    first, last = _window(start, end, limit)
    chunks = history_chunks(
        point_of, device, prop, selector, first, last, limit, timeout, None, chunk_rows
    )
    return _batches(chunks)


def _batches(chunks: Iterator[pa.Table]) -> Iterator[pa.RecordBatch]:
    for chunk in chunks:
        yield from shape_table(chunk).to_batches()


def history_table(
    point_of: PointOf,
    device: str,
    prop: str,
    start: TimeLike,
    end: TimeLike = None,
    selector: str | None = None,
    limit: int | None = None,
    timeout: float | None = None,
    chunk_rows: int = TABLE_CHUNK_ROWS,
) -> pa.Table:
    """``ClientService.history_table``: every row of the window as one ``pyarrow.Table``
    (columns of :func:`shape_table`; the chunks' buffers, not copies)."""
    import pyarrow as pa

    first, last = _window(start, end, limit)
    tables = [
        shape_table(chunk)
        for chunk in history_chunks(
            point_of, device, prop, selector, first, last, limit, timeout, None, chunk_rows
        )
    ]
    if not tables:
        return shape_table(_empty_chunk())
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        raise ValueError(
            f"{device}/{prop}: a field changes type within the window (a new schema version: "
            f"{exc}); read it with history_batches, or a window on each side of the change"
        ) from None


def _empty_chunk() -> pa.Table:
    import pyarrow as pa

    kinds = [pa.int64(), pa.int64(), pa.string(), pa.string(), pa.string(), pa.int64()]
    kinds.append(pa.string())
    return pa.table(
        {name: pa.array([], kind) for name, kind in zip(META_COLUMNS, kinds, strict=True)}
    )


def backfill_rows(
    point_of: PointOf,
    device: str,
    prop: str,
    selector: str | None,
    start: int,
    until: int,
    columnar: bool = False,
) -> Iterator[Notification]:
    """For ``subscribe(backfill=...)``: the rows of ``[start, until)`` with the seam wait
    (``Backfill`` turns a failure into one error notification); ``columnar``: one
    :class:`HistoryChunk` per chunk the server sends (as big as it sends them), not a
    notification per row."""
    if columnar:
        chunks = history_chunks(
            point_of, device, prop, selector, start, until, None, None, until, TABLE_CHUNK_ROWS
        )
        return (HistoryChunk(shape_table(chunk)) for chunk in chunks)
    return _notifications(
        history_chunks(
            point_of, device, prop, selector, start, until, None, None, until, CHUNK_ROWS
        )
    )


def history_chunks(
    point_of: PointOf,
    device: str,
    prop: str,
    selector: str | None,
    start: int,
    end: int,
    limit: int | None,
    timeout: float | None,
    until: int | None,
    chunk_rows: int,
) -> Iterator[pa.Table]:
    """The chunks of a query as the server sent them (Arrow tables over the received frames),
    each asked for when the previous one has been consumed (the flow control)."""
    import pyarrow as pa

    point = point_of(HISTORY_PREFIX + device, prop)
    sent = 0
    cursor: tuple[int, str, int] | None = None
    while True:
        filters = Data()
        filters.append("format", CHUNK_FORMAT, DataType.STRING)
        filters.append("start", start, DataType.INT64)
        filters.append("end", end, DataType.INT64)
        want = chunk_rows if limit is None else min(chunk_rows, limit - sent)
        filters.append("limit", want, DataType.INT64)
        if until is not None:
            filters.append("until", until, DataType.INT64)
            filters.append("wait_ms", SEAM_WAIT_MS, DataType.INT64)
        if cursor is not None:
            filters.append("after_stamp", cursor[0], DataType.INT64)
            filters.append("after_recorder", cursor[1], DataType.STRING)
            filters.append("after_seq", cursor[2], DataType.INT64)
        reply = _history_get(point, device, prop, selector, filters, timeout)
        try:
            # A view of the received frame: the table's buffers point into it (zero-copy).
            chunk = pa.ipc.open_stream(pa.py_buffer(reply.get_array("arrow"))).read_all()
        except (pa.ArrowInvalid, KeyError, TypeError) as exc:
            raise HistoryUnavailableError(
                f"{device}/{prop}: the history server sent a chunk that is not an Arrow IPC "
                f"stream ({exc})"
            ) from None
        if chunk.num_rows:
            yield chunk
        sent += chunk.num_rows
        if not chunk.num_rows or not reply["more"] or (limit is not None and sent >= limit):
            return
        last = chunk.num_rows - 1
        cursor = (
            int(chunk.column("acq_stamp")[last].as_py()),
            str(chunk.column("recorder_id")[last].as_py()),
            int(chunk.column("seq")[last].as_py()),
        )


def _history_get(
    point: Any,
    device: str,
    prop: str,
    selector: str | None,
    filters: Data,
    timeout: float | None,
) -> Data:
    signal = f"{device}/{prop}"
    try:
        reply = point.get(selector, filters=filters, timeout=timeout)
    except NotAuthorizedError:
        raise
    except NoSuchDeviceError as exc:
        raise HistoryUnavailableError(f"{signal}: no recorder serves its history ({exc})") from exc
    except (DisconnectedError, TimeoutError, TransportError) as exc:
        raise HistoryUnavailableError(
            f"{signal}: the history server is unreachable ({exc})"
        ) from exc
    data: Data = reply.data
    return data


# Backfill phases (see Backfill).
_WAITING, _FETCHING, _BRIDGE, _DONE = range(4)
HOLD_LIMIT = 10_000  # live updates held while the past is fetched, at least (queue_size if more)


def _stamp(entry: Entry) -> int:
    payload = entry[0]
    if isinstance(payload, Message) and payload.header.request_type is not (
        RequestType.SUBSCRIBE_EXCEPTION
    ):
        stamp = payload.context.acq_stamp
        if stamp:
            return stamp
    return driver.wall_time_ns()


def _live_data(entry: Entry) -> bool:
    payload = entry[0]
    return (
        isinstance(payload, Message)
        and payload.header.request_type is RequestType.NOTIFICATION_DATA
        and payload.header.update_type in (UpdateType.NORMAL, UpdateType.IMMEDIATE)
    )


class Backfill:
    """The seam between a subscription's past and its live updates (docs/client.md).

    1. The live subscription starts at once; its updates are **held** (dispatcher thread: one
       list append each) from the ``FIRST`` update on.
    2. A task in the subscription's scheduler group fetches the recorded rows with
       ``start <= acq_stamp < a_first`` (``a_first``: the FIRST update's stamp) and delivers
       them as HISTORY, then the FIRST update.
    3. **Bridge.** The server computes FIRST with a get and activates the subscriber after it:
       an update published in between reaches the recorder but not this subscription (its
       sequence numbers do not show it). So at the first live NORMAL/IMMEDIATE update (stamp
       ``s1``, held in its turn if it comes later) the recorded rows with
       ``a_first < acq_stamp < s1`` are delivered as HISTORY first. Then the held updates, then
       everything live as usual, the server's per-subscription sequence numbers counting gaps.

    The past comes as HISTORY notifications, one per row, or with ``backfill_columnar`` as
    :class:`HistoryChunk` s (a ``pyarrow.Table`` each, one per chunk the server sends): the
    same rows, the same seam, fewer and bigger deliveries.

    The history server waits (bounded) until its recorder has acknowledged the signal up to
    the seam's stamp before it answers, so rows still on their way to the recorder are not
    missed. A failed fetch delivers one notification whose ``.error`` says why, and the
    subscription carries on live. Only the first FIRST is backfilled: after an outage the
    subscription re-subscribes without fetching the outage from history.
    """

    def __init__(self, fetch: Callable[[int, int], Iterator[Notification]], start: int) -> None:
        self._fetch = fetch
        self._start = start
        self._lock = threading.Lock()
        self._hold: list[Entry] | None = None
        self._phase = _WAITING
        self._seam = 0
        self._sub: Subscription | None = None
        self._limit = HOLD_LIMIT
        self._failed = False

    def attach(self, sub: Subscription, queue_size: int) -> None:
        self._sub = sub
        self._limit = max(HOLD_LIMIT, queue_size)

    def take(self, entry: Entry) -> bool:
        """Dispatcher thread: True when ``entry`` is held (delivered later, in order)."""
        phase = self._phase
        if phase == _DONE:
            return False
        with self._lock:
            hold = self._hold
            if hold is not None:
                self._append(hold, entry)
                return True
            if self._phase == _WAITING:
                payload = entry[0]
                if not isinstance(payload, Message) or (
                    payload.header.request_type is RequestType.SUBSCRIBE_EXCEPTION
                ):
                    self._phase = _DONE  # rejected or lost before FIRST: nothing to join
                    return False
                self._hold = [entry]
                self._phase = _FETCHING
                return self._start_task(self._initial)
            if self._phase == _BRIDGE:
                if not _live_data(entry):
                    self._phase = _DONE
                    return False
                self._hold = [entry]
                return self._start_task(self._bridge)
        return False

    def _append(self, hold: list[Entry], entry: Entry) -> None:
        hold.append(entry)
        if len(hold) > self._limit and len(hold) > 2:
            # Drop the oldest after the first (the seam's own update), carried as a gap.
            _, gap, _ = hold.pop(1)
            payload, next_gap, seq = hold[1]
            hold[1] = (payload, next_gap + gap + 1, seq)
            if self._sub is not None:
                self._sub.count_dropped()

    def _start_task(self, task: Callable[[], None]) -> bool:
        sub = self._sub
        assert sub is not None
        if sub.run_in_group(task):
            return True
        self._hold = None  # no scheduler (closing): deliver normally
        self._phase = _DONE
        return False

    def _emit_rows(self, start: int, until: int) -> int | None:
        """Deliver the rows of ``[start, until)``; how many, or None when the subscription was
        closed. A failure is delivered as one error notification and ends the backfill (no
        bridge)."""
        sub = self._sub
        assert sub is not None
        failure: RdaError | None = None
        emitted = 0
        try:
            for notification in self._fetch(start, until):
                if sub.closed:
                    return None
                sub.emit((notification, 0, 0))
                # A columnar backfill's chunk is many rows (the bridge's gap counts rows).
                emitted += notification.rows if isinstance(notification, HistoryChunk) else 1
        except RdaError as exc:
            failure = exc
        except Exception as exc:  # a bug, not an rda error: say so, and still go live
            log.exception("backfill of %s/%s failed", sub.device, sub.property)
            failure = HistoryUnavailableError(f"{sub.device}/{sub.property}: backfill: {exc}")
        if failure is not None:
            self._failed = True
            sub.emit((Notification(error=failure, update_type=UpdateType.HISTORY), 0, 0))
        return None if sub.closed else emitted

    def _initial(self) -> None:
        with self._lock:
            assert self._hold is not None
            first = self._hold[0]
        seam = _stamp(first)
        self._seam = seam
        if self._emit_rows(self._start, seam) is None:
            return
        self._drain(bridge=not self._failed)

    def _bridge(self) -> None:
        with self._lock:
            assert self._hold is not None
            first = self._hold[0]
        rows = self._emit_rows(self._seam + 1, _stamp(first))
        if rows is None:
            return
        self._bridged(rows)
        self._drain(bridge=False)

    def _bridged(self, rows: int) -> None:
        """The bridge rows were what the server published while it prepared FIRST, which its
        sequence numbers count as missed in the first live update's gap: they are not."""
        with self._lock:
            hold = self._hold
            if hold:
                payload, gap, seq = hold[0]
                hold[0] = (payload, max(0, gap - rows), seq)

    def _drain(self, bridge: bool) -> None:
        """Deliver what is held, in order, then let the dispatcher deliver directly again.

        ``bridge``: the first held live update after FIRST (``hold[0]``, emitted as is) is
        preceded by the bridge rows."""
        sub = self._sub
        assert sub is not None
        after_first = False
        while True:
            with self._lock:
                hold = self._hold
                assert hold is not None
                if not hold:
                    self._hold = None
                    self._phase = _BRIDGE if bridge else _DONE
                    return
                entry = hold[0]
                if bridge and after_first:
                    if _live_data(entry):
                        break  # bridge before it; it stays held until then
                    bridge = False  # an error or a new FIRST came first: nothing to bridge
                hold.pop(0)
            sub.emit(entry)
            after_first = True
        rows = self._emit_rows(self._seam + 1, _stamp(entry))
        if rows is not None:
            self._bridged(rows)
            self._drain(bridge=False)
