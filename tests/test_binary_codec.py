"""The binary wire codec: round trips, golden bytes, fuzzing, zero-copy and decode limits.

Every test runs against both implementations, the pure-Python one and the compiled one
(``rda.serialization.binary.PYTHON`` / ``COMPILED``): see the ``implementation`` fixture.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rda.serialization import Data, DataType, DecodeError, DecodeLimits, binary, decode, encode

T = DataType


@pytest.fixture(autouse=True, scope="module", params=["python", "compiled"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the module once per codec: the tests call the module-level ``encode``/``decode``,
    rebound here, so each test body stays the one contract both implementations must meet.
    Module scope: hypothesis refuses function-scoped fixtures around ``@given``."""
    codec = binary.PYTHON if request.param == "python" else binary.COMPILED
    if codec is None:
        pytest.fail("the compiled codec (rda.serialization._cbinary) was not built")
    names = globals()
    saved = names["encode"], names["decode"]
    names["encode"], names["decode"] = codec.encode, codec.decode
    yield codec.name
    names["encode"], names["decode"] = saved


names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=6)
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
_INTS = {T.INT8: 8, T.INT16: 16, T.INT32: 32, T.INT64: 64}
_DTYPES = {
    T.BOOL_ARRAY: "?",
    T.INT8_ARRAY: "<i1",
    T.INT16_ARRAY: "<i2",
    T.INT32_ARRAY: "<i4",
    T.INT64_ARRAY: "<i8",
    T.FLOAT32_ARRAY: "<f4",
    T.FLOAT64_ARRAY: "<f8",
}
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)


def _scalar() -> st.SearchStrategy[tuple[DataType, Any]]:
    ints = [
        st.tuples(st.just(t), st.integers(-(2 ** (b - 1)), 2 ** (b - 1) - 1))
        for t, b in _INTS.items()
    ]
    return st.one_of(
        st.tuples(st.just(T.BOOL), st.booleans()),
        *ints,
        st.tuples(st.just(T.FLOAT32), st.floats(width=32)),
        st.tuples(st.just(T.FLOAT64), st.floats()),
        st.tuples(st.just(T.STRING), texts),
    )


def _array() -> st.SearchStrategy[tuple[DataType, Any]]:
    numeric = [st.tuples(st.just(t), hnp.arrays(np.dtype(dt), shapes)) for t, dt in _DTYPES.items()]
    strings_1d = st.tuples(st.just(T.STRING_ARRAY), st.lists(texts, max_size=5))
    strings_nd = shapes.flatmap(
        lambda shape: st.tuples(
            st.just(T.STRING_ARRAY),
            st.lists(texts, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))).map(
                lambda items: np.array([*items, ""], dtype=object)[:-1].reshape(shape)
            ),
        )
    )
    return st.one_of(*numeric, strings_1d, strings_nd)


def _build(entries: list[tuple[str, tuple[DataType, Any]]]) -> Data:
    d = Data()
    for name, (t, value) in entries:
        d.append(name, value, t)
    return d


def _data_of(values: st.SearchStrategy[tuple[DataType, Any]]) -> st.SearchStrategy[Data]:
    return st.lists(st.tuples(names, values), max_size=4, unique_by=lambda e: e[0]).map(_build)


