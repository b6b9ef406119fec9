"""Recorded rows back into ``rda.Data``: the inverse of the recorder's mapping (docs/history.md,
"Mapping of the Data container").

A history chunk (``history.py``) carries the values as they were recorded, as an Arrow
``data`` struct column; ``client.history()`` makes each row the ``Data`` the device sent: scalars keep their width (an ``int32``
column is an ``INT32`` entry), ``list<T>`` is a 1-D array, ``struct<elements, dims>`` an N-D
array (row-major), a nested struct a nested ``Data``, ``list<struct>`` a Data array. A null
field is a field the value did not have (a narrower, older schema version): it is left out.

Conversion is column by column (one pass over each Arrow child per batch), and numeric arrays
are zero-copy views of the Arrow buffers, read-only, so a 1 MiB waveform is never copied on
its way from the Parquet page to the wire.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rda.serialization.data import Data, DataType

__all__ = ["ND_NAMES", "rows_to_data"]

ND_NAMES = ("elements", "dims")  # the struct of an N-D array: row-major elements, then dims

_SCALAR_TYPES: dict[pa.DataType, DataType] = {
    pa.bool_(): DataType.BOOL,
    pa.int8(): DataType.INT8,
    pa.int16(): DataType.INT16,
    pa.int32(): DataType.INT32,
    pa.int64(): DataType.INT64,
    pa.float32(): DataType.FLOAT32,
    pa.float64(): DataType.FLOAT64,
    pa.string(): DataType.STRING,
    pa.large_string(): DataType.STRING,
}

# One column of a batch: per row the value (None: absent) and the Data type of the column.
_Column = tuple[list[Any], DataType | None]


def _is_nd(kind: pa.DataType) -> bool:
    return (
        pa.types.is_struct(kind)
        and [kind.field(i).name for i in range(kind.num_fields)] == list(ND_NAMES)
        and pa.types.is_list(kind.field(0).type)
    )


def _frozen(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    array.flags.writeable = False
    return array


def _list_rows(array: pa.ListArray) -> list[tuple[int, int] | None]:
    offsets = array.offsets.to_numpy()
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [(int(offsets[i]), int(offsets[i + 1])) if valid[i] else None for i in range(len(array))]


def _element_values(values: pa.Array) -> tuple[Any, DataType]:
    """The flat elements of a list column as numpy (numbers, bools) or a Python list (strings)."""
    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return values.to_pylist(), DataType.STRING_ARRAY
    scalar = _SCALAR_TYPES.get(kind)
    if scalar is None:
        raise TypeError(f"no Data type for array elements of Arrow type {kind}")
    numbers = values.to_numpy(zero_copy_only=False)
    return numbers, scalar.array


def _list_column(array: pa.ListArray) -> _Column:
    inner = array.values
    if pa.types.is_struct(inner.type):
        items = rows_to_data(inner)
        return [
            None if span is None else [d if d is not None else Data() for d in items[slice(*span)]]
            for span in _list_rows(array)
        ], DataType.DATA_ARRAY
    flat, kind = _element_values(inner)
    rows: list[Any] = []
    for span in _list_rows(array):
        if span is None:
            rows.append(None)
        elif kind is DataType.STRING_ARRAY:
            rows.append(flat[span[0] : span[1]])
        else:
            rows.append(_frozen(flat[span[0] : span[1]]))
    return rows, kind


def _nd_column(array: pa.StructArray) -> _Column:
    elements = array.field(0)
    dims = array.field(1).to_pylist()
    flat, kind = _element_values(elements.values)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    rows: list[Any] = []
    for i, span in enumerate(_list_rows(elements)):
        if not valid[i] or span is None or dims[i] is None:
            rows.append(None)
            continue
        shape = tuple(int(d) for d in dims[i])
        if kind is DataType.STRING_ARRAY:
            rows.append(np.array(flat[span[0] : span[1]], dtype=object).reshape(shape))
        else:
            rows.append(_frozen(flat[span[0] : span[1]].reshape(shape)))
    return rows, kind


def _column(array: pa.Array) -> _Column:
    kind = array.type
    if pa.types.is_null(kind):
        return [None] * len(array), None
    if _is_nd(kind):
        return _nd_column(array)
    if pa.types.is_struct(kind):
        return list(rows_to_data(array)), DataType.DATA
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _list_column(array)
    scalar = _SCALAR_TYPES.get(kind)
    if scalar is None:
        raise TypeError(f"no Data type for Arrow type {kind}")
    return array.to_pylist(), scalar


def rows_to_data(array: pa.Array) -> list[Data | None]:
    """One ``Data`` per row of a struct array (None for a null row, e.g. an error row)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_null(array.type):
        return [None] * len(array)
    if not pa.types.is_struct(array.type):
        raise TypeError(f"a recorded value is a struct, not {array.type}")
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    names = [array.type.field(i).name for i in range(array.type.num_fields)]
    # StructArray.field ignores the struct's own offset; flatten() applies it.
    columns = [_column(child) for child in array.flatten()]
    typed = [(n, v, k) for n, (v, k) in zip(names, columns, strict=True) if k is not None]
    # The values are already what Data holds (they were recorded from Data, and Arrow gives
    # back Python scalars, little-endian arrays, lists of str): built without per-field checks,
    # as a decoder does, which is what makes a 5,000-row chunk cost milliseconds.
    make = Data.from_parts
    field_names = [name for name, _, _ in typed]
    if typed and all(valid) and all(child.null_count == 0 for child in array.flatten()):
        kinds = dict(zip(field_names, [kind for _, _, kind in typed], strict=True))
        return [
            make(dict(zip(field_names, row, strict=True)), kinds.copy())
            for row in zip(*[column for _, column, _ in typed], strict=True)
        ]
    out: list[Data | None] = []
    for row, ok in enumerate(valid.tolist()):
        if not ok:
            out.append(None)
            continue
        values: dict[str, Any] = {}
        types: dict[str, DataType] = {}
        for name, column, kind in typed:
            value = column[row]
            if value is not None:
                values[name] = value
                types[name] = kind
        out.append(make(values, types))
    return out
