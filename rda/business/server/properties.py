"""The declared metadata of a server's properties, and what the server does with it.

A :class:`PropertyTable` is built once per server from what its code declared: the fields of
each ``Device`` property (``@rda.prop(..., fields=...)`` and the schema's annotations) and the
``ServerBuilder.describe`` calls of callback servers. It answers ``describe`` (the reserved get,
docs/protocol.md, "Describe"), refuses a callback server's sets outside the control limits
(a ``Device`` property's own ``validate`` does that for it), computes the alarm of each value
the server sends and keeps the last alarm state of each declared property for the metrics.

Bounded: its keys are the declared properties, fixed at build time; nothing a client sends
adds one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping

from rda.business.metadata import (
    Alarm,
    AlarmRule,
    Field,
    PropertyDescription,
    Severity,
    limit_problems,
)
from rda.business.server.devices import Device, PropertyValidationError
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError
from rda.serialization.message import encode_alarm

__all__ = ["AlarmEncoder", "PropertyTable", "description_data"]

Key = tuple[str, str]


def description_data(description: PropertyDescription) -> Data:
    """The DATA body of a describe reply: ``rda_description``, the description as JSON."""
    return Data(rda_description=json.dumps(description.to_dict(), separators=(",", ":")))


class AlarmEncoder:
    """The alarm rule of one property, bound to its table: values in, the REPLY_CONTEXT body
    out (None when not in alarm: nothing is sent); a change of severity is recorded in the
    table. Called for every value the property sends (once per notification, whatever the
    number of subscribers): the rule's quick check and one identity test when nothing
    changed. Alarms repeat (a value drifting above a limit reads the same at the field's
    precision), so each body is encoded once and kept, at most ``MAX_BODIES`` of them."""

    MAX_BODIES = 256

    __slots__ = ("_bodies", "_key", "_last", "_rule", "_table")

    def __init__(self, table: PropertyTable, key: Key, fields: Mapping[str, Field]) -> None:
        self._table = table
        self._key = key
        self._rule = AlarmRule(fields)
        self._last = Severity.NONE
        # (severity, message, field) -> its encoded body; bounded: cleared when full (values
        # that never repeat, at full precision, then cost an encoding each, as without it).
        self._bodies: dict[tuple[Severity, str, str], bytes] = {}

    def alarm(self, data: Data) -> Alarm:
        """The alarm of ``data``, recorded as the property's state."""
        alarm = self._rule(data)
        severity = alarm.severity
        if severity is not self._last:
            self._last = severity
            self._table.record(self._key, severity)
        return alarm

    def __call__(self, data: Data) -> bytes | None:
        state = self._rule.state(data)
        severity = state[0]
        if severity is not self._last:
            self._last = severity
            self._table.record(self._key, severity)
        if severity is _NONE:
            return None
        bodies = self._bodies
        body = bodies.get(state)
        if body is None:
            if len(bodies) >= self.MAX_BODIES:
                bodies.clear()
            body = bodies[state] = encode_alarm(int(severity), state[1], state[2])
        return body

    def error(self) -> None:
        """An error notification: the property's value is INVALID until the next value."""
        self._last = Severity.INVALID
        self._table.record(self._key, Severity.INVALID)


_NONE = Severity.NONE


class PropertyTable:
    """See the module docstring. ``raw_devices``: whether callbacks serve devices other than
    the ``Device`` objects (then describing an unknown device is not an error)."""

    def __init__(
        self,
        devices: Mapping[str, Device],
        declared: Mapping[Key, PropertyDescription],
        raw_devices: bool,
    ) -> None:
        self._devices = dict(devices)
        self._raw_devices = raw_devices
        self._declared = dict(declared)
        self._encoders: dict[Key, AlarmEncoder] = {}
        self._limited: dict[Key, Mapping[str, Field]] = {}
        self._lock = threading.Lock()
        self._state: dict[Key, Severity] = {}
        for key, description in self._declared.items():
            if any(f.limits is not None for f in description.fields.values()):
                self._limited[key] = description.fields
        for name, device in self._devices.items():
            for prop in device.properties().values():
                key = (name, prop.name)
                self._declared[key] = prop.describe(name)
        for key, description in self._declared.items():
            alarming = {n: f for n, f in description.fields.items() if f.has_alarm_limits}
            if alarming:
                self._encoders[key] = AlarmEncoder(self, key, alarming)
                self._state[key] = Severity.NONE

    def __bool__(self) -> bool:
        """False when nothing is declared: the server then skips every metadata step."""
        return bool(self._encoders or self._limited)

    def describe(self, device: str, prop: str) -> PropertyDescription:
        """The description of ``device/prop``; a property of a callback device that declared
        nothing is described with no fields, as settable (the server hands its sets on)."""
        found = self._declared.get((device, prop))
        if found is not None:
            return found
        obj = self._devices.get(device)
        if obj is not None:
            known = ", ".join(sorted(obj.properties())) or "none"
            raise NoSuchDeviceError(f"{device}/{prop}: no such property (known: {known})")
        if not self._raw_devices:
            raise NoSuchDeviceError(f"{device}: no such device")
        return PropertyDescription(device, prop, {}, "", settable=True)

    def encoder(self, device: str, prop: str) -> AlarmEncoder | None:
        """The alarm rule of ``device/prop``; None when it declares no alarm limits."""
        return self._encoders.get((device, prop))

    def check_set(self, device: str, prop: str, data: Data) -> None:
        """Refuse a callback server's set outside the declared control limits (a ``Device``
        property checks its own in ``DeviceProperty.validate``)."""
        fields = self._limited.get((device, prop))
        if fields is None:
            return
        problems = limit_problems(fields, data)
        if problems:
            raise PropertyValidationError(f"{device}/{prop}: {'; '.join(problems)}")

    def record(self, key: Key, severity: Severity) -> None:
        """``key``'s alarm severity is now ``severity`` (its encoder calls this on a change)."""
        with self._lock:
            self._state[key] = severity

    def alarm_counts(self) -> dict[Severity, int]:
        """How many declared properties are in each severity now (MINOR..INVALID; NONE
        included), from the last value each sent."""
        counts = dict.fromkeys(Severity, 0)
        with self._lock:
            for severity in self._state.values():
                counts[severity] += 1
        return counts

    def alarm_states(self) -> dict[Key, Severity]:
        """The last severity of each property with alarm limits."""
        with self._lock:
            return dict(self._state)

    def descriptions(self) -> list[PropertyDescription]:
        """Every declared description, by device then property."""
        return [self._declared[key] for key in sorted(self._declared)]
