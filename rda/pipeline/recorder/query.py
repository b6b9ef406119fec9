"""History reads for the history server: the Parquet store and the unconverted journal together.

One call, :meth:`HistoryReader.chunk`, returns the next rows of one (device, property) in
acquisition-stamp order after a cursor, at most ``max_rows`` rows and about ``max_bytes``.
Nothing is kept between calls except caches of immutable facts (a file's stamp range), so a
client that goes away leaves nothing behind, and the recorder's writer never waits for a reader.

**Each row once.** A row is ``(recorder_id, seq)``. The reader first notes the converter's
``max_seq`` (every segment up to it is in the store: the converter writes the Parquet files
before it moves ``max_seq``, and converts segments in seq order), then lists the journal
segments past it, then the store's files. A segment converted in between is read twice, from
both places, and the duplicates (adjacent once sorted by ``(acq_stamp, recorder_id, seq)``)
are dropped; a segment is deleted only ``retention`` after its conversion, so none vanishes
between the two listings. A compaction in progress (inputs and output side by side) is
deduplicated the same way. A file listed but gone when read (a compaction's input deleted
after its linger, for a reader slower than that) makes the chunk list again and start over
(:meth:`HistoryReader.chunk`): never a chunk with that file's rows silently missing.

**Order and cursor.** Rows are ordered by ``(acq_stamp, recorder_id, seq)``; the cursor is
that triple of the last row delivered, so the next chunk starts strictly after it. To fill a
chunk the reader opens sources (files, segments) by increasing first stamp and stops when the
next source starts after the ``max_rows``-th smallest stamp it already has: every row of the
chunk is then known, and a chunk reads about ``max_rows`` rows, not the whole window.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rda.business.client.arrow_rows import rows_to_data
from rda.pipeline.recorder.converter import partition_dir
from rda.pipeline.recorder.journal import Journal, Segment, read_segment
from rda.pipeline.recorder.schema import partition_escape
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data
from rda.serialization.errors import HistoryUnavailableError

__all__ = ["CHUNK_FIRST", "RELISTS", "Chunk", "Cursor", "HistoryReader", "HistoryRow"]

_DAY_NS = 86_400 * 10**9
RELISTS = 3  # listings a chunk makes when listed files keep vanishing, before it gives up
_CACHE = 4096  # stamp ranges of files and segments kept (a few dozen bytes each)
# Parquet files (or row groups) kept decoded, in bytes: a long answer reads each once, not once
# per chunk, and a window asked again is answered without decoding. Sized to hold an hour of a
# 1 kHz scalar (about 270 MiB decoded): an LRU smaller than a window read in order evicts
# every group before it is asked again. Counted in HistoryServerStatistics (cache_*).
_TABLE_CACHE_BYTES = 512 << 20
_WHOLE_FILE_BYTES = 64 << 20  # a file up to this is decoded whole; a bigger one by row group
# A kept source used this recently (seconds) is not evicted for a new one: a window larger than
# the cache, read again, then finds all but its last sources kept (an LRU, read in order,
# would have evicted each before it was asked again, and decoded the whole window each time).
_HOT = 10.0


_TableKey = tuple[str, int, str, str]
_SEGMENT_ROWS = -2  # the "row group" of a cached journal segment's rows of one key


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """The position after which the next chunk starts: the last row's sort key."""

    acq_stamp: int
    recorder_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class HistoryRow:
    acq_stamp: int
    cycle_stamp: int
    cycle_name: str
    selector: str
    recorder_id: str
    seq: int
    error: str | None
    data: Data | None


# The chunk's columns, in order (the wire's contract, docs/history.md "The chunk"): these
# first, then any other column the store has (e.g. the update type, the alarm severity), then
# ``data``. Not sent: what is derived (``ts``), the receive time, the partition values.
CHUNK_FIRST = ("acq_stamp", "cycle_stamp", "cycle_name", "selector", "recorder_id", "seq", "error")
_NOT_SENT = frozenset({"ts", "recv_stamp", "data", "device", "property", "date"})
_NOT_READ = _NOT_SENT - {"data"}  # a Parquet file's columns not read at all


