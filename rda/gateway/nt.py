"""rda values as pvAccess values: the gateway's type table (docs/gateway.md, "Types").

A field PV takes the normative type EPICS tools expect of a record: a scalar field is an
``epics:nt/NTScalar:1.0``, a 1-D array an ``epics:nt/NTScalarArray:1.0``, with the
``display``, ``control`` and ``valueAlarm`` sub-structures laid out as the IOC's QSRV2 serves
them (so a client reads a gateway PV and a record with the same code); an array of two or
more dimensions is an ``epics:nt/NTNDArray:1.0``. The property PV is a structure
(``rda:nt/Property:1.0``) whose ``value`` holds the fields (nested ``Data`` as nested
structures, N-D arrays as NTNDArray sub-structures, arrays of ``Data`` as ``any[]``), beside
``alarm``, ``timeStamp``, the cycle and the gap counter.

Types are built once per layout: a :data:`Layout` is a hashable description of a ``Data``'s
field names and types, cheap to compute for each update; a PV keeps its type while the layout
stays the same.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from p4p import Type, Value
from p4p.nt import NTNDArray

from rda.serialization.data import Data, DataType

__all__ = [
    "ALARM",
    "CODES",
    "NTNDARRAY_ID",
    "NTSCALARARRAY_ID",
    "NTSCALAR_ID",
    "PROPERTY_ID",
    "TIME",
    "FieldKind",
    "Layout",
    "field_kind",
    "field_type",
    "layout_of",
    "ndarray_value",
    "ndim_of",
    "property_type",
    "pv_value",
    "scalar_value",
    "stamp",
]

NTSCALAR_ID = "epics:nt/NTScalar:1.0"
NTSCALARARRAY_ID = "epics:nt/NTScalarArray:1.0"
NTNDARRAY_ID = "epics:nt/NTNDArray:1.0"
PROPERTY_ID = "rda:nt/Property:1.0"

# The element type codes of p4p (docs/gateway.md's table); rda has no unsigned types.
CODES: dict[DataType, str] = {
    DataType.BOOL: "?",
    DataType.INT8: "b",
    DataType.INT16: "h",
    DataType.INT32: "i",
    DataType.INT64: "l",
    DataType.FLOAT32: "f",
    DataType.FLOAT64: "d",
    DataType.STRING: "s",
}
_NUMERIC = frozenset("bhilfd")

ALARM = ("S", "alarm_t", [("severity", "i"), ("status", "i"), ("message", "s")])
TIME = ("S", "time_t", [("secondsPastEpoch", "l"), ("nanoseconds", "i"), ("userTag", "i")])
_FORM = ("S", "enum_t", [("index", "i"), ("choices", "as")])
_NDARRAY_SPEC = NTNDArray.buildType().aspy()
_NDARRAY = NTNDArray()

# Layout: per field (name, type, ndim or nested layout). A scalar has ndim 0.
Layout = tuple[tuple[str, DataType, Any], ...]


class FieldKind:
    """What a field PV is, from the field's type and shape."""

    SCALAR = "scalar"
    ARRAY = "array"
    NDARRAY = "ndarray"
    STRUCTURE = "structure"


def ndim_of(kind: DataType, value: Any) -> int:
    if not kind.is_array:
        return 0
    shape = getattr(value, "shape", None)
    return 1 if shape is None else max(1, len(shape))


def layout_of(data: Data) -> Layout:
    """The hashable layout of ``data``: names, types, array ranks and nested layouts."""
    out: list[tuple[str, DataType, Any]] = []
    for (name, value), kind in zip(data.items(), data.types().values(), strict=True):
        if kind is DataType.DATA:
            out.append((name, kind, layout_of(value)))
        else:
            out.append((name, kind, ndim_of(kind, value)))
    return tuple(out)


def field_kind(kind: DataType, ndim: Any) -> str:
    """The PV kind of a field of type ``kind`` (``ndim`` from its layout entry)."""
    if kind in (DataType.DATA, DataType.DATA_ARRAY):
        return FieldKind.STRUCTURE
    if not kind.is_array:
        return FieldKind.SCALAR
    if ndim >= 2 and kind.element is not DataType.STRING:
        return FieldKind.NDARRAY
    return FieldKind.ARRAY  # N-D string arrays are served flattened (docs/gateway.md)


