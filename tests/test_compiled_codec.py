"""What only the compiled codec has (``rda.serialization._cbinary``): its string cache, its
numpy views made without ``np.frombuffer`` and its in-place access to Data's slots. Each test
holds it to the pure codec's answer or to a stated bound; the contract both share is in
test_binary_codec.py."""

from __future__ import annotations

import pickle
from types import ModuleType

import numpy as np
import pytest

from rda.serialization import Data, DecodeError, binary


@pytest.fixture(scope="module")
def cbinary() -> ModuleType:
    if binary.COMPILED is None:
        pytest.fail("the compiled codec (rda.serialization._cbinary) was not built")
    from rda.serialization import _cbinary

    return _cbinary


def _compiled_decode(raw: bytes | bytearray | memoryview) -> Data:
    assert binary.COMPILED is not None
    return binary.COMPILED.decode(raw)


def test_data_slots_are_used_in_place(cbinary: ModuleType) -> None:
    # On CPython the slot offsets resolve: the fast path is the one the benchmark measures.
    assert cbinary.DIRECT_SLOTS is True
    d = Data(a=1.5, c=["x", "y"])
    out = _compiled_decode(binary.PYTHON.encode(d))
    assert type(out) is Data and out == d and out.types() == d.types()
    out["b"] = 2  # a decoded Data is an ordinary, mutable Data
    assert list(out) == ["a", "c", "b"]
    assert pickle.loads(pickle.dumps(out)) == out


def test_a_data_subclass_encodes_as_its_base() -> None:
    class Reading(Data):
        __slots__ = ("unit",)
        unit: str

    r = Reading(v=[1, 2, 3], s="text")
    r.unit = "mm"
    assert binary.COMPILED is not None
    assert binary.COMPILED.encode(r) == binary.PYTHON.encode(Data(v=[1, 2, 3], s="text"))


def test_repeated_strings_decode_equal_and_from_the_cache(cbinary: ModuleType) -> None:
    d = Data(names=[f"element_{i:02d}" for i in range(40)], label="ready")
    raw = binary.PYTHON.encode(d)
    first, second = _compiled_decode(raw), _compiled_decode(raw)
    assert first == d and second == d
    assert type(second["names"]) is list and all(type(s) is str for s in second["names"])
    # The second decode reuses the first one's str objects (strings are immutable).
    assert all(a is b for a, b in zip(first["names"], second["names"], strict=True))
    assert first["label"] is second["label"]
    # The list itself is new every time: changing one decoded Data changes no other.
    assert first["names"] is not second["names"]
    first["names"][0] = "changed"
    assert _compiled_decode(raw)["names"][0] == "element_00"


def test_the_string_cache_is_bounded(cbinary: ModuleType) -> None:
    many = [f"s{i:06d}" for i in range(3 * cbinary.STRING_CACHE_SLOTS)]
    raw = binary.PYTHON.encode(Data(v=many))
    assert _compiled_decode(raw)["v"] == many
    assert 0 < cbinary.string_cache_size() <= cbinary.STRING_CACHE_SLOTS


def test_long_and_non_ascii_strings_decode_as_the_pure_codec_does(cbinary: ModuleType) -> None:
    n = cbinary.STRING_CACHE_MAX_BYTES
    values = ["", "a", "é", "ascii", "x" * (n - 1), "y" * n, "z" * (n + 1), "日本語", "mixé" * 30]
    d = Data(v=values, s="é" * 3, t="w" * (n + 5), e="")
    raw = binary.PYTHON.encode(d)
    for _ in range(2):  # the second time through the cache
        out = _compiled_decode(raw)
        assert out == binary.PYTHON.decode(raw) == d
        assert [type(s) for s in out["v"]] == [str] * len(values)


def test_a_cached_name_with_nul_is_refused_every_time() -> None:
    good = binary.PYTHON.encode(Data(ab=1.0))
    bad = good.replace(b"ab", b"a\x00")  # same length: only the name changes
    for _ in range(3):
        with pytest.raises(DecodeError, match="contains NUL"):
            _compiled_decode(bad)
        with pytest.raises(DecodeError, match="contains NUL"):
            binary.PYTHON.decode(bad)


def test_invalid_utf8_in_a_string_array_names_the_offset_as_the_pure_codec() -> None:
    raw = bytearray(binary.PYTHON.encode(Data(v=["ok", "abc", "tail"])))
    at = raw.index(b"abc")
    raw[at + 1] = 0xFF
    with pytest.raises(DecodeError) as compiled:
        _compiled_decode(bytes(raw))
    with pytest.raises(DecodeError) as pure:
        binary.PYTHON.decode(bytes(raw))
    assert str(compiled.value) == str(pure.value)
    assert compiled.value.offset == pure.value.offset == at + 1


@pytest.mark.parametrize("dtype", ["?", "<i1", "<i2", "<i4", "<i8", "<f4", "<f8"])
def test_array_views_carry_the_flags_of_np_frombuffer(dtype: str) -> None:
    # The compiled views are made with PyArray_NewFromDescr and no flag update after it:
    # contiguity, alignment (odd offsets) and read-only must be what the pure codec gives.
    flags = ("C_CONTIGUOUS", "F_CONTIGUOUS", "OWNDATA", "WRITEABLE", "ALIGNED")
    for shape in [(0,), (1,), (5,), (3, 4), (0, 3), (2, 0, 2), (1, 1, 7)]:
        for pad in range(1, 10):
            raw = binary.PYTHON.encode(Data(p="x" * pad, v=np.ones(shape, dtype=dtype)))
            for buffer in (raw, bytearray(raw), memoryview(raw)):
                got, want = _compiled_decode(buffer)["v"], binary.PYTHON.decode(buffer)["v"]
                assert {f: got.flags[f] for f in flags} == {f: want.flags[f] for f in flags}
                assert got.strides == want.strides and got.shape == want.shape
                assert np.array_equal(got, want)


def test_field_tables_in_another_order_or_with_other_key_objects_encode_the_same() -> None:
    # The encoder walks the type table beside the value table and looks a type up only when
    # the two disagree; Data.from_parts accepts tables that do.
    d = Data(alpha=1.5, beta="x", gamma=[1, 2], nested=Data(z=["p", "q"]), strs=["u", "v"])
    values = {name: d[name] for name in d}
    types = d.types()
    want = binary.PYTHON.encode(d)
    assert binary.COMPILED is not None
    reordered = Data.from_parts(values, dict(reversed(list(types.items()))))
    other_keys = Data.from_parts(
        {"".join(list(name)): v for name, v in values.items()}, dict(types)
    )
    assert all(a is not b for a, b in zip(other_keys, d, strict=True))  # new key objects
    for data in (reordered, other_keys):
        assert binary.COMPILED.encode(data) == binary.PYTHON.encode(data) == want
        assert binary.COMPILED.writable_arrays(data) == 0
