"""The gateway's names, types, metadata and shared feeds without a network (docs/gateway.md)."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from p4p import Value

import rda
from rda.business.client.subscriptions import Notification
from rda.gateway import metadata, nt
from rda.gateway.feeds import FeedTable, Update
from rda.gateway.naming import PvName, parse_pv_name, pv_name
from rda.serialization.header import DataContext

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


def test_metadata_maps_to_display_control_and_value_alarm() -> None:
    description = rda.PropertyDescription(
        "PS1",
        "Setting",
        {
            "current": rda.Field(
                units="A",
                description="set point",
                precision=3,
                limits=(-10.0, 10.0),
                warning=(-8.0, 8.0),
                alarm=(None, 9.0),
            ),
            "label": rda.Field(units="-", description="a name"),
        },
    )
    meta = metadata.field_metadata(description, ("current",), "d")
    value = Value(nt.field_type(rda.DataType.FLOAT64, 0), {"value": 1.0, **meta})
    assert value["display.units"] == "A" and value["display.precision"] == 3
    assert value["display.description"] == "set point"
    assert (value["display.limitLow"], value["display.limitHigh"]) == (-10.0, 10.0)
    assert (value["control.limitLow"], value["control.limitHigh"]) == (-10.0, 10.0)
    assert value["valueAlarm.lowWarningLimit"] == -8.0
    assert value["valueAlarm.highWarningLimit"] == 8.0
    assert value["valueAlarm.highAlarmLimit"] == 9.0
    assert math.isnan(value["valueAlarm.lowAlarmLimit"])  # not declared
    assert value["valueAlarm.highAlarmSeverity"] == 2 and value["valueAlarm.lowAlarmSeverity"] == 0
    assert value["valueAlarm.highWarningSeverity"] == 1
    # Not declared at all: what an IOC sends for a record without them.
    bare = metadata.field_metadata(description, ("other",), "d")
    assert bare["display"]["units"] == "" and math.isnan(bare["control"]["limitLow"])
    assert metadata.field_metadata(None, ("current",), "i")["control"]["limitLow"] == 0
    # A string field: units and description only.
    assert metadata.field_metadata(description, ("label",), "s") == {
        "display": {"description": "a name", "units": "-"}
    }


def test_a_field_pv_shows_its_own_fields_alarm() -> None:
    description = rda.PropertyDescription(
        "PS1", "Setting", {"current": rda.Field(units="A", warning=(-8.0, 8.0), alarm=(-9.0, 9.0))}
    )
    assert metadata.field_alarm(description, ("current",), 1.0) == metadata.NO_ALARM
    minor = metadata.field_alarm(description, ("current",), 8.5)
    assert (minor.severity, minor.status) == (1, metadata.DEVICE)
    major = metadata.field_alarm(description, ("current",), -9.5)
    assert major.severity == 2 and "current" in major.message
    assert metadata.field_alarm(description, ("other",), 99.0) == metadata.NO_ALARM
    assert metadata.field_alarm(None, ("current",), 99.0) == metadata.NO_ALARM
    assert metadata.alarm_state(rda.Alarm(rda.Severity.MAJOR, "too high")).as_dict() == {
        "severity": 2,
        "status": metadata.DEVICE,
        "message": "too high",
    }


def test_errors_are_invalid_with_their_text() -> None:
    lost = metadata.error_alarm(rda.DisconnectedError("server gone"))
    assert (lost.severity, lost.status) == (3, metadata.DRIVER)
    assert lost.message == "DisconnectedError: server gone"
    remote = metadata.error_alarm(rda.RemoteError("RuntimeError", "interlock open"))
    assert (remote.severity, remote.status) == (3, metadata.DEVICE)
    assert remote.message == "RuntimeError: interlock open"


class _Stub:
    """A ClientService stand-in for one feed: captures the listener, refuses describe."""

    def __init__(self) -> None:
        self.listener: Any = None
        self.closed = 0

    def access_point(self, device: str, prop: str) -> _Stub:
        return self

    def subscribe(self, selector: str | None, listener: Any) -> _Stub:
        self.listener = listener
        return self

    def describe(self, timeout: float | None = None) -> Any:
        raise rda.RemoteProtocolError("no describe here")

    def close(self) -> None:
        self.closed += 1


class _Shown:
    def __init__(self) -> None:
        self.updates: list[Update] = []

    def show(self, update: Update) -> None:
        self.updates.append(update)


def test_a_feed_counts_gaps_and_keeps_the_last_value_on_an_error() -> None:
    stub = _Stub()
    table = FeedTable(cast(Any, stub))
    first, second = _Shown(), _Shown()
    table.attach(("PS1", "Acquisition", ""), first)
    assert stub.listener is not None
    context = DataContext("CPS.USER.LHC1", 1, 2, "")
    stub.listener(Notification(rda.Data(current=1.0), context, gap=0))
    stub.listener(Notification(rda.Data(current=2.0), context, gap=3))
    stub.listener(Notification(error=rda.DisconnectedError("server gone")))
    assert [u.gaps for u in first.updates] == [0, 3, 3]  # counted, never reset
    lost = first.updates[-1]
    assert lost.failed and lost.data is not None and lost.data["current"] == 2.0
    assert (lost.alarm.severity, lost.alarm.status) == (3, metadata.DRIVER)
    # A second PV of the same property shares the subscription and starts from the latest.
    table.attach(("PS1", "Acquisition", ""), second)
    assert len(table) == 1 and table.opened == 1
    assert second.updates == [lost]
    assert table.gaps() == 3
    table.detach(("PS1", "Acquisition", ""), first)
    assert stub.closed == 0
    table.detach(("PS1", "Acquisition", ""), second)
    assert stub.closed == 1 and len(table) == 0
