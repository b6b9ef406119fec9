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

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
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

from rda.pipeline.stream.rows import (
    JournalError,
    JournalOptions,
    SegmentRef,
    read_segment_rows,
    report_missing,
    stream_schema,
)

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

# The journal's own naming (rda.pipeline.recorder.journal): seg-<firstseq:020d>-<lastseq:020d>.arrow.
_SEGMENT = re.compile(r"^seg-(\d{20})-(\d{20})\.arrow$")
Offset = dict[str, int]


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


def _last_seq(options: JournalOptions, recorder_id: str, segments: list[_Segment]) -> int:
    newest = segments[-1].last_seq if segments else 0
    return max(newest, _baseline(options, recorder_id, segments))


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
                report_missing(options, recorder_id, expected, segment.first_seq - 1)
            planned.append(
                SegmentRef(recorder_id, segment.path, segment.first_seq, segment.last_seq)
            )
            expected = segment.last_seq + 1
        if expected <= high:
            report_missing(options, recorder_id, expected, high)
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


# --- Spark ------------------------------------------------------------------------------------


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of whole segments; see the module docstring for offsets and replay."""

    def __init__(self, options: JournalOptions) -> None:
        self.options = options
        self._target: Offset | None = None  # availableNow: the newest offsets at query start

    def _newest(self) -> Offset:
        root = self.options.root
        return {
            r: _last_seq(self.options, r, _segments(root, r)) for r in _recorder_ids(self.options)
        }

    def initialOffset(self) -> Offset:
        root = self.options.root
        return {
            r: _baseline(self.options, r, _segments(root, r)) for r in _recorder_ids(self.options)
        }

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
    """A batch read of every segment present now (``spark.read.format("rda-journal")``).

    Filters on ``device``, ``property`` and ``recorder_id`` (``=``, ``IN``) are applied by the
    source; comparisons on ``seq`` skip whole segments (Spark still applies them to the rows).
    """

    def __init__(self, options: JournalOptions) -> None:
        self.options = options
        self.recorders: frozenset[str] | None = None
        self.seq_low = 0  # segments wholly below or above are not read
        self.seq_high: int | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        keys: dict[str, frozenset[str]] = {}
        for item in filters:
            column = getattr(item, "attribute", None)
            if column in (("device",), ("property",), ("recorder_id",)) and isinstance(
                item, EqualTo | In
            ):
                values = frozenset([item.value] if isinstance(item, EqualTo) else item.value)
                if all(isinstance(v, str) for v in values):
                    name = column[0]
                    keys[name] = keys[name] & values if name in keys else values
                    continue
            if column == ("seq",) and isinstance(getattr(item, "value", None), int):
                self._bound_seq(item)
            yield item
        self.options = replace(
            self.options,
            devices=keys.get("device", self.options.devices),
            properties=keys.get("property", self.options.properties),
        )
        self.recorders = keys.get("recorder_id")

    def _bound_seq(self, item: Filter) -> None:
        value = int(getattr(item, "value", 0))
        if isinstance(item, GreaterThan | GreaterThanOrEqual | EqualTo):
            self.seq_low = max(self.seq_low, value + 1 if isinstance(item, GreaterThan) else value)
        if isinstance(item, LessThan | LessThanOrEqual | EqualTo):
            high = value - 1 if isinstance(item, LessThan) else value
            self.seq_high = high if self.seq_high is None else min(self.seq_high, high)

    def partitions(self) -> Sequence[JournalPartition]:
        segments = [
            SegmentRef(recorder_id, s.path, s.first_seq, s.last_seq)
            for recorder_id in _recorder_ids(self.options)
            if self.recorders is None or recorder_id in self.recorders
            for s in _segments(self.options.root, recorder_id)
            if s.last_seq >= self.seq_low
            and (self.seq_high is None or s.first_seq <= self.seq_high)
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
    """Register ``rda-journal`` and ``rda-live`` (rda.pipeline.stream.live) with a session."""
    from rda.pipeline.stream.live import LiveDataSource

    spark.dataSource.register(JournalDataSource)
    spark.dataSource.register(LiveDataSource)