def _meta_fields(code: str) -> list[tuple[str, Any]]:
    """QSRV2's display/control/valueAlarm, typed after the value's element code."""
    if code not in _NUMERIC:
        return [("display", ("S", None, [("description", "s"), ("units", "s")]))]
    return [
        (
            "display",
            (
                "S",
                None,
                [
                    ("limitLow", code),
                    ("limitHigh", code),
                    ("description", "s"),
                    ("units", "s"),
                    ("precision", "i"),
                    ("form", _FORM),
                ],
            ),
        ),
        ("control", ("S", None, [("limitLow", code), ("limitHigh", code), ("minStep", code)])),
        (
            "valueAlarm",
            (
                "S",
                None,
                [
                    ("active", "?"),
                    ("lowAlarmLimit", code),
                    ("lowWarningLimit", code),
                    ("highWarningLimit", code),
                    ("highAlarmLimit", code),
                    ("lowAlarmSeverity", "i"),
                    ("lowWarningSeverity", "i"),
                    ("highWarningSeverity", "i"),
                    ("highAlarmSeverity", "i"),
                    ("hysteresis", "d"),
                ],
            ),
        ),
    ]


@functools.lru_cache(maxsize=64)
def field_type(kind: DataType, ndim: int) -> Any:
    """The p4p ``Type`` of a field PV of a scalar or array field (NTScalar, NTScalarArray,
    NTNDArray)."""
    pv_kind = field_kind(kind, ndim)
    if pv_kind == FieldKind.NDARRAY:
        return NTNDArray.buildType()
    code = CODES[kind.element]
    array = pv_kind == FieldKind.ARRAY
    spec: list[tuple[str, Any]] = [
        ("value", "a" + code if array else code),
        ("alarm", ALARM),
        ("timeStamp", TIME),
    ]
    spec.extend(_meta_fields(code))
    return Type(spec, id=NTSCALARARRAY_ID if array else NTSCALAR_ID)


def _value_spec(layout: Layout) -> list[tuple[str, Any]]:
    spec: list[tuple[str, Any]] = []
    for name, kind, detail in layout:
        if kind is DataType.DATA:
            spec.append((name, ("S", None, _value_spec(detail))))
        elif kind is DataType.DATA_ARRAY:
            spec.append((name, "av"))
        elif field_kind(kind, detail) == FieldKind.NDARRAY:
            spec.append((name, _NDARRAY_SPEC))
        else:
            code = CODES[kind.element]
            spec.append((name, "a" + code if kind.is_array else code))
    return spec


@functools.lru_cache(maxsize=256)
def property_type(layout: Layout) -> Any:
    """The p4p ``Type`` of a property PV (or of a nested ``Data`` field's PV)."""
    return Type(
        [
            ("value", ("S", None, _value_spec(layout))),
            ("alarm", ALARM),
            ("timeStamp", TIME),
            ("cycleName", "s"),
            ("cycleStamp", TIME),
            ("selector", "s"),
            ("gaps", "l"),
        ],
        id=PROPERTY_ID,
    )


def stamp(ns: int) -> dict[str, int]:
    """A ``time_t`` from nanoseconds since the epoch."""
    seconds, nanoseconds = divmod(ns, 1_000_000_000)
    return {"secondsPastEpoch": seconds, "nanoseconds": nanoseconds}


def ndarray_value(array: np.ndarray[Any, Any]) -> Any:
    """An NTNDArray ``Value`` of an N-D numeric array (dimensions innermost first, as
    areaDetector sends them)."""
    return _NDARRAY.wrap(np.ascontiguousarray(array))


def _strings(value: Any) -> list[str]:
    if isinstance(value, np.ndarray):
        return [str(s) for s in value.ravel()]
    return [str(s) for s in value]


def _data_value(data: Data) -> Value:
    """A ``Data`` as a self-typed structure ``Value`` (the elements of an ``any[]``)."""
    layout = layout_of(data)
    return Value(Type(_value_spec(layout)), pv_value(data, layout))


def pv_value(data: Data, layout: Layout) -> dict[str, Any]:
    """``data`` as the initialiser of a ``value`` structure of ``property_type(layout)``."""
    out: dict[str, Any] = {}
    for (name, kind, detail), value in zip(layout, data.values(), strict=True):
        out[name] = _field_value(kind, detail, value)
    return out


def _field_value(kind: DataType, detail: Any, value: Any) -> Any:
    if kind is DataType.DATA:
        return pv_value(value, detail)
    if kind is DataType.DATA_ARRAY:
        return [_data_value(d) for d in value]
    if kind.is_array:
        if kind.element is DataType.STRING:
            return _strings(value)
        if detail >= 2:
            return ndarray_value(value)
        return value
    return value


def scalar_value(kind: DataType, value: Any) -> Any:
    """A field's value for the ``value`` of its field PV (NTNDArray: the whole wrapped value)."""
    if kind.is_array:
        if kind.element is DataType.STRING:
            return _strings(value)
        return value
    return value
