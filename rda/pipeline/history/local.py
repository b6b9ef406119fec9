"""Small History pulls with pyarrow alone (no JVM): ``search``, ``get`` and ``stats``.

``root`` is a local path, a store URI (``s3://``, ``file://``, ...) or a ``Store``; every read
goes through its ``pyarrow.fs`` filesystem.

What ``rda history`` uses unless ``--spark`` is given. Like ``rda.pipeline.history.api.History``,
each call resolves the exact Parquet files of the partitions its window touches
(``StoreIndex``), never scanning the store, and filters by ``acq_stamp`` in ``[start, end)``.
Each file is read on its own and its value fields flattened to columns before the files are
concatenated, so files of different (widened) schema versions combine without a cast.
"""

from __future__ import annotations

import datetime
import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rda.pipeline.history.paths import Signal, StoreIndex, days_between, parse_signals
from rda.pipeline.recorder.store import Store

__all__ = ["GET_COLUMNS", "STATS_COLUMNS", "local_get", "local_search", "local_stats"]

GET_COLUMNS = ("device", "property", "acq_stamp", "ts", "cycle_name", "cycle_stamp", "selector")
STATS_COLUMNS = (
    "device",
    "property",
    "ts",
    "acq_stamp",
    "field",
    "count",
    "nan_count",
    "errors",
    "first",
    "last",
    "min",
    "max",
    "mean",
    "std",
)
_ATTEMPTS = 3  # listings tried when a compaction removes a file between listing and reading
_READ = ["acq_stamp", "ts", "cycle_name", "cycle_stamp", "selector", "error", "recorder_id", "seq"]


