"""Property metadata: units, precision, control limits and alarm limits, declared per field.

Pure data and pure functions, no I/O: the server enforces and computes with them, the clients
and tools (CLI, panel, gateway, recorder) show them. The names follow the two control systems
operators know (docs/server.md, "Property metadata"):

===========  =====================  ==========================================
``Field``    EPICS record field     Tango attribute property
===========  =====================  ==========================================
units        EGU                    unit
precision    PREC                   format
limits       DRVL / DRVH            min_value / max_value
warning      LOW / HIGH (MINOR)     min_warning / max_warning
alarm        LOLO / HIHI (MAJOR)    min_alarm / max_alarm
===========  =====================  ==========================================

``compute_alarm(fields, values)`` is the alarm rule: each declared field's value against its
limits, the worst field wins (an array: its worst element); a value that is not a number
(a string, a bool, nested data) has no alarm. ``limit_problems`` is the control-limit rule a
set must pass. Both read values through ``Mapping`` access only, so they take ``Data``, a
``dict`` or anything alike.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "DESCRIBE_SELECTOR",
    "NO_ALARM",
    "Alarm",
    "AlarmRule",
    "Field",
    "PropertyDescription",
    "Severity",
    "compute_alarm",
    "fields_of_model",
    "format_value",
    "limit_problems",
    "span",
]

Pair = tuple[float | None, float | None]

#: The selector of a GET that asks for the property's description instead of its value
#: (docs/protocol.md, "Describe"): client and server both name it from here.
DESCRIBE_SELECTOR = "rda:describe"


class Severity(enum.IntEnum):
    """Alarm severity, numbered as EPICS numbers it (``alarm.severity`` in pvAccess)."""

    NONE = 0
    MINOR = 1
    MAJOR = 2
    INVALID = 3


@dataclass(frozen=True, slots=True)
class Alarm:
    """The alarm state of one value: its severity, why, and the (worst) field that caused it.

    ``message`` reads like ``"current 11.2 A above high alarm 10"``; ``Alarm.NONE`` (also
    ``NO_ALARM``) is the state of a value within every limit, or with no limits declared."""

    severity: Severity = Severity.NONE
    message: str = ""
    field: str = ""

    NONE: ClassVar[Alarm]

    def __bool__(self) -> bool:
        """True when in alarm (any severity above NONE)."""
        return self.severity is not Severity.NONE

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"severity": "MAJOR", "message": "...", "field": "current"}``."""
        return {"severity": self.severity.name, "message": self.message, "field": self.field}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alarm:
        """Inverse of :meth:`to_dict`; also takes the severity as its number.

        Raises ``ValueError`` for an unknown severity or a non-string message/field."""
        severity = _severity(d.get("severity", "NONE"))
        message, name = d.get("message", ""), d.get("field", "")
        if not isinstance(message, str) or not isinstance(name, str):
            raise ValueError("alarm message and field must be strings")
        if severity is Severity.NONE and not message and not name:
            return NO_ALARM
        return cls(severity, message, name)


NO_ALARM = Alarm()
Alarm.NONE = NO_ALARM


