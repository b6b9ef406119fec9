"""``Data``: the ordered, typed mapping every rda message body carries (docs/serialization.md).

Types are RDA3's, chosen so C++ and Java peers can hold every value: bool, int8..int64,
float32, float64, string, N-D arrays of each, nested ``Data`` and 1-D arrays of ``Data``.
There are no unsigned types: unsigned input is rejected with an error that says so.

How values are stored (and returned by ``data[name]``):

* scalars as Python ``bool``/``int``/``float``/``str`` (the type lives beside the value, so
  an ``INT32`` scalar reads back as a plain ``int``; float32 values are rounded on entry);
* numeric and bool arrays as little-endian numpy arrays, by reference (no copy);
* string arrays as ``list[str]`` when 1-D, as numpy ``object`` arrays of ``str`` when N-D;
* nested Data as ``Data`` (by reference), Data arrays as ``list[Data]``.

No string (value or name) may contain NUL: C peers use NUL-terminated strings, and the binary
codec relies on it to ship a string array as one blob (docs/serialization.md).
"""

from __future__ import annotations

import enum
import struct
import sys
from collections.abc import ItemsView, Iterator, Mapping, MutableMapping, ValuesView
from typing import Any

import numpy as np

__all__ = ["Data", "DataType"]

_F32 = struct.Struct("<f")
_MAX_NDIM = 32


class DataType(enum.IntEnum):
    """The type of one Data entry; the low 4 bits are the binary codec's element tag."""

    BOOL = 0x01
    INT8 = 0x02
    INT16 = 0x03
    INT32 = 0x04
    INT64 = 0x05
    FLOAT32 = 0x06
    FLOAT64 = 0x07
    STRING = 0x08
    DATA = 0x09
    BOOL_ARRAY = 0x11
    INT8_ARRAY = 0x12
    INT16_ARRAY = 0x13
    INT32_ARRAY = 0x14
    INT64_ARRAY = 0x15
    FLOAT32_ARRAY = 0x16
    FLOAT64_ARRAY = 0x17
    STRING_ARRAY = 0x18
    DATA_ARRAY = 0x19

    @property
    def is_array(self) -> bool:
        return self.value >= 0x10

    @property
    def element(self) -> DataType:
        """The scalar type of an array's elements (the type itself for scalars)."""
        return DataType(self.value & 0x0F)

    @property
    def array(self) -> DataType:
        """The array type whose elements are of this scalar type."""
        return DataType(self.value | 0x10)

    @property
    def label(self) -> str:
        """Lower-case name used in repr, JSON and CSV: ``int32``, ``string``, ``data``."""
        return self.element.name.lower()


T = DataType
# Numeric element types and their little-endian numpy dtypes (bool is one byte, 0 or 1).
NUMERIC_DTYPES: dict[DataType, np.dtype[Any]] = {
    T.BOOL: np.dtype("?"),
    T.INT8: np.dtype("<i1"),
    T.INT16: np.dtype("<i2"),
    T.INT32: np.dtype("<i4"),
    T.INT64: np.dtype("<i8"),
    T.FLOAT32: np.dtype("<f4"),
    T.FLOAT64: np.dtype("<f8"),
}
_DTYPE_TYPES: dict[np.dtype[Any], DataType] = {dt: t.array for t, dt in NUMERIC_DTYPES.items()}
INT_RANGES: dict[DataType, tuple[int, int]] = {
    t: (-(1 << (8 * n - 1)), (1 << (8 * n - 1)) - 1)
    for t, n in ((T.INT8, 1), (T.INT16, 2), (T.INT32, 4), (T.INT64, 8))
}
# Python values stored as they are, with no check: their type alone decides (Data.__init__).
_PLAIN: dict[type, DataType] = {float: T.FLOAT64, bool: T.BOOL}

