"""Journal segments -> the Hive-partitioned Parquet store, idempotently; segment retention.

Store layout (the contract with the History API, docs/history.md):
``root/device=D/property=P/date=YYYY-MM-DD/part-<recorder_id>-<firstseq>-<lastseq>.parquet``.

Idempotence: a conversion takes a *group* of closed segments. Before writing, the group and the
file names it will produce are recorded as ``planned`` in ``progress.json`` (atomically
replaced); each file is written tmp -> fsync -> rename; then the group moves to ``done``. A
restart first redoes a planned group with the same segments, hence the same names: files are
overwritten, never duplicated. File names derive only from the rows (recorder, first and last
seq of the rows of one key and day), never from time or chance.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rda.pipeline.recorder.journal import (
    Journal,
    Segment,
    fsync_directory,
    segment_layout,
    write_durably,
)
from rda.pipeline.recorder.schema import SchemaCatalog, merge_types, partition_escape
from rda.pipeline.recorder.store import Store

__all__ = [
    "STORE_COLUMNS",
    "Converter",
    "ConverterStatistics",
    "column_or_null",
    "journal_root",
    "parquet_options",
    "partition_dir",
    "partition_path",
]

log = logging.getLogger("rda.pipeline.recorder.converter")

_DAY_NS = 86_400 * 10**9
_EPOCH = datetime.date(1970, 1, 1).toordinal()
STORE_COLUMNS = (
    "acq_stamp",
    "ts",
    "cycle_stamp",
    "cycle_name",
    "selector",
    "recv_stamp",
    "recorder_id",
    "seq",
    "error",
    "update_type",
    "alarm_severity",
    "data",
)


@dataclass(frozen=True, slots=True)
class ConverterStatistics:
    converted_segments: int
    files_written: int
    errors: int
    last_error: str | None


def partition_path(root: Path | str, device: str, prop: str, date: str) -> Path:
    """The directory of one (device, property, day) partition."""
    return (
        Path(root)
        / f"device={partition_escape(device)}"
        / f"property={partition_escape(prop)}"
        / f"date={date}"
    )


def partition_dir(store: Store, device: str, prop: str, date: str) -> str:
    """The store path of one (device, property, day) partition."""
    return store.path(
        f"device={partition_escape(device)}", f"property={partition_escape(prop)}", f"date={date}"
    )


ROW_GROUP_BYTES = 16 << 20  # uncompressed bytes per Parquet row group, about


class _Target(NamedTuple):
    """Where a Parquet file goes: one argument, so ``_write_parquet(target, table)`` stays the
    single seam a crash test wraps."""

    store: Store
    path: str


def group_rows(table: pa.Table) -> int:
    """Rows per Parquet row group: about :data:`ROW_GROUP_BYTES` of data each (at most a
    million rows), so that a reader of a window (the history server, DuckDB, Spark) decodes
    the groups it needs, not a whole file of big arrays."""
    per_row = max(1, int(table.nbytes) // max(1, int(table.num_rows)))
    return max(1, min(1 << 20, ROW_GROUP_BYTES // per_row))


def _leaves(kind: pa.DataType, path: str, in_list: bool) -> list[tuple[str, pa.DataType, bool]]:
    """``(Parquet column path, type, inside a list)`` of each leaf column under ``path``."""
    if pa.types.is_struct(kind):
        return [
            leaf
            for i in range(kind.num_fields)
            for leaf in _leaves(kind.field(i).type, f"{path}.{kind.field(i).name}", in_list)
        ]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaves(kind.value_type, f"{path}.list.element", True)
    return [(path, kind, in_list)]


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How the store writes a Parquet file of ``schema`` (converter and compaction alike).

    Every column is zstd-compressed and dictionary-encoded where that pays, except the values
    of floating-point arrays (waveforms, spectra, images as floats): written plain and
    uncompressed. Their bits hardly compress (zstd saves a few per cent) and a dictionary
    never fits, while decoding them costs several times the plain read, which is what a
    history reader of big arrays waits for (docs/performance.md, "Columnar history")."""
    compression: dict[str, str] = {}
    dictionary: list[str] = []
    for field in schema:
        for path, kind, in_list in _leaves(field.type, field.name, False):
            if in_list and pa.types.is_floating(kind):
                compression[path] = "none"
            else:
                compression[path] = "zstd"
                dictionary.append(path)
    return {"compression": compression, "use_dictionary": dictionary}


