"""The recorder's journal: durable Arrow IPC segments, the only thing an acknowledgement trusts.

A segment is one Arrow IPC *file* ``seg-<firstseq>-<lastseq>.arrow`` in ``root/_journal/<id>/``,
written to a hidden temporary name, fsynced, renamed, and the directory fsynced: only after
that rename is durable do its rows count as acknowledged. A crash leaves either the whole
segment or only a ``.tmp`` file, which recovery deletes (its rows were never acknowledged).

One segment holds rows of many (device, property, schema version) keys. Arrow IPC needs one
schema per file, so ``data`` is a dense union with one struct child per distinct Arrow *type*
of the segment's keys, and the ``key`` column (int32) gives each row's index in the
``rda.keys`` metadata list: keys of one type (a thousand power supplies publishing the same
struct) share one child, so a segment holds any number of keys and still one row per row, no
per-key padding. A union has at most :data:`MAX_TYPES` children; a segment written before the
``key`` column existed has one child per key (its type code is the key's index) and is read
the same way.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rda.pipeline.recorder.schema import build_array
from rda.pipeline.recorder.store import fsync_directory, write_durably
from rda.serialization.data import Data

__all__ = [
    "MAX_TYPES",
    "Journal",
    "Segment",
    "SegmentBuilder",
    "fsync_directory",
    "read_segment",
    "segment_layout",
    "write_durably",
]

log = logging.getLogger("rda.pipeline.recorder.journal")

MAX_TYPES = 127  # distinct value types per segment: dense union type codes are int8
_SEGMENT = re.compile(r"^seg-(\d{20})-(\d{20})\.arrow$")
_META_FIELDS = [
    pa.field("selector", pa.string()),
    pa.field("acq_stamp", pa.int64()),
    pa.field("cycle_stamp", pa.int64()),
    pa.field("cycle_name", pa.string()),
    pa.field("recv_stamp", pa.int64()),
    pa.field("seq", pa.int64()),
    pa.field("error", pa.string()),
    # The update's type by name (FIRST, NORMAL, IMMEDIATE_UPDATE, ...): a FIRST is the value
    # a (re)subscription started with, not necessarily a new acquisition. Absent from segments
    # written before it existed (read back as null).
    pa.field("update_type", pa.string()),
    # The alarm severity the server computed for the value (0 NONE, 1 MINOR, 2 MAJOR,
    # 3 INVALID: rda.Severity, EPICS numbering); null when the notification carried no alarm
    # state (a Sample, rows recorded before the column existed).
    pa.field("alarm_severity", pa.int8()),
]

Key = tuple[str, str, int]  # (device, property, schema version)
# One row's columns as the writer hands them to ``SegmentBuilder.append_row``: the key's slot,
# then the meta columns in ``_META_FIELDS`` order (the value goes to ``append_value``).
Row = tuple[int, str, int, int, str, int, int, str | None, str, int | None]
ROW_WIDTH = 10
_SEQ, _RECV_STAMP = 6, 5  # where these are in a Row
_EMPTY = pa.struct([])


class SegmentBuilder:
    """Rows of one segment: each row's columns (``append_row``, one tuple) and its value
    (``append_value``, in the same order); Arrow arrays at ``build``.

    The columns of every row go end to end into one flat list (``list.extend`` of the row's
    tuple): the writer's cost per row is one short-lived tuple and two list calls, not one
    append per column, and no object per row outlives the call (each one would count towards
    the garbage collector's next pass, which walks every queued row). ``build`` takes each
    column as a slice of stride ``ROW_WIDTH``, then lays each union child's values out with
    numpy index arithmetic. ``add`` does both by name.
    """

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.key_types: list[pa.StructType] = []
        self._index: dict[Key, int] = {}
        self._type_keys: dict[int, int] = {}  # id(type) -> how many keys have it now
        self._alive: list[pa.StructType] = []
        # Per key: True while every value added to it has exactly its type's fields, in
        # order (``key_slot``'s ``exact``): its values are transposed into columns directly.
        self._exact: list[bool] = []
        self.columns: list[Any] = []  # the rows' columns, row after row (ROW_WIDTH each)
        self.values: list[Any] = []  # each row's value (None for an error row)
        self.append_row = self.columns.extend
        self.append_value = self.values.append

    def __len__(self) -> int:
        return len(self.values)

    @property
    def first_seq(self) -> int:
        return int(self.columns[_SEQ])

    @property
    def last_seq(self) -> int:
        return int(self.columns[_SEQ - ROW_WIDTH])

    @property
    def first_recv_stamp(self) -> int:
        return int(self.columns[_RECV_STAMP])

    def key_slot(self, key: Key, arrow_type: pa.StructType, exact: bool = False) -> int | None:
        """The index of ``key`` (its type widened to ``arrow_type``), None when ``arrow_type``
        would be the segment's ``MAX_TYPES + 1``-th distinct type.

        Keys share a union child when they are given the *same* type object (the recorder
        hands out one object per distinct type): grouping by identity costs a pointer, where
        hashing an Arrow struct type costs microseconds, once per key and segment. Equal types
        given as distinct objects are still stored right, in children of their own.

        ``exact`` promises that every value the caller adds through this slot is a ``Data``
        whose fields are exactly ``arrow_type``'s, in its order (not None, not narrower):
        ``build`` then takes its columns by transposing the values instead of by name."""
        slot = self._index.get(key)
        current = None if slot is None else self.key_types[slot]
        if current is arrow_type or (current is not None and current.equals(arrow_type)):
            assert slot is not None
            self._exact[slot] = self._exact[slot] and exact
            return slot
        counts = self._type_keys
        if id(arrow_type) not in counts and len(counts) >= MAX_TYPES:
            return None
        counts[id(arrow_type)] = counts.get(id(arrow_type), 0) + 1
        self._alive.append(arrow_type)  # ids stay unique while the builder lives
        if slot is None:
            slot = self._index[key] = len(self.keys)
            self.keys.append(key)
            self.key_types.append(arrow_type)
            self._exact.append(exact)
            return slot
        assert current is not None
        counts[id(current)] -= 1
        if not counts[id(current)]:
            del counts[id(current)]
        self.key_types[slot] = arrow_type
        self._exact[slot] = False  # values of the narrower type are in it already
        return slot

    def add(
        self,
        slot: int,
        value: Any,
        selector: str,
        acq_stamp: int,
        cycle_stamp: int,
        cycle_name: str,
        recv_stamp: int,
        seq: int,
        error: str | None,
        update_type: str = "NORMAL",
        alarm_severity: int | None = None,
    ) -> None:
        """One row, by name (what ``append_row`` and ``append_value`` take)."""
        self.values.append(value)
        self.append_row(
            (
                slot,
                selector,
                acq_stamp,
                cycle_stamp,
                cycle_name,
                recv_stamp,
                seq,
                error,
                update_type,
                alarm_severity,
            )
        )

    def build(self, recorder_id: str) -> pa.Table:
        """The segment's table: meta columns, ``key``, and the dense-union ``data`` column."""
        count = len(self.values)
        if not count:
            raise ValueError("a segment needs at least one row")
        flat = self.columns
        if len(flat) != count * ROW_WIDTH:
            raise ValueError(f"rows of {len(flat) / count} columns, not {ROW_WIDTH}")
        slots = flat[0::ROW_WIDTH]
        meta = [flat[i::ROW_WIDTH] for i in range(1, ROW_WIDTH)]
        values = self.values
        row_keys = np.fromiter(slots, np.int32, count)
        # One union child per distinct type: the keys of a type are laid end to end in it
        # (in slot order), so a row's offset is its key's start in the child plus its rank
        # among its key's rows.
        per_key = np.bincount(row_keys, minlength=len(self.keys))
        child_of: dict[int, int] = {}  # id(type) -> child (key_slot: one object per type)
        child_types: list[pa.StructType] = []
        child_exact: list[bool] = []
        child_length: list[int] = []
        code = np.empty(len(self.keys), np.int8)
        start = np.empty(len(self.keys), np.int32)
        for slot, kind in enumerate(self.key_types):
            child = child_of.get(id(kind))
            if child is None:
                child = child_of[id(kind)] = len(child_types)
                child_types.append(kind)
                child_exact.append(True)
                child_length.append(0)
            code[slot] = child
            start[slot] = child_length[child]
            child_length[child] += int(per_key[slot])
            child_exact[child] = child_exact[child] and self._exact[slot]
        order = np.argsort(row_keys, kind="stable")  # by key, in row (seq) order within one
        first_of_key = np.zeros(len(self.keys), np.int64)
        np.cumsum(per_key[:-1], out=first_of_key[1:])
        rank = np.empty(count, np.int64)
        rank[order] = np.arange(count) - first_of_key[row_keys[order]]
        row_codes = code[row_keys]
        children = []
        for child, kind in enumerate(child_types):
            rows = order if len(child_types) == 1 else order[row_codes[order] == child]
            in_order = (
                values
                if len(rows) == count and bool((rows[1:] > rows[:-1]).all())
                else [values[i] for i in rows.tolist()]
            )
            children.append(_child_array(in_order, kind, child_exact[child]))
        data = pa.UnionArray.from_dense(
            pa.array(row_codes),
            pa.array((start[row_keys] + rank).astype(np.int32)),
            children,
            [f"t{i}" for i in range(len(children))],
        )
        columns = [pa.array(column, f.type) for column, f in zip(meta, _META_FIELDS, strict=True)]
        columns += [pa.array(row_keys), data]
        metadata = {"rda.keys": json.dumps(self.keys), "rda.recorder_id": recorder_id}
        fields = [*_META_FIELDS, pa.field("key", pa.int32()), pa.field("data", data.type)]
        return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=metadata))