flat_data = _data_of(st.one_of(_scalar(), _array()))
any_data = st.recursive(
    flat_data,
    lambda inner: _data_of(
        st.one_of(
            _scalar(),
            _array(),
            st.tuples(st.just(T.DATA), inner),
            st.tuples(st.just(T.DATA_ARRAY), st.lists(inner, max_size=3)),
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(any_data)
def test_round_trip_every_type_and_nesting(data: Data) -> None:
    raw = encode(data)
    assert decode(raw) == data
    assert decode(memoryview(raw)) == data
    assert decode(bytearray(raw)) == data
    assert encode(decode(raw)) == raw  # the encoding is canonical


def test_paper_object_round_trip() -> None:
    d = Data(
        a=np.arange(40, dtype=np.int32),
        b=np.linspace(0, 1, 40),
        c=[f"element-{i}" for i in range(40)],
    )
    out = decode(encode(d))
    assert out == d and out.types() == d.types()
    assert out["c"][39] == "element-39"


# Golden bytes: each is pinned so the wire format cannot drift unnoticed (and matches the
# worked examples in docs/serialization.md).
GOLDEN: list[tuple[Data, str]] = [
    (Data(), "00000000"),
    (Data(x=1), "010000000500010008000000780100000000000000"),
    (Data(on=True), "0100000001000200010000006f6e01"),
    (Data(v=1.5), "01000000070001000800000076000000000000f83f"),
    (Data(s="hé"), "0100000008000100030000007368c3a9"),
    (Data(n=["a", "", "bc"]), "0100000008010100060000006e610000626300"),
    (_build([("n", (T.STRING_ARRAY, []))]), "0100000008010100000000006e"),
    (
        Data(a=np.array([1, -1], np.int16)),
        "010000000301010004000000610100ffff",
    ),
    (
        Data(m=np.arange(6, dtype=np.int8).reshape(2, 3)),
        "01000000020201000e0000006d0200000003000000000102030405",
    ),
    (
        Data(d={"k": np.int32(7)}),
        "010000000900010011000000640100000004000100040000006b07000000",
    ),
    (
        Data(l=[{}, {}]),
        "01000000090101000c0000006c020000000000000000000000",
    ),
]


@pytest.mark.parametrize(("data", "hexbytes"), GOLDEN)
def test_golden_bytes(data: Data, hexbytes: str) -> None:
    assert encode(data).hex() == hexbytes
    assert decode(bytes.fromhex(hexbytes)) == data


def test_decoded_arrays_are_zero_copy_read_only_views() -> None:
    big = np.random.default_rng(1).random(131072)  # 1 MiB of float64
    raw = encode(Data(x=big))
    out = decode(raw)["x"]
    assert np.shares_memory(out, np.frombuffer(raw, np.uint8))
    assert not out.flags.writeable
    assert np.array_equal(out, big)
    writable = bytearray(raw)
    from_bytearray = decode(writable)["x"]
    assert np.shares_memory(from_bytearray, np.frombuffer(writable, np.uint8))
    assert not from_bytearray.flags.writeable  # a writable input is still viewed read-only


def _decode_or_decode_error(raw: bytes, limits: DecodeLimits | None = None) -> None:
    try:
        decode(raw, limits)
    except DecodeError as exc:
        assert "offset" in str(exc) or exc.offset is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_decode_error(raw: bytes) -> None:
    _decode_or_decode_error(raw)


@settings(max_examples=200, deadline=None)
@given(any_data, st.data())
def test_truncated_encodings_raise_decode_error(data: Data, draw: st.DataObject) -> None:
    raw = encode(data)
    cut = draw.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut])


@settings(max_examples=300, deadline=None)
@given(any_data, st.data())
def test_mutated_encodings_decode_or_raise_decode_error(data: Data, draw: st.DataObject) -> None:
    raw = bytearray(encode(data))
    for _ in range(draw.draw(st.integers(1, 4))):
        i = draw.draw(st.integers(0, len(raw) - 1))
        raw[i] = draw.draw(st.integers(0, 255))
    try:
        out = decode(bytes(raw))
    except DecodeError:
        return
    assert decode(encode(out)) == out  # whatever decodes is a valid, re-encodable Data


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "4-byte entry count"),
        (struct.pack("<I", 2**31) + bytes(16), "declares 2147483648 entries"),
        (bytes.fromhex("0100000007010100ffffff7f61"), "bytes remain"),
        (bytes.fromhex("01000000070101000300000061000000"), "whole number"),
        (bytes.fromhex("010000000f0001000000000061"), "unknown type tag 15"),
        (bytes.fromhex("0100000001000100010000006102"), "0 or 1"),
        (bytes.fromhex("010000000800010001000000ff61"), "not valid UTF-8"),
        (bytes.fromhex("01000000080000000000000000"), "empty field name"),
        (bytes.fromhex("0100000008010100010000006162"), "end with NUL"),
        (bytes.fromhex("01000000050001000800000061000000000000000000"), "trailing"),
        (
            bytes.fromhex("02000000" + ("0500010008000000610000000000000000") * 2),
            "duplicate",
        ),
        (
            bytes.fromhex("01000000070201000c00000061ffffffffffffffff00000000"),
            "dims",
        ),
        (bytes.fromhex("01000000090101000400000061ffffff7f"), "Data declared"),
    ],
)
def test_bad_input_names_the_problem_and_offset(raw: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message) as info:
        decode(raw)
    assert info.value.offset is not None


