"""The History API's computations on top of its reads: aligned, resample, stats, decimate.

Every function takes a ``History`` and works on ``History.frame`` (the rows of a window, with
``error``, ``recorder_id`` and ``seq``). Time buckets start at ``start`` and are ``every`` long:
bucket ``b`` holds ``start + b*every <= acq_stamp < start + (b+1)*every``. Only public Spark
APIs are used: the as-of join is a union ordered by time with ``last(..., ignorenulls=True)``
over a window (``_joinAsOf`` is private and far slower here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rda.pipeline.history.paths import (
    StoreIndex,
    parse_duration,
    parse_signal,
    parse_signals,
    parse_time,
)


class History(Protocol):
    """What these computations read through (``rda.pipeline.History`` in api.py is the one
    there is). A protocol, so that this module does not import api.py, which imports it."""

    spark: SparkSession
    index: StoreIndex

    def frame(
        self,
        signals: str | Sequence[str],
        start: Any,
        end: Any,
        fields: Sequence[str] | None = None,
        selector: str | None = None,
        errors: bool = False,
    ) -> DataFrame: ...

    def last_before(
        self,
        signals: str | Sequence[str],
        t: Any,
        lookback: Any = "1d",
        selector: str | None = None,
    ) -> DataFrame: ...


__all__ = ["aligned", "col", "decimate", "resample", "stats", "union_frames"]

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NUMERIC = (*_INTEGRAL, T.FloatType, T.DoubleType)
_META = ("device", "property", "acq_stamp", "ts", "cycle_name", "cycle_stamp", "selector")
_INTERNAL = ("error", "recorder_id", "seq")
_HOWS = ("last", "first", "mean", "min", "max", "sum", "count")
_FILLS = ("previous", None, "drop")


def col(name: str) -> Column:
    """A column by its exact name (field columns may contain dots: ``"a.b"``)."""
    return F.col("`" + name.replace("`", "``") + "`")


# --- union by name with common types ---------------------------------------------------------


def _common_type(types: list[T.DataType]) -> T.DataType:
    known = [t for t in types if not isinstance(t, T.NullType)]
    if not known:
        return T.NullType()
    if all(t == known[0] for t in known):
        return known[0]
    if all(isinstance(t, _INTEGRAL) for t in known):
        return T.LongType()
    if all(isinstance(t, _NUMERIC) for t in known):
        return T.DoubleType()
    return T.StringType()


def _converted(frame: DataFrame, name: str, target: T.DataType) -> Column:
    if name not in frame.columns:
        return F.lit(None).cast(target).alias(name)
    source = frame.schema[name].dataType
    if source == target:
        return col(name)
    if isinstance(target, T.StringType) and isinstance(
        source, T.StructType | T.ArrayType | T.MapType
    ):
        return F.to_json(col(name)).alias(name)
    return col(name).cast(target).alias(name)


def union_frames(frames: list[DataFrame]) -> DataFrame:
    """Union by column name; a column whose types differ is widened to ``bigint`` (integers),
    ``double`` (numbers) or else ``string`` (structs and arrays as JSON)."""
    if len(frames) == 1:
        return frames[0]
    names: list[str] = []
    for frame in frames:
        names.extend(n for n in frame.columns if n not in names)
    targets = {
        name: _common_type([f.schema[name].dataType for f in frames if name in f.columns])
        for name in names
    }
    aligned_frames = [f.select(*[_converted(f, n, targets[n]) for n in names]) for f in frames]
    result = aligned_frames[0]
    for frame in aligned_frames[1:]:
        result = result.union(frame)
    return result


# --- helpers ---------------------------------------------------------------------------------


def _fields(frame: DataFrame) -> list[str]:
    return [c for c in frame.columns if c not in _META and c not in _INTERNAL]


def _numeric(frame: DataFrame) -> list[str]:
    return [c for c in _fields(frame) if isinstance(frame.schema[c].dataType, _NUMERIC)]


def _bucket(start: int, every: int) -> Column:
    # Integer arithmetic in SQL: ns stamps do not fit a double exactly.
    return F.expr(f"(acq_stamp - {start}) div {every}")


def _bucket_time(start: int, every: int, bucket: str = "bucket") -> list[Column]:
    stamp = F.expr(f"{start} + {bucket} * {every}")
    return [
        F.timestamp_micros(F.expr(f"({start} + {bucket} * {every}) div 1000")).alias("ts"),
        stamp.alias("acq_stamp"),
    ]


def _order_key() -> Column:
    return F.struct("acq_stamp", "recorder_id", "seq")


def _window(start: Any, end: Any) -> tuple[int, int]:
    return parse_time(start, "start"), parse_time(end, "end")


# --- aligned ---------------------------------------------------------------------------------


def aligned(
    history: History,
    master: str,
    others: str | Sequence[str],
    start: Any,
    end: Any,
    tolerance: Any = None,
    lookback: Any = "1d",
) -> DataFrame:
    """Each master row in ``[start, end)`` with the others' last values as of its ``acq_stamp``.

    Columns: the master's as in ``get`` (with device and property), then one column per other
    signal named ``"DEV/Prop#field"`` (that field) or ``"DEV/Prop"`` (the whole value, a struct).
    A value older than ``tolerance`` is null; values from up to ``lookback`` before ``start``
    count. A row of another signal with the same stamp as a master row counts (``<=``).
    """
    start_ns, end_ns = _window(start, end)
    target = parse_signal(master, "master")
    tol = None if tolerance is None else parse_duration(tolerance, "tolerance")
    span = parse_duration(lookback, "lookback")
    keys = history.index.keys([target])
    if len(keys) > 1:
        raise ValueError(f"master: {master!r} names {len(keys)} signals, aligned takes one")
    base = history.frame(master, start_ns, end_ns)
    master_columns = [c for c in base.columns if c not in _INTERNAL]
    parts = [base.select(*[col(c) for c in master_columns], "seq", F.lit(1).alias("_is_master"))]
    names: list[str] = []
    for other in parse_signals(others, "others"):
        for device, prop in history.index.keys([other]) or [(other.device, other.prop)]:
            name = f"{device}/{prop}" if other.field is None else f"{device}/{prop}#{other.field}"
            if name in names:
                continue
            names.append(name)
            rows = history.frame(name, start_ns - span, end_ns)
            fields = _fields(rows)
            value = (
                F.lit(None)
                if not fields
                else col(fields[0])
                if other.field is not None
                else F.struct(*[col(f) for f in fields])
            )
            parts.append(
                rows.select(
                    "acq_stamp",
                    "seq",
                    F.lit(0).alias("_is_master"),
                    F.struct(F.col("acq_stamp").alias("t"), value.alias("v")).alias(
                        f"_o{len(names)}"
                    ),
                )
            )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part, allowMissingColumns=True)
    # One ordering over all signals: a single task sorts the window's rows (fine up to millions).
    window = Window.orderBy("acq_stamp", "_is_master", "seq").rowsBetween(
        Window.unboundedPreceding, Window.currentRow
    )
    selected = [col(c) for c in master_columns]
    for i, name in enumerate(names, start=1):
        last = F.last(F.col(f"_o{i}"), ignorenulls=True).over(window)
        value = last.getField("v")
        if tol is not None:
            value = F.when(F.col("acq_stamp") - last.getField("t") <= F.lit(tol), value)
        selected.append(value.alias(name))
    return (
        union.select(*selected, "_is_master", "seq")
        .where(F.col("_is_master") == 1)
        .orderBy("acq_stamp", "seq")
        .drop("_is_master", "seq")
    )


# --- resample --------------------------------------------------------------------------------


def _aggregate(how: str, name: str) -> Column:
    value = col(name)
    if how == "last":
        return F.max_by(value, F.when(value.isNotNull(), _order_key()))
    if how == "first":
        return F.min_by(value, F.when(value.isNotNull(), _order_key()))
    return {"mean": F.avg, "min": F.min, "max": F.max, "sum": F.sum, "count": F.count}[how](value)


def resample(
    history: History,
    signals: str | Sequence[str],
    start: Any,
    end: Any,
    every: Any = "10s",
    how: str = "last",
    fill: str | None = "previous",
    selector: str | None = None,
) -> DataFrame:
    """One row per signal and bucket of ``every`` from ``start``: device, property, ts and
    acq_stamp (the bucket's start), then each field aggregated by ``how`` (last, first: any
    field; mean, min, max, sum, count: numeric fields only).

    ``fill="previous"`` fills empty buckets with the last earlier value (for ``how="last"`` the
    last value before ``start`` seeds it); ``fill=None`` leaves them null; ``"drop"`` omits them.
    """
    start_ns, end_ns = _window(start, end)
    step = parse_duration(every, "every")
    if how not in _HOWS:
        raise ValueError(f"how: {how!r} is not one of {', '.join(_HOWS)}")
    if fill not in _FILLS:
        raise ValueError(f"fill: {fill!r} is not 'previous', None or 'drop'")
    rows = history.frame(signals, start_ns, end_ns, selector=selector)
    fields = _fields(rows) if how in ("last", "first") else _numeric(rows)
    buckets = max(0, -(-(end_ns - start_ns) // step))
    grouped = rows.groupBy("device", "property", _bucket(start_ns, step).alias("bucket")).agg(
        *[_aggregate(how, f).alias(f) for f in fields]
    )
    if fill != "drop":
        keys = history.spark.createDataFrame(
            history.index.keys(parse_signals(signals)),
            "device string, property string",
        )
        grid = keys.crossJoin(history.spark.range(buckets).withColumnRenamed("id", "bucket"))
        grouped = grid.join(grouped, ["device", "property", "bucket"], "left")
    if fill == "previous":
        if how == "last":
            seed = history.last_before(signals, start_ns - 1, selector=selector)
            seed_fields = [col(f) if f in seed.columns else F.lit(None) for f in fields]
            grouped = grouped.unionByName(
                seed.select(
                    "device",
                    "property",
                    F.lit(-1).cast("long").alias("bucket"),
                    *[c.alias(f) for c, f in zip(seed_fields, fields, strict=True)],
                )
            )
        window = (
            Window.partitionBy("device", "property")
            .orderBy("bucket")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        grouped = grouped.select(
            "device",
            "property",
            "bucket",
            *[F.last(col(f), ignorenulls=True).over(window).alias(f) for f in fields],
        ).where(F.col("bucket") >= 0)
    return grouped.select(
        "device", "property", *_bucket_time(start_ns, step), *[col(f) for f in fields]
    ).orderBy("device", "property", "acq_stamp")


# --- stats -----------------------------------------------------------------------------------

_STATS_SCHEMA = (
    "field string, count bigint, nan_count bigint, errors bigint, first double, last double, "
    "min double, max double, mean double, std double"
)


def stats(
    history: History,
    signals: str | Sequence[str],
    start: Any,
    end: Any,
    every: Any = None,
    selector: str | None = None,
) -> DataFrame:
    """Statistics per signal, numeric scalar field (and bucket of ``every`` if given).

    Columns: device, property, [ts, acq_stamp of the bucket start,] field, count (values that
    are not null, NaN included), nan_count, errors (error rows of the signal), first, last (by
    time), min, max, mean, std (sample, ddof=1; NaN left out of min..std). Buckets without rows
    have no row.
    """
    start_ns, end_ns = _window(start, end)
    step = None if every is None else parse_duration(every, "every")
    rows = history.frame(signals, start_ns, end_ns, selector=selector, errors=True)
    fields = _numeric(rows)
    keys = [F.col("device"), F.col("property")]
    if step is not None:
        keys.append(_bucket(start_ns, step).alias("bucket"))
    aggregates = [F.count("error").alias("_errors")]
    for i, name in enumerate(fields):
        value = col(name).cast("double")
        clean = F.when(~F.isnan(value), value)
        # Ordering by acq_stamp alone keeps the aggregation buffers fixed-width (hash aggregate).
        stamp = F.when(value.isNotNull(), F.col("acq_stamp"))
        aggregates += [
            F.count(value).alias(f"_c{i}"),
            F.count_if(F.isnan(value)).alias(f"_n{i}"),
            F.min_by(value, stamp).alias(f"_f{i}"),
            F.max_by(value, stamp).alias(f"_l{i}"),
            F.min(clean).alias(f"_min{i}"),
            F.max(clean).alias(f"_max{i}"),
            F.avg(clean).alias(f"_mean{i}"),
            F.stddev_samp(clean).alias(f"_std{i}"),
        ]
    head = ["device", "property"] + (_bucket_time(start_ns, step) if step is not None else [])
    if not fields:
        bucket = "ts timestamp, acq_stamp bigint, " if step is not None else ""
        schema = f"device string, property string, {bucket}{_STATS_SCHEMA}"
        return history.spark.createDataFrame([], schema)
    grouped = rows.groupBy(*keys).agg(*aggregates)
    per_field = F.array(
        *[
            F.struct(
                F.lit(name).alias("field"),
                F.col(f"_c{i}").alias("count"),
                F.col(f"_n{i}").cast("long").alias("nan_count"),
                F.col("_errors").alias("errors"),
                F.col(f"_f{i}").alias("first"),
                F.col(f"_l{i}").alias("last"),
                F.col(f"_min{i}").alias("min"),
                F.col(f"_max{i}").alias("max"),
                F.col(f"_mean{i}").alias("mean"),
                F.col(f"_std{i}").alias("std"),
            )
            for i, name in enumerate(fields)
        ]
    )
    order = ["device", "property"] + (["acq_stamp"] if step is not None else []) + ["field"]
    return grouped.select(*head, F.inline(per_field)).orderBy(*order)


# --- decimate --------------------------------------------------------------------------------


def decimate(
    history: History,
    signal: str,
    start: Any,
    end: Any,
    points: int = 2000,
    selector: str | None = None,
) -> DataFrame:
    """Min and max of one numeric field per bin, for plots: ``points // 2`` bins of equal width
    from ``start`` (two points per bin). Columns: device, property, ts and acq_stamp (bin
    start), count, min, max (NaN left out); bins without values have no row.

    The field is the signal's ``#field``, else the property's only numeric field.
    """
    start_ns, end_ns = _window(start, end)
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ValueError(f"points: {points!r} must be an int >= 2")
    target = parse_signal(signal, "signal")
    if len(history.index.keys([target])) > 1:
        raise ValueError(f"signal: {signal!r} names several signals, decimate takes one")
    rows = history.frame(signal, start_ns, end_ns, selector=selector)
    numeric = _numeric(rows)
    if target.field is None and len(numeric) > 1:
        raise ValueError(
            f"signal: {signal!r} has several numeric fields ({', '.join(numeric)}): "
            "name one as DEV/Prop#field"
        )
    bins = points // 2
    width = max(1, -(-(end_ns - start_ns) // bins))
    value = col(numeric[0]).cast("double") if numeric else F.lit(None).cast("double")
    clean = F.when(~F.isnan(value), value)
    grouped = rows.groupBy("device", "property", _bucket(start_ns, width).alias("bucket")).agg(
        F.count(clean).alias("count"), F.min(clean).alias("min"), F.max(clean).alias("max")
    )
    return (
        grouped.where(F.col("count") > 0)
        .select("device", "property", *_bucket_time(start_ns, width), "count", "min", "max")
        .orderBy("acq_stamp")
    )
