"""The recorded past for the strip chart, so a chart opens already filled with the last minutes.

Two sources, one shape (``{"t": [...], "v": [...]}``):

- :class:`HistoryReader` (``rda panel --history STORE``): reads a recorder's Parquet store with
  ``rda.pipeline.history.local.local_get`` (pyarrow only, no JVM: docs/history.md);
- :class:`ServiceHistory` (without ``--history``): asks the recorder that serves the signal's
  history over rda (``client.history_table``: Arrow chunks, no object per row; found through the directory's ``history:<DEVICE>``
  entries: docs/client.md). No recorder there: ``HistoryUnavailableError``, and the chart
  starts empty and fills from the live stream.
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Any, Protocol

from rda.business.client.history import field_column
from rda.business.client.service import ClientService

__all__ = [
    "MAX_HISTORY_MINUTES",
    "MAX_HISTORY_POINTS",
    "MAX_SERVICE_ROWS",
    "HistoryReader",
    "Past",
    "ServiceHistory",
    "parse_minutes",
]

MAX_HISTORY_POINTS = 4000
# The longest window the chart may ask for (a week): far beyond its choices, and a bound that
# keeps the window's arithmetic in range (``minutes=inf`` overflowed into a 500).
MAX_HISTORY_MINUTES = 7 * 24 * 60.0
# Rows asked of a history service per series: the oldest first, so at high rates a long window
# opens with its beginning only (the service answers in stamp order, it does not thin).
MAX_SERVICE_ROWS = 50_000


class Past(Protocol):
    """Where the strip chart's recorded past comes from."""

    kind: str  # "store" or "service": shown on the page

    def series(
        self, device: str, prop: str, field: str, minutes: float, selector: str | None = None
    ) -> dict[str, Any]: ...


def parse_minutes(text: str) -> float:
    """The ``minutes`` of a history query: a number in ``(0, MAX_HISTORY_MINUTES]``, else
    ``ValueError`` saying so (inf, nan, 1e300, 0, negatives and words alike)."""
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not 0 < minutes <= MAX_HISTORY_MINUTES:  # nan compares false
        raise ValueError(
            f"minutes must be a number of minutes in (0, {MAX_HISTORY_MINUTES:g}], not {text!r}"
        )
    return minutes


def _thin(t: list[float], v: list[float]) -> dict[str, Any]:
    step = max(1, math.ceil(len(t) / MAX_HISTORY_POINTS))
    return {"t": t[::step], "v": v[::step]}


class HistoryReader:
    """Numeric-field series out of one recorder store."""

    kind = "store"

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
        t, v = [], []
        for stamp, value in zip(stamps, values, strict=True):
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            t.append(stamp / 1e9)
            v.append(float(value))
        return _thin(t, v)


class ServiceHistory:
    """Numeric-field series asked of a recorder's history service through the panel's client."""

    kind = "service"

    def __init__(self, client: ClientService, timeout: float = 5.0) -> None:
        self._client = client
        self._timeout = timeout

    def series(
        self, device: str, prop: str, field: str, minutes: float, selector: str | None = None
    ) -> dict[str, Any]:
        """As :meth:`HistoryReader.series`; raises ``HistoryUnavailableError`` when no
        recorder serves ``device/prop``'s history."""
        table = self._client.history_table(
            device,
            prop,
            -datetime.timedelta(minutes=minutes),
            selector=selector or None,
            limit=MAX_SERVICE_ROWS,
            timeout=self._timeout,
        )
        column = field_column(field)
        if column not in table.schema.names or table.num_rows == 0:
            return {"t": [], "v": []}
        t: list[float] = []
        v: list[float] = []
        stamps = table.column("acq_stamp").to_pylist()
        for stamp, value in zip(stamps, table.column(column).to_pylist(), strict=True):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue  # an error row (null), or not a number
            if math.isfinite(value):
                t.append(stamp / 1e9)
                v.append(float(value))
        return _thin(t, v)