def local_search(root: Store | Path | str, pattern: str = "*/*") -> pa.Table:
    """device, property, first_day, last_day, schema_versions of the recorded pairs matching."""
    text = pattern if "/" in pattern else f"{pattern}/*"
    signals = parse_signals(text, "pattern")
    if signals[0].field is not None:
        raise ValueError(f"pattern: {pattern!r}: a search names no field")
    index = StoreIndex(root)
    rows = []
    for device, prop in index.keys(signals):
        days = index.days(device, prop)
        if days:
            rows.append(
                {
                    "device": device,
                    "property": prop,
                    "first_day": datetime.date.fromisoformat(days[0]),
                    "last_day": datetime.date.fromisoformat(days[-1]),
                    "schema_versions": index.versions(device, prop),
                }
            )
    schema = pa.schema(
        [
            ("device", pa.string()),
            ("property", pa.string()),
            ("first_day", pa.date32()),
            ("last_day", pa.date32()),
            ("schema_versions", pa.list_(pa.int32())),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _field(data: pa.Array, path: str) -> pa.Array | None:
    """The column of ``data`` at the dotted ``path`` (None when a file lacks it)."""
    column: pa.Array = data
    for part in path.split("."):
        if not pa.types.is_struct(column.type) or column.type.get_field_index(part) < 0:
            return None
        column = pc.struct_field(column, part)
    return column


def _names(
    signal: Signal, fields: Sequence[str] | None, data_type: pa.DataType | None
) -> list[str]:
    if signal.field is not None:
        return [signal.field]
    if fields:
        return list(fields)
    if data_type is None or not pa.types.is_struct(data_type):
        return []
    return [data_type.field(i).name for i in range(data_type.num_fields)]


def _read_file(
    filesystem: pafs.FileSystem, path: str, start: int, end: int, errors: bool
) -> pa.Table:
    window = (pc.field("acq_stamp") >= start) & (pc.field("acq_stamp") < end)
    if not errors:
        window = window & pc.field("error").is_null()
    table = pq.read_table(path, filters=window, filesystem=filesystem)
    return table.drop_columns(
        [c for c in ("device", "property", "date") if c in table.schema.names]
    )


def _key_table(
    index: StoreIndex,
    key: tuple[str, str],
    signals: list[Signal],
    days: list[str],
    window: tuple[int, int],
    fields: Sequence[str] | None,
    errors: bool,
) -> pa.Table | None:
    pieces = []
    for path in index.files(key[0], key[1], days):
        table = _read_file(index.store.fs, path, window[0], window[1], errors)
        if not table.num_rows:
            continue
        data = (
            table.column("data").combine_chunks()
            if "data" in table.schema.names
            else pa.nulls(table.num_rows)
        )
        columns: dict[str, Any] = {
            "device": pa.array([key[0]] * table.num_rows, pa.string()),
            "property": pa.array([key[1]] * table.num_rows, pa.string()),
        }
        columns.update({c: table.column(c) for c in _READ})
        for signal in signals:
            for name in _names(signal, fields, data.type):
                column = _field(data, name)
                if column is not None and name not in columns:
                    columns[name] = column
        pieces.append(pa.table(columns))
    if not pieces:
        return None
    return pa.concat_tables(pieces, promote_options="permissive")


def _collect(
    root: Store | Path | str,
    signals: str | Sequence[str],
    start: int,
    end: int,
    fields: Sequence[str] | None,
    errors: bool,
) -> pa.Table | None:
    parsed = parse_signals(signals)
    days = days_between(start, end)
    for attempt in range(_ATTEMPTS):
        index = StoreIndex(root)
        try:
            tables = []
            for key in index.keys(parsed):
                chosen = [s for s in parsed if s.matches(*key)]
                table = _key_table(index, key, chosen, days, (start, end), fields, errors)
                if table is not None:
                    tables.append(table)
            break
        except FileNotFoundError:
            # A compaction deleted a listed input (this read outlived its linger): its rows
            # are in the output now, so list again and read again, whole.
            if attempt == _ATTEMPTS - 1:
                raise
    if not tables:
        return None
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(
            f"signals: their fields have incompatible types ({exc}); pull them one by one"
        ) from None
    return table.sort_by(
        [
            ("device", "ascending"),
            ("property", "ascending"),
            ("acq_stamp", "ascending"),
            ("recorder_id", "ascending"),
            ("seq", "ascending"),
        ]
    )


def _empty(names: Sequence[str]) -> pa.Table:
    types = {"acq_stamp": pa.int64(), "cycle_stamp": pa.int64(), "ts": pa.timestamp("us", "UTC")}
    return pa.schema([(n, types.get(n, pa.string())) for n in names]).empty_table()


def _select(table: pa.Table, selector: str) -> pa.Table:
    column = table.column("selector")
    if any(ch in selector for ch in "*?["):
        # fnmatch anchors with \\Z, which RE2 (Arrow's regex engine) spells $.
        pattern = "^" + fnmatch.translate(selector).removesuffix("\\Z") + "$"
        return table.filter(pc.match_substring_regex(column, pattern))
    return table.filter(pc.equal(column, selector))


def local_get(
    root: Store | Path | str,
    signals: str | Sequence[str],
    start: int,
    end: int,
    fields: Sequence[str] | None = None,
    selector: str | None = None,
    errors: bool = False,
) -> pa.Table:
    """Rows with ``start <= acq_stamp < end``; columns as ``History.get`` (see the module doc)."""
    base = [*GET_COLUMNS, *(["error"] if errors else [])]
    table = _collect(root, signals, start, end, fields, errors)
    if table is None:
        return _empty(base)
    if selector is not None:
        table = _select(table, selector)
    values = [c for c in table.schema.names if c not in (*GET_COLUMNS, *_READ)]
    return table.select([*base, *values])


def _numeric(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    )


def _summary(values: np.ndarray[Any, Any]) -> dict[str, Any]:
    finite = values[~np.isnan(values)]
    return {
        "count": len(values),
        "first": float(values[0]) if len(values) else None,
        "last": float(values[-1]) if len(values) else None,
        "min": float(finite.min()) if len(finite) else None,
        "max": float(finite.max()) if len(finite) else None,
        "mean": float(finite.mean()) if len(finite) else None,
        "std": float(finite.std(ddof=1)) if len(finite) > 1 else None,
        "nan_count": int(np.isnan(values).sum()),
    }


def _pairs(table: pa.Table) -> list[tuple[str, str]]:
    devices = table.column("device").to_pylist()
    return sorted(set(zip(devices, table.column("property").to_pylist(), strict=True)))


def local_stats(
    root: Store | Path | str,
    signals: str | Sequence[str],
    start: int,
    end: int,
    every: int | None = None,
) -> pa.Table:
    """Per signal, numeric scalar field and bucket: the statistics, as ``History.stats``.

    Buckets (with ``every``, ns) start at ``start``: bucket ``b`` is ``[start + b*every,
    start + (b+1)*every)``, identified by ``ts``/``acq_stamp`` (those columns only exist with
    ``every``). ``count`` counts values (NaN included; not nulls, not error rows),
    ``nan_count`` the NaNs; ``min``/``max``/``mean``/``std`` (sample) leave NaN out;
    ``first``/``last`` are by time; ``errors`` counts the bucket's error rows.
    """
    table = _collect(root, signals, start, end, None, errors=True)
    rows: list[dict[str, Any]] = []
    for device, prop in [] if table is None else _pairs(table):
        assert table is not None
        sub = table.filter(
            pc.and_(pc.equal(table["device"], device), pc.equal(table["property"], prop))
        )
        acq = sub.column("acq_stamp").to_numpy()
        buckets = (acq - start) // every if every else np.zeros(len(acq), dtype=np.int64)
        failed = sub.column("error").is_valid().to_numpy(zero_copy_only=False)
        fields = [
            f.name for f in sub.schema if f.name not in (*GET_COLUMNS, *_READ) and _numeric(f.type)
        ]
        for number in np.unique(buckets):
            in_bucket = buckets == number
            begin = start + int(number) * (every or 0)
            common = {
                "device": device,
                "property": prop,
                "ts": begin // 1000,
                "acq_stamp": begin,
                "errors": int((in_bucket & failed).sum()),
            }
            for name in fields:
                column = sub.column(name).cast(pa.float64()).to_numpy(zero_copy_only=False)
                valid = sub.column(name).is_valid().to_numpy(zero_copy_only=False)
                values = column[in_bucket & valid & ~failed]
                rows.append({**common, "field": name, **_summary(values)})
    types: dict[str, pa.DataType] = {
        "device": pa.string(),
        "property": pa.string(),
        "field": pa.string(),
        "ts": pa.timestamp("us", "UTC"),
        "acq_stamp": pa.int64(),
        "count": pa.int64(),
        "errors": pa.int64(),
        "nan_count": pa.int64(),
    }
    names = [n for n in STATS_COLUMNS if every or n not in ("ts", "acq_stamp")]
    schema = pa.schema([(n, types.get(n, pa.float64())) for n in names])
    return pa.Table.from_pylist(rows, schema=schema)
