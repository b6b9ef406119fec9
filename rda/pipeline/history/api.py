"""The History API: the recorder's Parquet store read through PySpark.

``History(spark, root)`` works on any SparkSession, local or on a cluster (``root`` a path
mounted at the same place on every node, or a store URI such as ``s3://bucket/history``, which
Spark reads as ``s3a://``: see ``rda.pipeline.recorder.store``). Each call resolves the exact files of the partitions its window
touches (``rda.pipeline.history.paths``), reads them with ``basePath`` = the store root and an
explicit schema merged from the files' footers (no directory scan, no inference job), and
filters ``acq_stamp`` to ``[start, end)``; Parquet row-group statistics make that filter cheap.

Schema versions (docs/history.md, "History API"): files whose ``data`` types merge (a version
only widens) are read together; files of versions whose types conflict are read apart, and
the results are unioned by column name. A column whose type differs between versions (or
between signals) is widened to ``bigint`` when all are integers, ``double`` when all are
numbers, and otherwise returned as ``string`` (structs and arrays as JSON).
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import importlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_type

from rda.pipeline.history import ops as history_ops
from rda.pipeline.history.ops import col, union_frames
from rda.pipeline.history.paths import (
    FileGroup,
    Signal,
    StoreIndex,
    days_between,
    parse_duration,
    parse_signals,
    parse_time,
)
from rda.pipeline.recorder.schema import merge_types
from rda.pipeline.recorder.store import Store

__all__ = ["BASE_COLUMNS", "History", "col", "to_pandas"]

#: The columns every ``get`` result starts with, in this order; the value fields follow.
BASE_COLUMNS = ("device", "property", "acq_stamp", "ts", "cycle_name", "cycle_stamp", "selector")
_INTERNAL = ("error", "recorder_id", "seq")
_HOUR_NS = 3_600 * 10**9
# Spark stats the explicit file list in a job when it has more paths than a threshold (32), with
# one task per path up to 10,000: thousands of tasks that each stat a few files.
_LISTING_TASKS = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
# get's order by ranges of signals (``_ranges``) on sessions of at most this many cores; a
# bigger cluster keeps orderBy, whose sampling scans run on all its cores, rather than one
# read (and listing) per range.
_RANGES_MAX = 16
_FILE_FIELDS = [
    T.StructField("acq_stamp", T.LongType()),
    T.StructField("ts", T.TimestampType()),
    T.StructField("cycle_stamp", T.LongType()),
    T.StructField("cycle_name", T.StringType()),
    T.StructField("selector", T.StringType()),
    T.StructField("recv_stamp", T.LongType()),
    T.StructField("recorder_id", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("error", T.StringType()),
]
# Partition columns given in the schema keep their types (a device named "42" stays a string).
_PARTITION_FIELDS = [
    T.StructField("device", T.StringType()),
    T.StructField("property", T.StringType()),
    T.StructField("date", T.StringType()),
]


def _field_type(data_type: pa.DataType | None, path: str) -> pa.DataType | None:
    kind = data_type
    for part in path.split("."):
        if kind is None or not pa.types.is_struct(kind) or kind.get_field_index(part) < 0:
            return None
        kind = kind.field(part).type
    return kind


def _field_column(path: str) -> Column:
    column = F.col("data")
    for part in path.split("."):
        column = column.getField(part)
    return column


class History:
    """Query the recorder's store (see the module docstring and docs/history.md)."""

    def __init__(self, spark: SparkSession, root: Store | Path | str) -> None:
        self.spark = spark
        self.index = StoreIndex(root)
        self.store = self.index.store
        # The driver lists and reads footers through pyarrow.fs; Spark reads the same files
        # through its Hadoop connectors, which name them differently (s3:// -> s3a://).
        self.root = self.store.spark_path(self.store.base)

    @classmethod
    def local(cls, root: Store | Path | str, master: str = "local[*]") -> History:
        """A History on a local SparkSession with the settings of ``local_session``."""
        from rda.pipeline.spark_session import local_session

        return cls(local_session(master=master), root)

    # --- search ---------------------------------------------------------------------------------

    def search(self, pattern: str = "*/*") -> DataFrame:
        """Recorded (device, property) pairs matching a glob ``"DEV/PROP"`` (``"DEV"``: any prop).

        Columns: device, property, first_day, last_day (dates), schema_versions (array<int>).
        """
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"pattern: {pattern!r} is not a DEVICE/PROPERTY glob")
        text = pattern if "/" in pattern else f"{pattern}/*"
        signals = parse_signals(text, "pattern")
        if signals[0].field is not None:
            raise ValueError(f"pattern: {pattern!r}: a search names no field")
        rows = []
        for device, prop in self.index.keys(signals):
            days = self.index.days(device, prop)
            if not days:
                continue
            rows.append(
                (
                    device,
                    prop,
                    _date(days[0]),
                    _date(days[-1]),
                    self.index.versions(device, prop),
                )
            )
        schema = T.StructType(
            [
                T.StructField("device", T.StringType()),
                T.StructField("property", T.StringType()),
                T.StructField("first_day", T.DateType()),
                T.StructField("last_day", T.DateType()),
                T.StructField("schema_versions", T.ArrayType(T.IntegerType())),
            ]
        )
        return self.spark.createDataFrame(rows, schema)

    # --- get --------------------------------------------------------------------------------------

    def get(
        self,
        signals: str | Sequence[str],
        start: Any,
        end: Any,
        fields: Sequence[str] | None = None,
        selector: str | None = None,
        errors: bool = False,
    ) -> DataFrame:
        """Rows with ``start <= acq_stamp < end``, sorted by device, property and time.

        Columns: device, property, acq_stamp (ns), ts, cycle_name, cycle_stamp, selector, then
        ``error`` when ``errors`` (error rows are left out otherwise), then the value fields:
        a signal's ``#field``, else ``fields``, else every top-level field of ``data``.
        ``selector`` keeps rows of that selector (a glob is allowed).
        """
        frame = self._sorted(signals, start, end, fields, selector, errors)
        keep = [c for c in frame.columns if c not in _INTERNAL or (errors and c == "error")]
        return frame.select(*[col(c) for c in keep])

    def last_before(
        self,
        signals: str | Sequence[str],
        t: Any,
        lookback: Any = "1d",
        selector: str | None = None,
    ) -> DataFrame:
        """The last value (not an error) per (device, property) at or before ``t``.

        Only ``(t - lookback, t]`` is read; a signal with no value in it has no row. Columns as
        in ``get``. Unlike the other methods this one runs Spark jobs when called (small ones:
        finding each signal's newest stamp); the rows themselves are read lazily.
        """
        at = parse_time(t, "t")
        span = parse_duration(lookback, "lookback")
        stamps = self._last_stamps(signals, at, span, selector)
        if not stamps:  # an empty window: no rows, the usual columns
            frame = self.frame(signals, at + 1, at + 1, None, selector, False)
        else:
            frame = self.frame(signals, min(stamps.values()), at + 1, None, selector, False)
        wanted = self.spark.createDataFrame(
            [(d, p, stamp) for (d, p), stamp in sorted(stamps.items())],
            "device string, property string, _newest bigint",
        )
        # The IN list reaches the Parquet reader (row groups without those stamps are skipped);
        # the broadcast join keeps each signal's own stamp.
        candidates = (
            frame.where(F.col("acq_stamp").isin(sorted(set(stamps.values()))))
            .join(F.broadcast(wanted), ["device", "property"])
            .where(F.col("acq_stamp") == F.col("_newest"))
            .drop("_newest")
        )
        others = [c for c in frame.columns if c not in ("device", "property")]
        last = candidates.groupBy("device", "property").agg(
            F.max_by(
                F.struct(*[col(c) for c in others]), F.struct("acq_stamp", "recorder_id", "seq")
            ).alias("last")
        )
        keep = [c for c in others if c not in _INTERNAL]
        # One row per signal: sorting in one partition spares orderBy's sampling job.
        return (
            last.select("device", "property", *[F.col("last").getField(c).alias(c) for c in keep])
            .coalesce(1)
            .sortWithinPartitions("device", "property")
        )

    def _last_stamps(
        self, signals: str | Sequence[str], at: int, span: int, selector: str | None
    ) -> dict[tuple[str, str], int]:
        """Each signal's newest value stamp in ``(at - span, at]`` (runs small Spark jobs).

        The last hour is tried first: most signals have a value in it, and only their stamps
        are read (a hash aggregate of one column). The rest of the lookback is read only if
        some signal has no value in that hour.
        """
        keys = self.index.keys(parse_signals(signals))
        lower = at - span + 1
        near = max(lower, at - _HOUR_NS)
        stamps: dict[tuple[str, str], int] = {}
        for low, high in ((near, at + 1), (lower, near)):
            if low >= high:
                continue
            newest = (
                self.frame(signals, low, high, None, selector, False)
                .groupBy("device", "property")
                .agg(F.max("acq_stamp").alias("newest"))
                .collect()
            )
            for row in newest:
                stamps.setdefault((row["device"], row["property"]), int(row["newest"]))
            if all(key in stamps for key in keys):
                break
        return stamps

    def aligned(
        self,
        master: str,
        others: str | Sequence[str],
        start: Any,
        end: Any,
        tolerance: Any = None,
        lookback: Any = "1d",
    ) -> DataFrame:
        """Master rows with the others' values as of each; see ``history_ops.aligned``."""
        return history_ops.aligned(self, master, others, start, end, tolerance, lookback)

    def resample(
        self,
        signals: str | Sequence[str],
        start: Any,
        end: Any,
        every: Any = "10s",
        how: str = "last",
        fill: str | None = "previous",
        selector: str | None = None,
    ) -> DataFrame:
        """One row per signal and time bucket; see ``history_ops.resample``."""
        return history_ops.resample(self, signals, start, end, every, how, fill, selector)

    def stats(
        self,
        signals: str | Sequence[str],
        start: Any,
        end: Any,
        every: Any = None,
        selector: str | None = None,
    ) -> DataFrame:
        """count, nan_count, errors, first, last, min, max, mean, std per numeric field (and
        bucket); see ``history_ops.stats``."""
        return history_ops.stats(self, signals, start, end, every, selector)

    def decimate(
        self,
        signal: str,
        start: Any,
        end: Any,
        points: int = 2000,
        selector: str | None = None,
    ) -> DataFrame:
        """Min/max per bin of one numeric field, for plots; see ``history_ops.decimate``."""
        return history_ops.decimate(self, signal, start, end, points, selector)

    @staticmethod
    def to_pandas(frame: DataFrame) -> Any:
        """``to_pandas(frame)``: a time-indexed pandas DataFrame, arrays as numpy."""
        return to_pandas(frame)

    # --- the shared read --------------------------------------------------------------------------

    def frame(
        self,
        signals: str | Sequence[str],
        start: Any,
        end: Any,
        fields: Sequence[str] | None = None,
        selector: str | None = None,
        errors: bool = False,
    ) -> DataFrame:
        """``get`` unsorted, with ``error``, ``recorder_id`` and ``seq``: the base of every query."""
        parsed = parse_signals(signals)
        start_ns, end_ns = parse_time(start, "start"), parse_time(end, "end")
        self._check(fields, selector)
        days = days_between(start_ns, end_ns)
        wanted, _ = self._plan(parsed, fields, days, errors)
        frame = union_frames([self._read(group, names) for group, names in wanted])
        return frame.where(self._condition(start_ns, end_ns, selector, errors))

    def _sorted(
        self,
        signals: str | Sequence[str],
        start: Any,
        end: Any,
        fields: Sequence[str] | None,
        selector: str | None,
        errors: bool,
    ) -> DataFrame:
        """``frame`` sorted by device, property, acq_stamp, recorder_id and seq.

        With at least as many signals as the session has cores (at most ``_RANGES_MAX``), the
        signals are cut into ranges (in order, of about equal bytes) and each range is read
        and sorted by one task, the ranges following each other: the rows come out in the
        global order without the range partitioner's sampling jobs (each a scan of the whole
        window: Spark runs two under adaptive execution) nor a shuffle. Otherwise (few
        signals: a range would be one big task; a big cluster), ``orderBy``.
        """
        order = ("device", "property", "acq_stamp", "recorder_id", "seq")
        parsed = parse_signals(signals)
        start_ns, end_ns = parse_time(start, "start"), parse_time(end, "end")
        self._check(fields, selector)
        condition = self._condition(start_ns, end_ns, selector, errors)
        days = days_between(start_ns, end_ns)
        cores = _cores(self.spark)
        parts = cores if cores <= _RANGES_MAX else 1
        whole, cut = self._plan(parsed, fields, days, errors, parts)
        if len(cut) < 2:
            frame = union_frames([self._read(group, names) for group, names in whole])
            return frame.where(condition).orderBy(*order)
        names: list[str] = []  # the field columns in frame's order
        for _, columns in whole:
            names.extend(c for c in columns if c not in names)
        ranges = []
        for plan in cut:
            part = union_frames([self._read(group, columns) for group, columns in plan])
            ranges.append(part.where(condition).coalesce(1).sortWithinPartitions(*order))
        frame = union_frames(ranges)  # a union keeps its inputs' partitions in order
        head = [c for c in frame.columns if c not in names]
        return frame.select(*[col(c) for c in (*head, *[n for n in names if n in frame.columns])])

    @staticmethod
    def _check(fields: Sequence[str] | None, selector: str | None) -> None:
        if fields is not None and (
            isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields)
        ):
            raise ValueError(f"fields: {fields!r} is not a list of field names")
        if selector is not None and not isinstance(selector, str):
            raise ValueError(f"selector: {selector!r} is not a string")

    @staticmethod
    def _condition(start_ns: int, end_ns: int, selector: str | None, errors: bool) -> Column:
        condition = (F.col("acq_stamp") >= F.lit(start_ns)) & (F.col("acq_stamp") < F.lit(end_ns))
        if not errors:
            condition = condition & F.col("error").isNull()
        if selector is not None:
            if any(ch in selector for ch in "*?["):
                condition = condition & F.col("selector").rlike(fnmatch.translate(selector))
            else:
                condition = condition & (F.col("selector") == F.lit(selector))
        return condition

    def _plan(
        self,
        signals: list[Signal],
        fields: Sequence[str] | None,
        days: list[str],
        errors: bool,
        parts: int = 1,
    ) -> tuple[list[tuple[FileGroup, list[str]]], list[list[tuple[FileGroup, list[str]]]]]:
        """The file groups to read and, for each, its field columns (in first-seen order);
        then, with ``parts`` > 1, the same cut into ranges of signals (``_ranges``), in order
        (none when not cut)."""
        chosen: dict[tuple[str, str], list[Signal]] = {}
        files: list[tuple[tuple[str, str], str]] = []
        types: dict[tuple[str, str], list[pa.DataType]] = {}
        for key in self.index.keys(signals):
            paths = self.index.files(key[0], key[1], days)
            kinds = [self.index.data_type(p) for p in paths]
            if not errors:  # null-typed files hold error rows only
                paths = [p for p, k in zip(paths, kinds, strict=True) if k is not None]
            known = _distinct([k for k in kinds if k is not None])
            if not known:
                newest = self.index.any_type(*key)
                known = [] if newest is None else [newest]
            selecting = [
                s
                for s in signals
                if s.matches(*key)
                and (s.field is None or any(_field_type(k, s.field) for k in known))
            ]
            if not selecting:
                continue  # an unknown field: like an unknown signal, no rows
            chosen[key] = selecting
            types[key] = known
            files.extend((key, p) for p in paths)
        whole = self._groups(files, chosen, types, fields)
        ranges = _ranges(chosen, files, self.index, parts) if parts > 1 else []
        cut = []
        for keys in ranges if len(ranges) > 1 else []:
            part = [(key, path) for key, path in files if key in keys]
            cut.append(self._groups(part, {k: chosen[k] for k in keys}, types, fields))
        return whole, cut

    def _groups(
        self,
        files: list[tuple[tuple[str, str], str]],
        chosen: dict[tuple[str, str], list[Signal]],
        types: dict[tuple[str, str], list[pa.DataType]],
        fields: Sequence[str] | None,
    ) -> list[tuple[FileGroup, list[str]]]:
        groups = self.index.group(files)
        grouped = {k for g in groups for k in g.keys}
        for key in chosen:
            if key not in grouped:  # nothing in the window: an empty read with the right schema
                groups.append(FileGroup(_merge_all(types[key]), [], {key}))
        if not groups:
            groups.append(FileGroup(None, [], set()))
        plans = []
        for group in groups:
            names: list[str] = []
            for key in sorted(group.keys):
                for signal in chosen[key]:
                    for name in _names(signal, fields, types[key]):
                        if name not in names:
                            names.append(name)
            plans.append((group, names))
        return plans

    def _read(self, group: FileGroup, names: list[str]) -> DataFrame:
        columns = list(_FILE_FIELDS)
        if group.data_type is not None:
            spark_type = from_arrow_type(group.data_type, prefer_timestamp_ntz=False)
            columns.append(T.StructField("data", spark_type))
        schema = T.StructType(columns + _PARTITION_FIELDS)
        if group.files:
            with _listing_tasks(self.spark):  # Spark lists the files here, not at the action
                frame = (
                    self.spark.read.schema(schema)
                    .option("basePath", self.root)
                    .parquet(*[self.store.spark_path(f) for f in group.files])
                )
        else:
            frame = self.spark.createDataFrame([], schema)
        selected = [F.col(c) for c in (*BASE_COLUMNS, *_INTERNAL)]
        for name in names:
            kind = _field_type(group.data_type, name)
            if kind is None:
                selected.append(F.lit(None).cast(T.NullType()).alias(name))
            else:
                selected.append(_field_column(name).alias(name))
        return frame.select(*selected)


