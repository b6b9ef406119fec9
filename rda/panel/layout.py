"""A panel layout: what an operator keeps (its views, its strip chart, their arrangement).

A layout is JSON, validated by :class:`Layout` (pydantic) wherever it comes from: a file given
to ``rda panel --layout FILE`` (a bad file is a usage error, exit 2), a file loaded in the
browser or a layout encoded in a shared link (both sent to ``POST /api/layout``, which
answers the normalised layout or the errors). The browser builds one from what is on the
page (``Save layout``) and applies one by opening its views and chart series; the panel never
stores layouts itself.

Bounds keep a layout what a tab can show: at most ``MAX_VIEWS`` views (a tab's limit) and
``MAX_SERIES`` chart series; names are plain text and the page renders them as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rda.panel.session import MAX_VIEWS

__all__ = [
    "MAX_LAYOUT_BYTES",
    "MAX_SERIES",
    "ChartLayout",
    "Layout",
    "LayoutError",
    "SeriesLayout",
    "ViewLayout",
    "load_layout",
    "parse_layout",
]

MAX_SERIES = 32
MAX_LAYOUT_BYTES = 256 * 1024
_NAME = Field(min_length=1, max_length=256)
_SELECTOR = Field(default="", max_length=256)


class LayoutError(ValueError):
    """A layout that is not valid JSON or not a valid layout; the message says where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ViewLayout(_Strict):
    """One property view: what it shows and how its images are drawn."""

    device: str = _NAME
    property: str = _NAME
    selector: str = _SELECTOR
    # Per 2-D field: drawn as an image or as one line per row.
    images: dict[str, Literal["image", "lines"]] = Field(default_factory=dict, max_length=64)


class SeriesLayout(_Strict):
    """One line of the strip chart: a numeric field of a property."""

    device: str = _NAME
    property: str = _NAME
    selector: str = _SELECTOR
    field: str = _NAME


class ChartLayout(_Strict):
    """The strip chart: its series and its time window (seconds)."""

    window: Literal[60, 300, 900] = 300
    series: list[SeriesLayout] = Field(default_factory=list, max_length=MAX_SERIES)


class Layout(_Strict):
    """A whole page: views in order, their grid's columns (None: as many as fit), the chart."""

    version: Literal[1] = 1
    title: str = Field(default="", max_length=200)
    time_zone: Literal["utc", "local"] = "utc"
    columns: int | None = Field(default=None, ge=1, le=6)
    views: list[ViewLayout] = Field(default_factory=list, max_length=MAX_VIEWS)
    chart: ChartLayout = Field(default_factory=ChartLayout)


def _errors(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(top)"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def parse_layout(text: str | bytes) -> Layout:
    """``text`` (JSON) as a :class:`Layout`; raises :class:`LayoutError` saying what is wrong."""
    if len(text) > MAX_LAYOUT_BYTES:
        raise LayoutError(f"a layout is at most {MAX_LAYOUT_BYTES} bytes")
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise LayoutError(f"not JSON: {exc}") from None
    try:
        return Layout.model_validate(raw)
    except ValidationError as exc:
        raise LayoutError(f"not a panel layout: {_errors(exc)}") from None


def load_layout(path: Path | str) -> Layout:
    """The layout in the file at ``path``; :class:`LayoutError` names the file and the fault."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise LayoutError(f"{path}: {exc.strerror or exc}") from None
    try:
        return parse_layout(data)
    except LayoutError as exc:
        raise LayoutError(f"{path}: {exc}") from None