def _write_parquet(target: _Target, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    options = parquet_options(table.schema)
    pq.write_table(table, sink, row_group_size=group_rows(table), **options)
    target.store.write(target.path, sink.getvalue())


def column_or_null(table: pa.Table, name: str, kind: pa.DataType) -> pa.ChunkedArray:
    """``table``'s column ``name``, or nulls where an older journal segment or Parquet file
    was written before the column existed."""
    if name in table.column_names:
        return table.column(name)
    return pa.chunked_array([pa.nulls(len(table), kind)])


def _store_table(
    recorder_id: str,
    meta: pa.Table,
    data: pa.Array,
    key: tuple[str, str, int],
    units: dict[str, str] | None = None,
) -> pa.Table:
    # A row the server sent without an acquisition stamp (0: an older or foreign server) is
    # stored at the recorder's receive time, so that a time window finds it instead of it
    # sitting at 1970-01-01; it stays recognisable (acq_stamp == recv_stamp exactly, which a
    # stamp made before the network hop never is) and the journal keeps the stamp as sent
    # (docs/history.md). The recorder counts and logs such rows (missing_acq_stamps).
    sent = meta.column("acq_stamp").combine_chunks()
    recv = meta.column("recv_stamp").combine_chunks()
    acq = pa.compute.if_else(pa.compute.equal(sent, 0), recv, sent)
    ts = pa.compute.divide(acq, 1000).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    metadata = {
        "rda.device": key[0],
        "rda.property": key[1],
        "rda.schema_version": str(key[2]),
    }
    columns: dict[str, Any] = {
        "acq_stamp": acq,
        "ts": ts,
        "cycle_stamp": meta.column("cycle_stamp"),
        "cycle_name": meta.column("cycle_name"),
        "selector": meta.column("selector"),
        "recv_stamp": recv,
        "recorder_id": pa.array([recorder_id] * len(meta), pa.string()),
        "seq": meta.column("seq"),
        "error": meta.column("error"),
        "update_type": column_or_null(meta, "update_type", pa.string()),
        "alarm_severity": column_or_null(meta, "alarm_severity", pa.int8()),
        "data": data,
    }
    if units:
        metadata["rda.units"] = json.dumps(units, sort_keys=True)
    return pa.table(columns).replace_schema_metadata(metadata)


Key = tuple[str, str, int]  # (device, property, schema version), as in journal.py
_Piece = tuple[pa.Table, pa.Array]  # meta rows and their values, in seq order


def _split_by_key_and_day(group: list[Segment]) -> dict[tuple[Key, str], list[_Piece]]:
    """The rows of a group of segments per (key, UTC day of the acquisition stamp).

    Vectorised over keys: a recorder of a thousand properties has a thousand keys in every
    segment, and a step per key and segment would cost more than the rows. The rows of each
    value type (a union child, the same in every segment) are gathered from all segments,
    sorted once by (key, day, seq), and cut into runs. A key whose type changed within the
    group has one piece per type (the caller merges them)."""
    keys: dict[Key, int] = {}  # key -> its number in this group
    names: list[Key] = []
    kinds: dict[pa.DataType, int] = {}  # value type -> its gathered pieces
    gathered: list[list[tuple[pa.Table, pa.Array, np.ndarray[Any, Any]]]] = []
    for segment in group:
        with pa.memory_map(str(segment.path)) as source:
            table = pa.ipc.open_file(source).read_all()
        listed = json.loads(table.schema.metadata[b"rda.keys"])
        for raw in listed:
            key = (str(raw[0]), str(raw[1]), int(raw[2]))
            if key not in keys:
                keys[key] = len(names)
                names.append(key)
        number = np.fromiter(
            (keys[(str(k[0]), str(k[1]), int(k[2]))] for k in listed), np.int64, len(listed)
        )
        union, row_keys, codes, offsets = segment_layout(table)
        meta = table.drop_columns([n for n in ("key", "data") if n in table.column_names])
        for code in np.unique(codes):
            rows = np.flatnonzero(codes == code)
            child = union.field(int(code))
            kind = kinds.setdefault(child.type, len(gathered))
            if kind == len(gathered):
                gathered.append([])
            whole = len(rows) == len(codes)
            gathered[kind].append(
                (
                    meta if whole else meta.take(pa.array(rows)),
                    child.take(pa.array(offsets[rows])),
                    number[row_keys[rows]],
                )
            )
    parts: dict[tuple[Key, str], list[_Piece]] = defaultdict(list)
    for pieces in gathered:
        # promote: segments from before the update_type column fill it with nulls.
        meta = pa.concat_tables([m for m, _, _ in pieces], promote_options="default")
        data = pa.concat_arrays([d for _, d, _ in pieces])
        owner = np.concatenate([k for _, _, k in pieces])
        acq = meta.column("acq_stamp").to_numpy()
        recv = meta.column("recv_stamp").to_numpy()
        days = np.where(acq > 0, acq, recv) // _DAY_NS
        order = np.lexsort((meta.column("seq").to_numpy(), days, owner))
        owner, days = owner[order], days[order]
        take = pa.array(order)
        meta, data = meta.take(take), data.take(take)
        starts = np.flatnonzero((np.diff(owner) != 0) | (np.diff(days) != 0)) + 1
        bounds = [0, *starts.tolist(), len(owner)]
        for first, end in itertools.pairwise(bounds):
            day = datetime.date.fromordinal(_EPOCH + int(days[first])).isoformat()
            parts[(names[int(owner[first])], day)].append(
                (meta.slice(first, end - first), data.slice(first, end - first))
            )
    return parts


def journal_root(store: Store, journal: Path | str | None) -> Path:
    """Where ``_journal/`` lives: ``journal``, else the store's root when it is local.

    The journal is fsynced, renamed, locked and tailed file by file: it needs a local disk,
    so a store on another filesystem needs an explicit local ``journal`` directory.
    """
    if journal is not None:
        return Path(journal)
    if not store.local:
        raise ValueError(
            f"store {store.uri!r} is not on the local disk: give a local journal directory "
            "(journal=... / --journal)"
        )
    return Path(store.base)


class Converter:
    """Converts one recorder's closed segments into the Parquet store (see module docstring).

    ``root`` is the store (a local path, a URI ``pyarrow.fs`` resolves, or a ``Store``);
    ``journal`` the local directory holding ``_journal/<recorder_id>`` (default: the root, which
    must then be local).
    """

    def __init__(
        self,
        root: Store | Path | str,
        recorder_id: str,
        catalog: SchemaCatalog | None = None,
        *,
        journal: Path | str | None = None,
        retention: float = 86_400.0,
        max_group_rows: int = 1_000_000,
        max_group_bytes: int = 256 << 20,
        clock: Callable[[], float] = time.time,
        units_of: Callable[[str, str], dict[str, str]] | None = None,
    ) -> None:
        self.store = Store.open(root)
        # The declared units of a property's fields (the recorder's descriptions): written
        # into each file's ``rda.units`` metadata.
        self.units_of: Callable[[str, str], dict[str, str]] = units_of or (lambda d, p: {})
        self.recorder_id = recorder_id
        self.journal = Journal(journal_root(self.store, journal), recorder_id)
        self.catalog = catalog or SchemaCatalog(self.store, recorder_id)
        self.retention = retention
        self.max_group_rows = max_group_rows
        self.max_group_bytes = max_group_bytes  # a group is converted in memory
        self._clock = clock
        self._path = self.journal.directory / "progress.json"
        self._lock = threading.Lock()  # the converter thread and stop() may both call in
        self._progress: dict[str, Any] = {"max_seq": 0, "done": {}, "planned": None}
        self._converted = 0
        self._files = 0
        self._errors = 0
        self._last_error: str | None = None
        self.recover()

    @property
    def max_seq(self) -> int:
        """The highest seq ever converted (kept after retention deleted its segment)."""
        return int(self._progress["max_seq"])

    def recover(self) -> None:
        """Reload the progress record; drop tmp files an interrupted conversion left."""
        with self._lock:
            if self._path.exists():
                self._progress = json.loads(self._path.read_text())
            planned = self._progress.get("planned")
            for name in planned["files"] if planned else []:
                self.store.delete(self.store.tmp_name(self.store.path(name)))

    def statistics(self) -> ConverterStatistics:
        return ConverterStatistics(self._converted, self._files, self._errors, self._last_error)

    def _save(self) -> None:
        write_durably(self._path, json.dumps(self._progress).encode())

    def convert_pending(self) -> int:
        """Convert every closed segment not yet converted; return how many were."""
        with self._lock:
            total = 0
            try:
                planned = self._progress.get("planned")
                if planned:
                    by_name = {s.name: s for s in self.journal.segments()}
                    group = [by_name[name] for name in planned["segments"] if name in by_name]
                    total += self._convert_group(group)
                while True:
                    done = self._progress["done"]
                    pending = [s for s in self.journal.segments() if s.name not in done]
                    if not pending:
                        return total
                    group, rows, size = [], 0, 0
                    for segment in pending:
                        group.append(segment)
                        rows += segment.last_seq - segment.first_seq + 1
                        size += segment.path.stat().st_size
                        if rows >= self.max_group_rows or size >= self.max_group_bytes:
                            break
                    total += self._convert_group(group)
            except Exception as exc:
                self._errors += 1
                self._last_error = f"conversion failed: {exc}"
                log.exception("converter %s: conversion failed", self.recorder_id)
                raise

    def _convert_group(self, group: list[Segment]) -> int:
        if not group:
            self._progress["planned"] = None
            return 0
        parts = _split_by_key_and_day(group)
        outputs: list[tuple[str, pa.Table]] = []
        for (key, date), pieces in sorted(parts.items()):
            empty = pa.types.is_struct(pieces[0][1].type) and not pieces[0][1].type.num_fields
            if len(pieces) == 1 and not empty:
                meta, data = pieces[0]
            elif len(pieces) == 1:  # error rows only, before any value (_unify gives a type)
                meta, data = pieces[0][0], self._unify([pieces[0][1]], key)
            else:  # the key's type changed within the group: its rows come in pieces
                # promote: segments from before the update_type column fill it with nulls.
                meta = pa.concat_tables([m for m, _ in pieces], promote_options="default")
                data = self._unify([d for _, d in pieces], key)
                order = pa.array(np.argsort(meta.column("seq").to_numpy(), kind="stable"))
                meta, data = meta.take(order), data.take(order)
            seqs = meta.column("seq")
            name = f"part-{self.recorder_id}-{seqs[0].as_py()}-{seqs[-1].as_py()}.parquet"
            outputs.append(
                (
                    f"{partition_dir(self.store, key[0], key[1], date)}/{name}",
                    _store_table(self.recorder_id, meta, data, key, self.units_of(key[0], key[1])),
                )
            )
        self._progress["planned"] = {
            "segments": [s.name for s in group],
            "files": [self.store.relative(path) for path, _ in outputs],
        }
        self._save()
        for path, table in outputs:
            _write_parquet(_Target(self.store, path), table)
            self._files += 1
        now = self._clock()
        for segment in group:
            self._progress["done"][segment.name] = now
        self._progress["max_seq"] = max(self.max_seq, group[-1].last_seq)
        self._progress["planned"] = None
        self._save()
        self._converted += len(group)
        return len(group)

    def _unify(self, arrays: list[pa.Array], key: tuple[str, str, int]) -> pa.Array:
        """One array from a key's pieces; segments may carry narrower (older) struct types."""
        target: pa.DataType = arrays[0].type
        for array in arrays[1:]:
            merged = merge_types(target, array.type)
            target = merged if merged is not None else target
        if pa.types.is_struct(target) and target.num_fields == 0:
            # Errors recorded before any value: no struct to store (Parquet has no empty
            # struct), so use the property's current schema, else a null column.
            current = self.catalog.current(key[0], key[1])
            target = current.arrow_type if current is not None else pa.null()
            return pa.nulls(sum(len(a) for a in arrays), target)
        return pa.concat_arrays([a if a.type.equals(target) else a.cast(target) for a in arrays])

    def apply_retention(self) -> int:
        """Delete converted segments older than the retention; return how many were deleted."""
        with self._lock:
            limit = self._clock() - self.retention
            done: dict[str, float] = self._progress["done"]
            expired = [name for name, at in done.items() if at <= limit]
            if not expired:
                return 0
            for name in expired:
                (self.journal.directory / name).unlink(missing_ok=True)
                del done[name]
            fsync_directory(self.journal.directory)
            self._save()
            return len(expired)