@dataclass(frozen=True, slots=True)
class Chunk:
    """Rows in order as one Arrow table (what the wire carries); ``rows`` for one at a time."""

    table: pa.Table
    more: bool  # rows of the window remain after the last one

    @classmethod
    def empty(cls) -> Chunk:
        return cls(pa.table({name: pa.array([], _META_TYPES[name]) for name in CHUNK_FIRST}), False)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def rows(self) -> list[HistoryRow]:
        table = self.table
        data: list[Data | None] = (
            rows_to_data(table.column("data"))
            if "data" in table.schema.names
            else [None] * table.num_rows
        )
        columns = {name: table.column(name).to_pylist() for name in CHUNK_FIRST}
        return [
            HistoryRow(
                int(columns["acq_stamp"][i]),
                int(columns["cycle_stamp"][i] or 0),
                columns["cycle_name"][i] or "",
                columns["selector"][i] or "",
                columns["recorder_id"][i],
                int(columns["seq"][i]),
                columns["error"][i],
                data[i],
            )
            for i in range(table.num_rows)
        ]


_META_TYPES: dict[str, pa.DataType] = {
    "acq_stamp": pa.int64(),
    "cycle_stamp": pa.int64(),
    "cycle_name": pa.string(),
    "selector": pa.string(),
    "recorder_id": pa.string(),
    "seq": pa.int64(),
    "error": pa.string(),
}


@dataclass(frozen=True, slots=True)
class _Source:
    first: int  # smallest acq_stamp of the key's rows in it
    last: int
    path: str
    journal: bool
    group: int = -1  # a Parquet file's row group (a file too big to keep whole), -1: all


@dataclass(frozen=True, slots=True)
class _SegmentRows:
    """One key's rows of a journal segment as kept: meta columns, values, and the stored
    stamps when they are in order (None otherwise: a window is then a filter, not a slice)."""

    table: pa.Table
    data: pa.Array
    stamps: np.ndarray[Any, Any] | None


def _days(start: int, end: int) -> list[str]:
    epoch = datetime.date(1970, 1, 1)
    first, last = start // _DAY_NS, (end - 1) // _DAY_NS
    return [(epoch + datetime.timedelta(days=d)).isoformat() for d in range(first, last + 1)]


def _stored_stamps(meta: pa.Table) -> pa.Array:
    # The store puts a row sent without a stamp at its receive time (docs/history.md); the
    # journal keeps the stamp as sent, so apply the same rule to journal rows.
    sent = meta.column("acq_stamp").combine_chunks()
    recv = meta.column("recv_stamp").combine_chunks()
    return pc.if_else(pc.equal(sent, 0), recv, sent)


def _strings(schema: pa.Schema, columns: list[str]) -> list[str]:
    """The top-level string columns of a Parquet file among ``columns``: read as dictionaries
    and then cast to plain strings (:func:`_plain_strings`), which decodes the store's
    mostly-constant text columns (recorder, cycle, selector, update type) several times
    faster than Parquet's own materialization of each row's string."""
    return [n for n in columns if pa.types.is_string(schema.field(n).type)]


def _plain_strings(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns cast back to ``string`` (what the chunk carries)."""
    for at, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            kind = field.type.value_type
            column = pa.chunked_array([_plain(c, kind) for c in table.column(at).chunks], kind)
            table = table.set_column(at, field.name, column)
    return table


def _plain(array: pa.DictionaryArray, kind: pa.DataType) -> pa.Array:
    """One dictionary chunk as plain strings. The store's text columns mostly hold one value
    (the recorder, an empty selector, no error): built from that value's bytes repeated, with
    the indices' validity, several times faster than the general cast (a take per row)."""
    values = array.dictionary
    count = len(array)
    if kind != pa.string() or array.offset or len(values) > 1 or values.null_count:
        return array.cast(kind)
    if not len(values):  # every row null
        return pa.nulls(count, kind)
    value = values[0].as_py().encode()
    width = len(value)
    if count * width >= 2**31 - 1:  # beyond 32-bit offsets
        return array.cast(kind)
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(width)
    validity = array.buffers()[0]
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(value * count)]
    return pa.Array.from_buffers(kind, count, buffers, array.null_count)


def _sorted(stamps: np.ndarray[Any, Any]) -> bool:
    return bool(len(stamps) < 2 or np.all(stamps[1:] >= stamps[:-1]))


