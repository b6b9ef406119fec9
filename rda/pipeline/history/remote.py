"""``rda history get --from-recorder``: the same table as ``local_get``, asked of a running
recorder's history server over rda instead of read from the store.

The client finds the recorder through the directory (``history:<device>``, see
docs/history.md "History as a service"), so no store path or URI is needed, and rows the
recorder has not converted to Parquet yet are included. Signals are literal ``DEV/PROP`` or
``DEV/PROP#field`` (no globs: a history server answers for one signal at a time); the selector
is matched exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rda.business.client.history import field_column, value_columns
from rda.business.client.service import ClientService
from rda.pipeline.history.local import GET_COLUMNS
from rda.pipeline.history.paths import parse_signals

__all__ = ["remote_get"]


def _field(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    """Value field ``name`` (``a.b``: field ``b`` of struct field ``a``) of a history table."""
    head, _, rest = name.partition(".")
    column_name = field_column(head)
    if column_name not in table.schema.names:
        return None
    column = table.column(column_name)
    for part in rest.split(".") if rest else []:
        kind = column.type
        if not pa.types.is_struct(kind) or kind.get_field_index(part) < 0:
            return None
        column = pc.struct_field(column, part)
    return column


def _signal_table(
    table: pa.Table, device: str, prop: str, wanted: list[str], errors: bool
) -> pa.Table:
    if not errors:
        table = table.filter(pc.is_null(table.column("error")))
    count = table.num_rows
    micros = pc.divide(table.column("acq_stamp"), 1000)
    columns: dict[str, Any] = {
        "device": pa.repeat(pa.scalar(device), count),
        "property": pa.repeat(pa.scalar(prop), count),
        "acq_stamp": table.column("acq_stamp"),
        "ts": micros.cast(pa.timestamp("us", "UTC")),
        "cycle_name": table.column("cycle_name"),
        "cycle_stamp": table.column("cycle_stamp"),
        "selector": table.column("selector"),
    }
    if errors:
        columns["error"] = table.column("error")
    for name in wanted or [n.removeprefix("data.") for n in value_columns(table)]:
        column = _field(table, name)
        out = name if name not in columns else f"data.{name}"
        columns[out] = column if column is not None else pa.nulls(count)
    return pa.table(columns)


def remote_get(
    signals: str | Sequence[str],
    start: int,
    end: int,
    fields: Sequence[str] | None = None,
    selector: str | None = None,
    errors: bool = False,
    client: ClientService | None = None,
) -> pa.Table:
    """Rows with ``start <= acq_stamp < end`` from the recorders serving ``signals``, read
    with ``history_table`` (Arrow chunks, no object per row); values keep their Arrow types as
    stored (N-D arrays as ``struct<elements, dims>``, as ``local_get`` gives them)."""
    parsed = parse_signals(signals)
    for signal in parsed:
        if any(ch in signal.device + signal.prop for ch in "*?["):
            raise ValueError(f"signals: {signal.text!r}: --from-recorder takes no globs")
    own = client is None
    service = ClientService() if client is None else client
    tables: list[pa.Table] = []
    try:
        for signal in parsed:
            wanted = [signal.field] if signal.field else list(fields or [])
            found = service.history_table(signal.device, signal.prop, start, end, selector)
            tables.append(_signal_table(found, signal.device, signal.prop, wanted, errors))
    finally:
        if own:
            service.close()
    base = [*GET_COLUMNS, *(["error"] if errors else [])]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        types = {"acq_stamp": pa.int64(), "cycle_stamp": pa.int64()}
        types["ts"] = pa.timestamp("us", "UTC")
        return pa.schema([(n, types.get(n, pa.string())) for n in base]).empty_table()
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.select([*base, *(n for n in table.schema.names if n not in base)])