def _severity(value: object) -> Severity:
    if isinstance(value, Severity):
        return value
    if isinstance(value, str) and value.upper() in Severity.__members__:
        return Severity[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return Severity(value)
    raise ValueError(f"unknown alarm severity {value!r} (NONE, MINOR, MAJOR or INVALID)")


@dataclass(frozen=True, slots=True)
class Field:
    """What one field of a property means: units, how to show it, and its limits.

    ``limits`` (low, high): a set outside is refused. ``warning`` (low, high): a value
    outside is a MINOR alarm. ``alarm`` (lolo, hihi): a value outside is a MAJOR alarm.
    Either side of ``warning``/``alarm`` may be None (no limit on that side). Raises
    ``ValueError`` for a reversed pair or a negative precision."""

    units: str = ""
    description: str = ""
    precision: int | None = None
    limits: tuple[float, float] | None = None
    warning: Pair | None = None
    alarm: Pair | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.units, str) or not isinstance(self.description, str):
            raise ValueError("Field units and description must be strings")
        if "\0" in self.units or "\0" in self.description:
            raise ValueError("Field units and description may not contain NUL")
        if self.precision is not None and (
            isinstance(self.precision, bool)
            or not isinstance(self.precision, int)
            or not 0 <= self.precision <= 17
        ):
            raise ValueError(f"Field precision must be an int 0..17, not {self.precision!r}")
        if self.limits is not None:
            low, high = _pair("limits", self.limits, optional=False)
            object.__setattr__(self, "limits", (low, high))
        for name in ("warning", "alarm"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _pair(name, value, optional=True))

    @property
    def has_alarm_limits(self) -> bool:
        """True when a value of this field can be in alarm (warning or alarm limits)."""
        return self.warning is not None or self.alarm is not None

    def format(self, value: Any) -> str:
        """``value`` shown with this field's precision and units: ``"3.142 A"``."""
        text = format_value(value, self.precision)
        return f"{text} {self.units}" if self.units else text

    def summary(self) -> dict[str, Any]:
        """What a table shows of it: units, precision, and each pair as ``span`` text
        (``"-10..10"``, ``"..50"``); only what is declared. Every value a string or an int, so
        it travels in a Data (admin ``devices``) where None cannot."""
        out: dict[str, Any] = {}
        if self.units:
            out["units"] = self.units
        if self.precision is not None:
            out["precision"] = self.precision
        for name in ("limits", "warning", "alarm"):
            value = getattr(self, name)
            if value is not None:
                out[name] = span(value)
        if self.description:
            out["description"] = self.description
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form; only what is declared (an empty dict for ``Field()``)."""
        out: dict[str, Any] = {}
        if self.units:
            out["units"] = self.units
        if self.description:
            out["description"] = self.description
        if self.precision is not None:
            out["precision"] = self.precision
        for name in ("limits", "warning", "alarm"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Field:
        """Inverse of :meth:`to_dict`; ``ValueError`` for unknown keys or bad values."""
        unknown = set(d) - _FIELD_KEYS
        if unknown:
            raise ValueError(f"unknown Field keys: {', '.join(sorted(unknown))}")
        return cls(
            units=d.get("units", ""),
            description=d.get("description", ""),
            precision=d.get("precision"),
            limits=_tuple(d.get("limits")),  # checked by __post_init__
            warning=_tuple(d.get("warning")),
            alarm=_tuple(d.get("alarm")),
        )


_FIELD_KEYS = frozenset({"units", "description", "precision", "limits", "warning", "alarm"})


def span(pair: Pair) -> str:
    """A (low, high) pair as text: ``"-10..10"``, ``"..50"`` (no low side), ``"0.5.."``."""
    low, high = pair
    return f"{'' if low is None else f'{low:g}'}..{'' if high is None else f'{high:g}'}"


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _pair(name: str, value: Any, *, optional: bool) -> Pair:
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ValueError(f"Field {name} must be a (low, high) pair, not {value!r}")
    out: list[float | None] = []
    for side in value:
        if side is None and optional:
            out.append(None)
        elif isinstance(side, int | float) and not isinstance(side, bool) and math.isfinite(side):
            out.append(float(side))
        else:
            sides = "a finite number or None" if optional else "a finite number"
            raise ValueError(f"Field {name}: each side must be {sides}, not {side!r}")
    low, high = out
    if low is not None and high is not None and low > high:
        raise ValueError(f"Field {name}: low {low:g} above high {high:g}")
    return low, high


@dataclass(frozen=True, slots=True)
class PropertyDescription:
    """What ``AccessPoint.describe()`` returns: a property's declared fields and whether a
    set is possible. ``fields`` holds the declared fields only, in declaration order."""

    device: str
    property: str
    fields: Mapping[str, Field] = field(default_factory=dict)
    description: str = ""
    settable: bool = False

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (also what travels on the wire, docs/protocol.md, "Describe")."""
        return {
            "device": self.device,
            "property": self.property,
            "description": self.description,
            "settable": self.settable,
            "fields": {name: f.to_dict() for name, f in self.fields.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PropertyDescription:
        """Inverse of :meth:`to_dict`; ``ValueError`` when a part is missing or malformed."""
        try:
            device, prop = d["device"], d["property"]
            fields = d.get("fields", {})
            description, settable = d.get("description", ""), d.get("settable", False)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed property description: {exc}") from None
        if not all(isinstance(s, str) for s in (device, prop, description)):
            raise ValueError("property description: device, property and description are strings")
        if not isinstance(settable, bool) or not isinstance(fields, Mapping):
            raise ValueError("property description: settable is a bool, fields a mapping")
        return cls(
            device=device,
            property=prop,
            fields={str(k): Field.from_dict(v) for k, v in fields.items()},
            description=description,
            settable=settable,
        )


def fields_of_model(schema: Any) -> dict[str, Field]:
    """The ``Field`` declared in a pydantic model's annotations, by wire name.

    ``current: Annotated[float, rda.Field(units="A")]``: pydantic keeps the ``Field`` in the
    field's ``metadata``. Read through ``model_fields`` only (duck typing), so this module does
    not import pydantic. A field without one but with a pydantic ``description`` gets
    ``Field(description=...)`` only when another field of the model declares a ``Field``."""
    found: dict[str, Field] = {}
    described: dict[str, str] = {}
    for name, info in getattr(schema, "model_fields", {}).items():
        wire = getattr(info, "alias", None) or name
        declared = [m for m in getattr(info, "metadata", ()) if isinstance(m, Field)]
        if declared:
            found[wire] = declared[-1]
        elif getattr(info, "description", None):
            described[wire] = str(info.description)
    if not found:
        return {}
    out: dict[str, Field] = {}
    for name, info in getattr(schema, "model_fields", {}).items():
        wire = getattr(info, "alias", None) or name
        if wire in found:
            f = found[wire]
            if not f.description and getattr(info, "description", None):
                f = _with_description(f, str(info.description))
            out[wire] = f
        elif wire in described:
            out[wire] = Field(description=described[wire])
    return out


def _with_description(f: Field, description: str) -> Field:
    return Field(f.units, description, f.precision, f.limits, f.warning, f.alarm)


# -- the rules --------------------------------------------------------------------------------


def format_value(value: Any, precision: int | None) -> str:
    """A number with ``precision`` digits after the point (``None``: Python's shortest repr);
    anything else as ``str``. Arrays: their elements, comma-separated in brackets."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float | np.floating):
        return repr(float(value)) if precision is None else f"{float(value):.{precision}f}"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf":
        items = ", ".join(format_value(v, precision) for v in value.ravel().tolist())
        return f"[{items}]"
    return str(value)


def _numeric(value: Any) -> np.ndarray[Any, Any] | float | None:
    """``value`` as a float or a float array when it is a number or numeric array, else None
    (bools, strings and nested data have no limits)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "iuf" and value.size else None
    if isinstance(value, np.integer | np.floating):
        return float(value)
    return None


def _given(value: float, f: Field) -> str:
    """A value a client sent, as sent (a refused set names what was asked), with the units."""
    text = str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return f"{text} {f.units}" if f.units else text


def _shown(value: float, f: Field, limit: float) -> str:
    """A value in a message, then the units: an integral value without its ``.0``; else with
    the field's precision when that still shows it beyond the ``limit`` it crossed
    (``96.9298 A`` above 95), in full when rounding would put it onto the limit
    (``10.0004`` above 10 with precision 2 is not shown as ``10.00``)."""
    if value.is_integer() and abs(value) < 1e15:
        text = str(int(value))
    else:
        text = repr(value)
        if f.precision is not None:
            rounded = f"{value:.{f.precision}f}"
            if (float(rounded) > limit) == (value > limit) and float(rounded) != limit:
                text = rounded
    return f"{text} {f.units}" if f.units else text


def _bound(limit: float) -> str:
    return f"{limit:g}"


def compute_alarm(fields: Mapping[str, Field], values: Mapping[str, Any]) -> Alarm:
    """The alarm state of ``values`` under the fields' limits: the worst field wins (ties: the
    first declared); an array is as bad as its worst element; NaN is INVALID. Fields without
    warning/alarm limits, absent from ``values`` or not numeric do not count."""
    worst = NO_ALARM
    for name, f in fields.items():
        if f.warning is None and f.alarm is None:
            continue
        value = values.get(name)
        if value is None:
            continue
        number = _numeric(value)
        if number is None:
            continue
        found = (
            _scalar_alarm(name, number, f)
            if isinstance(number, float)
            else _array_alarm(name, number, f)
        )
        if found.severity > worst.severity:
            worst = found
            if worst.severity is Severity.INVALID:
                break
    return worst


class AlarmRule:
    """``compute_alarm`` for one property's fields, made once: what a server runs for every
    value it sends. A value within every limit (the usual case) is recognised by one chained
    comparison per field against the range where nothing is in alarm (the tighter of the
    warning and alarm ranges); only a value outside it, or one that is not a plain number,
    goes through ``compute_alarm`` for its severity and message. Same answers (tested)."""

    __slots__ = ("_bounds", "_fields", "_single")

    def __init__(self, fields: Mapping[str, Field]) -> None:
        self._fields = {n: f for n, f in fields.items() if f.has_alarm_limits}
        self._bounds: tuple[tuple[str, float, float], ...] = tuple(
            (name, *_quiet_range(f)) for name, f in self._fields.items()
        )
        # One field with alarm limits (the usual declaration): a plain number outside its
        # quiet range takes _scalar_alarm's checks, with each limit's text made here once.
        self._single: tuple[str, Field, tuple[_Check, ...]] | None = None
        if len(self._fields) == 1:
            ((name, f),) = self._fields.items()
            self._single = (name, f, _checks(f))

    def __bool__(self) -> bool:
        return bool(self._bounds)

    def __call__(self, values: Mapping[str, Any]) -> Alarm:
        get: Callable[[str], Any] = values.get
        for name, low, high in self._bounds:
            value = get(name)
            if value is None:
                continue
            cls = value.__class__
            if cls in _PLAIN_NUMBERS and low <= value <= high:
                continue  # NaN compares False: the full rule names it
            return compute_alarm(self._fields, values)
        return NO_ALARM

    def state(self, values: Mapping[str, Any]) -> tuple[Severity, str, str]:
        """``(severity, message, field)`` of the alarm ``self(values)`` would return, without
        making the ``Alarm``: what a server needs per notification (the body it sends)."""
        single = self._single
        if single is not None:
            name, f, checks = single
            value = values.get(name)
            if value is None:
                return _QUIET
            cls = value.__class__
            if cls in _PLAIN_NUMBERS:
                _, low, high = self._bounds[0]
                if low <= value <= high:
                    return _QUIET
                number = float(value)
                if number == number:  # NaN: the full rule names it
                    for severity, pair_low, pair_high, kind, low_text, high_text in checks:
                        if pair_high is not None and number > pair_high:
                            shown = _shown(number, f, pair_high)
                            return severity, f"{name} {shown} above high {kind} {high_text}", name
                        if pair_low is not None and number < pair_low:
                            shown = _shown(number, f, pair_low)
                            return severity, f"{name} {shown} below low {kind} {low_text}", name
                    return _QUIET
        alarm = self(values)
        return alarm.severity, alarm.message, alarm.field


# (severity, low, high, "alarm"/"warning", low's text, high's text): one of _scalar_alarm's
# checks, in its order (MAJOR first).
_Check = tuple[Severity, float | None, float | None, str, str, str]
_QUIET = (Severity.NONE, "", "")


def _checks(f: Field) -> tuple[_Check, ...]:
    checks: list[_Check] = []
    for severity, pair, kind in (
        (Severity.MAJOR, f.alarm, "alarm"),
        (Severity.MINOR, f.warning, "warning"),
    ):
        if pair is not None:
            low, high = pair
            low_text = "" if low is None else _bound(low)
            high_text = "" if high is None else _bound(high)
            checks.append((severity, low, high, kind, low_text, high_text))
    return tuple(checks)


_PLAIN_NUMBERS = frozenset({float, int})


def _quiet_range(f: Field) -> tuple[float, float]:
    """The closed range in which a value of ``f`` is in no alarm."""
    low, high = -math.inf, math.inf
    for pair in (f.warning, f.alarm):
        if pair is not None:
            if pair[0] is not None:
                low = max(low, pair[0])
            if pair[1] is not None:
                high = min(high, pair[1])
    return low, high


def _scalar_alarm(name: str, value: float, f: Field, label: str = "") -> Alarm:
    label = label or name
    if math.isnan(value):
        return Alarm(Severity.INVALID, f"{label} is not a number", name)
    for severity, pair, kind in (
        (Severity.MAJOR, f.alarm, "alarm"),
        (Severity.MINOR, f.warning, "warning"),
    ):
        if pair is None:
            continue
        low, high = pair
        if high is not None and value > high:
            return Alarm(
                severity, f"{label} {_shown(value, f, high)} above high {kind} {_bound(high)}", name
            )
        if low is not None and value < low:
            return Alarm(
                severity, f"{label} {_shown(value, f, low)} below low {kind} {_bound(low)}", name
            )
    return NO_ALARM


def _array_alarm(name: str, array: np.ndarray[Any, Any], f: Field) -> Alarm:
    values = array.astype(np.float64, copy=False)
    if values.dtype.kind == "f" and np.isnan(values).any():
        index = np.unravel_index(int(np.argmax(np.isnan(values))), values.shape)
        return _scalar_alarm(name, math.nan, f, _element(name, index))
    # The element furthest outside wins: the maximum against high limits, the minimum
    # against low ones; only those two elements need the scalar rule.
    top, bottom = int(np.argmax(values)), int(np.argmin(values))
    found = NO_ALARM
    for flat in (top, bottom):
        index = np.unravel_index(flat, values.shape)
        candidate = _scalar_alarm(name, float(values.flat[flat]), f, _element(name, index))
        if candidate.severity > found.severity:
            found = candidate
    return found


def _element(name: str, index: tuple[Any, ...]) -> str:
    return f"{name}[{', '.join(str(int(i)) for i in index)}]"


def limit_problems(fields: Mapping[str, Field], values: Mapping[str, Any]) -> list[str]:
    """One message per field of ``values`` outside its control ``limits``, naming the field,
    the value and the limit: ``"current 12.5 A above the high limit 10 (limits -10 to 10)"``.
    An array is refused at its first element outside; NaN is outside every limit."""
    problems: list[str] = []
    for name, f in fields.items():
        if f.limits is None:
            continue
        value = values.get(name)
        if value is None:
            continue
        number = _numeric(value)
        if number is None:
            continue
        problem = (
            _scalar_limit(name, number, f)
            if isinstance(number, float)
            else _array_limit(name, number, f)
        )
        if problem:
            problems.append(problem)
    return problems


def _scalar_limit(name: str, value: float, f: Field) -> str:
    assert f.limits is not None
    low, high = f.limits
    span = f"(limits {_bound(low)} to {_bound(high)})"
    if math.isnan(value):
        return f"{name} is not a number {span}"
    if value > high:
        return f"{name} {_given(value, f)} above the high limit {_bound(high)} {span}"
    if value < low:
        return f"{name} {_given(value, f)} below the low limit {_bound(low)} {span}"
    return ""


def _array_limit(name: str, array: np.ndarray[Any, Any], f: Field) -> str:
    assert f.limits is not None
    low, high = f.limits
    values = array.astype(np.float64, copy=False)
    outside = ~((values >= low) & (values <= high))  # NaN compares False: outside
    if not outside.any():
        return ""
    flat = int(np.argmax(outside))
    index = np.unravel_index(flat, values.shape)
    return _scalar_limit(_element(name, index), float(values.flat[flat]), f)
