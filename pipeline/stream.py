"""``rda-journal``: a Spark Python data source that tails the recorder's journal segments.

Offsets are per recorder: ``{recorder_id: last seq consumed}``, always the ``last_seq`` of a
segment (or the baseline before the first one read). A batch ``(start, end]`` is every segment
of each recorder with ``start < first_seq`` and ``last_seq <= end``: segments are immutable
files whose names carry their seq range, so planning the same offsets again (a restarted query
replaying its offset log) reads exactly the same rows. With an idempotent sink each row is
delivered exactly once.

A segment the recorder's retention deleted before the stream read it leaves a hole in the seq
range. By default (``failOnDataLoss=true``) the batch fails with an error naming the missing
seq range: those rows are in the Parquet store, not lost. ``failOnDataLoss=false`` skips them
with a warning.

The source is pickled to Spark's Python workers: it holds only options, and opens files in
``read``. Register it with ``spark.dataSource.register(JournalDataSource)``.
"""

from __future__ import annotations

import fnmatch
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
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from rda.pipeline.schema import SchemaCatalog

__all__ = [
    "JournalDataSource",
    "JournalError",
    "JournalOptions",
    "JournalPartition",
    "SegmentRef",
    "group_segments",
    "plan_partitions",
    "plan_segments",
    "read_segment_rows",
    "register",
    "stream_schema",
]

log = logging.getLogger("rda.pipeline.stream")

