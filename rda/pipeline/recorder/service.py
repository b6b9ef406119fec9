"""The history recorder: subscriptions -> bounded queue -> one writer -> durable journal segments.

The storage core needs no network: ``Recorder.offer(device, property, selector, notification)``
takes anything shaped like ``rda.Notification`` (``.data``, ``.context``, ``.error``), so a
fire-hose, a test or the subscription layer feed it the same way. With patterns and a client,
``start()`` subscribes and its listeners call ``offer``.

Guarantees (docs/history.md): the queue is bounded and its overflow is counted, never silent;
a single writer thread appends rows and every ``flush_interval`` (~200 ms) or ``flush_rows``
(5,000) writes a journal segment; only once it is durable does ``acked_seq`` advance. ``seq``
continues after the last durable one across restarts. A write failure (full disk, permission)
puts the recorder in the ``error`` state: it logs, counts, stops acknowledging, keeps its rows
in memory (bounded: the queue then overflows, counted) and retries.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import fnmatch
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from rda.business.server.builder import Server, ServerBuilder
from rda.pipeline.recorder.compaction import compact_store, delete_older
from rda.pipeline.recorder.converter import Converter, journal_root
from rda.pipeline.recorder.journal import Journal, SegmentBuilder
from rda.pipeline.recorder.model import (
    Closable,
    RecorderStatistics,
    Sample,
    default_id,
    parse_pattern,
)
from rda.pipeline.recorder.query import HistoryReader
from rda.pipeline.recorder.schema import SchemaCatalog, arrow_type_of, signature
from rda.pipeline.recorder.serve import HistoryHandler, start_history_server
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data
from rda.serialization.header import UpdateType

__all__ = ["Recorder", "RecorderStatistics", "Sample", "parse_pattern"]

log = logging.getLogger("rda.pipeline.recorder.service")

_EMPTY = pa.struct([])
_UPDATE_NAMES = {kind: kind.name for kind in UpdateType}  # a dict lookup, not Enum's .name
_GLOB = re.compile(r"[*?\[]")


DESCRIBE_TIMEOUT = 5.0  # seconds to ask a recorded property's description at start


class Recorder:
    """Records notifications into ``root`` (journal, then Parquet); see the module docstring."""

    def __init__(
        self,
        root: Store | Path | str,
        patterns: Sequence[str] = (),
        client: Any = None,
        *,
        recorder_id: str | None = None,
        directory: Any = None,
        queue_limit: int = 100_000,
        flush_interval: float = 0.2,
        flush_rows: int = 5_000,
        convert_interval: float = 5.0,
        retention: float = 86_400.0,
        convert: bool = True,
        journal: Path | str | None = None,
        on_ack: Callable[[int, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        serve: bool | ServerBuilder = False,
        compact_interval: float | None = None,
        compact_grace: float = 600.0,
        compact_linger: float = 60.0,
        keep: float | None = None,
    ) -> None:
        self.store = Store.open(root)
        self.root = self.store.uri
        self.recorder_id = recorder_id or default_id()
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.recorder_id):
            raise ValueError(f"recorder id {self.recorder_id!r} must match [A-Za-z0-9_.-]+")
        self.patterns = [parse_pattern(p) for p in patterns]
        self.queue_limit = queue_limit
        self.flush_interval = flush_interval
        self.flush_rows = flush_rows
        self.convert_interval = convert_interval
        self._client = client
        self._own_client = False
        self._directory = directory
        self._on_ack = on_ack
        self._clock = clock
        self._convert = convert
        # Compaction and partition retention (compaction.py) run in the converter thread,
        # after a conversion round, so they never race this recorder's own conversions.
        if (compact_interval is not None or keep is not None) and not self.store.local:
            raise ValueError(f"{self.store.uri}: compaction and --keep need a local store")
        self.compact_interval = compact_interval
        self.compact_grace = compact_grace
        self.compact_linger = compact_linger
        self.keep = keep
        self._next_compaction = 0.0
        self._footers: dict[Path, Any] = {}  # compaction's footer cache, one entry per file
        self._compacted_files = 0
        self._compaction_removed = 0
        self._partitions_deleted = 0
        self._compaction_errors = 0
        self.catalog = SchemaCatalog(self.store, self.recorder_id)
        self.journal = Journal(journal_root(self.store, journal), self.recorder_id)
        self.converter = Converter(
            self.store,
            self.recorder_id,
            self.catalog,
            journal=journal,
            retention=retention,
            units_of=self.units_of,
        )
        self._queue: collections.deque[tuple[str, str, str | None, Any, int]] = collections.deque()
        self._cond = threading.Condition()
        self._idle = False
        self._stopping = False
        self._flush_wanted = 0  # seq the caller of flush() waits for
        self._state = "created"
        self._next_seq = 1
        self._acked_seq = 0
        self._acked_rows = 0
        self._received = 0
        self._overflow = 0
        self._gaps = 0
        self._missing_stamps = 0
        self._repeated_first = 0
        # (device, property, selector) -> (acq_stamp, value) of the last value row stored:
        # one entry per recorded signal (the recorder's own configuration bounds it).
        self._last_values: dict[tuple[str, str, str], tuple[int, Any]] = {}
        self._unstamped_signals: set[tuple[str, str]] = set()
        self._segments = 0
        self._bytes = 0
        self._write_errors = 0
        self._last_error: str | None = None
        self._oldest_pending: int | None = None
        self._pending = 0
        self._draining = False
        self._routes: dict[tuple[str, str, tuple[Any, ...]], int] = {}  # per segment
        self._versions: dict[
            tuple[str, str, tuple[Any, ...]], tuple[int, tuple[str, ...] | None]
        ] = {}
        # (device, property, version) -> its type (one object per distinct type) and the
        # type's field names.
        self._version_types: dict[tuple[str, str, int], tuple[pa.StructType, tuple[str, ...]]] = {}
        self._type_objects: dict[pa.StructType, pa.StructType] = {}  # one per distinct type
        self._subscriptions: list[Closable] = []
        self._writer: threading.Thread | None = None
        self._converter_thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._lock_file: BinaryIO | None = None
        # The history server (serve.py): True, or a ServerBuilder to configure it.
        self._serve = serve
        self.history_server: Server | None = None
        self.history: HistoryHandler | None = None
        # Per (device, property): the newest stamp written but not yet durable, and durable.
        self._pending_stamps: dict[tuple[str, str], int] = {}
        self._acked_stamps: dict[tuple[str, str], int] = {}
        self._ack_lock = threading.Lock()
        self._units: dict[tuple[str, str], dict[str, str]] = {}

    # --- public API ---------------------------------------------------------------------------

    @property
    def acked_seq(self) -> int:
        """The highest seq whose row is durable in the journal (0 before the first)."""
        return self._acked_seq

    @property
    def state(self) -> str:
        return self._state

    def start(self) -> None:
        """Recover the journal, start the writer and converter threads, then subscribe."""
        if self._state != "created":
            raise RuntimeError(f"recorder is {self._state}, it can be started once")
        self._take_lock()
        try:
            self.converter.recover()
            last = max(self.journal.recover(), self.converter.max_seq)
        except BaseException:
            assert self._lock_file is not None
            self._lock_file.close()
            self._lock_file = None
            raise
        self._next_seq = last + 1
        self._acked_seq = last
        self._state = "running"
        self._writer = threading.Thread(
            target=self._write_loop, name=f"rda-recorder-{self.recorder_id}"
        )
        self._writer.start()
        if self._convert:
            self._converter_thread = threading.Thread(
                target=self._convert_loop, name=f"rda-converter-{self.recorder_id}"
            )
            self._converter_thread.start()
        try:
            if self.patterns:
                self._subscribe()
            if self._serve is not False:
                reader = HistoryReader(
                    self.store, self.journal, lambda: self.converter.max_seq, self.recorder_id
                )
                builder = None if self._serve is True else self._serve
                self.history_server, self.history = start_history_server(self, reader, builder)
        except BaseException:
            self.stop()
            raise

    def _take_lock(self) -> None:
        # Two live recorders with one id would reuse seqs and overwrite each other's files.
        # The kernel drops an flock when its process dies, so a SIGKILL leaves no stale lock.
        handle = open(self.journal.directory / ".lock", "a+b")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RuntimeError(
                f"recorder {self.recorder_id!r} is already running on {self.root}"
            ) from None
        self._lock_file = handle

    def offer(self, device: str, prop: str, selector: str | None, notification: Any) -> bool:
        """Queue one notification; False (and counted) if the queue is full. Thread-safe."""
        queue = self._queue
        if len(queue) >= self.queue_limit or self._stopping:
            with self._cond:
                self._overflow += 1
            return False
        queue.append((device, prop, selector, notification, time.time_ns()))
        if self._idle:
            with self._cond:
                self._cond.notify()
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything offered so far into a segment now; True once it is acknowledged."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flush_wanted = max(self._flush_wanted, 1)
            self._cond.notify()
            while self._queue or self._pending or self._draining:
                if self._writer is None or not self._writer.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(0.05, left))
        return True

    def records(self, device: str, prop: str) -> bool:
        """Whether this recorder records ``device/prop`` (a pattern names it, or rows came)."""
        if any(p == prop and fnmatch.fnmatchcase(device, g) for g, p, _ in self.patterns):
            return True
        with self._ack_lock:
            return (device, prop) in self._acked_stamps

    def acked_stamp(self, device: str, prop: str) -> int:
        """The highest acquisition stamp (ns) of ``device/prop`` that is durable, -1 if none:
        the history server's seam (rows of a signal arrive in stamp order, so every earlier
        one is durable too). The history handler is told after each durable segment."""
        with self._ack_lock:
            return self._acked_stamps.get((device, prop), -1)

    def convert_now(self) -> int:
        """Convert every closed segment to Parquet now (also done periodically); segments done."""
        return self.converter.convert_pending()

    def stop(self, timeout: float = 30.0, convert: bool | None = None) -> None:
        """Stop serving history, unsubscribe, write and acknowledge what is queued, convert it
        (by default), join."""
        if self.history is not None:
            self.history.close()  # seam waits end now (answered), not at their timeout
        if self.history_server is not None:
            self.history_server.stop()
            self.history_server = None
        for sub in self._subscriptions:
            try:
                sub.close()
            except Exception:
                log.exception("recorder %s: closing a subscription failed", self.recorder_id)
        self._subscriptions.clear()
        if self._own_client and self._client is not None:
            self._client.close()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._writer is not None:
            self._writer.join(timeout)
        self._stop_event.set()
        if self._converter_thread is not None:
            self._converter_thread.join(timeout)
        if self._convert if convert is None else convert:
            # A failure is logged and counted by the converter; the journal keeps the rows.
            with contextlib.suppress(Exception):
                self.converter.convert_pending()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None
        if self._state != "created":
            self._state = "stopped" if self._state != "error" else "error"

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def statistics(self) -> RecorderStatistics:
        queue = self._queue
        oldest = self._oldest_pending
        if oldest is None and queue:
            try:
                oldest = queue[0][4]
            except IndexError:
                oldest = None
        conv = self.converter.statistics()
        return RecorderStatistics(
            state=self._state,
            recorder_id=self.recorder_id,
            received=self._received,
            overflow=self._overflow,
            gaps=self._gaps,
            queue_depth=len(queue),
            queue_limit=self.queue_limit,
            pending_rows=self._pending,
            acked_seq=self._acked_seq,
            acked_rows=self._acked_rows,
            segments_written=self._segments,
            bytes_written=self._bytes,
            write_errors=self._write_errors,
            last_error=self._last_error or conv.last_error,
            lag_seconds=0.0 if oldest is None else max(0.0, (time.time_ns() - oldest) / 1e9),
            schema_changes=self.catalog.changes,
            converted_segments=conv.converted_segments,
            parquet_files=conv.files_written,
            conversion_errors=conv.errors,
            subscriptions=len(self._subscriptions),
            missing_acq_stamps=self._missing_stamps,
            repeated_first=self._repeated_first,
            compacted_files=self._compacted_files,
            compaction_inputs_removed=self._compaction_removed,
            partitions_deleted=self._partitions_deleted,
            compaction_errors=self._compaction_errors,
        )

    # --- subscription layer -------------------------------------------------------------------

    def _resolve_devices(self, glob: str) -> list[str]:
        if not _GLOB.search(glob):
            return [glob]
        directory = self._directory or getattr(self._client, "directory", None)
        if directory is None:
            from rda.business.directory import default_directory

            directory = default_directory()
        # A directory lists names and patterns (a pattern is not a device to subscribe to).
        known = [d for d in directory.devices() if not _GLOB.search(d)]
        devices = sorted(d for d in known if fnmatch.fnmatchcase(d, glob))
        if not devices:
            log.warning("recorder %s: no device matches %r", self.recorder_id, glob)
        return devices

    def _subscribe(self) -> None:
        if self._client is None:
            from rda.business.client.service import ClientService

            self._client = ClientService()
            self._own_client = True
        for glob, prop, selector in self.patterns:
            for device in self._resolve_devices(glob):
                point = self._client.access_point(device, prop)
                self._describe(device, prop, point)
                listener = self._listener(device, prop, selector)
                self._subscriptions.append(point.subscribe(selector=selector, listener=listener))

    def _describe(self, device: str, prop: str, point: Any) -> None:
        """Keep the units the property declares (stored with its Parquet files, served with its
        history). A server that cannot describe it (an older one) leaves it without units."""
        try:
            description = point.describe(timeout=DESCRIBE_TIMEOUT)
        except Exception as exc:
            log.info(
                "recorder %s: %s/%s has no description (%s)", self.recorder_id, device, prop, exc
            )
            return
        units = {name: f.units for name, f in description.fields.items() if f.units}
        if units:
            with self._ack_lock:
                self._units[(device, prop)] = units

    def units_of(self, device: str, prop: str) -> dict[str, str]:
        """The units ``device/prop`` declares for its fields (field -> units; empty if none)."""
        with self._ack_lock:
            return dict(self._units.get((device, prop), {}))

    def _listener(self, device: str, prop: str, selector: str | None) -> Callable[[Any], None]:
        def deliver(notification: Any) -> None:
            self.offer(device, prop, selector, notification)

        return deliver

    # --- the writer ---------------------------------------------------------------------------

    def _write_loop(self) -> None:
        builder = SegmentBuilder()
        started = 0.0
        retry_at = 0.0
        backlog_limit = self.flush_rows * 4  # rows held in memory while the disk fails
        queue = self._queue
        while True:
            with self._cond:
                wait = (
                    None
                    if not len(builder)
                    else max(0.0, started + self.flush_interval - self._clock())
                )
                if self._state == "error" and len(builder):
                    wait = max(0.0, retry_at - self._clock())
                if not queue and not self._stopping and not self._flush_wanted and wait != 0.0:
                    self._idle = True
                    self._cond.wait(wait)
                    self._idle = False
                stopping = self._stopping
                flush_wanted = self._flush_wanted
            # Set before the first pop: flush() must never see an empty queue and no pending
            # rows while rows are in between.
            self._draining = True
            room = (backlog_limit if self._state == "error" else self.flush_rows) - len(builder)
            taken = 0
            if queue and not len(builder):
                # (Once per batch, not per row: a row dropped as a repeated FIRST leaves the
                # builder empty and its deadline merely a little early.)
                started = self._clock()
            append = self._append
            while queue and taken < room:
                item = queue.popleft()
                if not append(builder, *item):
                    # A 128th value type in one segment (MAX_TYPES): close it, go on with a fresh one.
                    if not self._flush(builder):
                        queue.appendleft(item)
                        break
                    builder = SegmentBuilder()
                    self._routes.clear()
                    started = self._clock()
                    append(builder, *item)
                taken += 1
            self._pending = len(builder)
            self._draining = False
            if len(builder) and self._oldest_pending is None:
                self._oldest_pending = builder.first_recv_stamp
            due = (
                len(builder) >= self.flush_rows
                or (len(builder) and self._clock() - started >= self.flush_interval)
                or (len(builder) and (stopping or flush_wanted))
            )
            if due and (self._state != "error" or self._clock() >= retry_at):
                if self._flush(builder):
                    builder = SegmentBuilder()
                    self._routes.clear()
                    self._pending = 0
                    self._oldest_pending = None
                elif stopping:
                    # One last try failed: stop rather than retry forever; what is durable stays.
                    log.error(
                        "recorder %s: stopping with %d unacknowledged rows",
                        self.recorder_id,
                        len(builder) + len(queue),
                    )
                    with self._cond:
                        self._cond.notify_all()
                    return
                else:
                    retry_at = self._clock() + 1.0
            if not queue and not len(builder):
                with self._cond:
                    self._flush_wanted = 0
                    self._cond.notify_all()
                if stopping:
                    return

    def _append(
        self,
        builder: SegmentBuilder,
        device: str,
        prop: str,
        selector: str | None,
        notification: Any,
        recv_stamp: int,
    ) -> bool:
        # Once per recorded row: kept to attribute reads, dict lookups and one tuple for the
        # builder (SegmentBuilder.append_row), nothing per column.
        context = notification.context
        error = notification.error
        data = None
        if error is None:
            try:
                data = notification.data  # decoded late, here: a bad body becomes an error row
            except Exception as exc:
                error = exc
        self._gaps += getattr(notification, "gap", 0)
        value: Any = None
        error_text: str | None = None
        route: int | None = None
        if error is None and data is not None:
            try:
                sig = signature(data)
                route = self._routes.get((device, prop, sig))
                if route is None:
                    route = self._route(builder, device, prop, sig, data)
                    if route is None:
                        return False
                value = data
            except (TypeError, ValueError) as exc:
                error_text = f"unrecordable data: {exc}"
        else:
            error_text = "no data" if error is None else f"{type(error).__name__}: {error}"
        if route is None:
            current = self.catalog.current(device, prop)
            key = (device, prop, 0 if current is None else current.number)
            slot = builder.key_slot(key, _EMPTY if current is None else current.arrow_type)
            if slot is None:
                return False
            route = slot
            value = None
        update_type = getattr(notification, "update_type", UpdateType.NORMAL)
        alarm = getattr(notification, "alarm", None)  # the severity the server computed
        row_selector = context.selector or selector or ""
        acq_stamp = context.acq_stamp
        if error_text is None:
            signal = (device, prop, row_selector)
            if update_type is UpdateType.FIRST:
                last = self._last_values.get(signal)
                if last is not None and last[0] == acq_stamp and last[1] == value:
                    # The value a resubscription starts with, already stored (same acquisition
                    # stamp, same value): one acquisition is one row, however often it is resent.
                    self._repeated_first += 1
                    return True
            self._last_values[signal] = (acq_stamp, value)
            if not acq_stamp:
                self._missing_stamp(device, prop)
        seq = self._next_seq
        self._next_seq = seq + 1
        self._received += 1
        self._pending_stamps[(device, prop)] = acq_stamp or recv_stamp
        builder.append_value(value)
        builder.append_row(
            (
                route,
                row_selector,
                acq_stamp,
                context.cycle_stamp,
                context.cycle_name,
                recv_stamp,
                seq,
                error_text,
                _UPDATE_NAMES[update_type],
                None if alarm is None else int(alarm.severity),
            )
        )
        return True

    def _missing_stamp(self, device: str, prop: str) -> None:
        # Writer thread only. Counted always, logged once per signal: a server that never
        # stamps would otherwise flood the log with one line per row. Error rows made by the
        # client itself (a lost connection) carry no server stamp by nature and are not counted.
        self._missing_stamps += 1
        if (device, prop) not in self._unstamped_signals:
            self._unstamped_signals.add((device, prop))
            log.warning(
                "recorder %s: %s/%s sent a value without acq_stamp (0); stored at its receive "
                "time (acq_stamp == recv_stamp), further ones are only counted "
                "(missing_acq_stamps)",
                self.recorder_id,
                device,
                prop,
            )

    def _route(
        self, builder: SegmentBuilder, device: str, prop: str, sig: tuple[Any, ...], data: Any
    ) -> int | None:
        """The builder slot for a value of signature ``sig`` (None: the segment is full).

        A signature keeps the schema version it was first given for the recorder's lifetime,
        so a value alternating between two types does not open a new version each time.
        """
        known = self._versions.get((device, prop, sig))
        if known is None:
            version = self.catalog.resolve(device, prop, arrow_type_of(data))
            # The value's field names in order (None: not a Data), against its version's below.
            names = tuple(data) if data.__class__ is Data else None
            known = self._versions[(device, prop, sig)] = (version.number, names)
            # One object per distinct type: keys given the same object share a union child of
            # the segment (SegmentBuilder.key_slot), a thousand properties of one type one child.
            kind = self._type_objects.setdefault(version.arrow_type, version.arrow_type)
            fields = tuple(field.name for field in kind)
            self._version_types[(device, prop, version.number)] = (kind, fields)
        number, names = known
        key = (device, prop, number)
        kind, fields = self._version_types[key]
        # A value with exactly its version's fields, in order (not an older, narrower shape:
        # the version may have widened since): the segment transposes such values into its
        # columns at once (SegmentBuilder.key_slot's ``exact``).
        slot = builder.key_slot(key, kind, names == fields)
        if slot is not None:
            self._routes[(device, prop, sig)] = slot
        return slot

    def _flush(self, builder: SegmentBuilder) -> bool:
        if not len(builder):
            return True
        try:
            segment = self.journal.write(builder)
        except OSError as exc:
            self._write_errors += 1
            self._last_error = f"journal write failed: {exc}"
            if self._state != "error":
                log.error(
                    "recorder %s: journal write failed, not acknowledging (%d rows held): %s",
                    self.recorder_id,
                    len(builder),
                    exc,
                )
            self._state = "error"
            return False
        if self._state == "error":
            log.warning("recorder %s: journal writable again, acknowledging", self.recorder_id)
            self._state = "running" if not self._stopping else self._state
        self._segments += 1
        self._bytes += segment.path.stat().st_size
        self._acked_rows += len(builder)
        self._acked_seq = segment.last_seq
        with self._ack_lock:
            self._acked_stamps.update(self._pending_stamps)
        self._pending_stamps.clear()
        history = self.history
        if history is not None:
            history.acked()  # seam waits re-check (after the lock: the handler takes its own)
        if self._on_ack is not None:
            self._on_ack(segment.first_seq, segment.last_seq)
        return True

    # --- the converter thread -----------------------------------------------------------------

    def _convert_loop(self) -> None:
        # Convert in batches every convert_interval: converting each 200 ms segment on its own
        # would write many tiny Parquet files.
        while not self._stop_event.wait(self.convert_interval):
            try:
                self.converter.convert_pending()
                self.converter.apply_retention()
            except Exception:  # logged and counted by the converter; retried next round
                continue
            self.maintain_store()

    def maintain_store(self, now: float | None = None) -> None:
        """Run compaction and partition retention when due (the converter thread calls it)."""
        now = time.time() if now is None else now
        if self.compact_interval is None and self.keep is None:
            return
        if now < self._next_compaction:
            return
        self._next_compaction = now + (self.compact_interval or self.convert_interval)
        try:
            if self.compact_interval is not None:
                done = compact_store(
                    self.store,
                    grace=self.compact_grace,
                    linger=self.compact_linger,
                    clock=lambda: now,
                    footers=self._footers,
                )
                self._compacted_files += len(done.outputs)
                self._compaction_removed += done.removed
            if self.keep is not None:
                self._partitions_deleted += len(
                    delete_older(self.store, self.keep, clock=lambda: now)
                )
        except Exception as exc:  # a store problem: logged, counted, retried next round
            self._compaction_errors += 1
            self._last_error = f"compaction failed: {exc}"
            log.exception("recorder %s: compaction or retention failed", self.recorder_id)