_NUMPY_SCALARS: dict[type, DataType] = {
    np.bool_: T.BOOL,
    np.int8: T.INT8,
    np.int16: T.INT16,
    np.int32: T.INT32,
    np.int64: T.INT64,
    np.float32: T.FLOAT32,
    np.float64: T.FLOAT64,
}
_UNSIGNED_HINT = (
    "rda has no unsigned types (C++/Java peers): convert to a signed type, "
    "or pin one with append(name, value, type=DataType.INT64) when the values fit"
)


def _field(name: str) -> str:
    return f"field {name!r}"


def check_name(name: object) -> str:
    """Validate a field name: a non-empty str without NUL, at most 65535 UTF-8 bytes."""
    if not isinstance(name, str):
        raise TypeError(f"field names must be str, not {type(name).__name__}")
    if not name:
        raise ValueError("field names must not be empty")
    if "\x00" in name:
        raise ValueError(f"{_field(name)}: names must not contain NUL ('\\x00')")
    if len(name) > 0x3FFF and len(name.encode()) > 0xFFFF:
        raise ValueError(f"field name of {len(name)} characters exceeds 65535 UTF-8 bytes")
    return str(name)


def _check_str(name: str, value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{_field(name)}: strings must not contain NUL ('\\x00')")
    return str(value)


def _int(name: str, value: Any, t: DataType) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{_field(name)}: {t.label} needs an integer, got {type(value).__name__}")
    v = int(value)
    lo, hi = INT_RANGES[t]
    if not lo <= v <= hi:
        raise ValueError(f"{_field(name)}: {v} does not fit {t.label} [{lo}, {hi}]")
    return v


def _float(name: str, value: Any, t: DataType) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(
        value, float | int | np.floating | np.integer
    ):
        raise TypeError(f"{_field(name)}: {t.label} needs a number, got {type(value).__name__}")
    try:
        v = float(value)
        if t is T.FLOAT32:
            v = _F32.unpack(_F32.pack(v))[0]
    except OverflowError:
        raise ValueError(f"{_field(name)}: {value!r} does not fit {t.label}") from None
    return v


def _string_list(name: str, seq: Any) -> list[str]:
    out = list(seq)
    # Plain str elements (the usual case) are kept as they are: one pass over their types;
    # subclasses (a str Enum) are checked and made plain str.
    if not all(type(s) is str for s in out):
        for s in out:
            if not isinstance(s, str):
                raise TypeError(f"{_field(name)}: a string array holds only str, got {s!r}")
        out = [str(s) for s in out]
    if "\x00" in "".join(out):
        raise ValueError(f"{_field(name)}: strings must not contain NUL ('\\x00')")
    return out


def _string_array(name: str, arr: np.ndarray[Any, Any]) -> Any:
    """Normalise a numpy array of strings: list when 1-D, object ndarray when N-D."""
    if arr.ndim == 1:
        return _string_list(name, arr.tolist())
    flat = _string_list(name, arr.ravel().tolist())
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(arr.shape)


def _data_list(name: str, seq: Any) -> list[Data]:
    out: list[Data] = []
    for item in seq:
        if isinstance(item, Data):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(Data(item))
        else:
            raise TypeError(f"{_field(name)}: a Data array holds only Data or dicts, got {item!r}")
    return out


def _little_endian(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    order = arr.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return arr.astype(arr.dtype.newbyteorder("<"))
    return arr


def _infer_array(name: str, arr: np.ndarray[Any, Any]) -> tuple[DataType, Any]:
    if arr.ndim > _MAX_NDIM:
        raise ValueError(f"{_field(name)}: {arr.ndim} dimensions, at most {_MAX_NDIM} allowed")
    kind = arr.dtype.kind
    if kind == "u":
        raise TypeError(f"{_field(name)}: unsigned array {arr.dtype}: {_UNSIGNED_HINT}")
    if kind == "U":
        return T.STRING_ARRAY, _string_array(name, arr)
    if kind == "O":
        leaves = arr.ravel().tolist()
        if all(isinstance(x, str) for x in leaves):
            return T.STRING_ARRAY, _string_array(name, arr)
        if arr.ndim == 1 and all(isinstance(x, Data | Mapping) for x in leaves):
            return T.DATA_ARRAY, _data_list(name, leaves)
        raise TypeError(f"{_field(name)}: object array must hold only str, or only Data (1-D)")
    t = _DTYPE_TYPES.get(arr.dtype.newbyteorder("<")) if kind in "bif" else None
    if t is None:
        raise TypeError(f"{_field(name)}: unsupported array dtype {arr.dtype}")
    return t, _little_endian(arr)


def _infer_sequence(name: str, seq: list[Any] | tuple[Any, ...]) -> tuple[DataType, Any]:
    if not seq:  # nothing to infer from: numpy's default, float64 (pin a type to choose)
        return T.FLOAT64_ARRAY, np.empty(0, dtype="<f8")
    first = seq[0]
    if isinstance(first, str):
        return T.STRING_ARRAY, _string_list(name, seq)
    if isinstance(first, Data | Mapping):
        return T.DATA_ARRAY, _data_list(name, seq)
    if isinstance(first, list | tuple):  # nested lists: an N-D array of strings or numbers
        try:
            obj = np.array(seq, dtype=object)
        except ValueError as exc:
            raise ValueError(f"{_field(name)}: ragged nested lists: {exc}") from None
        leaves = obj.ravel().tolist()
        if leaves and all(isinstance(x, str) for x in leaves):
            return T.STRING_ARRAY, _string_array(name, obj)
        if any(isinstance(x, str | list | tuple | Mapping | Data) or x is None for x in leaves):
            raise TypeError(f"{_field(name)}: nested lists must be regular, of numbers or str")
    try:
        arr = np.array(seq)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"{_field(name)}: cannot make an array: {exc}") from None
    if arr.dtype.kind not in "bif":
        raise TypeError(f"{_field(name)}: a list must hold only numbers, only str or only Data")
    return _infer_array(name, arr)


def infer(name: str, value: Any) -> tuple[DataType, Any]:
    """The default type of a Python value and the value as Data stores it."""
    cls = type(value)
    if cls is float:
        return T.FLOAT64, value
    if cls is int:
        return T.INT64, _int(name, value, T.INT64)
    if cls is bool:
        return T.BOOL, value
    if cls is str:
        return T.STRING, _check_str(name, value)
    if cls is np.ndarray:
        if value.ndim == 0:
            return infer(name, value[()])
        return _infer_array(name, value)
    if isinstance(value, Data):
        return T.DATA, value
    if isinstance(value, list | tuple):
        return _infer_sequence(name, value)
    if isinstance(value, Mapping):
        return T.DATA, Data(value)
    if isinstance(value, np.generic):
        t = _NUMPY_SCALARS.get(type(value))
        if t is None:
            if isinstance(value, np.unsignedinteger):
                raise TypeError(
                    f"{_field(name)}: unsigned {type(value).__name__}: {_UNSIGNED_HINT}"
                )
            if isinstance(value, np.str_):
                return T.STRING, _check_str(name, str(value))
            raise TypeError(f"{_field(name)}: unsupported numpy scalar {type(value).__name__}")
        return coerce(name, value, t)
    for base in (int, float, str):  # subclasses of the builtins (IntEnum, ...); bool is final
        if isinstance(value, base):
            return infer(name, base(value))
    if isinstance(value, np.ndarray):
        return infer(name, np.asarray(value))
    raise TypeError(f"{_field(name)}: unsupported value type {cls.__name__}")


def _coerce_numeric_array(name: str, value: Any, t: DataType) -> np.ndarray[Any, Any]:
    target = NUMERIC_DTYPES[t.element]
    if type(value) is np.ndarray and value.dtype == target and 0 < value.ndim <= _MAX_NDIM:
        return _little_endian(value)  # already what the type pins (a device's own buffer)
    if isinstance(value, str | bytes | Mapping | Data) or not hasattr(value, "__len__"):
        raise TypeError(f"{_field(name)}: {t.name} needs a sequence or numpy array")
    try:
        src = value if isinstance(value, np.ndarray) else np.array(value)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"{_field(name)}: cannot make an array: {exc}") from None
    if src.dtype.kind not in "biuf":
        raise TypeError(f"{_field(name)}: {t.name} needs numbers, got dtype {src.dtype}")
    if src.ndim == 0 or src.ndim > _MAX_NDIM:
        raise ValueError(f"{_field(name)}: arrays need 1 to {_MAX_NDIM} dimensions")
    if src.dtype == target:
        return _little_endian(src)
    with np.errstate(all="ignore"):
        out = src.astype(target)
        if target.kind == "f" and src.dtype.kind == "f":
            # Rounding to float32 is what pinning means; overflowing to inf is not.
            lossy = bool((np.isinf(out) & np.isfinite(src)).any())
        else:
            # Both directions: a wrapped value can survive the round trip back (uint8 200 ->
            # int8 -56 -> uint8 200), a rounded one can compare equal after promotion.
            lossy = not (bool((out == src).all()) and bool((out.astype(src.dtype) == src).all()))
    if lossy:
        raise ValueError(f"{_field(name)}: values do not fit {t.label} exactly")
    return out


