"""Turning command-line text into typed ``Data`` for ``rda set`` (and ``rda admin`` arguments).

``rda set PS1/Settings current=2.5 mode=ON`` must send what the property expects: an ``int32``
field gets an int32, not the int64/str a literal would infer. So the CLI reads the current
value first and converts each given text to that field's ``DataType``; a field the property
does not have yet is inferred from the literal. Whatever does not parse is a
:class:`BadValueError` naming the field, the text and the type (exit code 9).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rda.serialization.data import Data, DataType
from rda.serialization.errors import RdaError

__all__ = ["BadValueError", "build_data", "merge_data", "parse_assignments", "parse_literal"]

_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
_FALSE = frozenset({"false", "0", "no", "off", "f", "n"})


class BadValueError(RdaError, ValueError):
    """A value given on the command line does not fit the field's type."""


def parse_assignments(pairs: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x=y"]`` -> ``{"a": "1", "b": "x=y"}``; a pair without ``=`` is an error."""
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise BadValueError(f"{pair!r}: expected name=value")
        result[name.strip()] = value
    return result


def parse_literal(text: str) -> Any:
    """Best guess for a field with no known type: int, float, bool, JSON list/object, str."""
    stripped = text.strip()
    for convert in (int, float):
        try:
            return convert(stripped)
        except ValueError:
            pass
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if stripped[:1] in "[{":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise BadValueError(f"cannot parse {text!r} as JSON: {exc.msg}") from None
    return text


def build_data(values: Mapping[str, Any], template: Data | None) -> Data:
    """Data for ``values`` with each field converted to its type in ``template`` (if any).

    ``values`` holds command-line text (``name=value``) or JSON values (``--json``).
    """
    out = Data()
    types = template.types() if template is not None else {}
    for name, value in values.items():
        target = types.get(name)
        nested = template[name] if target is DataType.DATA and template is not None else None
        try:
            if target is None:
                out.append(name, parse_literal(value) if isinstance(value, str) else value)
            else:
                converted = _convert(name, value, target, nested)
                out.append(name, converted, type=target)
        except BadValueError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            kind = target.name.lower() if target is not None else "a value"
            raise BadValueError(f"field {name!r}: cannot use {value!r} as {kind}: {exc}") from None
    return out


def merge_data(base: Data, changes: Data) -> Data:
    """``base`` with the fields of ``changes`` put in (nested ``Data`` merged the same way).

    ``rda set DEV/PROP mode=3`` sends the value it read with ``mode`` replaced: a property
    whose schema requires ``current`` too would refuse ``mode`` alone (issue 26).
    """
    out = base.copy()
    types = base.types()
    for name in changes:
        value, kind = changes[name], changes.type_of(name)
        if kind is DataType.DATA and types.get(name) is DataType.DATA:
            value = merge_data(base[name], value)
        out.append(name, value, type=kind)
    return out


def _convert(name: str, value: Any, target: DataType, nested: Data | None) -> Any:
    if target is DataType.DATA:
        obj = _json(name, value) if isinstance(value, str) else value
        if not isinstance(obj, Mapping):
            raise BadValueError(f"field {name!r}: expected a JSON object, got {value!r}")
        return build_data(obj, nested)
    if target is DataType.DATA_ARRAY:
        obj = _json(name, value) if isinstance(value, str) else value
        if not isinstance(obj, list) or not all(isinstance(v, Mapping) for v in obj):
            raise BadValueError(f"field {name!r}: expected a JSON list of objects")
        return [Data(v) for v in obj]
    if target.is_array:
        return _array(name, value, target)
    if not isinstance(value, str):
        return value
    return _scalar(name, value, target)


def _scalar(name: str, text: str, target: DataType) -> Any:
    stripped = text.strip()
    try:
        if target is DataType.STRING:
            return text
        if target is DataType.BOOL:
            lowered = stripped.lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError("expected true/false, yes/no, on/off or 1/0")
        if target in (DataType.FLOAT32, DataType.FLOAT64):
            return float(stripped)
        return int(stripped, 0)
    except ValueError as exc:
        raise BadValueError(
            f"field {name!r}: cannot parse {text!r} as {target.name.lower()} ({exc})"
        ) from None


def _array(name: str, value: Any, target: DataType) -> Any:
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            items: Any = _json(name, stripped)
        else:
            # Comma-separated is the short form: ``rda set DEV/P knobs=1,2,3``.
            items = [v.strip() for v in stripped.split(",")] if stripped else []
    else:
        items = value
    element = target.element
    if element is DataType.STRING:
        return _strings(items)
    return np.asarray(_elements(name, items, element))


def _elements(name: str, items: Any, element: DataType) -> Any:
    if isinstance(items, list):
        return [_elements(name, v, element) for v in items]
    if isinstance(items, str):
        return _scalar(name, items, element)
    return items


def _strings(items: Any) -> Any:
    if isinstance(items, list):
        return [_strings(v) for v in items]
    return str(items)


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadValueError(f"field {name!r}: cannot parse {text!r} as JSON: {exc.msg}") from None
