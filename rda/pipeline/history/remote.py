"""``rda history get --from-recorder``: the same table as ``local_get``, asked of a running
recorder's history server over rda instead of read from the store.

The client finds the recorder through the directory (``history:<device>``, see
docs/history.md "History as a service"), so no store path or URI is needed, and rows the
recorder has not converted to Parquet yet are included. Signals are literal ``DEV/PROP`` or
``DEV/PROP#field`` (no globs: a history server answers for one signal at a time); the selector
is matched exactly.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rda.business.client.service import ClientService
from rda.pipeline.history.local import GET_COLUMNS
from rda.pipeline.history.paths import parse_signals

__all__ = ["remote_get"]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def remote_get(
    signals: str | Sequence[str],
    start: int,
    end: int,
    fields: Sequence[str] | None = None,
    selector: str | None = None,
    errors: bool = False,
    client: ClientService | None = None,
) -> pa.Table:
    """Rows with ``start <= acq_stamp < end`` from the recorders serving ``signals``."""
    parsed = parse_signals(signals)
    for signal in parsed:
        if any(ch in signal.device + signal.prop for ch in "*?["):
            raise ValueError(f"signals: {signal.text!r}: --from-recorder takes no globs")
    own = client is None
    service = ClientService() if client is None else client
    rows: list[dict[str, Any]] = []
    try:
        for signal in parsed:
            wanted = [signal.field] if signal.field else list(fields or [])
            found = service.history(signal.device, signal.prop, start, end, selector)
            for notification in found:
                context = notification.context
                error = notification.error
                if error is not None and not errors:
                    continue
                row: dict[str, Any] = {
                    "device": signal.device,
                    "property": signal.prop,
                    "acq_stamp": context.acq_stamp,
                    "ts": datetime.datetime.fromtimestamp(context.acq_stamp / 1e9, tz=datetime.UTC),
                    "cycle_name": context.cycle_name,
                    "cycle_stamp": context.cycle_stamp,
                    "selector": context.selector,
                }
                if errors:
                    row["error"] = None if error is None else f"{type(error).__name__}: {error}"
                if error is None:
                    values = notification.data.to_dict()
                    for name in wanted or list(values):
                        head, _, rest = name.partition(".")
                        value = values.get(head)
                        for part in rest.split(".") if rest else []:
                            value = value.get(part) if isinstance(value, dict) else None
                        row[name] = _plain(value)
                rows.append(row)
    finally:
        if own:
            service.close()
    base = [*GET_COLUMNS, *(["error"] if errors else [])]
    if not rows:
        types = {"acq_stamp": pa.int64(), "cycle_stamp": pa.int64()}
        types["ts"] = pa.timestamp("us", "UTC")
        return pa.schema([(n, types.get(n, pa.string())) for n in base]).empty_table()
    table = pa.Table.from_pylist(rows)
    return table.select([*base, *(n for n in table.schema.names if n not in base)])