def coerce(name: str, value: Any, t: DataType) -> tuple[DataType, Any]:
    """Convert ``value`` to the pinned type ``t`` or raise TypeError/ValueError naming the field."""
    if t in INT_RANGES:
        return t, _int(name, value, t)
    if t is T.FLOAT64 or t is T.FLOAT32:
        return t, _float(name, value, t)
    if t is T.BOOL:
        if not isinstance(value, bool | np.bool_):
            raise TypeError(f"{_field(name)}: bool needs True or False, got {value!r}")
        return t, bool(value)
    if t is T.STRING:
        if not isinstance(value, str):
            raise TypeError(f"{_field(name)}: string needs a str, got {type(value).__name__}")
        return t, _check_str(name, value)
    if t is T.DATA:
        if isinstance(value, Data):
            return t, value
        if isinstance(value, Mapping):
            return t, Data(value)
        raise TypeError(f"{_field(name)}: data needs a Data or a dict, got {type(value).__name__}")
    if t is T.STRING_ARRAY:
        if isinstance(value, np.ndarray) and value.dtype.kind in "UO":
            return t, _string_array(name, value)
        if isinstance(value, list | tuple):
            if value and isinstance(value[0], list | tuple):
                inferred, stored = _infer_sequence(name, value)
                if inferred is t:
                    return t, stored
                raise TypeError(f"{_field(name)}: STRING_ARRAY needs str elements")
            return t, _string_list(name, value)
        raise TypeError(f"{_field(name)}: STRING_ARRAY needs a list of str or a str array")
    if t is T.DATA_ARRAY:
        if isinstance(value, list | tuple) or (
            isinstance(value, np.ndarray) and value.dtype.kind == "O" and value.ndim == 1
        ):
            return t, _data_list(name, value)
        raise TypeError(f"{_field(name)}: DATA_ARRAY needs a list of Data or dicts")
    return t, _coerce_numeric_array(name, value, t)