# The journal's own naming (rda.pipeline.journal): seg-<firstseq:020d>-<lastseq:020d>.arrow.
_SEGMENT = re.compile(r"^seg-(\d{20})-(\d{20})\.arrow$")
_GLOB = re.compile(r"[*?\[]")
_META = [
    pa.field("recorder_id", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("device", pa.string()),
    pa.field("property", pa.string()),
    pa.field("schema_version", pa.int32()),
    pa.field("acq_stamp", pa.int64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("cycle_stamp", pa.int64()),
    pa.field("cycle_name", pa.string()),
    pa.field("selector", pa.string()),
    pa.field("recv_stamp", pa.int64()),
    pa.field("error", pa.string()),
]
Offset = dict[str, int]


class JournalError(RuntimeError):
    """The journal cannot deliver a planned batch (segments deleted before they were read)."""


@dataclass(frozen=True, slots=True)
class JournalOptions:
    """The parsed source options (see ``docs/history.md``, "Streaming")."""

    root: str
    recorders: tuple[str, ...] | None  # None: every recorder under root/_journal
    device: str | None  # glob
    property: str | None  # glob
    data: str  # "json" or "struct"
    data_type: pa.StructType | None  # struct mode: the selected schema version's type
    schema_version: int | None  # struct mode: rows of this version only
    max_segments: int | None
    rows_per_partition: int
    starting: str  # "earliest" or "latest"
    fail_on_data_loss: bool

    @classmethod
    def parse(cls, options: dict[str, str]) -> JournalOptions:
        opts = {k.lower(): v for k, v in options.items()}
        root = opts.get("root") or opts.get("path")
        if not root:
            raise ValueError("rda-journal: option 'root' (the recorder's store) is required")
        recorders = opts.get("recorder")
        data = opts.get("data", "json").lower()
        if data not in ("json", "struct"):
            raise ValueError(f"rda-journal: option 'data' must be json or struct, not {data!r}")
        starting = opts.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ValueError(
                f"rda-journal: 'startingOffsets' must be earliest or latest: {starting!r}"
            )
        fail = opts.get("failondataloss", "true").lower()
        if fail not in ("true", "false"):
            raise ValueError(f"rda-journal: 'failOnDataLoss' must be true or false: {fail!r}")
        max_text = opts.get("maxsegmentspertrigger")
        max_segments = _positive_int("maxSegmentsPerTrigger", max_text) if max_text else None
        per_task = _positive_int("rowsPerPartition", opts.get("rowsperpartition", "100000"))
        device, prop = opts.get("device"), opts.get("property")
        data_type, version = None, None
        if data == "struct":
            data_type, version = _struct_type(root, device, prop, opts.get("schemaversion"))
        return cls(
            root=root,
            recorders=tuple(r.strip() for r in recorders.split(",") if r.strip())
            if recorders
            else None,
            device=device,
            property=prop,
            data=data,
            data_type=data_type,
            schema_version=version,
            max_segments=max_segments,
            rows_per_partition=per_task,
            starting=starting,
            fail_on_data_loss=fail == "true",
        )


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"rda-journal: option {name!r} must be an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"rda-journal: option {name!r} must be >= 1: {value}")
    return value


def _struct_type(
    root: str, device: str | None, prop: str | None, version_text: str | None
) -> tuple[pa.StructType, int]:
    """The Arrow type of ``data`` in struct mode: one literal key, one schema version."""
    if not device or not prop or _GLOB.search(device) or _GLOB.search(prop):
        raise ValueError("rda-journal: data=struct needs a literal 'device' and 'property'")
    catalog = SchemaCatalog(root)
    numbers = [v["number"] for v in catalog.versions(device, prop)]
    if not numbers:
        raise ValueError(f"rda-journal: {device}/{prop} has no recorded schema under {root}")
    number = _positive_int("schemaVersion", version_text) if version_text else numbers[-1]
    arrow_type = catalog.arrow_type(device, prop, number)
    if not isinstance(arrow_type, pa.StructType):
        raise ValueError(f"rda-journal: {device}/{prop} has no schema version {number}")
    return arrow_type, number


def stream_schema(options: JournalOptions) -> pa.Schema:
    """The Arrow schema of the rows the source yields (``data`` last)."""
    data = pa.field("data", options.data_type if options.data_type is not None else pa.string())
    return pa.schema([*_META, data])


# --- the journal on disk -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Segment:
    path: str
    first_seq: int
    last_seq: int


def _journal_dir(root: str) -> Path:
    return Path(root) / "_journal"


def _recorder_ids(options: JournalOptions) -> list[str]:
    if options.recorders is not None:
        return sorted(options.recorders)
    directory = _journal_dir(options.root)
    if not directory.is_dir():
        return []
    return sorted(e.name for e in os.scandir(directory) if e.is_dir() and e.name[0] not in "._")


def _segments(root: str, recorder_id: str) -> list[_Segment]:
    """The durable segments of one recorder, oldest first (none if it has no journal)."""
    directory = _journal_dir(root) / recorder_id
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _SEGMENT.match(entry.name)
        if match:
            found.append(_Segment(entry.path, int(match[1]), int(match[2])))
    found.sort(key=lambda s: s.first_seq)
    return found


def _converted_seq(root: str, recorder_id: str) -> int:
    """The highest seq converted to Parquet (its segment may be gone), 0 if none."""
    try:
        progress = json.loads((_journal_dir(root) / recorder_id / "progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return 0
    return int(progress.get("max_seq", 0))


def _baseline(options: JournalOptions, recorder_id: str, segments: list[_Segment]) -> int:
    """Where a recorder's stream starts: before its oldest segment, or after its newest."""
    if options.starting == "latest":
        newest = segments[-1].last_seq if segments else 0
        return max(newest, _converted_seq(options.root, recorder_id))
    if segments:
        return segments[0].first_seq - 1
    return _converted_seq(options.root, recorder_id)


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment of one recorder, as planned into a batch."""

    recorder_id: str
    path: str
    first_seq: int
    last_seq: int


class JournalPartition(InputPartition):
    """Consecutive segments of one recorder: the unit a Spark task reads.

    Grouping segments (up to ``rowsPerPartition`` rows) keeps the per-task cost of a Python
    data source off the many small segments the recorder writes (one per ~200 ms).
    """

    def __init__(self, segments: Sequence[SegmentRef]) -> None:
        super().__init__([(s.recorder_id, s.first_seq, s.last_seq) for s in segments])
        self.segments = list(segments)


def plan_segments(options: JournalOptions, start: Offset, end: Offset) -> list[SegmentRef]:
    """The segments of ``(start, end]``, checking that none is missing (see the module doc)."""
    planned: list[SegmentRef] = []
    for recorder_id in sorted(end):
        low, high = start.get(recorder_id), int(end[recorder_id])
        if low is None or high <= low:
            continue  # a recorder's first appearance only records its baseline
        expected = low + 1
        for segment in _segments(options.root, recorder_id):
            if segment.first_seq <= low or segment.last_seq > high:
                continue
            if segment.first_seq != expected:
                _missing(options, recorder_id, expected, segment.first_seq - 1)
            planned.append(
                SegmentRef(recorder_id, segment.path, segment.first_seq, segment.last_seq)
            )
            expected = segment.last_seq + 1
        if expected <= high:
            _missing(options, recorder_id, expected, high)
    return planned


def group_segments(segments: Sequence[SegmentRef], max_rows: int) -> list[JournalPartition]:
    """Consecutive segments of a recorder, at most ``max_rows`` rows per group (>= 1 segment)."""
    groups: list[list[SegmentRef]] = []
    rows = 0
    for segment in segments:
        size = segment.last_seq - segment.first_seq + 1
        current = groups[-1] if groups else None
        if current and current[0].recorder_id == segment.recorder_id and rows + size <= max_rows:
            current.append(segment)
            rows += size
        else:
            groups.append([segment])
            rows = size
    return [JournalPartition(g) for g in groups]


def plan_partitions(options: JournalOptions, start: Offset, end: Offset) -> list[JournalPartition]:
    """The Spark partitions of the batch ``(start, end]``: segments grouped per recorder."""
    return group_segments(plan_segments(options, start, end), options.rows_per_partition)


def _missing(options: JournalOptions, recorder_id: str, first: int, last: int) -> None:
    message = (
        f"rda-journal: segments of recorder {recorder_id!r} holding seq {first}..{last} are gone "
        f"from {options.root}/_journal (deleted by retention before the stream read them); "
        "their rows are in the Parquet store (History.get)"
    )
    if options.fail_on_data_loss:
        raise JournalError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


# --- reading one segment -----------------------------------------------------------------------


def _json_values(child: pa.Array) -> np.ndarray[Any, Any]:
    # NaN and infinities are written as NaN/Infinity, which Spark's from_json accepts.
    return np.array(
        [None if v is None else json.dumps(v, separators=(",", ":")) for v in child.to_pylist()],
        dtype=object,
    )


def _fit(child: pa.Array, target: pa.StructType) -> pa.Array:
    """``child`` (a segment's struct, possibly narrower or wider) as ``target``: by field name."""
    if child.type.equals(target):
        return child
    fields = []
    for field in target:
        index = child.type.get_field_index(field.name) if pa.types.is_struct(child.type) else -1
        if index < 0:
            fields.append(pa.nulls(len(child), field.type))
        else:
            column = child.field(index)
            fields.append(column if column.type.equals(field.type) else column.cast(field.type))
    mask = child.is_null() if len(child) else None
    return pa.StructArray.from_arrays(fields, fields=list(target), mask=mask)


def read_segment_rows(options: JournalOptions, partition: SegmentRef) -> pa.RecordBatch:
    """The rows of one segment, flattened to :func:`stream_schema`, in seq order."""
    schema = stream_schema(options)
    try:
        with pa.memory_map(partition.path) as source:
            table = pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        _missing(options, partition.recorder_id, partition.first_seq, partition.last_seq)
        return pa.RecordBatch.from_pylist([], schema=schema)
    keys = [tuple(k) for k in json.loads(table.schema.metadata[b"rda.keys"])]
    union = table.column("data").combine_chunks()
    codes = union.type_codes.to_numpy(zero_copy_only=False)
    offsets = union.offsets.to_numpy(zero_copy_only=False)
    wanted = np.zeros(len(keys), dtype=bool)
    for code, (device, prop, version) in enumerate(keys):
        wanted[code] = (
            (options.device is None or fnmatch.fnmatchcase(device, options.device))
            and (options.property is None or fnmatch.fnmatchcase(prop, options.property))
            and (options.schema_version is None or version in (options.schema_version, 0))
        )
    mask = wanted[codes]
    rows = np.flatnonzero(mask)
    codes, offsets = codes[rows], offsets[rows]
    take = pa.array(rows)
    acq = table.column("acq_stamp").take(take)
    columns: dict[str, Any] = {
        "recorder_id": pa.array([partition.recorder_id] * len(rows), pa.string()),
        "seq": table.column("seq").take(take),
        "device": pa.array([k[0] for k in keys], pa.string()).take(pa.array(codes)),
        "property": pa.array([k[1] for k in keys], pa.string()).take(pa.array(codes)),
        "schema_version": pa.array([k[2] for k in keys], pa.int32()).take(pa.array(codes)),
        "acq_stamp": acq,
        "ts": pc.divide(acq, 1000).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }
    for name in ("cycle_stamp", "cycle_name", "selector", "recv_stamp", "error"):
        columns[name] = table.column(name).take(take)
    columns["data"] = _data_column(options, union, keys, codes, offsets)
    out = pa.table(columns, schema=schema).combine_chunks()
    batches = out.to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema)


def _data_column(
    options: JournalOptions,
    union: pa.UnionArray,
    keys: list[tuple[Any, ...]],
    codes: np.ndarray[Any, Any],
    offsets: np.ndarray[Any, Any],
) -> pa.Array:
    if options.data_type is None:
        values = np.empty(len(codes), dtype=object)
        for code in np.unique(codes):
            selected = codes == code
            values[selected] = _json_values(union.field(int(code)))[offsets[selected]]
        return pa.array(values, pa.string())
    target = options.data_type
    pieces = np.empty(len(codes), dtype=np.int64)
    arrays: list[pa.Array] = []
    base = 0
    for code in np.unique(codes):
        selected = codes == code
        if int(keys[int(code)][2]) == options.schema_version:
            child = _fit(union.field(int(code)), target)
        else:  # error rows stored before any value (version 0): data is null
            child = pa.nulls(len(union.field(int(code))), target)
        arrays.append(child)
        pieces[selected] = offsets[selected] + base
        base += len(child)
    if not arrays:
        return pa.nulls(0, target)
    return pa.concat_arrays(arrays).take(pa.array(pieces))


# --- Spark ------------------------------------------------------------------------------------


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of whole segments; see the module docstring for offsets and replay."""

    def __init__(self, options: JournalOptions) -> None:
        self.options = options
        self._target: Offset | None = None  # availableNow: the newest offsets at query start

    def _newest(self) -> Offset:
        newest = {}
        for recorder_id in _recorder_ids(self.options):
            segments = _segments(self.options.root, recorder_id)
            newest[recorder_id] = max(
                segments[-1].last_seq if segments else 0,
                _baseline(self.options, recorder_id, segments),
            )
        return newest

    def initialOffset(self) -> Offset:
        offset = {}
        for recorder_id in _recorder_ids(self.options):
            segments = _segments(self.options.root, recorder_id)
            offset[recorder_id] = _baseline(self.options, recorder_id, segments)
        return offset

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._newest()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_segments is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.options.max_segments)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Advance over whole segments, up to the read limit, round-robin across recorders."""
        end = dict(start)
        candidates: dict[str, list[_Segment]] = {}
        ids = sorted(self._target) if self._target is not None else _recorder_ids(self.options)
        for recorder_id in ids:
            segments = _segments(self.options.root, recorder_id)
            if recorder_id not in start:
                # First seen after the query started: record where it starts, read next batch.
                end[recorder_id] = _baseline(self.options, recorder_id, segments)
                continue
            ceiling = self._target[recorder_id] if self._target is not None else None
            candidates[recorder_id] = [
                s
                for s in segments
                if s.last_seq > start[recorder_id] and (ceiling is None or s.last_seq <= ceiling)
            ]
        files = rows = 0
        progress = True
        while progress:
            progress = False
            for recorder_id, pending in candidates.items():
                if not pending:
                    continue
                segment = pending[0]
                size = segment.last_seq - segment.first_seq + 1
                if isinstance(limit, ReadMaxFiles) and files >= limit.max_files:
                    return dict(sorted(end.items()))
                if isinstance(limit, ReadMaxRows) and files and rows + size > limit.max_rows:
                    return dict(sorted(end.items()))
                pending.pop(0)
                end[recorder_id] = segment.last_seq
                files += 1
                rows += size
                progress = True
        return dict(sorted(end.items()))

    def reportLatestOffset(self) -> Offset:
        return self._newest()

    def partitions(self, start: Offset, end: Offset) -> Sequence[JournalPartition]:
        return plan_partitions(self.options, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, JournalPartition)
        for segment in partition.segments:
            yield read_segment_rows(self.options, segment)

    def commit(self, end: Offset) -> None:
        """Nothing to release: segments belong to the recorder (its retention deletes them)."""


class JournalBatchReader(DataSourceReader):
    """A batch read of every segment present now (``spark.read.format("rda-journal")``)."""

    def __init__(self, options: JournalOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[JournalPartition]:
        segments = [
            SegmentRef(recorder_id, s.path, s.first_seq, s.last_seq)
            for recorder_id in _recorder_ids(self.options)
            for s in _segments(self.options.root, recorder_id)
        ]
        return group_segments(segments, self.options.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, JournalPartition)
        for segment in partition.segments:
            yield read_segment_rows(self.options, segment)


class JournalDataSource(DataSource):
    """``spark.readStream.format("rda-journal").option("root", ROOT).load()``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = JournalOptions.parse(dict(options))

    @classmethod
    def name(cls) -> str:
        return "rda-journal"

    def schema(self) -> StructType:
        schema = from_arrow_type(pa.struct(list(stream_schema(self.parsed))))
        assert isinstance(schema, StructType)
        return schema

    def reader(self, schema: StructType) -> JournalBatchReader:
        return JournalBatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> JournalStreamReader:
        return JournalStreamReader(self.parsed)


def register(spark: Any) -> None:
    """Register ``rda-journal`` and ``rda-live`` (rda.pipeline.stream_live) with a session."""
    from rda.pipeline.stream_live import LiveDataSource

    spark.dataSource.register(JournalDataSource)
    spark.dataSource.register(LiveDataSource)
