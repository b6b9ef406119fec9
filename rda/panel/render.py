"""``Data`` -> JSON for the browser: what a property view and the strip chart draw.

Every field becomes ``{"name", "type", "kind", ...}`` with ``kind`` one of ``scalar``,
``string``, ``strings``, ``data`` (a nested ``Data``: ``fields``), ``records`` (an array of
``Data``), ``array`` (1-D numeric) or ``image`` (2-D numeric). Big values never travel whole:

- a 1-D array longer than ``columns`` (the plot's width in pixels) is cut into ``columns``
  buckets and each sends its min and max, so a spike shows however long the array is (a 1 MiB
  float64 array is 131,072 values: 1,000 columns send 2,000 numbers);
- a 2-D array is reduced to at most ``IMAGE_MAX`` pixels a side (block maximum) and scaled to
  0..255 grey levels, sent base64-encoded with its true shape and value range. An image of at
  most ``LINE_ROWS`` rows also sends each row as plot points (``rows``, decimated as a 1-D
  array), so the browser can draw it as one line per row (an orbit's H and V planes). Its
  rows are named by the value's first string array with one item per row (``row_labels``),
  and its columns placed by the first 1-D numeric array with one value per column (``x``,
  ``x_name``), when the value has them (the demo's ``planes`` and ``positions``).
"""

from __future__ import annotations

import base64
import math
import warnings
from typing import Any

import numpy as np

from rda.serialization.data import Data, DataType
from rda.serialization.header import DataContext

__all__ = [
    "IMAGE_MAX",
    "LINE_ROWS",
    "STRING_MAX",
    "context_json",
    "data_json",
    "decimate",
    "image",
    "numeric_fields",
]

IMAGE_MAX = 256
LINE_ROWS = 16
STRING_MAX = 4096
_NUMERIC = {
    DataType.BOOL,
    DataType.INT8,
    DataType.INT16,
    DataType.INT32,
    DataType.INT64,
    DataType.FLOAT32,
    DataType.FLOAT64,
}


def _number(value: float) -> float | None:
    """JSON has no NaN or infinity: they travel as null."""
    return value if math.isfinite(value) else None


def decimate(values: np.ndarray[Any, Any], columns: int) -> dict[str, Any]:
    """A 1-D array as plot points: whole when it fits ``columns``, else min/max per column."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n <= columns:
        return {"length": n, "x": None, "y": [_number(float(v)) for v in values]}
    # Column c covers [edges[c], edges[c+1]); every value lands in exactly one column.
    edges = np.linspace(0, n, columns + 1).astype(np.int64)
    starts = edges[:-1]
    with np.errstate(invalid="ignore"):
        lows = np.fmin.reduceat(values, starts)
        highs = np.fmax.reduceat(values, starts)
    return {
        "length": n,
        "x": [int(s) for s in starts],
        "min": [_number(float(v)) for v in lows],
        "max": [_number(float(v)) for v in highs],
    }


def image(values: np.ndarray[Any, Any]) -> dict[str, Any]:
    """A 2-D array as grey levels (block maximum down to ``IMAGE_MAX`` a side)."""
    values = np.asarray(values, dtype=np.float64)
    rows, cols = values.shape
    step_r, step_c = max(1, math.ceil(rows / IMAGE_MAX)), max(1, math.ceil(cols / IMAGE_MAX))
    if step_r > 1 or step_c > 1:
        pad_r, pad_c = (-rows) % step_r, (-cols) % step_c
        padded = np.pad(values, ((0, pad_r), (0, pad_c)), constant_values=np.nan)
        blocks = padded.reshape(
            padded.shape[0] // step_r, step_r, padded.shape[1] // step_c, step_c
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN block stays NaN
            values = np.nanmax(blocks, axis=(1, 3))
    finite = values[np.isfinite(values)]
    low = float(finite.min()) if finite.size else 0.0
    high = float(finite.max()) if finite.size else 0.0
    span = high - low or 1.0
    grey = np.nan_to_num((values - low) / span * 255.0, nan=0.0).clip(0, 255).astype(np.uint8)
    return {
        "shape": [rows, cols],
        "width": int(grey.shape[1]),
        "height": int(grey.shape[0]),
        "min": low,
        "max": high,
        "pixels": base64.b64encode(grey.tobytes()).decode("ascii"),
    }


def _field(name: str, kind: DataType, value: Any, columns: int) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": kind.name}
    if kind in _NUMERIC:
        out["kind"] = "scalar"
        if kind == DataType.BOOL:
            out["value"] = bool(value)
        elif kind == DataType.FLOAT32 or kind == DataType.FLOAT64:
            out["value"] = _number(float(value))
        else:
            out["value"] = int(value)
    elif kind == DataType.STRING:
        out["kind"] = "string"
        out["value"] = str(value)[:STRING_MAX]
    elif kind == DataType.DATA:
        out["kind"] = "data"
        out["fields"] = data_json(value, columns)
    elif kind == DataType.DATA_ARRAY:
        out["kind"] = "records"
        out["items"] = [data_json(item, columns) for item in list(value)[:64]]
        out["length"] = len(value)
    elif kind == DataType.STRING_ARRAY:
        out["kind"] = "strings"
        items = [str(v) for v in np.asarray(value).ravel()[:256]]
        out["items"] = items
        out["shape"] = list(np.shape(value))
    else:  # numeric arrays
        array = np.asarray(value)
        if array.ndim == 2 and min(array.shape) > 1:
            out["kind"] = "image"
            out.update(image(array))
            if array.shape[0] <= LINE_ROWS:
                out["rows"] = [decimate(row, columns) for row in array]
        else:
            out["kind"] = "array"
            out.update(decimate(array.ravel(), columns))
    return out


def data_json(data: Data, columns: int = 1000) -> list[dict[str, Any]]:
    """Each field of ``data``, in order, as described in the module docstring."""
    types = data.types()
    fields = [_field(name, types[name], value, columns) for name, value in data.items()]
    for field in fields:
        if field.get("kind") == "image":
            _label_axes(field, fields)
    return fields


def _label_axes(image_field: dict[str, Any], fields: list[dict[str, Any]]) -> None:
    """Row names and column positions for an image, from its sibling fields (see above)."""
    rows, cols = image_field["shape"]
    for other in fields:
        if other["kind"] == "strings" and other["shape"] == [rows]:
            image_field["row_labels"] = other["items"]
            break
    for other in fields:
        if other["kind"] == "array" and other["length"] == cols and other["x"] is None:
            image_field["x_name"] = other["name"]
            image_field["x"] = other["y"]
            break


def numeric_fields(data: Data) -> dict[str, float]:
    """The numeric scalar fields of ``data`` (top level), for the strip chart."""
    types = data.types()
    out = {}
    for name, value in data.items():
        if types[name] in _NUMERIC:
            out[name] = float(value)
    return out


def context_json(context: DataContext | None) -> dict[str, Any] | None:
    if context is None:
        return None
    return {
        "cycle_name": context.cycle_name,
        "cycle_stamp": context.cycle_stamp,
        "acq_stamp": context.acq_stamp,
        "selector": context.selector,
    }
