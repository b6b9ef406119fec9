"""Property metadata (rda.business.metadata): Field, Alarm, PropertyDescription and the two
rules, the alarm computation and the control-limit check; pure functions, no network."""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rda
from rda.business.metadata import (
    NO_ALARM,
    AlarmRule,
    compute_alarm,
    fields_of_model,
    format_value,
    limit_problems,
)

pytestmark = pytest.mark.timeout(60)

CURRENT = rda.Field(units="A", precision=1, warning=(-8, 8), alarm=(-10, 10), limits=(-12, 12))


def test_public_names_and_severity_numbering() -> None:
    assert [int(s) for s in rda.Severity] == [0, 1, 2, 3]  # EPICS' numbering
    assert rda.Alarm.NONE is NO_ALARM
    assert not rda.Alarm.NONE and rda.Alarm(rda.Severity.MINOR)


def test_alarm_below_and_above_each_limit() -> None:
    fields = {"current": CURRENT}
    assert compute_alarm(fields, {"current": 0.0}) is NO_ALARM
    assert compute_alarm(fields, {"current": 8.0}) is NO_ALARM  # on the limit: inside
    minor = compute_alarm(fields, {"current": 9.0})
    assert minor == rda.Alarm(rda.Severity.MINOR, "current 9 A above high warning 8", "current")
    major = compute_alarm(fields, {"current": 11.25})
    assert major == rda.Alarm(rda.Severity.MAJOR, "current 11.2 A above high alarm 10", "current")
    low = compute_alarm(fields, {"current": -9})
    assert low.severity is rda.Severity.MINOR and "below low warning -8" in low.message
    nan = compute_alarm(fields, {"current": math.nan})
    assert nan.severity is rda.Severity.INVALID and nan.message == "current is not a number"


def test_messages_round_by_precision_unless_that_hides_the_crossing() -> None:
    volts = {"v": rda.Field(units="V", precision=2, alarm=(None, 10))}
    assert compute_alarm(volts, {"v": 10.4567}).message == "v 10.46 V above high alarm 10"
    # 10.0004 with two digits would read 10.00, on the limit: shown in full.
    assert compute_alarm(volts, {"v": 10.0004}).message == "v 10.0004 V above high alarm 10"
    assert compute_alarm(volts, {"v": 12}).message == "v 12 V above high alarm 10"


def test_one_sided_limits() -> None:
    fields = {"t": rda.Field(alarm=(None, 50.0))}
    assert compute_alarm(fields, {"t": -1e9}) is NO_ALARM
    assert compute_alarm(fields, {"t": 51}).severity is rda.Severity.MAJOR


def test_worst_field_wins_and_first_declared_breaks_ties() -> None:
    fields = {
        "a": rda.Field(warning=(0, 1)),
        "b": rda.Field(alarm=(0, 1)),
        "c": rda.Field(alarm=(0, 1)),
    }
    alarm = compute_alarm(fields, {"a": 5, "b": 5, "c": 5})
    assert (alarm.severity, alarm.field) == (rda.Severity.MAJOR, "b")
    assert compute_alarm(fields, {"a": 5, "b": 0.5}).field == "a"


def test_arrays_worst_element_named_by_index() -> None:
    fields = {"orbit": rda.Field(units="mm", warning=(-1, 1), alarm=(-2, 2))}
    orbit = np.array([[0.0, 0.5, 1.5], [-2.5, 0.0, 0.0]])
    alarm = compute_alarm(fields, rda.Data(orbit=orbit))
    assert alarm == rda.Alarm(rda.Severity.MAJOR, "orbit[1, 0] -2.5 mm below low alarm -2", "orbit")
    assert compute_alarm(fields, {"orbit": np.zeros(4, np.int32)}) is NO_ALARM
    nan = compute_alarm(fields, {"orbit": np.array([0.0, np.nan])})
    assert nan.severity is rda.Severity.INVALID and "orbit[1]" in nan.message


def test_non_numeric_and_undeclared_fields_have_no_alarm() -> None:
    fields = {"mode": rda.Field(alarm=(0, 1)), "on": rda.Field(alarm=(0, 0)), "x": rda.Field()}
    values = rda.Data(mode="FAST", on=True, x=1e9, other=1e9)
    assert compute_alarm(fields, values) is NO_ALARM
    assert compute_alarm(fields, {"mode": ["a", "b"]}) is NO_ALARM


