"""The string forms of Data: JSON (lossless, any Data) and CSV (flat Data only).

JSON (docs/serialization.md, "JSON"): an object whose keys are the field names, in order,
each mapping to ``{"type": T, "value": V}`` with ``T`` a lower-case DataType name
(``"int32"``, ``"float64_array"``, ``"data"``). Arrays carry a flat C-order ``value`` list
and, when not 1-D, ``"dims"``. Non-finite floats are the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` so the text stays standard JSON.

CSV (docs/serialization.md, "CSV"): row 1 the names, row 2 the types as repr shows them
(``float64``, ``int32[40]``, ``string[3]``), then one row per array element: a scalar sits in
the first data row, array element ``i`` in data row ``i``; cells past an array's length are
empty. The declared length keeps an empty string apart from a missing cell.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

import numpy as np

from rda.serialization._binary_format import DEFAULT_LIMITS, DecodeLimits
from rda.serialization.data import INT_RANGES, NUMERIC_DTYPES, Data, DataType, check_name
from rda.serialization.errors import DecodeError

__all__ = ["from_csv", "from_json", "to_csv", "to_json"]

T = DataType
_BY_NAME = {t.name.lower(): t for t in DataType}
_BY_LABEL = {t.label: t for t in DataType if not t.is_array}
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# ------------------------------------------------------------------------------------ JSON


def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def _json_entry(t: DataType, v: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": t.name.lower()}
    if t is T.DATA:
        entry["value"] = _json_object(v)
    elif t is T.DATA_ARRAY:
        entry["value"] = [_json_object(d) for d in v]
    elif t is T.FLOAT32 or t is T.FLOAT64:
        entry["value"] = _json_float(v)
    elif t.is_array:
        arr = v if isinstance(v, np.ndarray) else None
        if arr is not None and arr.ndim != 1:
            entry["dims"] = list(arr.shape)
        flat = arr.ravel().tolist() if arr is not None else list(v)
        if t.element in (T.FLOAT32, T.FLOAT64):
            flat = [_json_float(x) for x in flat]
        entry["value"] = flat
    else:
        entry["value"] = v
    return entry


def _json_object(data: Data) -> dict[str, Any]:
    types = data._types
    return {name: _json_entry(types[name], v) for name, v in data._values.items()}


def to_json(data: Data, *, indent: int | None = None) -> str:
    """The JSON string form of ``data``: lossless for every type (see the module docstring)."""
    return json.dumps(_json_object(data), indent=indent, ensure_ascii=False, allow_nan=False)


def from_json(text: str | bytes, limits: DecodeLimits | None = None) -> Data:
    """Parse the JSON string form; malformed text or structure raises ``DecodeError``."""
    lim = DEFAULT_LIMITS if limits is None else limits
    try:
        tree = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc.msg}", exc.pos) from None
    except (ValueError, RecursionError, TypeError) as exc:
        raise DecodeError(f"invalid JSON: {exc}") from None
    try:
        return _json_data(tree, "$", 1, lim, [lim.max_elements])
    except RecursionError:  # only reachable when max_depth is set beyond the Python stack
        raise DecodeError("Data nested too deeply for the Python stack") from None


def _fail(path: str, message: str) -> DecodeError:
    return DecodeError(f"{path}: {message}")


def _spend(budget: list[int], n: int, path: str, lim: DecodeLimits) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise _fail(path, f"more than max_elements={lim.max_elements} elements")


def _json_data(tree: Any, path: str, depth: int, lim: DecodeLimits, budget: list[int]) -> Data:
    if depth > lim.max_depth:
        raise _fail(path, f"Data nested deeper than max_depth={lim.max_depth}")
    if not isinstance(tree, dict):
        raise _fail(path, f"expected an object of fields, got {type(tree).__name__}")
    _spend(budget, len(tree), path, lim)
    data = Data()
    for name, entry in tree.items():
        where = f"{path}.{name}"
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise _fail(where, 'expected {"type": ..., "value": ...}')
        t = _BY_NAME.get(entry["type"])
        if t is None:
            raise _fail(where, f"unknown type {entry['type']!r}")
        if "value" not in entry or set(entry) - {"type", "value", "dims"}:
            raise _fail(where, 'an entry has exactly "type", "value" and optional "dims"')
        value = _json_value(t, entry, where, depth, lim, budget)
        try:
            data.append(name, value, t)
        except (TypeError, ValueError) as exc:
            raise _fail(where, str(exc)) from None
    return data


def _json_number(t: DataType, x: Any, path: str) -> Any:
    if t is T.FLOAT32 or t is T.FLOAT64:
        if isinstance(x, str) and x in _NONFINITE:
            return _NONFINITE[x]
        if isinstance(x, int | float) and not isinstance(x, bool):
            return float(x)
    elif t is T.BOOL:
        if isinstance(x, bool):
            return x
    elif t is T.STRING:
        if isinstance(x, str):
            return x
    elif isinstance(x, int) and not isinstance(x, bool):
        lo, hi = INT_RANGES[t]
        if lo <= x <= hi:
            return x
        raise _fail(path, f"{x} does not fit {t.label}")
    raise _fail(path, f"{x!r} is not a valid {t.label}")


def _json_value(
    t: DataType, entry: dict[str, Any], path: str, depth: int, lim: DecodeLimits, budget: list[int]
) -> Any:
    value = entry["value"]
    if t is T.DATA:
        return _json_data(value, path, depth + 1, lim, budget)
    if not t.is_array:
        return _json_number(t, value, path)
    if not isinstance(value, list):
        raise _fail(path, f"{t.name.lower()} value must be a list")
    _spend(budget, len(value), path, lim)
    if t is T.DATA_ARRAY:
        if "dims" in entry:
            raise _fail(path, "Data arrays are 1-D and carry no dims")
        return [_json_data(v, f"{path}[{i}]", depth + 1, lim, budget) for i, v in enumerate(value)]
    dims = entry.get("dims", [len(value)])
    if (
        not isinstance(dims, list)
        or not 1 <= len(dims) <= 32
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 0xFFFFFFFF for d in dims
        )
        or math.prod(dims) != len(value)
    ):
        raise _fail(path, f"dims {dims!r} do not describe {len(value)} elements")
    element = t.element
    flat = [_json_number(element, x, f"{path}[{i}]") for i, x in enumerate(value)]
    if element is T.STRING:
        if len(dims) == 1:
            return flat
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
    else:
        arr = np.array(flat, dtype=NUMERIC_DTYPES[element])
    try:
        return arr.reshape(dims)
    except ValueError as exc:  # zero-size dims whose product overflows numpy's index type
        raise _fail(path, f"cannot shape the array as {dims}: {exc}") from None


# ------------------------------------------------------------------------------------- CSV


def _csv_cell(t: DataType, x: Any) -> str:
    if t is T.BOOL:
        return "true" if x else "false"
    if t is T.FLOAT32 or t is T.FLOAT64:
        return repr(float(x))  # repr round-trips exactly; nan/inf spelled as float() reads them
    return str(x)


def to_csv(data: Data) -> str:
    """The CSV form of a flat Data (scalars and 1-D arrays, no Data); else ``ValueError``."""
    columns: list[list[str]] = []
    header: list[str] = []
    for name, v in data._values.items():
        t = data._types[name]
        if (
            t is T.DATA
            or t is T.DATA_ARRAY
            or (t.is_array and not isinstance(v, list | tuple) and v.ndim != 1)
        ):
            raise ValueError(
                f"field {name!r} is {t.name.lower()}"
                f"{'' if not isinstance(v, np.ndarray) else f' with shape {v.shape}'}: "
                "CSV holds only flat Data (scalars and 1-D arrays)"
            )
        element = t.element
        if t.is_array:
            items = v.tolist() if isinstance(v, np.ndarray) else v
            columns.append([_csv_cell(element, x) for x in items])
            header.append(f"{element.label}[{len(items)}]")
        else:
            columns.append([_csv_cell(t, v)])
            header.append(t.label)
    out = io.StringIO()
    # CRLF as RFC 4180 says; it also makes the writer quote fields holding a lone "\r".
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(list(data._values))
    writer.writerow(header)
    rows = max((len(c) for c in columns), default=0)
    for i in range(rows):
        writer.writerow([c[i] if i < len(c) else "" for c in columns])
    return out.getvalue()


def _parse_type(token: str, where: str) -> tuple[DataType, int | None]:
    """``int32`` -> (INT32, None); ``int32[40]`` -> (INT32_ARRAY, 40)."""
    label, bracket, rest = token.partition("[")
    t = _BY_LABEL.get(label)
    if t is None or t is T.DATA:
        raise DecodeError(f"{where}: unknown CSV type {token!r}")
    if not bracket:
        return t, None
    if not rest.endswith("]") or not rest[:-1].isdigit():
        raise DecodeError(f"{where}: array type must look like {label}[N], got {token!r}")
    return t.array, int(rest[:-1])


def _csv_scalar(t: DataType, cell: str, where: str) -> Any:
    try:
        if t is T.BOOL:
            if cell not in ("true", "false"):
                raise ValueError("expected true or false")
            return cell == "true"
        if t is T.STRING:
            return cell
        if t is T.FLOAT32 or t is T.FLOAT64:
            return float(cell)
        value = int(cell)
    except ValueError as exc:
        raise DecodeError(f"{where}: {cell!r} is not a valid {t.label} ({exc})") from None
    lo, hi = INT_RANGES[t]
    if not lo <= value <= hi:
        raise DecodeError(f"{where}: {value} does not fit {t.label}")
    return value


def from_csv(text: str, limits: DecodeLimits | None = None) -> Data:
    """Parse the CSV form (see the module docstring); anything malformed -> ``DecodeError``."""
    lim = DEFAULT_LIMITS if limits is None else limits
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except (csv.Error, TypeError) as exc:
        raise DecodeError(f"invalid CSV: {exc}") from None
    if len(rows) < 2:
        raise DecodeError(f"CSV needs a names row and a types row, got {len(rows)} rows")
    names, tokens = rows[0], rows[1]
    if len(tokens) != len(names):
        raise DecodeError(f"line 2: {len(tokens)} types for {len(names)} names")
    if len(names) + sum(len(r) for r in rows[2:]) > lim.max_elements:
        raise DecodeError(f"more than max_elements={lim.max_elements} elements")
    body = rows[2:]
    for i, row in enumerate(body):
        if len(row) != len(names):
            raise DecodeError(f"line {i + 3}: {len(row)} cells, expected {len(names)}")
    data = Data()
    for col, (name, token) in enumerate(zip(names, tokens, strict=True)):
        where = f"column {col + 1} ({name!r})"
        try:
            check_name(name)
        except ValueError as exc:
            raise DecodeError(f"{where}: {exc}") from None
        if name in data:
            raise DecodeError(f"{where}: duplicate field name")
        t, length = _parse_type(token, where)
        n = 1 if length is None else length
        if n > len(body):
            raise DecodeError(f"{where}: declares {n} elements but only {len(body)} rows follow")
        cells = [row[col] for row in body]
        if any(cells[n:]):
            raise DecodeError(f"{where}: cells past the declared length must be empty")
        element = t.element
        items = [_csv_scalar(element, c, f"{where}, line {i + 3}") for i, c in enumerate(cells[:n])]
        try:
            if length is None:
                data.append(name, items[0], t)
            elif element is T.STRING:
                data.append(name, items, t)
            else:
                data.append(name, np.array(items, dtype=NUMERIC_DTYPES[element]), t)
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"{where}: {exc}") from None
    return data