def test_depth_limit() -> None:
    d = Data(leaf=1)
    for _ in range(9):
        d = Data(inner=d)
    raw = encode(d)  # 10 levels
    assert decode(raw, DecodeLimits(max_depth=10)) == d
    with pytest.raises(DecodeError, match="max_depth=9"):
        decode(raw, DecodeLimits(max_depth=9))
    deep = Data(leaf=1)
    for _ in range(70):
        deep = Data(inner=deep)
    with pytest.raises(ValueError, match="nested deeper"):
        encode(deep)


def test_element_limit() -> None:
    raw = encode(Data(a=np.zeros(100), s=["x"] * 50, l=[Data()] * 10))
    assert len(decode(raw, DecodeLimits(max_elements=3 + 100 + 50 + 10))) == 3
    for limit in (3, 50, 150, 162):
        with pytest.raises(DecodeError, match="max_elements"):
            decode(raw, DecodeLimits(max_elements=limit))


def test_invalid_limits_and_inputs() -> None:
    with pytest.raises(ValueError):
        DecodeLimits(max_depth=0)
    with pytest.raises(TypeError):
        encode({"a": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        decode("text")  # type: ignore[arg-type]


def test_nesting_beyond_the_python_stack_is_a_decode_error() -> None:
    # Each level: a one-entry Data whose entry "d" is the level below; innermost: Data().
    raw = bytes(4)
    for _ in range(5000):
        raw = struct.pack("<IBBHI", 1, 9, 0, 1, len(raw)) + b"d" + raw
    with pytest.raises(DecodeError, match="Python stack"):
        decode(raw, DecodeLimits(max_depth=10**6))
    with pytest.raises(DecodeError, match="max_depth=64"):
        decode(raw)


def test_zero_size_array_with_huge_dims() -> None:
    dims = "00000000" + "ffffffff" * 4
    raw = bytes.fromhex("01000000070501001400000061" + dims)
    with pytest.raises(DecodeError, match="cannot shape"):
        decode(raw)
    ok = bytes.fromhex("0100000007020100080000006100000000ffffffff")
    assert decode(ok)["a"].shape == (0, 0xFFFFFFFF)


def test_zero_size_array_with_absurd_dims_is_a_decode_error() -> None:
    """(3774873604, 0) holds no bytes, but tolist()/repr would build billions of lists
    (found by hypothesis): the implied nested lists count against max_elements."""

    arr = np.empty((1, 0), dtype=object)
    good = encode(Data(s=arr))
    assert decode(good)["s"].shape == (1, 0)
    bad = good.replace(struct.pack("<II", 1, 0), struct.pack("<II", 3774873604, 0), 1)
    assert bad != good
    with pytest.raises(DecodeError, match="nested lists"):
        decode(bad)
    numeric = encode(Data(a=np.empty((1, 0), dtype=np.float64)))
    bad_numeric = numeric.replace(struct.pack("<II", 1, 0), struct.pack("<II", 3774873604, 0), 1)
    with pytest.raises(DecodeError, match="nested lists"):
        decode(bad_numeric)


def test_object_arrays_compare_without_building_lists() -> None:
    a = np.array([["x", "y"], ["z", "w"]], dtype=object)
    assert Data(s=a) == Data(s=a.copy())
    b = a.copy()
    b[1, 1] = "q"
    assert Data(s=a) != Data(s=b)
    assert Data(s=np.empty((5, 0), dtype=object)) == Data(s=np.empty((5, 0), dtype=object))