def _fmt_value(t: DataType, v: Any) -> str:
    if t is T.STRING_ARRAY and isinstance(v, list):
        if len(v) > 12:
            return f"[{', '.join(map(repr, v[:3]))}, ..., {', '.join(map(repr, v[-3:]))}]"
        return repr(v)
    if isinstance(v, np.ndarray):
        # One line, whatever the ndim: numpy breaks rows onto new lines.
        return " ".join(np.array2string(v, separator=", ", threshold=12, edgeitems=3).split())
    return repr(v)


def type_label(t: DataType, v: Any) -> str:
    """``float64``, ``int32[40]``, ``string[2x3]``: the type as repr and CSV show it."""
    if not t.is_array:
        return t.label
    shape = v.shape if isinstance(v, np.ndarray) else (len(v),)
    return f"{t.label}[{'x'.join(map(str, shape))}]"


def _values_equal(t: DataType, a: Any, b: Any) -> bool:
    if t is T.FLOAT64 or t is T.FLOAT32:
        return bool(a == b or (a != a and b != b))  # NaN equals NaN here: see Data.__eq__
    if isinstance(a, np.ndarray):
        if not isinstance(b, np.ndarray) or a.shape != b.shape:
            return False
        if a.dtype.kind == "O":
            # Element-wise, without building nested Python lists (cost follows the elements).
            return a.size == 0 or bool(np.array_equal(a, b))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    return bool(a == b)