def _shaped(table: pa.Table, data: pa.Array | pa.ChunkedArray, recorder_id: str | None) -> pa.Table:
    """A source's rows with the chunk's columns, in the chunk's order (no copy but a journal's
    recorder column: ``recorder_id``, when the source's rows carry none)."""
    count = table.num_rows
    columns: dict[str, Any] = {}
    for name in CHUNK_FIRST:
        if name == "recorder_id" and recorder_id is not None:
            columns[name] = pa.repeat(pa.scalar(recorder_id), count)
        else:
            columns[name] = table.column(name)
    for name in table.schema.names:
        if name not in columns and name not in _NOT_SENT:
            columns[name] = table.column(name)
    columns["data"] = data
    return pa.table(columns)


class _Piece:
    """Rows of one source, already filtered to the window, with the chunk's columns.

    ``row_bytes`` is the mean row size the chunk's byte bound counts for this source's rows:
    computed on the source's rows before they were cut to what the chunk can use, so the cut
    and the bound agree (``HistoryReader.chunk``)."""

    def __init__(self, table: pa.Table, recorder_id: str | None, row_bytes: int) -> None:
        count = table.num_rows
        self.table = table
        self.acq = table.column("acq_stamp").to_numpy()
        self.seq = table.column("seq").to_numpy()
        self.recorders = self.table.column("recorder_id")
        self.row_bytes = row_bytes
        # The one recorder of its rows (a journal's, a file's), and whether the rows are in
        # chunk order already: what lets a chunk be slices of its pieces (_assemble_runs).
        if recorder_id is None and count:
            names = pc.unique(self.recorders)
            recorder_id = str(names[0].as_py()) if len(names) == 1 else None
        self.recorder = recorder_id
        steps = np.diff(self.acq)
        self.ordered = bool(np.all(steps >= 0) and np.all(np.diff(self.seq)[steps == 0] > 0))

    def rows_until(self, after: Cursor) -> int:
        """How many of the first rows are at or before ``after`` (an ordered piece of one
        recorder)."""
        stamp = after.acq_stamp
        if self.recorder is None or self.recorder < after.recorder_id:
            return int(np.searchsorted(self.acq, stamp, "right"))
        low = int(np.searchsorted(self.acq, stamp, "left"))
        if self.recorder > after.recorder_id:
            return low
        high = int(np.searchsorted(self.acq, stamp, "right"))
        return low + int(np.searchsorted(self.seq[low:high], after.seq, "right"))


def _disjoint_runs(pieces: list[_Piece]) -> bool:
    """Each piece in order, each starting after the last stamp of the one before: their rows
    joined are in order, and none is in two of them."""
    return all(p.ordered for p in pieces) and all(
        a.acq[-1] < b.acq[0] for a, b in itertools.pairwise(pieces)
    )