def _cores(spark: SparkSession) -> int:
    """The session's default parallelism (0 where there is no SparkContext: Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:
        return 0


def _ranges(
    chosen: dict[tuple[str, str], list[Signal]],
    files: list[tuple[tuple[str, str], str]],
    index: StoreIndex,
    parts: int,
) -> list[set[tuple[str, str]]]:
    """The signals cut into ``parts`` runs of consecutive keys (sorted as Spark sorts
    device, property: by code point, which is UTF-8's byte order) of about equal bytes.

    One range (no cut) when there are fewer signals than parts, or when one signal holds more
    than one and a half parts' share: one task would read and sort most of the rows alone."""
    keys = sorted(chosen)
    size = dict.fromkeys(keys, 0)
    for key, path in files:
        size[key] += index.size(path)
    total = sum(size.values())
    if len(keys) < parts or total == 0 or max(size.values()) * parts > 1.5 * total:
        return [set(keys)]
    ranges: list[set[tuple[str, str]]] = [set()]
    filled = 0
    for key in keys:
        # a new range once this one holds its share (the last takes the rest)
        if filled >= total * len(ranges) / parts and len(ranges) < parts:
            ranges.append(set())
        ranges[-1].add(key)
        filled += size[key]
    return ranges


@contextlib.contextmanager
def _listing_tasks(spark: SparkSession) -> Iterator[None]:
    """Spark's listing of an explicit file list in one task per core, not one per path.

    The explicit list is already exact (``StoreIndex.files``); Spark still stats every path,
    in a job of ``min(paths, parallelism)`` tasks (10,000 by default). Lowered to the session's
    default parallelism for this read only (a value the session set lower is kept), the job
    keeps the cluster's cores and loses the per-task cost.
    """
    cores = _cores(spark)  # 0 on Spark Connect: Spark's own setting
    before = spark.conf.get(_LISTING_TASKS)
    lower = cores > 0 and (before is None or cores < int(before))
    if lower:
        spark.conf.set(_LISTING_TASKS, str(cores))
    try:
        yield
    finally:
        if lower and before is None:
            spark.conf.unset(_LISTING_TASKS)
        elif lower and before is not None:
            spark.conf.set(_LISTING_TASKS, before)


def _merge_all(kinds: list[pa.DataType]) -> pa.DataType | None:
    merged: pa.DataType | None = None
    for kind in kinds:
        if merged is None:
            merged = kind
            continue
        widened = merge_types(merged, kind)
        merged = widened if widened is not None else kind  # the newest version's type wins
    return merged


def _distinct(kinds: list[pa.DataType]) -> list[pa.DataType]:
    out: list[pa.DataType] = []
    for kind in kinds:
        if not any(kind.equals(seen) for seen in out):
            out.append(kind)
    return out


def _names(signal: Signal, fields: Sequence[str] | None, kinds: list[pa.DataType]) -> list[str]:
    """A signal's field columns: its ``#field``, else ``fields``, else the top-level fields of
    every type its files have (all schema versions, in first-seen order)."""
    if signal.field is not None:
        return [signal.field]
    if fields is not None:
        return list(fields)
    names: list[str] = []
    for kind in kinds:
        if pa.types.is_struct(kind):
            names.extend(n for n in (f.name for f in kind) if n not in names)
    return names


def _date(day: str) -> datetime.date:
    return datetime.date.fromisoformat(day)


def _to_numpy(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"elements", "dims"}:
        if value["elements"] is None or value["dims"] is None:
            return None
        return np.asarray(value["elements"]).reshape([int(d) for d in value["dims"]])
    if isinstance(value, list | tuple) and not isinstance(value, str):
        return np.asarray(value)
    return value


def to_pandas(frame: DataFrame) -> Any:
    """A pandas DataFrame indexed by time (``datetime64[ns, UTC]`` from ``acq_stamp``, else
    ``ts``), with array fields as numpy arrays (N-D arrays reshaped)."""
    pd: Any = importlib.import_module("pandas")  # no pandas stubs in the dev environment

    result: Any = frame.toPandas()
    if "ts" in result.columns and result["ts"].dt.tz is None:
        result["ts"] = result["ts"].dt.tz_localize("UTC")  # Spark hands back naive session-time
    if "acq_stamp" in result.columns:
        index = pd.to_datetime(result["acq_stamp"].astype("int64"), unit="ns", utc=True)
    elif "ts" in result.columns:
        index = result["ts"].astype("datetime64[ns, UTC]")
    else:
        index = None
    for field in frame.schema.fields:
        if isinstance(field.dataType, T.ArrayType | T.StructType):
            result[field.name] = [
                _to_numpy(v.asDict(recursive=True) if hasattr(v, "asDict") else v)
                for v in result[field.name]
            ]
    if index is not None:
        result.index = pd.DatetimeIndex(index, name="time")
    return result
