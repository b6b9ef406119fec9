"""The gateway's names and types without a network (docs/gateway.md, "Naming", "Types")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from p4p import Value

import rda
from rda.gateway import nt
from rda.gateway.naming import PvName, parse_pv_name, pv_name

NAME = st.text(
    alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd"), whitelist_characters="_-:"),
    min_size=1,
    max_size=12,
)


@settings(deadline=None, max_examples=200)
@given(
    device=st.text(
        alphabet=st.characters(
            whitelist_categories=("Lu", "Ll", "Nd"), whitelist_characters="_-:."
        ),
        min_size=1,
        max_size=12,
    ),
    prop=NAME,
    field=st.lists(NAME, max_size=3),
    selector=st.one_of(
        st.just(""), st.from_regex(r"[A-Z]{1,4}(\.[A-Z0-9]{1,5}){0,3}", fullmatch=True)
    ),
)
def test_names_round_trip(device: str, prop: str, field: list[str], selector: str) -> None:
    name = pv_name(device, prop, tuple(field), selector)
    assert parse_pv_name(name) == PvName(device, prop, tuple(field), selector)


def test_the_parse_reads_from_the_left() -> None:
    assert parse_pv_name("PS1/Acquisition.current@CPS.USER.LHC1") == PvName(
        "PS1", "Acquisition", ("current",), "CPS.USER.LHC1"
    )
    assert parse_pv_name("PR.BPM/Orbit") == PvName("PR.BPM", "Orbit")
    assert parse_pv_name("A/B/C").prop == "B/C"  # only the first '/' splits
    for bad in ("PS1", "/P", "PS1/", "PS1/P.", "PS1/P..f", "PS1/P@", "PS 1/P", "x" * 600):
        with pytest.raises(ValueError):
            parse_pv_name(bad)


@pytest.mark.parametrize(
    ("kind", "ndim", "id_", "code"),
    [
        (rda.DataType.BOOL, 0, nt.NTSCALAR_ID, "?"),
        (rda.DataType.INT8, 0, nt.NTSCALAR_ID, "b"),
        (rda.DataType.INT16, 0, nt.NTSCALAR_ID, "h"),
        (rda.DataType.INT32, 0, nt.NTSCALAR_ID, "i"),
        (rda.DataType.INT64, 0, nt.NTSCALAR_ID, "l"),
        (rda.DataType.FLOAT32, 0, nt.NTSCALAR_ID, "f"),
        (rda.DataType.FLOAT64, 0, nt.NTSCALAR_ID, "d"),
        (rda.DataType.STRING, 0, nt.NTSCALAR_ID, "s"),
        (rda.DataType.FLOAT64_ARRAY, 1, nt.NTSCALARARRAY_ID, "ad"),
        (rda.DataType.INT8_ARRAY, 1, nt.NTSCALARARRAY_ID, "ab"),
        (rda.DataType.STRING_ARRAY, 1, nt.NTSCALARARRAY_ID, "as"),
        (rda.DataType.STRING_ARRAY, 2, nt.NTSCALARARRAY_ID, "as"),
        (rda.DataType.FLOAT32_ARRAY, 2, nt.NTNDARRAY_ID, None),
        (rda.DataType.INT32_ARRAY, 3, nt.NTNDARRAY_ID, None),
    ],
)
def test_the_type_table(kind: rda.DataType, ndim: int, id_: str, code: str | None) -> None:
    type_ = nt.field_type(kind, ndim)
    assert type_.getID() == id_
    if code is not None:
        spec = dict(type_.aspy()[2])
        assert spec["value"] == code
        numeric = code[-1] in "bhilfd"
        assert ("control" in spec) is numeric and ("valueAlarm" in spec) is numeric
        assert "display" in spec


def test_the_property_structure_holds_every_kind() -> None:
    data = rda.Data(
        flag=True,
        count=np.int64(7),
        name="x",
        trace=np.arange(4.0),
        image=np.arange(6, dtype=np.int16).reshape(2, 3),
        labels=["a", "b"],
        nested=rda.Data(x=1.5),
        rows=[rda.Data(a=1), rda.Data(a=2, b="two")],
    )
    layout = nt.layout_of(data)
    type_ = nt.property_type(layout)
    assert type_.getID() == nt.PROPERTY_ID
    value = Value(type_, {"value": nt.pv_value(data, layout), "gaps": 2})
    assert value["value.flag"] is True and value["value.count"] == 7
    assert list(value["value.trace"]) == [0.0, 1.0, 2.0, 3.0]
    image = value["value.image"]
    assert image.getID() == nt.NTNDARRAY_ID
    assert [d.size for d in image.dimension] == [3, 2]  # innermost first
    assert list(image.value) == list(range(6))
    assert value["value.labels"] == ["a", "b"]
    assert value["value.nested.x"] == 1.5
    assert [r.a for r in value["value.rows"]] == [1, 2] and value["value.rows"][1].b == "two"
    assert value["gaps"] == 2
    # The layout is what decides whether a PV keeps its type.
    assert nt.layout_of(rda.Data(x=1.0)) != nt.layout_of(rda.Data(x=1))
    assert nt.layout_of(rda.Data(x=np.zeros(3))) != nt.layout_of(rda.Data(x=np.zeros((1, 3))))
