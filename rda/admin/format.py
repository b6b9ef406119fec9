"""Human-readable output for the CLI and admin replies: tables, summarised arrays, units.

Everything here works on plain Python values (what ``Data.to_dict()`` returns: scalars, str,
numpy arrays, nested dicts, lists of dicts), so it can be tested without a server. Arrays are
never printed in full on a terminal: a line like ``float64[2x64] min=-1.2 max=3.4`` tells an
operator what arrived without flooding the screen (``--json`` prints everything).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "dumps",
    "format_bytes",
    "format_duration",
    "format_mapping",
    "format_table",
    "format_timestamp",
    "format_value",
    "humanize",
    "summarize_array",
    "to_jsonable",
]

# Short arrays are shown in full; this many elements or more are summarised.
_SHOW_ELEMENTS = 8


def format_duration(seconds: float) -> str:
    """``0.00042`` -> ``420 µs``; ``3725`` -> ``1 h 2 min``: the unit a human would choose."""
    if math.isnan(seconds):
        return "n/a"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds == 0:
        return "0 s"
    # Round to the 3 significant digits shown before choosing the unit, so 0.9996 ms reads
    # "1 ms", not "1e+03 µs".
    seconds = float(f"{seconds:.3g}")
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 60.0:
        return f"{seconds:.3g} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def format_bytes(count: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")  # pragma: no cover


def format_timestamp(seconds: float | None, now: float | None = None) -> str:
    """A UNIX time as local ISO time, with the age when ``now`` is given; ``-`` for none."""
    if seconds is None or seconds <= 0:
        return "-"
    text = _dt.datetime.fromtimestamp(seconds).isoformat(sep=" ", timespec="milliseconds")
    if now is not None:
        text += f" ({format_duration(max(0.0, now - seconds))} ago)"
    return text


def summarize_array(array: np.ndarray[Any, Any]) -> str:
    """``float64[2x64] min=-1.2 max=3.4``; short 1-D arrays are shown in full."""
    dims = "x".join(str(n) for n in array.shape)
    kind = "str" if array.dtype.kind in "OUS" else str(array.dtype)
    head = f"{kind}[{dims}]"
    if array.size == 0:
        return head
    if array.ndim == 1 and array.size < _SHOW_ELEMENTS:
        return f"{head} {_short_list(array.tolist())}"
    if array.dtype.kind in "biuf":
        values = array.astype(np.float64, copy=False)
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return f"{head} (no finite values)"
        return f"{head} min={_num(float(finite.min()))} max={_num(float(finite.max()))}"
    first = array.reshape(-1)[:3].tolist()
    return f"{head} {_short_list(first)[:-1]}, ...]"


def format_value(value: Any) -> str:
    """One value on one line: scalars as themselves, arrays summarised, nested data abridged."""
    if isinstance(value, np.ndarray):
        return summarize_array(value)
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, float | np.floating):
        return _num(float(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k}={format_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, Sequence):
        if len(value) >= _SHOW_ELEMENTS:
            return f"[{len(value)} items]"
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def format_mapping(data: Mapping[str, Any], indent: int = 0) -> str:
    """A multi-line ``name  value`` listing; nested mappings are indented below their name."""
    if not data:
        return " " * indent + "(empty)"
    # Align the values of one-line fields; nested blocks start on their own line.
    flat = [k for k, v in data.items() if not (isinstance(v, Mapping) and v) and not _is_records(v)]
    width = max((len(str(k)) for k in flat), default=0)
    lines: list[str] = []
    pad = " " * indent
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:")
            lines.append(format_mapping(value, indent + 2))
        elif _is_records(value):
            lines.append(f"{pad}{key}:")
            lines.append(_indent(format_table(list(value)), indent + 2))
        else:
            lines.append(f"{pad}{str(key).ljust(width)}  {format_value(value)}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A table cell: an empty list is "-" (the wire cannot tell the type of an empty list, so
    an empty list of names arrives as ``float64[0]``, which says nothing to a reader)."""
    if isinstance(value, np.ndarray) and value.size == 0:
        return "-"
    if isinstance(value, list | tuple) and not value:
        return "-"
    return format_value(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of mappings as an aligned text table (columns: the union of keys, in order)."""
    if not rows:
        return "(none)"
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        columns = list(seen)
    cells = [[_cell(row[c]) if c in row else "" for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    header = "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join([header.rstrip(), *body])


# Field names whose float values are UNIX times or durations in seconds, in admin replies and
# snapshots: shown as local times and with units instead of ``1.79533e+09``.
TIME_FIELDS = frozenset(
    {"connected_since", "last_heard", "last_update", "started_at", "registered_at", "time"}
)
DURATION_FIELDS = frozenset({"uptime", "connected_for", "seconds", "mean", "sum", "p50", "p99"})


def humanize(value: Any, now: float | None = None) -> Any:
    """A copy of nested plain values with time and duration fields turned into text (times
    with their age when ``now`` is given)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, float | int) and not isinstance(item, bool):
                if key in TIME_FIELDS:
                    out[key] = format_timestamp(float(item), now)
                    continue
                if key in DURATION_FIELDS:
                    out[key] = format_duration(float(item))
                    continue
            out[key] = humanize(item, now)
        return out
    if isinstance(value, list):
        return [humanize(v, now) for v in value]
    if isinstance(value, np.ndarray) and value.size == 0:
        # An empty list in an admin reply became an array of Data's default type (float64):
        # there is no element type to show, only that it is empty.
        return []
    return value


def to_jsonable(value: Any) -> Any:
    """Plain values -> what ``json.dumps`` accepts (arrays as nested lists, NaN as null)."""
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def dumps(value: Any) -> str:
    """Compact, stable JSON for scripts: one document per call."""
    return json.dumps(to_jsonable(value), sort_keys=False, separators=(",", ":"))


def _is_records(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) > 0
        and all(isinstance(v, Mapping) for v in value)
    )


def _indent(text: str, indent: int) -> str:
    pad = " " * indent
    return "\n".join(pad + line for line in text.splitlines())


def _num(value: float) -> str:
    if value.is_integer() and abs(value) < 1e15:
        return f"{value:.1f}"
    return f"{value:.6g}"


def _short_list(values: list[Any]) -> str:
    return "[" + ", ".join(format_value(v) for v in values) + "]"
