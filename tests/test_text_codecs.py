"""The JSON and CSV string forms: round trips, the documented layout, and bad input."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rda.serialization import (
    Data,
    DataType,
    DecodeError,
    DecodeLimits,
    from_csv,
    from_json,
    to_csv,
    to_json,
)

T = DataType
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=6)
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
_NUMERIC = {
    T.BOOL_ARRAY: "?",
    T.INT8_ARRAY: "<i1",
    T.INT16_ARRAY: "<i2",
    T.INT32_ARRAY: "<i4",
    T.INT64_ARRAY: "<i8",
    T.FLOAT32_ARRAY: "<f4",
    T.FLOAT64_ARRAY: "<f8",
}


def _scalars() -> st.SearchStrategy[tuple[DataType, Any]]:
    return st.one_of(
        st.tuples(st.just(T.BOOL), st.booleans()),
        st.tuples(st.just(T.INT8), st.integers(-128, 127)),
        st.tuples(st.just(T.INT16), st.integers(-(2**15), 2**15 - 1)),
        st.tuples(st.just(T.INT32), st.integers(-(2**31), 2**31 - 1)),
        st.tuples(st.just(T.INT64), st.integers(-(2**63), 2**63 - 1)),
        st.tuples(st.just(T.FLOAT32), st.floats(width=32)),
        st.tuples(st.just(T.FLOAT64), st.floats()),
        st.tuples(st.just(T.STRING), texts),
    )


def _arrays(max_dims: int) -> st.SearchStrategy[tuple[DataType, Any]]:
    shapes = hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=0, max_side=4)
    return st.one_of(
        *[st.tuples(st.just(t), hnp.arrays(np.dtype(dt), shapes)) for t, dt in _NUMERIC.items()],
        st.tuples(st.just(T.STRING_ARRAY), st.lists(texts, max_size=5)),
    )


def _build(entries: list[tuple[str, tuple[DataType, Any]]]) -> Data:
    d = Data()
    for name, (t, value) in entries:
        d.append(name, value, t)
    return d


def _data_of(values: st.SearchStrategy[tuple[DataType, Any]]) -> st.SearchStrategy[Data]:
    return st.lists(st.tuples(names, values), max_size=4, unique_by=lambda e: e[0]).map(_build)


flat = _data_of(st.one_of(_scalars(), _arrays(1)))
nested = st.recursive(
    _data_of(st.one_of(_scalars(), _arrays(3))),
    lambda inner: _data_of(
        st.one_of(
            _scalars(),
            _arrays(3),
            st.tuples(st.just(T.DATA), inner),
            st.tuples(st.just(T.DATA_ARRAY), st.lists(inner, max_size=3)),
        )
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(nested)
def test_json_round_trip_every_type_and_nesting(data: Data) -> None:
    text = to_json(data)
    json.loads(text)  # standard JSON: no bare NaN/Infinity tokens
    assert from_json(text) == data
    assert from_json(text).types() == data.types()


@settings(max_examples=150, deadline=None)
@given(flat)
def test_csv_round_trip_flat_data(data: Data) -> None:
    assert from_csv(to_csv(data)) == data


def test_json_layout() -> None:
    d = Data(v=1.5, m=np.arange(4, dtype=np.int32).reshape(2, 2), n=["a"], sub={"z": False})
    d.append("nan", math.nan, T.FLOAT32)
    assert json.loads(to_json(d)) == {
        "v": {"type": "float64", "value": 1.5},
        "m": {"type": "int32_array", "dims": [2, 2], "value": [0, 1, 2, 3]},
        "n": {"type": "string_array", "value": ["a"]},
        "sub": {"type": "data", "value": {"z": {"type": "bool", "value": False}}},
        "nan": {"type": "float32", "value": "NaN"},
    }


def test_csv_layout() -> None:
    d = Data(i=7, s=["a", "", "c,d"], f=np.array([0.5, -math.inf]))
    assert to_csv(d) == 'i,s,f\r\nint64,string[3],float64[2]\r\n7,a,0.5\r\n,,-inf\r\n,"c,d",\r\n'


@pytest.mark.parametrize(
    "d",
    [Data(sub={"a": 1}), Data(l=[{}]), Data(m=np.zeros((2, 2))), Data(s=[["a"], ["b"]])],
)
def test_csv_rejects_non_flat_data(d: Data) -> None:
    with pytest.raises(ValueError, match="flat Data"):
        to_csv(d)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "invalid JSON"),
        ("[]", "expected an object"),
        ('{"a": 1}', "type"),
        ('{"a": {"type": "int128", "value": 1}}', "unknown type"),
        ('{"a": {"type": "int8", "value": 300}}', "does not fit int8"),
        ('{"a": {"type": "int8", "value": true}}', "not a valid int8"),
        ('{"a": {"type": "float64", "value": "x"}}', "not a valid float64"),
        ('{"a": {"type": "int32_array", "value": [1, 2], "dims": [3]}}', "dims"),
        ('{"a": {"type": "int32_array", "value": 1}}', "must be a list"),
        ('{"a": {"type": "string", "value": "x\\u0000"}}', "NUL"),
        ('{"a": {"type": "string", "value": "x", "extra": 1}}', "exactly"),
        ('{"": {"type": "string", "value": "x"}}', "empty"),
        ("[" * 100000 + "]" * 100000, "invalid JSON"),
    ],
)
def test_bad_json_raises_decode_error(text: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        from_json(text)


def test_json_limits() -> None:
    d = Data(leaf=1)
    for _ in range(5):
        d = Data(inner=d)
    with pytest.raises(DecodeError, match="max_depth"):
        from_json(to_json(d), DecodeLimits(max_depth=5))
    with pytest.raises(DecodeError, match="max_elements"):
        from_json(to_json(Data(a=np.zeros(10))), DecodeLimits(max_elements=5))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names row and a types row"),
        ("a\n", "names row and a types row"),
        ("a,b\nint8\n", "1 types for 2 names"),
        ("a\nint9\n1\n", "unknown CSV type"),
        ("a\nint8\n300\n", "does not fit int8"),
        ("a\nint8\nx\n", "not a valid int8"),
        ("a\nbool\nyes\n", "not a valid bool"),
        ("a\nint8[2]\n1\n", "only 1 rows follow"),
        ("a\nint8[1]\n1\n2\n", "past the declared length"),
        ("a\nint8[x]\n", "must look like"),
        ("a,a\nint8,int8\n1,2\n", "duplicate"),
        ("a,b\nint8,int8\n1\n", "1 cells, expected 2"),
        ('a\nstring\n"x\n', "invalid CSV"),
        ("a\ndata\nx\n", "unknown CSV type"),
    ],
)
def test_bad_csv_raises_decode_error(text: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        from_csv(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_random_text_only_raises_decode_error(text: str) -> None:
    for parse in (from_json, from_csv):
        with contextlib.suppress(DecodeError):
            parse(text)


def test_json_zero_size_dims_out_of_range() -> None:
    big = '{"a": {"type": "int32_array", "dims": [0, 5000000000], "value": []}}'
    with pytest.raises(DecodeError, match="dims"):
        from_json(big)
    huge = '{"a": {"type": "int32_array", "dims": [0, 4294967295, 4294967295, 4294967295], "value": []}}'
    with pytest.raises(DecodeError, match="cannot shape"):
        from_json(huge)


def test_json_nesting_beyond_the_python_stack_is_a_decode_error() -> None:
    text = '{"type": "data", "value": {}}'
    for _ in range(3000):
        text = '{"type": "data", "value": {"d": ' + text + "}}"
    with pytest.raises(DecodeError, match=r"Python stack|invalid JSON"):
        from_json('{"d": ' + text + "}", DecodeLimits(max_depth=10**6))
