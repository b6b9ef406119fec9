"""The Data container: type inference, pinning, rejection, getters, equality, repr, dicts."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest

from rda.serialization import Data, DataType

T = DataType


def test_default_types_of_python_values() -> None:
    d = Data(
        b=True,
        i=3,
        f=1.5,
        s="x",
        names=["a", "b"],
        ints=[1, 2],
        floats=[1, 2.5],
        flags=[True, False],
        sub={"q": 1},
        subs=[{"q": 1}, Data(r=2)],
        grid=[[1, 2], [3, 4]],
        sgrid=[["a", "b"], ["c", "d"]],
        empty=[],
    )
    assert d.types() == {
        "b": T.BOOL,
        "i": T.INT64,
        "f": T.FLOAT64,
        "s": T.STRING,
        "names": T.STRING_ARRAY,
        "ints": T.INT64_ARRAY,
        "floats": T.FLOAT64_ARRAY,
        "flags": T.BOOL_ARRAY,
        "sub": T.DATA,
        "subs": T.DATA_ARRAY,
        "grid": T.INT64_ARRAY,
        "sgrid": T.STRING_ARRAY,
        "empty": T.FLOAT64_ARRAY,
    }
    assert d["grid"].shape == (2, 2)
    assert d["sgrid"].shape == (2, 2) and d["sgrid"].dtype == object
    assert isinstance(d["sub"], Data) and d["subs"][1]["r"] == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.int8(1), T.INT8),
        (np.int16(1), T.INT16),
        (np.int32(1), T.INT32),
        (np.int64(1), T.INT64),
        (np.float32(1), T.FLOAT32),
        (np.float64(1), T.FLOAT64),
        (np.bool_(True), T.BOOL),
        (np.zeros(3, np.int8), T.INT8_ARRAY),
        (np.zeros((2, 3, 4), np.float32), T.FLOAT32_ARRAY),
        (np.zeros(2, bool), T.BOOL_ARRAY),
        (np.array(["a", "b"]), T.STRING_ARRAY),
        (np.array(7, np.int16), T.INT16),
    ],
)
def test_numpy_values_keep_their_type(value: Any, expected: DataType) -> None:
    assert Data(v=value).type_of("v") is expected


def test_numpy_arrays_are_stored_by_reference_and_big_endian_is_normalised() -> None:
    arr = np.arange(4, dtype=np.float64)
    assert Data(a=arr)["a"] is arr
    big = np.arange(4, dtype=">i4")
    stored = Data(a=big)["a"]
    assert stored.dtype == np.dtype("<i4") and stored.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("value", [np.uint8(1), np.zeros(2, np.uint16), np.uint64(3)])
def test_unsigned_values_are_rejected(value: Any) -> None:
    with pytest.raises(TypeError, match="no unsigned types"):
        Data(v=value)


def test_unsigned_array_pins_to_signed_when_lossless() -> None:
    d = Data()
    d.append("v", np.array([1, 2], np.uint32), T.INT64_ARRAY)
    assert d["v"].dtype == np.int64
    with pytest.raises(ValueError, match="do not fit int8"):
        d.append("w", np.array([200], np.uint8), T.INT8_ARRAY)


@pytest.mark.parametrize(
    "bad",
    [{"v": "a\x00b"}, {"v": ["ok", "b\x00"]}, {"a\x00": 1}, {"": 1}],
)
def test_nul_and_empty_names_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"NUL|empty"):
        Data(bad)


def test_subclasses_of_builtins_take_the_builtin_type() -> None:
    d = Data(t=DataType.INT8, s=type("S", (str,), {})("x"))
    assert (d.type_of("t"), d["t"], type(d["t"])) == (T.INT64, 2, int)
    assert (d.type_of("s"), type(d["s"])) == (T.STRING, str)


def test_unsupported_values_are_rejected() -> None:
    for bad in (b"bytes", object(), [1, "a"], [[1, 2], [3]], np.zeros(2, np.complex64), None):
        with pytest.raises((TypeError, ValueError)):
            Data(v=bad)
    with pytest.raises(ValueError, match="int64"):
        Data(v=2**63)


@pytest.mark.parametrize(
    ("t", "lo", "hi"),
    [(T.INT8, -128, 127), (T.INT16, -(2**15), 2**15 - 1), (T.INT32, -(2**31), 2**31 - 1)],
)
def test_pinned_integer_ranges(t: DataType, lo: int, hi: int) -> None:
    d = Data()
    d.append("lo", lo, t)
    d.append("hi", hi, t)
    assert (d["lo"], d["hi"], d.type_of("hi")) == (lo, hi, t)
    for bad in (lo - 1, hi + 1):
        with pytest.raises(ValueError, match=f"'x'.*does not fit {t.name.lower()}"):
            d.append("x", bad, t)
    with pytest.raises(TypeError):
        d.append("x", 1.5, t)


def test_pinned_float32_rounds_and_rejects_overflow() -> None:
    d = Data()
    d.append("f", 0.1, T.FLOAT32)
    assert d["f"] == float(np.float32(0.1)) and d["f"] != 0.1
    d.append("a", [0.1, 1e30], T.FLOAT32_ARRAY)
    assert d["a"].dtype == np.float32
    with pytest.raises(ValueError, match="float32"):
        d.append("g", 1e39, T.FLOAT32)
    with pytest.raises(ValueError, match="float32"):
        d.append("b", [1e39], T.FLOAT32_ARRAY)


def test_pinned_arrays_convert_only_losslessly() -> None:
    d = Data()
    d.append("i", [1, 2, 3], T.INT16_ARRAY)
    assert d["i"].dtype == np.int16
    d.append("f", np.array([1.0, 2.0]), T.INT32_ARRAY)
    assert d["f"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="do not fit"):
        d.append("x", [1.5], T.INT32_ARRAY)
    with pytest.raises(ValueError, match="do not fit"):
        d.append("x", [70000], T.INT16_ARRAY)
    with pytest.raises(TypeError):
        d.append("x", ["a"], T.INT32_ARRAY)
    d.append("s", [], T.STRING_ARRAY)
    d.append("e", [], T.DATA_ARRAY)
    assert d.type_of("s") is T.STRING_ARRAY and d.type_of("e") is T.DATA_ARRAY


def test_mapping_protocol_and_order() -> None:
    d = Data(a=1, b=2)
    d["c"] = 3
    d["a"] = "replaced"
    assert list(d) == ["a", "b", "c"] and list(d.keys()) == ["a", "b", "c"]
    assert d["a"] == "replaced" and d.type_of("a") is T.STRING
    assert "b" in d and "z" not in d and len(d) == 3
    del d["b"]
    assert list(d.items()) == [("a", "replaced"), ("c", 3)]
    values = d.values()  # a live view, in field order
    d["d"] = 4.5
    assert list(values) == ["replaced", 3, 4.5] and len(values) == 3
    assert d.get("zz", 9) == 9
    with pytest.raises(KeyError):
        d["zz"]


def test_typed_getters() -> None:
    d = Data(b=True, i=np.int16(4), f=2.5, s="x", a=[1.0], n=["p"], sub={"q": 1}, subs=[{}])
    assert d.get_bool("b") is True
    assert d.get_int("i") == 4 and d.get_float("f") == 2.5 and d.get_str("s") == "x"
    assert d.get_array("a").tolist() == [1.0]
    assert d.get_array("n").tolist() == ["p"] and d.get_str_list("n") == ["p"]
    assert d.get_data("sub") == Data(q=1) and d.get_data_array("subs") == [Data()]
    with pytest.raises(TypeError, match="field 'f' is float64, not an integer"):
        d.get_int("f")
    with pytest.raises(TypeError, match="field 's' is string, not a float"):
        d.get_float("s")
    with pytest.raises(KeyError, match="no field 'nope'"):
        d.get_str("nope")


def test_deep_equality() -> None:
    def make() -> Data:
        return Data(a=np.arange(6.0).reshape(2, 3), n=["x"], sub={"q": [1, 2]}, f=math.nan)

    assert make() == make()
    assert Data(a=1, b=2) == Data(b=2, a=1)  # field order is not compared
    other = make()
    other["sub"]["q"] = [1, 3]
    assert make() != other
    assert Data(a=np.zeros(2, np.int32)) != Data(a=np.zeros(2, np.int64))
    assert Data(a=np.zeros((2, 3))) != Data(a=np.zeros((3, 2)))
    assert Data(a=1) != Data(a=1.0)
    assert Data(a=1) != {"a": 1}


def test_repr_shows_types() -> None:
    d = Data(current=1.5, names=["a", "b", "c"])
    assert repr(d) == "Data(current: float64 = 1.5, names: string[3] = ['a', 'b', 'c'])"
    nested = repr(Data(m=np.zeros((2, 3), np.int32), s=Data(x=np.int8(1))))
    assert "m: int32[2x3] = [[0, 0, 0], [0, 0, 0]]" in nested
    assert "s: data = Data(x: int8 = 1)" in nested
    assert "\n" not in nested
    assert "..." in repr(Data(a=np.arange(1000)))


def test_pickle_and_copy() -> None:
    d = Data(a=np.arange(3, dtype=np.int16), s=["x"], sub={"n": np.int8(1)})
    d.append("f", 0.5, T.FLOAT32)
    back = pickle.loads(pickle.dumps(d))
    assert back == d and back.types() == d.types()
    shallow = d.copy()
    shallow["a"] = 1
    assert d.type_of("a") is T.INT16_ARRAY and shallow["sub"] is d["sub"]


def test_to_dict_and_from_dict_round_trip() -> None:
    d = Data(a=np.arange(3, dtype=np.int32), s=["x"], sub={"n": np.int8(1)}, subs=[{"f": 1.0}])
    d.append("f", 0.5, T.FLOAT32)
    plain = d.to_dict()
    assert isinstance(plain["sub"], dict) and isinstance(plain["subs"][0], dict)
    assert isinstance(plain["a"], np.ndarray) and plain["a"] is d["a"]
    assert plain["f"].dtype == np.float32
    assert Data.from_dict(plain) == d