class HistoryReader:
    """Reads one recorder's view of its history (see the module docstring)."""

    def __init__(
        self, store: Store, journal: Journal, converted_seq: Callable[[], int], recorder_id: str
    ) -> None:
        self.store = store
        self.journal = journal
        self.recorder_id = recorder_id
        self._converted_seq = converted_seq
        self._ranges: collections.OrderedDict[tuple[str, str, str], tuple[int, int] | None] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        # Decoded sources: a Parquet file or row group ``(path, group, "", "")``, a journal
        # segment's rows of one key ``(path, _SEGMENT_ROWS, device, property)``.
        self._tables: collections.OrderedDict[_TableKey, Any] = collections.OrderedDict()
        self._table_sizes: dict[_TableKey, int] = {}
        self._units: dict[tuple[str, str], dict[str, str]] = {}
        self._spans: collections.OrderedDict[tuple[str, int], list[tuple[int, int, int]]] = (
            collections.OrderedDict()
        )
        self._table_bytes = 0
        self._used: dict[_TableKey, float] = {}  # when each kept source was last used
        # The one source decoded last that the cache had no room for (all it held being hot),
        # kept aside for the next chunk, which usually reads it again: (key, entry, size).
        self._spare: tuple[_TableKey, Any, int] | None = None
        self._listed_names: frozenset[str] | None = None
        self._listed: list[Segment] = []
        # Per key, its journal sources for one listing and converted seq (the listing it was
        # made from, that seq, the sources): every chunk of a long answer asks for the same.
        self._journal_sources: collections.OrderedDict[
            tuple[str, str], tuple[list[Segment], int, list[_Source]]
        ] = collections.OrderedDict()
        self._relists = 0
        self._cache_hits = 0
        self._cache_misses = 0

    def units(self, device: str, prop: str) -> dict[str, str]:
        """The units of ``device/prop``'s fields as found in the store's files read so far."""
        with self._lock:
            return dict(self._units.get((device, prop), {}))

    def known(self, device: str, prop: str) -> bool:
        """Whether the store holds a partition of the key (history from an earlier run)."""
        key = self.store.path(
            f"device={partition_escape(device)}", f"property={partition_escape(prop)}"
        )
        return self.store.is_dir(key)

    # --- sources ------------------------------------------------------------------------------

    def _remember(self, key: tuple[str, str, str], value: tuple[int, int] | None) -> None:
        with self._lock:
            self._ranges[key] = value
            if len(self._ranges) > _CACHE:
                self._ranges.popitem(last=False)

    def _cached(self, key: tuple[str, str, str]) -> tuple[bool, tuple[int, int] | None]:
        with self._lock:
            if key in self._ranges:
                self._ranges.move_to_end(key)
                return True, self._ranges[key]
        return False, None

    def _file_spans(self, path: str, size: int) -> list[tuple[int, int, int]]:
        """``(row group or -1 for the whole file, first stamp, last stamp)`` of a Parquet file:
        one span for a file small enough to keep decoded, one per row group otherwise."""
        key = (path, size)
        with self._lock:
            if key in self._spans:
                self._spans.move_to_end(key)
                return self._spans[key]
        metadata = pq.read_metadata(path, filesystem=self.store.fs)
        index = metadata.schema.names.index("acq_stamp")
        groups: list[tuple[int, int, int]] = []
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            if not row_group.num_rows:
                continue
            stats = row_group.column(index).statistics
            if stats is None or not stats.has_min_max:
                groups.append((group, -(2**63), 2**63 - 1))  # no statistics: always read it
            else:
                groups.append((group, int(stats.min), int(stats.max)))
        whole = sum(metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups))
        spans = groups
        if groups and whole <= _WHOLE_FILE_BYTES:
            spans = [(-1, min(g[1] for g in groups), max(g[2] for g in groups))]
        with self._lock:
            self._spans[key] = spans
            if len(self._spans) > _CACHE:
                self._spans.popitem(last=False)
        return spans

    def _segment_range(self, path: Path, device: str, prop: str) -> tuple[int, int] | None:
        key = (str(path), device, prop)
        hit, value = self._cached(key)
        if hit:
            return value
        stamps = [
            piece.table.column("acq_stamp") for piece in self._segment_rows(path, device, prop)
        ]
        value = None
        if stamps:
            value = (
                min(int(pc.min(column).as_py()) for column in stamps),
                max(int(pc.max(column).as_py()) for column in stamps),
            )
        self._remember(key, value)
        return value

    def _segment_rows(self, path: Path, device: str, prop: str) -> list[_SegmentRows]:
        """The rows of ``device/prop`` in a journal segment, the store's stamp rule applied,
        decoded once and kept like a Parquet file (a segment is immutable once listed): its
        range and each chunk that reads it use the same decoding."""
        key = (str(path), _SEGMENT_ROWS, device, prop)
        entry = self._kept(key)
        if entry is not None:
            rows: list[_SegmentRows] = entry
            return rows
        rows = []
        for (dev, name, _), meta, data in read_segment(path):
            if dev == device and name == prop and len(meta):
                at = meta.schema.get_field_index("acq_stamp")
                stored = _stored_stamps(meta)
                stamps = stored.to_numpy()
                table = meta.set_column(at, "acq_stamp", stored)
                rows.append(_SegmentRows(table, data, stamps if _sorted(stamps) else None))
        self._keep(key, rows, sum(r.table.nbytes + r.data.nbytes for r in rows))
        return rows

    def _kept(self, key: _TableKey) -> Any:
        """A decoded source from the cache (None if not there), counted."""
        with self._lock:
            entry = self._tables.get(key)
            if entry is not None:
                self._tables.move_to_end(key)
                self._used[key] = time.monotonic()
                self._cache_hits += 1
                return entry
            if self._spare is not None and self._spare[0] == key:
                self._cache_hits += 1
                return self._spare[1]
            self._cache_misses += 1
        return None

    def _keep(self, key: _TableKey, entry: Any, size: int) -> None:
        """Keep a decoded source (bounded by bytes, least recent out, unless everything kept
        is hot: then the new source goes aside, alone, see :data:`_HOT`)."""
        if size > _TABLE_CACHE_BYTES // 4:
            return
        with self._lock:
            if key in self._tables:  # decoded by two chunks at once: counted once
                return
            now = time.monotonic()
            while self._tables and self._table_bytes + size > _TABLE_CACHE_BYTES:
                old = next(iter(self._tables))
                if now - self._used[old] < _HOT:
                    self._spare = (key, entry, size)
                    return
                del self._tables[old], self._used[old]
                self._table_bytes -= self._table_sizes.pop(old)
            self._tables[key] = entry
            self._table_sizes[key] = size
            self._used[key] = now
            if self._spare is not None and self._spare[0] == key:
                self._spare = None
            self._table_bytes += size

    def _journal_segments(self) -> list[Segment]:
        """``Journal.segments()``, listed again only when the directory's names changed: a
        long answer lists once per chunk, and building a Segment per file (hundreds for an
        hour) cost more than the rest of a chunk's listing. A segment's name is its seq range,
        so the same names are the same segments; a file made or deleted while the journal
        lists changes the names the next chunk sees, which lists again."""
        try:
            names = frozenset(entry.name for entry in os.scandir(self.journal.directory))
        except FileNotFoundError:
            names = frozenset()
        with self._lock:
            if names == self._listed_names:
                return self._listed
        listed = self.journal.segments()
        with self._lock:
            self._listed_names, self._listed = names, listed
        return listed

    def _sources(self, device: str, prop: str, low: int, end: int) -> list[_Source]:
        converted = self._converted_seq()  # first: see "Each row once"
        found = list(self._segment_sources(device, prop, converted))
        for day in _days(low, end):
            for info in self.store.files(partition_dir(self.store, device, prop, day)):
                name = str(info.base_name)
                if not name.endswith(".parquet") or name.startswith(("_", ".")):
                    continue
                for group, first, last in self._file_spans(info.path, int(info.size or 0)):
                    found.append(_Source(first, last, info.path, False, group))
        return sorted((s for s in found if s.last >= low and s.first < end), key=lambda s: s.first)

    def _segment_sources(self, device: str, prop: str, converted: int) -> list[_Source]:
        """The unconverted journal segments holding rows of the key, with their stamp spans:
        worked out once per listing and converted seq (an hour's answer of 16 chunks over
        720 segments otherwise looked each segment's span up again for every chunk)."""
        listed = self._journal_segments()
        key = (device, prop)
        with self._lock:
            kept = self._journal_sources.get(key)
            if kept is not None and kept[0] is listed and kept[1] == converted:
                self._journal_sources.move_to_end(key)
                return kept[2]
        found: list[_Source] = []
        for segment in listed:
            if segment.last_seq <= converted:
                continue
            try:
                span = self._segment_range(segment.path, device, prop)
            except FileNotFoundError:  # retention deleted it: converted long ago
                continue
            if span is not None:
                found.append(_Source(span[0], span[1], str(segment.path), True))
        with self._lock:
            self._journal_sources[key] = (listed, converted, found)
            self._journal_sources.move_to_end(key)
            if len(self._journal_sources) > _CACHE:
                self._journal_sources.popitem(last=False)
        return found

    # --- reading --------------------------------------------------------------------------------

    def _read(
        self, source: _Source, device: str, prop: str, low: int, end: int
    ) -> list[tuple[pa.Table, pa.Array | pa.ChunkedArray]]:
        if source.journal:
            pieces: list[tuple[pa.Table, pa.Array | pa.ChunkedArray]] = []
            for rows in self._segment_rows(Path(source.path), device, prop):
                if rows.stamps is not None:
                    # In stamp order (the usual case): the window is a slice of the mapped
                    # segment. A filter would copy every value of the segment on every chunk
                    # that reads it (a segment of 1 MiB arrays: all its MiB, each time).
                    first = int(np.searchsorted(rows.stamps, low, "left"))
                    count = int(np.searchsorted(rows.stamps, end, "left")) - first
                    pieces.append((rows.table.slice(first, count), rows.data.slice(first, count)))
                    continue
                acq = rows.table.column("acq_stamp")
                mask = pc.and_(pc.greater_equal(acq, low), pc.less(acq, end))
                pieces.append((rows.table.filter(mask), rows.data.filter(mask)))
            return pieces
        table, stamps = self._parquet(source.path, source.group)
        units = (table.schema.metadata or {}).get(b"rda.units")
        if units is not None:  # what the property declared when the file was written
            with self._lock:
                self._units[(device, prop)] = json.loads(units)
        if stamps is not None:  # in stamp order (the usual case): the window is a slice
            first = int(np.searchsorted(stamps, low, "left"))
            table = table.slice(first, int(np.searchsorted(stamps, end, "left")) - first)
        else:
            column = table.column("acq_stamp")
            table = table.filter(pc.and_(pc.greater_equal(column, low), pc.less(column, end)))
        # The column as read (one chunk per row group), not combined: combining would copy the
        # rest of the file on every chunk of a long answer.
        data = table.column("data") if "data" in table.schema.names else pa.nulls(table.num_rows)
        return [(table.drop_columns(["data"]), data)]

    def _parquet(self, path: str, group: int) -> tuple[pa.Table, np.ndarray[Any, Any] | None]:
        """A Parquet file (``group`` -1) or one of its row groups, decoded once and kept
        (bounded by bytes, least recent out), with its stamps when they are in order (else
        None): a long answer reads each once, not once per chunk."""
        key = (path, group, "", "")
        entry = self._kept(key)
        if entry is not None:
            kept: tuple[pa.Table, np.ndarray[Any, Any] | None] = entry
            return kept
        with self.store.fs.open_input_file(path) as source:
            parquet = pq.ParquetFile(source, pre_buffer=True)
            # Only what a chunk carries: the derived and receive stamps are half the bytes of
            # a scalar's row and never sent (_NOT_SENT; the journal's are read for its stamps).
            columns = [n for n in parquet.schema_arrow.names if n not in _NOT_READ]
            strings = _strings(parquet.schema_arrow, columns)
            if strings:
                parquet = pq.ParquetFile(
                    source, pre_buffer=True, metadata=parquet.metadata, read_dictionary=strings
                )
            if group < 0:
                table = parquet.read(columns=columns)
            else:
                table = parquet.read_row_group(group, columns=columns)
        table = _plain_strings(table)
        stamps = table.column("acq_stamp").to_numpy()
        entry = (table, stamps if _sorted(stamps) else None)
        self._keep(key, entry, int(table.nbytes))
        return entry

    def chunk(
        self,
        device: str,
        prop: str,
        start: int,
        end: int,
        *,
        after: Cursor | None = None,
        selector: str | None = None,
        max_rows: int = 1000,
        max_bytes: int = 8 << 20,
    ) -> Chunk:
        """The next rows of ``[start, end)`` after ``after`` (see the module docstring).

        A listed file that is gone when read (a compaction's input deleted after its linger,
        a segment after its retention) makes the chunk list its sources again and start over:
        the rows are in what replaced it. After :data:`RELISTS` listings in a row that each
        met a missing file, :class:`HistoryUnavailableError` (the client sees it; no row is
        silently left out)."""
        missing: FileNotFoundError | None = None
        for _ in range(RELISTS):
            try:
                return self._chunk(device, prop, start, end, after, selector, max_rows, max_bytes)
            except FileNotFoundError as exc:
                missing = exc
                with self._lock:
                    self._relists += 1
        raise HistoryUnavailableError(
            f"{device}/{prop}: the store changed under the read {RELISTS} times in a row "
            f"(compaction or retention deleting what was listed: {missing}); ask again"
        )

    def cache(self) -> tuple[int, int, int]:
        """The decoded-file cache: ``(hits, misses, bytes held)``; at most 512 MiB held, and
        one source aside (at most a quarter of that)."""
        with self._lock:
            spare = self._spare[2] if self._spare is not None else 0
            return self._cache_hits, self._cache_misses, self._table_bytes + spare

    def relists(self) -> int:
        """How many times a chunk listed its sources again because a listed file was gone."""
        with self._lock:
            return self._relists

    def _chunk(
        self,
        device: str,
        prop: str,
        start: int,
        end: int,
        after: Cursor | None,
        selector: str | None,
        max_rows: int,
        max_bytes: int,
    ) -> Chunk:
        low = start if after is None else max(start, after.acq_stamp)
        if end <= low or max_rows < 1:
            return Chunk.empty()
        pieces: list[_Piece] = []
        count = 0
        left_over = False
        sources = self._sources(device, prop, low, end)
        size = 0
        for source in sources:
            if (count >= max_rows or size >= max_bytes) and source.first > self._bound(
                pieces, low if after else None, max_rows, max_bytes
            ):
                left_over = True  # unread sources: rows remain after this chunk
                break
            for table, data in self._read(source, device, prop, low, end):
                if selector is not None:
                    keep = pc.equal(table.column("selector"), selector)
                    table, data = table.filter(keep), data.filter(keep)
                recorder = self.recorder_id if source.journal else None
                shaped = _shaped(table, data, recorder)
                acq = table.column("acq_stamp").to_numpy()
                row_bytes = max(1, shaped.nbytes // max(1, shaped.num_rows))
                # Only the rows that can make this chunk: the max_rows smallest stamps, and
                # no more than the source's rows that fill max_bytes on their own (plus those
                # at the cursor's stamp, which may be delivered already). Keeps a chunk
                # O(its size) however many rows remain in a big file.
                fill = min(max_rows, max_bytes // row_bytes + 1)
                needed = fill + int(np.count_nonzero(acq == low))
                if len(acq) > needed:
                    left_over = True
                    if _sorted(acq):
                        shaped = shaped.slice(0, needed)
                    else:
                        nearest = pa.array(np.sort(np.argsort(acq, kind="stable")[:needed]))
                        shaped = shaped.take(nearest)
                if shaped.num_rows:
                    piece = _Piece(shaped, recorder, row_bytes)
                    pieces.append(piece)
                    count += shaped.num_rows
                    size += piece.row_bytes * shaped.num_rows
        chunk = self._assemble(pieces, after, max_rows, max_bytes)
        if left_over and not chunk.more and len(chunk):
            chunk = dataclasses.replace(chunk, more=True)
        return chunk

    @staticmethod
    def _bound(pieces: list[_Piece], cursor: int | None, max_rows: int, max_bytes: int) -> float:
        """The stamp past which no row can make this chunk, from the rows read so far: that of
        its ``max_rows``-th row, or of the row where its ``max_bytes`` are reached. Rows at
        the cursor's stamp may be delivered already: they count towards neither (else a chunk
        could end a row short)."""
        joined = np.concatenate([p.acq for p in pieces])
        sizes = np.concatenate([np.full(len(p.acq), p.row_bytes, np.int64) for p in pieces])
        if _disjoint_runs(pieces):  # the usual case: in order already, no row twice
            ordered = joined
        else:
            # A row read from two places counts once (the chunk keeps one copy).
            seqs = np.concatenate([p.seq for p in pieces])
            order = np.lexsort((seqs, joined))
            ordered, seqs, sizes = joined[order], seqs[order], sizes[order]
            once = np.ones(len(ordered), bool)
            once[1:] = (ordered[1:] != ordered[:-1]) | (seqs[1:] != seqs[:-1])
            ordered, sizes = ordered[once], sizes[once]
        skip = int(np.count_nonzero(ordered == cursor)) if cursor is not None else 0
        bound = math.inf
        if len(ordered) >= max_rows + skip:
            bound = float(ordered[max_rows + skip - 1])
        spent = np.cumsum(sizes[skip:])
        if len(spent) and spent[-1] >= max_bytes:
            bound = min(bound, float(ordered[skip + int(np.searchsorted(spent, max_bytes))]))
        return bound

    def _assemble(
        self, pieces: list[_Piece], after: Cursor | None, max_rows: int, max_bytes: int
    ) -> Chunk:
        if not pieces:
            return Chunk.empty()
        runs = self._assemble_runs(pieces, after, max_rows, max_bytes)
        if runs is not None:
            return runs
        acq = np.concatenate([p.acq for p in pieces])
        seq = np.concatenate([p.seq for p in pieces])
        names = sorted({str(r) for p in pieces for r in pc.unique(p.recorders).to_pylist()})
        value_set = pa.array(names, pa.string())
        recorder = np.concatenate(
            [pc.index_in(p.recorders, value_set=value_set).to_numpy() for p in pieces]
        ).astype(np.int64)
        number = np.concatenate([np.full(len(p.acq), n, np.int64) for n, p in enumerate(pieces)])
        index = np.concatenate([np.arange(len(p.acq), dtype=np.int64) for p in pieces])
        # Of a row read from two places, the copy counted at the larger row size comes first
        # and is kept: a source cut to the rows that fill max_bytes on their own (chunk) then
        # still fills it, so the chunk cannot pass rows the cut left out.
        row_size = np.array([p.row_bytes for p in pieces], np.int64)[number]
        order = np.lexsort((-row_size, seq, recorder, acq))
        acq, seq, recorder = acq[order], seq[order], recorder[order]
        number, index = number[order], index[order]
        # The same row read from two places: equal keys, adjacent once sorted.
        keep = np.ones(len(acq), bool)
        keep[1:] = (acq[1:] != acq[:-1]) | (recorder[1:] != recorder[:-1]) | (seq[1:] != seq[:-1])
        if after is not None:
            # Strictly after the cursor, by (acq_stamp, recorder_id, seq).
            rec_later = np.array([r > after.recorder_id for r in names])[recorder]
            rec_same = np.array([r == after.recorder_id for r in names])[recorder]
            keep &= (acq > after.acq_stamp) | (
                (acq == after.acq_stamp) & (rec_later | (rec_same & (seq > after.seq)))
            )
        chosen_at = np.flatnonzero(keep)
        sizes = np.array([p.row_bytes for p in pieces], np.int64)[number[chosen_at]]
        # As many rows as fit in max_rows and max_bytes (at least one).
        within = int(np.searchsorted(np.cumsum(sizes), max_bytes, side="left")) + 1
        take = min(max_rows, within, len(chosen_at))
        more = take < len(chosen_at)
        chosen_at = chosen_at[:take]
        number, index = number[chosen_at], index[chosen_at]
        # One table needs one type per column: a piece whose types conflict with those before
        # it (a field that changed type: a new schema version) starts the next chunk.
        used = list(dict.fromkeys(number.tolist()))
        schema = pieces[used[0]].table.schema
        for n in used[1:]:
            try:
                schema = pa.unify_schemas(
                    [schema, pieces[n].table.schema], promote_options="permissive"
                )
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                cut = int(np.flatnonzero(number == n)[0])
                number, index, more = number[:cut], index[:cut], True
                break
        return Chunk(self._table(pieces, number, index), more)

    @staticmethod
    def _assemble_runs(
        pieces: list[_Piece], after: Cursor | None, max_rows: int, max_bytes: int
    ) -> Chunk | None:
        """The usual case, without sorting or copying: each piece is in order and of one
        recorder, and each starts after the last stamp of the one before (so no row is in two
        of them): the chunk is a slice of each, one after the other. None otherwise."""
        if not _disjoint_runs(pieces) or any(p.recorder is None for p in pieces):
            return None
        slices: list[pa.Table] = []
        schema: pa.Schema | None = None
        rows, size, more = 0, 0, False
        for piece in pieces:
            first = 0 if after is None else piece.rows_until(after)
            left = len(piece.acq) - first
            if left <= 0:
                continue
            fit = (max_bytes - size) // piece.row_bytes
            take = min(left, max_rows - rows, fit if slices else max(1, fit))
            if take > 0:
                try:
                    schema = (
                        piece.table.schema
                        if schema is None
                        else pa.unify_schemas(
                            [schema, piece.table.schema], promote_options="permissive"
                        )
                    )
                except (pa.ArrowTypeError, pa.ArrowInvalid):
                    return Chunk(pa.concat_tables(slices, promote_options="permissive"), True)
                slices.append(piece.table.slice(first, take))
                rows += take
                size += take * piece.row_bytes
            if take < left:
                more = True
                break
        if not slices:
            return Chunk.empty()
        return Chunk(pa.concat_tables(slices, promote_options="permissive"), more)

    @staticmethod
    def _table(
        pieces: list[_Piece], number: np.ndarray[Any, Any], index: np.ndarray[Any, Any]
    ) -> pa.Table:
        """The chosen rows (piece ``number[k]``, row ``index[k]``) as one table, in order."""
        count = len(number)
        if count and number[0] == number[-1] and np.all(number == number[0]):
            first = int(index[0])
            if index[-1] - first == count - 1 and _sorted(index):  # a run: a zero-copy slice
                return pieces[int(number[0])].table.slice(first, count)
        parts: list[pa.Table] = []
        positions: list[np.ndarray[Any, Any]] = []
        for n in np.unique(number).tolist():
            at = np.flatnonzero(number == n)
            parts.append(pieces[n].table.take(pa.array(index[at])))
            positions.append(at)
        table = pa.concat_tables(parts, promote_options="permissive")
        return table.take(pa.array(np.argsort(np.concatenate(positions), kind="stable")))