def _child_array(values: Sequence[Any], kind: pa.StructType, exact: bool) -> pa.Array:
    """One union child: the values of its keys, end to end.

    Exact values (``key_slot``) are read in one pass into one flat list, field after field
    and row after row, whose every ``num_fields``-th item is one column: no lookup by name
    per field and row, and no per-row object kept alive for the collector to walk."""
    width = kind.num_fields
    if exact and values and width:
        flat = list(itertools.chain.from_iterable(map(Data.values, values)))
        if len(flat) == width * len(values):
            arrays = [build_array(flat[i::width], f.type) for i, f in enumerate(kind)]
            return pa.StructArray.from_arrays(arrays, fields=list(kind))
    return build_array(values, kind)


@dataclass(frozen=True, slots=True)
class Segment:
    """A durable segment on disk: its path and the seq range it holds."""

    path: Path
    first_seq: int
    last_seq: int

    @property
    def name(self) -> str:
        return self.path.name


def segment_layout(
    table: pa.Table,
) -> tuple[pa.UnionArray, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A segment table's ``data`` union and, per row, its key index (in ``rda.keys``), its
    union child (type code) and its offset in that child. A segment written before the
    ``key`` column had one child per key: its type code is the key index."""
    union = table.column("data").combine_chunks()
    codes = union.type_codes.to_numpy(zero_copy_only=False)
    offsets = union.offsets.to_numpy(zero_copy_only=False)
    if "key" in table.column_names:
        return union, table.column("key").to_numpy(), codes, offsets
    return union, codes.astype(np.int32), codes, offsets


def read_segment(path: Path) -> Iterator[tuple[Key, pa.Table, pa.Array]]:
    """Yield ``(key, meta rows, data)`` per key of a segment, rows in seq order.

    ``meta rows`` has the meta columns of that key's rows; ``data`` their values (structs of
    the key's type). The rows are grouped by key once (one sort, one take), then sliced.
    """
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    keys = [tuple(k) for k in json.loads(table.schema.metadata[b"rda.keys"])]
    union, row_keys, codes, offsets = segment_layout(table)
    order = np.argsort(row_keys, kind="stable")  # stable: seq order within a key
    bounds = np.searchsorted(row_keys[order], np.arange(len(keys) + 1))
    meta = table.drop_columns([n for n in ("key", "data") if n in table.column_names])
    if not np.array_equal(order, np.arange(len(order))):  # one key, or keys in runs: no copy
        meta = meta.take(pa.array(order))
    for index, key in enumerate(keys):
        first, end = int(bounds[index]), int(bounds[index + 1])
        if first == end:  # a key whose only row was dropped (a repeated FIRST)
            yield (str(key[0]), str(key[1]), int(key[2])), meta.slice(0, 0), pa.array([], _EMPTY)
            continue
        row = int(order[first])
        # The key's values are one run of its child, in seq order (SegmentBuilder.build).
        data = union.field(int(codes[row])).slice(int(offsets[row]), end - first)
        yield (str(key[0]), str(key[1]), int(key[2])), meta.slice(first, end - first), data


class Journal:
    """The segment directory of one recorder: write segments durably, list and recover them."""

    def __init__(self, root: Path | str, recorder_id: str) -> None:
        self.recorder_id = recorder_id
        self.directory = Path(root) / "_journal" / recorder_id
        self.directory.mkdir(parents=True, exist_ok=True)

    def recover(self) -> int:
        """Delete leftovers of an interrupted write; return the last durable seq (0 if none)."""
        for stray in self.directory.glob(".*.tmp"):
            log.info("journal %s: removing unfinished %s", self.recorder_id, stray.name)
            stray.unlink()
        segments = self.segments()
        return segments[-1].last_seq if segments else 0

    def segments(self) -> list[Segment]:
        """Durable segments, oldest first."""
        found = []
        for entry in os.scandir(self.directory):
            match = _SEGMENT.match(entry.name)
            if match:
                found.append(Segment(Path(entry.path), int(match[1]), int(match[2])))
        found.sort(key=lambda s: s.first_seq)
        return found

    def write(self, builder: SegmentBuilder) -> Segment:
        """Write the rows of ``builder`` as one durable segment (raises OSError on failure)."""
        table = builder.build(self.recorder_id)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        first, last = builder.first_seq, builder.last_seq
        path = self.directory / f"seg-{first:020d}-{last:020d}.arrow"
        write_durably(path, sink.getvalue())
        return Segment(path, first, last)
