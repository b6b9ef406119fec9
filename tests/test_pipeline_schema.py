"""Data -> Arrow mapping for every Data type, type merging, and the schema catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rda.pipeline.recorder.schema import (
    SchemaCatalog,
    arrow_type_of,
    build_array,
    merge_types,
    partition_escape,
    signature,
)
from rda.serialization.data import Data, DataType

SCALARS = [
    (DataType.BOOL, True, pa.bool_()),
    (DataType.INT8, -5, pa.int8()),
    (DataType.INT16, 300, pa.int16()),
    (DataType.INT32, -70_000, pa.int32()),
    (DataType.INT64, 2**40, pa.int64()),
    (DataType.FLOAT32, 1.5, pa.float32()),
    (DataType.FLOAT64, 2.25, pa.float64()),
    (DataType.STRING, "héllo", pa.string()),
]
ARRAYS = [
    (np.array([True, False]), pa.bool_()),
    (np.array([1, -2], np.int8), pa.int8()),
    (np.array([1, -2], np.int16), pa.int16()),
    (np.array([1, -2], np.int32), pa.int32()),
    (np.array([1, -2], np.int64), pa.int64()),
    (np.array([0.5, -2], np.float32), pa.float32()),
    (np.array([0.5, -2], np.float64), pa.float64()),
]


def _roundtrip(data: Data) -> dict[str, Any]:
    arrow_type = arrow_type_of(data)
    array = build_array([data], arrow_type)
    assert array.type.equals(arrow_type)
    row: dict[str, Any] = array.to_pylist()[0]
    return row


@pytest.mark.parametrize(("kind", "value", "expected"), SCALARS)
def test_scalars_map_to_same_width(kind: DataType, value: object, expected: pa.DataType) -> None:
    data = Data()
    data.append("v", value, type=kind)
    assert arrow_type_of(data) == pa.struct([pa.field("v", expected)])
    assert _roundtrip(data) == {"v": value}


@pytest.mark.parametrize(("value", "element"), ARRAYS)
def test_one_dimensional_arrays_are_lists(
    value: np.ndarray[Any, Any], element: pa.DataType
) -> None:
    data = Data(v=value)
    assert arrow_type_of(data) == pa.struct([pa.field("v", pa.list_(element))])
    assert _roundtrip(data) == {"v": value.tolist()}


@pytest.mark.parametrize(("value", "element"), ARRAYS)
def test_n_dimensional_arrays_keep_elements_and_dims(
    value: np.ndarray[Any, Any], element: pa.DataType
) -> None:
    cube = np.resize(value, (2, 3, 2)).astype(value.dtype)
    data = Data(v=cube)
    nd = pa.struct(
        [pa.field("elements", pa.list_(element)), pa.field("dims", pa.list_(pa.int32()))]
    )
    assert arrow_type_of(data) == pa.struct([pa.field("v", nd)])
    row = _roundtrip(data)["v"]
    assert row["dims"] == [2, 3, 2]
    assert np.array_equal(np.array(row["elements"], value.dtype).reshape(row["dims"]), cube)


def test_string_arrays_one_and_n_dimensional() -> None:
    data = Data(names=["a", "b", "c"], grid=np.array([["a", "b"], ["c", "d"]]))
    grid = pa.struct(
        [pa.field("elements", pa.list_(pa.string())), pa.field("dims", pa.list_(pa.int32()))]
    )
    assert arrow_type_of(data) == pa.struct(
        [pa.field("names", pa.list_(pa.string())), pa.field("grid", grid)]
    )
    assert _roundtrip(data) == {
        "names": ["a", "b", "c"],
        "grid": {"elements": ["a", "b", "c", "d"], "dims": [2, 2]},
    }


def test_nested_data_and_data_arrays() -> None:
    data = Data(inner=Data(k=1, deeper=Data(z="x")), items=[Data(a=1), Data(a=2, b="y")], none=[])
    arrow_type = arrow_type_of(data)
    assert arrow_type.field("inner").type == pa.struct(
        [pa.field("k", pa.int64()), pa.field("deeper", pa.struct([pa.field("z", pa.string())]))]
    )
    # Elements of a Data array may differ in fields: the element type is their union.
    assert arrow_type.field("items").type == pa.list_(
        pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())])
    )
    assert _roundtrip(data) == {
        "inner": {"k": 1, "deeper": {"z": "x"}},
        "items": [{"a": 1, "b": None}, {"a": 2, "b": "y"}],
        "none": [],
    }


def test_batch_with_missing_fields_and_null_rows() -> None:
    wide = pa.struct([pa.field("a", pa.int64()), pa.field("w", pa.list_(pa.float64()))])
    array = build_array([Data(a=1), None, Data(a=3, w=np.array([1.0, 2.0]))], wide)
    assert array.to_pylist() == [{"a": 1, "w": None}, None, {"a": 3, "w": [1.0, 2.0]}]


def test_signature_tells_types_apart() -> None:
    assert signature(Data(a=1)) == signature(Data(a=2))
    assert signature(Data(a=1)) != signature(Data(a=1.0))
    assert signature(Data(a=np.zeros(3))) != signature(Data(a=np.zeros((3, 1))))
    assert signature(Data(a=np.zeros(3))) != signature(Data(a=np.zeros(3, np.float32)))
    assert signature(Data(d=Data(x=1))) != signature(Data(d=Data(x="1")))


def test_merge_types_only_gains_fields() -> None:
    a = pa.struct([pa.field("x", pa.int64())])
    b = pa.struct([pa.field("y", pa.string())])
    assert merge_types(a, b) == pa.struct([pa.field("x", pa.int64()), pa.field("y", pa.string())])
    assert merge_types(a, a) == a
    assert merge_types(a, pa.struct([pa.field("x", pa.float64())])) is None
    assert merge_types(pa.list_(a), pa.list_(b)) == pa.list_(merge_types(a, b))
    assert merge_types(pa.list_(pa.int32()), _nd(pa.int32())) is None


def _nd(element: pa.DataType) -> pa.DataType:
    return pa.struct(
        [pa.field("elements", pa.list_(element)), pa.field("dims", pa.list_(pa.int32()))]
    )


def test_unsupported_value_is_a_type_error() -> None:
    class Odd:
        def items(self) -> list[tuple[str, Any]]:
            return [("v", object())]

        def type_of(self, name: str) -> str:
            return "MYSTERY"

    with pytest.raises(TypeError, match="no Arrow mapping"):
        arrow_type_of(Odd())


def test_catalog_widens_then_opens_a_version_on_type_change(tmp_path: Path) -> None:
    catalog = SchemaCatalog(tmp_path, "r1")
    v1 = catalog.resolve("PS1", "Acq", arrow_type_of(Data(a=1)))
    assert v1.number == 1
    widened = catalog.resolve("PS1", "Acq", arrow_type_of(Data(b="x")))
    assert widened.number == 1 and widened.arrow_type.names == ["a", "b"]
    assert catalog.resolve("PS1", "Acq", arrow_type_of(Data(a=5))).number == 1
    assert catalog.changes == 0
    v2 = catalog.resolve("PS1", "Acq", arrow_type_of(Data(a="now a string")))
    assert v2.number == 2 and catalog.changes == 1
    # Persisted, and visible to another catalog (another recorder on the same root).
    other = SchemaCatalog(tmp_path, "r2")
    versions = other.versions("PS1", "Acq")
    assert [v["number"] for v in versions] == [1, 2]
    assert other.arrow_type("PS1", "Acq", 1) == widened.arrow_type
    current = other.current("PS1", "Acq")
    assert current is not None and current.number == 2
    assert other.current("PS2", "Acq") is None


def test_partition_escape() -> None:
    assert partition_escape("PS1.A-b_c") == "PS1.A-b_c"
    assert partition_escape("a/b=c d%") == "a%2Fb%3Dc%20d%25"