def test_limit_problems_name_field_value_and_limit() -> None:
    fields = {"current": CURRENT, "mode": rda.Field(limits=(0, 1))}
    assert limit_problems(fields, {"current": 12.0, "mode": "FAST"}) == []
    assert limit_problems(fields, {"current": 12.5}) == [
        "current 12.5 A above the high limit 12 (limits -12 to 12)"
    ]
    assert limit_problems(fields, {"current": -13}) == [
        "current -13 A below the low limit -12 (limits -12 to 12)"
    ]
    assert limit_problems(fields, {"current": math.nan}) == [
        "current is not a number (limits -12 to 12)"
    ]
    wave = {"w": rda.Field(limits=(0, 10))}
    assert limit_problems(wave, {"w": np.array([1.0, 11.0, -1.0])}) == [
        "w[1] 11 above the high limit 10 (limits 0 to 10)"
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limits": (2, 1)},
        {"limits": (None, 1)},
        {"warning": (5, 1)},
        {"alarm": (math.inf, None)},
        {"alarm": (1, 2, 3)},
        {"precision": -1},
        {"precision": True},
        {"units": 3},
        {"units": "A\x00"},
    ],
)
def test_field_refuses_bad_declarations(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        rda.Field(**kwargs)


def test_json_round_trips() -> None:
    assert rda.Field().to_dict() == {}
    assert rda.Field.from_dict(CURRENT.to_dict()) == CURRENT
    description = rda.PropertyDescription(
        "PS1",
        "Setting",
        {"current": CURRENT, "mode": rda.Field(description="how")},
        "the set",
        True,
    )
    assert rda.PropertyDescription.from_dict(description.to_dict()) == description
    assert list(rda.PropertyDescription.from_dict(description.to_dict()).fields) == [
        "current",
        "mode",
    ]
    alarm = rda.Alarm(rda.Severity.MAJOR, "x 3 above high alarm 2", "x")
    assert rda.Alarm.from_dict(alarm.to_dict()) == alarm
    assert rda.Alarm.from_dict({"severity": 0}) is NO_ALARM
    for bad in ({"severity": "LOUD"}, {"severity": 7}, {"severity": 1, "message": 3}):
        with pytest.raises(ValueError):
            rda.Alarm.from_dict(bad)
    bad_descriptions: list[Any] = [{"device": "x"}, {"device": 1, "property": "p"}, []]
    for bad_description in bad_descriptions:
        with pytest.raises(ValueError):
            rda.PropertyDescription.from_dict(bad_description)
    with pytest.raises(ValueError, match="unknown Field keys: colour"):
        rda.Field.from_dict({"colour": "red"})


def test_fields_from_a_pydantic_model() -> None:
    class Setting(pydantic.BaseModel):
        current: Annotated[float, rda.Field(units="A", limits=(-10, 10))] = pydantic.Field(
            description="the output current"
        )
        mode: str = pydantic.Field("OFF", description="operating mode")
        raw: int = 0

    fields = fields_of_model(Setting)
    assert list(fields) == ["current", "mode"]
    assert fields["current"] == rda.Field(
        units="A", limits=(-10, 10), description="the output current"
    )
    assert fields["mode"] == rda.Field(description="operating mode")

    class Plain(pydantic.BaseModel):
        x: float = pydantic.Field(0.0, description="no rda.Field anywhere")

    assert fields_of_model(Plain) == {}


def test_format_value() -> None:
    assert format_value(3.14159, 3) == "3.142"
    assert format_value(0.0054867241744152705, None) == "0.0054867241744152705"
    assert format_value(7, 2) == "7"
    assert format_value(True, 2) == "true"
    assert format_value(np.array([1.0, 2.5]), 1) == "[1.0, 2.5]"
    assert CURRENT.format(1.25) == "1.2 A"


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
optional = st.one_of(st.none(), finite)


@st.composite
def fields(draw: st.DrawFn) -> rda.Field:
    def pair() -> tuple[float | None, float | None] | None:
        low, high = draw(optional), draw(optional)
        if low is not None and high is not None and low > high:
            low, high = high, low
        return draw(st.one_of(st.none(), st.just((low, high))))

    return rda.Field(warning=pair(), alarm=pair())


def _reference(f: rda.Field, v: float) -> rda.Severity:
    """The rule written plainly: MAJOR outside (lolo, hihi), MINOR outside (low, high)."""

    def outside(pair: tuple[float | None, float | None] | None) -> bool:
        if pair is None:
            return False
        low, high = pair
        return (low is not None and v < low) or (high is not None and v > high)

    if outside(f.alarm):
        return rda.Severity.MAJOR
    return rda.Severity.MINOR if outside(f.warning) else rda.Severity.NONE


@given(f=fields(), values=st.lists(finite, min_size=1, max_size=20))
def test_array_alarm_is_its_worst_element(f: rda.Field, values: list[float]) -> None:
    alarm = compute_alarm({"x": f}, {"x": np.array(values)})
    assert alarm.severity == max(_reference(f, v) for v in values)
    assert (alarm.field == "x") == bool(alarm)


@given(
    declared=st.lists(fields(), min_size=1, max_size=5),
    data=st.data(),
)
def test_worst_field_wins(declared: list[rda.Field], data: st.DataObject) -> None:
    names = [f"f{i}" for i in range(len(declared))]
    values = {n: data.draw(finite) for n in names}
    alarm = compute_alarm(dict(zip(names, declared, strict=True)), values)
    severities = [_reference(f, values[n]) for n, f in zip(names, declared, strict=True)]
    assert alarm.severity == max(severities)
    if alarm:
        assert alarm.field == names[severities.index(alarm.severity)]


@given(low=finite, span=st.floats(0, 1e6), value=finite)
def test_limits_accept_exactly_the_closed_range(low: float, span: float, value: float) -> None:
    high = low + span
    if not math.isfinite(high):
        return
    problems = limit_problems({"x": rda.Field(limits=(low, high))}, {"x": value})
    assert (problems == []) == (low <= value <= high)


scalar = st.one_of(
    finite,
    st.just(math.nan),
    st.integers(-(2**40), 2**40),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


@given(
    declared=st.lists(st.one_of(fields(), st.just(rda.Field(units="V"))), min_size=1, max_size=4),
    data=st.data(),
)
def test_the_compiled_rule_answers_as_compute_alarm(
    declared: list[rda.Field], data: st.DataObject
) -> None:
    """AlarmRule (what a server runs per value) is compute_alarm with a quick path."""
    names = [f"f{i}" for i in range(len(declared))]
    fields = dict(zip(names, declared, strict=True))
    values = {n: data.draw(scalar) for n in names}
    values = {n: v for n, v in values.items() if v is not None}
    rule = AlarmRule(fields)
    expected = compute_alarm(fields, values)
    assert rule(values) == expected
    assert rule.state(values) == (expected.severity, expected.message, expected.field)
    arrays = {n: np.array([data.draw(finite), data.draw(finite)]) for n in names}
    expected = compute_alarm(fields, arrays)
    assert rule(arrays) == expected
    assert rule.state(arrays) == (expected.severity, expected.message, expected.field)


@given(
    limits=fields(),
    precision=st.one_of(st.none(), st.integers(0, 6)),
    units=st.sampled_from(["", "A"]),
    value=scalar,
    other=scalar,
)
def test_the_rule_of_one_field_states_what_compute_alarm_says(
    limits: rda.Field, precision: int | None, units: str, value: Any, other: Any
) -> None:
    """AlarmRule.state's path for a property with one alarmed field (a number checked against
    limit texts made once) gives compute_alarm's severity, message and field."""
    field = rda.Field(units, "", precision, None, limits.warning, limits.alarm)
    fields = {"x": field, "y": rda.Field(units="V")}
    values = {n: v for n, v in (("x", value), ("y", other)) if v is not None}
    expected = compute_alarm(fields, values)
    stated = (expected.severity, expected.message, expected.field)
    assert AlarmRule(fields).state(values) == stated
    if not any(isinstance(v, str) and "\x00" in v for v in values.values()):
        # the same read from a Data (its own get), what a server passes
        assert AlarmRule(fields).state(rda.Data(values)) == stated
