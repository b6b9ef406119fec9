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
deduplicated the same way.

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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rda.pipeline.recorder.converter import partition_dir
from rda.pipeline.recorder.journal import Journal, read_segment
from rda.pipeline.recorder.readback import rows_to_data
from rda.pipeline.recorder.schema import partition_escape
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data

__all__ = ["Chunk", "Cursor", "HistoryReader", "HistoryRow"]

_DAY_NS = 86_400 * 10**9
_CACHE = 4096  # stamp ranges of files and segments kept (a few dozen bytes each)
# Parquet files kept decoded, in bytes: a long answer reads each file once, not once per chunk
# (a file holds a whole conversion group, up to a million rows, far more than one chunk).
_TABLE_CACHE_BYTES = 256 << 20


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


@dataclass(frozen=True, slots=True)
class Chunk:
    """Rows in order, as columns (what the wire carries); ``rows`` for one at a time."""

    acq_stamp: np.ndarray[Any, Any]
    cycle_stamp: np.ndarray[Any, Any]
    seq: np.ndarray[Any, Any]
    recorder: list[str]
    selector: list[str]
    cycle_name: list[str]
    error: list[str | None]
    data: list[Data | None]
    more: bool  # rows of the window remain after the last one

    @classmethod
    def empty(cls) -> Chunk:
        none = np.zeros(0, np.int64)
        return cls(none, none, none, [], [], [], [], [], False)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def rows(self) -> list[HistoryRow]:
        return [
            HistoryRow(
                int(self.acq_stamp[i]),
                int(self.cycle_stamp[i]),
                self.cycle_name[i],
                self.selector[i],
                self.recorder[i],
                int(self.seq[i]),
                self.error[i],
                self.data[i],
            )
            for i in range(len(self.data))
        ]


@dataclass(frozen=True, slots=True)
class _Source:
    first: int  # smallest acq_stamp of the key's rows in it
    last: int
    path: str
    journal: bool


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


