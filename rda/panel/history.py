"""The recorded past for the strip chart (``rda panel --history STORE``).

Reads the recorder's Parquet store with ``rda.pipeline.history.local.local_get`` (pyarrow
only, no JVM: docs/history.md), so a chart opens already filled with the last minutes. The
panel works without it: without ``--history`` (or without the ``[pipeline]`` extra) the chart
starts empty and fills from the live stream.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["MAX_HISTORY_POINTS", "HistoryReader"]

MAX_HISTORY_POINTS = 4000


class HistoryReader:
    """Numeric-field series out of one recorder store."""

    def __init__(self, root: str) -> None:
        # Imported here: the panel itself does not need the [pipeline] extra.
        from rda.pipeline.history.local import local_get

        self.root = root
        self._get = local_get

    def series(
        self, device: str, prop: str, field: str, minutes: float, selector: str | None = None
    ) -> dict[str, Any]:
        """``{"t": [s since epoch], "v": [...]}`` of ``device/prop``'s ``field`` over the last
        ``minutes``, thinned by striding to at most ``MAX_HISTORY_POINTS`` points."""
        end = time.time_ns()
        start = end - int(minutes * 60e9)
        table = self._get(
            self.root, f"{device}/{prop}", start, end, fields=[field], selector=selector or None
        )
        if field not in table.schema.names or table.num_rows == 0:
            return {"t": [], "v": []}
        table = table.sort_by("acq_stamp")
        stamps = table.column("acq_stamp").to_pylist()
        values = table.column(field).to_pylist()
        step = max(1, math.ceil(len(stamps) / MAX_HISTORY_POINTS))
        t, v = [], []
        for stamp, value in zip(stamps[::step], values[::step], strict=True):
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            t.append(stamp / 1e9)
            v.append(float(value))
        return {"t": t, "v": v}