class Data(MutableMapping[str, Any]):
    """An ordered, typed mapping of field name to value.

    ``Data(current=1.5, names=["a", "b"])`` infers each type (int -> int64, float -> float64,
    list of str -> string array, list of numbers -> numpy array, dict -> Data, ...);
    ``append(name, value, type=DataType.INT32)`` pins another one, with a range check.
    Setting an existing name replaces its value and type but keeps its position.
    """

    __slots__ = ("_types", "_values")

    _types: dict[str, DataType]
    _values: dict[str, Any]

    def __init__(self, mapping: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._values = {}
        self._types = {}
        if mapping is not None:
            if isinstance(mapping, Data):
                self._values.update(mapping._values)
                self._types.update(mapping._types)
            else:
                for name, value in mapping.items():
                    self.append(name, value)
        values, types = self._values, self._types
        for name, value in kwargs.items():
            # ``Data(value=1.5)``, what a handler builds per get or notify: a float or a bool
            # needs no conversion, and a keyword is a str already; other values (and names
            # check_name would refuse) take append's path.
            t = _PLAIN.get(type(value))
            if t is not None and name and "\x00" not in name and len(name) <= 0x3FFF:
                values[name] = value
                types[name] = t
            else:
                self.append(name, value)

    @classmethod
    def from_parts(cls, values: dict[str, Any], types: dict[str, DataType]) -> Data:
        """Build from dicts already known valid (names checked, values stored as their types
        say): no per-field checks. For codecs and readers of stored columns, not for values
        from outside: those go through ``Data(...)`` or ``append``."""
        self = cls.__new__(cls)
        self._values = values
        self._types = types
        return self

    def append(self, name: str, value: Any, type: DataType | None = None) -> None:
        """Add (or replace) ``name``; ``type`` pins the type, else it is inferred."""
        name = check_name(name)
        if value is self:
            raise ValueError(f"{_field(name)}: a Data cannot contain itself")
        t, stored = infer(name, value) if type is None else coerce(name, value, DataType(type))
        self._values[name] = stored
        self._types[name] = t

    def __setitem__(self, name: str, value: Any) -> None:
        self.append(name, value)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __delitem__(self, name: str) -> None:
        del self._values[name]
        del self._types[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        # Mapping.get's answer, by the dict's own get (a server's alarm rule asks per value).
        return self._values.get(name, default)

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def items(self) -> ItemsView[str, Any]:
        return self._values.items()

    def values(self) -> ValuesView[Any]:
        # The dict's own view: Mapping's would look every name up through __getitem__.
        return self._values.values()

    def type_of(self, name: str) -> DataType:
        """The type of field ``name`` (KeyError if absent)."""
        return self._types[name]

    def types(self) -> dict[str, DataType]:
        """A copy of the name -> type table, in field order."""
        return dict(self._types)

    def _typed(self, name: str, accepted: tuple[DataType, ...], what: str) -> Any:
        try:
            t = self._types[name]
        except KeyError:
            raise KeyError(f"no field {name!r} (fields: {', '.join(self._values)})") from None
        if t not in accepted:
            raise TypeError(f"{_field(name)} is {type_label(t, self._values[name])}, not {what}")
        return self._values[name]

    def get_bool(self, name: str) -> bool:
        return bool(self._typed(name, (T.BOOL,), "a bool"))

    def get_int(self, name: str) -> int:
        return int(self._typed(name, (T.INT8, T.INT16, T.INT32, T.INT64), "an integer"))

    def get_float(self, name: str) -> float:
        return float(self._typed(name, (T.FLOAT32, T.FLOAT64), "a float"))

    def get_str(self, name: str) -> str:
        return str(self._typed(name, (T.STRING,), "a string"))

    def get_array(self, name: str) -> np.ndarray[Any, Any]:
        """A numeric, bool or string array as a numpy array (strings: dtype object)."""
        arrays = (*(t.array for t in NUMERIC_DTYPES), T.STRING_ARRAY)
        value = self._typed(name, arrays, "an array")
        if isinstance(value, list):
            out = np.empty(len(value), dtype=object)
            out[:] = value
            return out
        result: np.ndarray[Any, Any] = value
        return result

    def get_str_list(self, name: str) -> list[str]:
        value = self._typed(name, (T.STRING_ARRAY,), "a string array")
        if not isinstance(value, list):
            raise TypeError(f"{_field(name)} is an N-D string array; use get_array")
        return list(value)

    def get_data(self, name: str) -> Data:
        result: Data = self._typed(name, (T.DATA,), "a Data")
        return result

    def get_data_array(self, name: str) -> list[Data]:
        return list(self._typed(name, (T.DATA_ARRAY,), "a Data array"))

    def __eq__(self, other: object) -> bool:
        """Deep equality: same names, types and values, field order ignored.

        Arrays compare by dtype, shape and values; a NaN equals a NaN (so a decoded copy
        equals its original)."""
        if not isinstance(other, Data):
            return NotImplemented
        if self._types != other._types:
            return False
        theirs = other._values
        types = self._types
        return all(_values_equal(types[n], v, theirs[n]) for n, v in self._values.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}: {type_label(t, v)} = {_fmt_value(t, v)}"
            for (name, v), t in zip(self._values.items(), self._types.values(), strict=True)
        )
        return f"Data({fields})"

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], dict[str, DataType]]]:
        # Pickle the two tables as they are: the generic slots protocol is 5x slower.
        return _restore, (self._values, self._types)

    def copy(self) -> Data:
        """A shallow copy: a new field table sharing the values."""
        return Data.from_parts(dict(self._values), dict(self._types))

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts. Arrays stay numpy arrays, Data arrays become lists of dicts, and
        int8/16/32 and float32 scalars become numpy scalars, so ``Data.from_dict`` restores the
        same types (except empty string/Data arrays, which have nothing to infer from)."""
        out: dict[str, Any] = {}
        for (name, v), t in zip(self._values.items(), self._types.values(), strict=True):
            if t is T.DATA:
                out[name] = v.to_dict()
            elif t is T.DATA_ARRAY:
                out[name] = [d.to_dict() for d in v]
            elif t in _WIDTH_SCALARS:
                out[name] = _WIDTH_SCALARS[t](v)
            elif isinstance(v, list):
                out[name] = list(v)
            else:
                out[name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Data:
        """Build from nested dicts, inferring every type (see ``to_dict``)."""
        return cls(d)


def _restore(values: dict[str, Any], types: dict[str, DataType]) -> Data:
    """Unpickle a Data (see ``Data.__reduce__``)."""
    return Data.from_parts(values, types)


_WIDTH_SCALARS: dict[DataType, Any] = {
    T.INT8: np.int8,
    T.INT16: np.int16,
    T.INT32: np.int32,
    T.FLOAT32: np.float32,
}