class _Piece:
    """Rows of one source, already filtered to the window: meta columns and their values."""

    def __init__(self, table: pa.Table, data: pa.Array, recorder_id: str | None) -> None:
        self.acq = table.column("acq_stamp").to_numpy()
        self.seq = table.column("seq").to_numpy()
        self.table = table
        self.data = data
        if recorder_id is None:
            self.recorders = table.column("recorder_id").to_pylist()
        else:
            self.recorders = [recorder_id] * table.num_rows
        self.row_bytes = max(1, data.nbytes // max(1, len(data)))


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
        self._tables: collections.OrderedDict[tuple[str, int], pa.Table] = collections.OrderedDict()
        self._table_bytes = 0

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

    def _file_range(self, path: str, size: int) -> tuple[int, int] | None:
        key = (path, str(size), "")
        hit, value = self._cached(key)
        if hit:
            return value
        metadata = pq.read_metadata(path, filesystem=self.store.fs)
        index = metadata.schema.names.index("acq_stamp")
        low: int | None = None
        high: int | None = None
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max:
                low, high = -(2**63), 2**63 - 1  # no statistics: always read it
                break
            low = stats.min if low is None else min(low, stats.min)
            high = stats.max if high is None else max(high, stats.max)
        value = None if low is None or high is None else (int(low), int(high))
        self._remember(key, value)
        return value

    def _segment_range(self, path: Path, device: str, prop: str) -> tuple[int, int] | None:
        key = (str(path), device, prop)
        hit, value = self._cached(key)
        if hit:
            return value
        stamps = [
            _stored_stamps(meta)
            for (dev, name, _), meta, _ in read_segment(path)
            if dev == device and name == prop and len(meta)
        ]
        value = None
        if stamps:
            joined = pa.concat_arrays(stamps)
            value = (int(pc.min(joined).as_py()), int(pc.max(joined).as_py()))
        self._remember(key, value)
        return value

    def _sources(self, device: str, prop: str, low: int, end: int) -> list[_Source]:
        converted = self._converted_seq()  # first: see "Each row once"
        found: list[_Source] = []
        for segment in self.journal.segments():
            if segment.last_seq <= converted:
                continue
            try:
                span = self._segment_range(segment.path, device, prop)
            except FileNotFoundError:  # retention deleted it: converted long ago
                continue
            if span is not None:
                found.append(_Source(span[0], span[1], str(segment.path), True))
        for day in _days(low, end):
            for info in self.store.files(partition_dir(self.store, device, prop, day)):
                name = str(info.base_name)
                if not name.endswith(".parquet") or name.startswith(("_", ".")):
                    continue
                span = self._file_range(info.path, int(info.size or 0))
                if span is not None:
                    found.append(_Source(span[0], span[1], info.path, False))
        return sorted((s for s in found if s.last >= low and s.first < end), key=lambda s: s.first)

    # --- reading --------------------------------------------------------------------------------

    def _read(
        self, source: _Source, device: str, prop: str, low: int, end: int
    ) -> list[tuple[pa.Table, pa.Array]]:
        if source.journal:
            pieces = []
            for (dev, name, _), meta, data in read_segment(Path(source.path)):
                if dev != device or name != prop or not len(meta):
                    continue
                acq = _stored_stamps(meta)
                table = meta.set_column(meta.schema.get_field_index("acq_stamp"), "acq_stamp", acq)
                mask = pc.and_(pc.greater_equal(acq, low), pc.less(acq, end))
                pieces.append((table.filter(mask), data.filter(mask)))
            return pieces
        table = self._parquet(source.path)
        stamps = table.column("acq_stamp")
        table = table.filter(pc.and_(pc.greater_equal(stamps, low), pc.less(stamps, end)))
        data = (
            table.column("data").combine_chunks()
            if "data" in table.schema.names
            else pa.nulls(table.num_rows)
        )
        return [(table.drop_columns(["data"]), data)]

    def _parquet(self, path: str) -> pa.Table:
        """A whole Parquet file, decoded once and kept (bounded by bytes, least recent out)."""
        with self._lock:
            for key in self._tables:
                if key[0] == path:
                    self._tables.move_to_end(key)
                    return self._tables[key]
        table = pq.read_table(path, filesystem=self.store.fs)
        size = table.nbytes
        if size <= _TABLE_CACHE_BYTES // 4:
            with self._lock:
                self._tables[(path, size)] = table
                self._table_bytes += size
                while self._table_bytes > _TABLE_CACHE_BYTES:
                    (_, old), _ = self._tables.popitem(last=False)
                    self._table_bytes -= old
        return table

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
        """The next rows of ``[start, end)`` after ``after`` (see the module docstring)."""
        low = start if after is None else max(start, after.acq_stamp)
        if end <= low or max_rows < 1:
            return Chunk.empty()
        pieces: list[_Piece] = []
        stamps: list[np.ndarray[Any, Any]] = []
        count = 0
        left_over = False
        sources = self._sources(device, prop, low, end)
        for source in sources:
            if count >= max_rows:
                joined = np.concatenate(stamps)
                # Rows at the cursor's stamp may be delivered already: they do not count
                # towards this chunk's max_rows (else it could end a row short).
                wanted = max_rows + (int(np.count_nonzero(joined == low)) if after else 0)
                if count >= wanted and source.first > np.partition(joined, wanted - 1)[wanted - 1]:
                    left_over = True  # unread sources: rows remain after this chunk
                    break
            try:
                read = self._read(source, device, prop, low, end)
            except FileNotFoundError:
                continue  # a compaction replaced it; its output is listed too, or next time
            for table, data in read:
                if selector is not None:
                    keep = pc.equal(table.column("selector"), selector)
                    table, data = table.filter(keep), data.filter(keep)
                acq = table.column("acq_stamp").to_numpy()
                # Only the rows that can make this chunk: the max_rows smallest stamps (plus
                # those at the cursor's stamp, which may be delivered already). Keeps a chunk
                # O(max_rows) in Python however many rows remain in a big file.
                needed = max_rows + int(np.count_nonzero(acq == low))
                if len(acq) > needed:
                    left_over = True
                    nearest = pa.array(np.sort(np.argsort(acq, kind="stable")[:needed]))
                    table, data = table.take(nearest), data.take(nearest)
                if table.num_rows:
                    piece = _Piece(table, data, self.recorder_id if source.journal else None)
                    pieces.append(piece)
                    stamps.append(piece.acq)
                    count += table.num_rows
        chunk = self._assemble(pieces, after, max_rows, max_bytes)
        if left_over and not chunk.more and len(chunk):
            chunk = dataclasses.replace(chunk, more=True)
        return chunk

    def _assemble(
        self, pieces: list[_Piece], after: Cursor | None, max_rows: int, max_bytes: int
    ) -> Chunk:
        if not pieces:
            return Chunk.empty()
        acq = np.concatenate([p.acq for p in pieces])
        seq = np.concatenate([p.seq for p in pieces])
        names = sorted({r for p in pieces for r in set(p.recorders)})
        code_of = {name: code for code, name in enumerate(names)}
        recorder = np.concatenate(
            [
                np.fromiter((code_of[r] for r in p.recorders), np.int64, len(p.recorders))
                for p in pieces
            ]
        )
        number = np.concatenate([np.full(len(p.acq), n, np.int64) for n, p in enumerate(pieces)])
        index = np.concatenate([np.arange(len(p.acq), dtype=np.int64) for p in pieces])
        order = np.lexsort((seq, recorder, acq))
        acq, seq, recorder = acq[order], seq[order], recorder[order]
        number, index = number[order], index[order]
        # The same row read from two places: equal keys, adjacent once sorted.
        keep = np.ones(len(acq), bool)
        keep[1:] = (acq[1:] != acq[:-1]) | (recorder[1:] != recorder[:-1]) | (seq[1:] != seq[:-1])
        if after is not None:
            # Strictly after the cursor, by (acq_stamp, recorder_id, seq).
            later = [r > after.recorder_id for r in names]
            same = np.array([r == after.recorder_id for r in names])
            rec_later = np.array(later)[recorder]
            rec_same = same[recorder]
            keep &= (acq > after.acq_stamp) | (
                (acq == after.acq_stamp) & (rec_later | (rec_same & (seq > after.seq)))
            )
        chosen_at = np.flatnonzero(keep)
        sizes = np.array([pieces[n].row_bytes for n in number[chosen_at]], np.int64)
        # As many rows as fit in max_rows and max_bytes (at least one).
        within = int(np.searchsorted(np.cumsum(sizes), max_bytes, side="left")) + 1
        take = min(max_rows, within, len(chosen_at))
        more = take < len(chosen_at)
        chosen_at = chosen_at[:take]
        return self._columns(pieces, number[chosen_at], index[chosen_at], more)

    def _columns(
        self,
        pieces: list[_Piece],
        number: np.ndarray[Any, Any],
        index: np.ndarray[Any, Any],
        more: bool,
    ) -> Chunk:
        """The chosen rows (piece ``number[k]``, row ``index[k]``) as the chunk's columns."""
        count = len(number)
        acq = np.empty(count, np.int64)
        cycle = np.empty(count, np.int64)
        seq = np.empty(count, np.int64)
        lists: dict[str, list[Any]] = {
            name: [None] * count for name in ("recorder", "selector", "cycle_name", "error", "data")
        }
        for n in np.unique(number).tolist():
            at = np.flatnonzero(number == n)
            piece = pieces[n]
            rows = index[at]
            meta = piece.table.take(pa.array(rows))
            acq[at] = meta.column("acq_stamp").to_numpy()
            cycle[at] = meta.column("cycle_stamp").fill_null(0).to_numpy()
            seq[at] = meta.column("seq").to_numpy()
            found = {
                "selector": meta.column("selector").fill_null("").to_pylist(),
                "cycle_name": meta.column("cycle_name").fill_null("").to_pylist(),
                "error": meta.column("error").to_pylist(),
                "data": rows_to_data(piece.data.take(pa.array(rows))),
                "recorder": [piece.recorders[r] for r in rows.tolist()],
            }
            positions = at.tolist()
            for name, values in found.items():
                target = lists[name]
                for k, value in zip(positions, values, strict=True):
                    target[k] = value
        return Chunk(
            acq,
            cycle,
            seq,
            lists["recorder"],
            lists["selector"],
            lists["cycle_name"],
            lists["error"],
            lists["data"],
            more,
        )
