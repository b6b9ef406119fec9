"""What the gateway tells EPICS about a value besides the value: ``alarm``, ``display``,
``control`` and ``valueAlarm``. The one place where rda's metadata meets the normative types.

- ``alarm``: an error notification (the server's handler failed, the subscription was
  refused) is INVALID with the error's text, status DEVICE; a lost connection to the rda
  server is INVALID, status DRIVER, with the reason; otherwise the alarm the rda server
  computed for the value (severity NONE, MINOR, MAJOR, INVALID: EPICS numbering).
- ``display``/``control``/``valueAlarm``: from the property's description (units, precision,
  control limits, warning and alarm limits of the field); a limit not declared is NaN, units
  and description empty, as an IOC sends for a record without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification
from rda.business.metadata import Alarm, Field, PropertyDescription, compute_alarm
from rda.serialization.errors import DisconnectedError, RdaError, RemoteError, TimeoutError

__all__ = [
    "DESCRIBE_TIMEOUT",
    "DEVICE",
    "DRIVER",
    "INVALID",
    "NO_ALARM",
    "AlarmState",
    "Description",
    "alarm_state",
    "describe",
    "error_alarm",
    "error_text",
    "field_alarm",
    "field_metadata",
    "notification_alarm",
]

# EPICS alarm severities and the alarm_t status codes used here (pvAccess numbering).
MINOR, MAJOR, INVALID = 1, 2, 3
DEVICE, DRIVER = 1, 2


@dataclass(frozen=True, slots=True)
class AlarmState:
    """The ``alarm_t`` of a PV."""

    severity: int = 0
    status: int = 0
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "status": self.status, "message": self.message}


NO_ALARM = AlarmState()

# The property's description as the gateway keeps it (None: the server gave none).
Description = PropertyDescription | None


def alarm_state(alarm: Alarm) -> AlarmState:
    """An rda alarm as ``alarm_t``: a limit alarm has status DEVICE, as QSRV2 reports a
    record's HIHI or LOW."""
    severity = int(alarm.severity)
    return AlarmState(severity, DEVICE if severity else 0, alarm.message)


def field_alarm(description: Description, path: tuple[str, ...], value: Any) -> AlarmState:
    """The alarm of one field's value under its declared limits (the rule the rda server
    applies to the whole value, ``compute_alarm``, applied to this field alone): a field PV
    shows its own alarm, not the property's worst field's."""
    declared = _declared(description, path)
    if declared is None:
        return NO_ALARM
    return alarm_state(compute_alarm({path[-1]: declared}, {path[-1]: value}))


def _declared(description: Description, path: tuple[str, ...]) -> Field | None:
    if description is None or not path:
        return None
    return description.fields.get(".".join(path))


def error_alarm(error: RdaError) -> AlarmState:
    """INVALID with the error's text; DRIVER for a lost server, DEVICE for the server's own
    errors."""
    lost = isinstance(error, DisconnectedError | TimeoutError)
    return AlarmState(INVALID, DRIVER if lost else DEVICE, error_text(error))


def error_text(error: BaseException) -> str:
    """``Type: message``; a server's error already names its own type."""
    if isinstance(error, RemoteError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def notification_alarm(notification: Notification) -> AlarmState:
    """The alarm of one rda notification."""
    error = notification.error
    if error is not None:
        return error_alarm(error)
    return alarm_state(notification.alarm)


# Seconds the first value of a feed waits for the property's description.
DESCRIBE_TIMEOUT = 2.0


def describe(client: ClientService, device: str, prop: str) -> Description:
    """The property's description (``AccessPoint.describe``); an ``RdaError`` when the
    server cannot give one (a server older than property metadata answers with a
    ``RemoteProtocolError``)."""
    return client.access_point(device, prop).describe(timeout=DESCRIBE_TIMEOUT)


def field_metadata(description: Description, path: tuple[str, ...], code: str) -> dict[str, Any]:
    """The ``display``, ``control`` and ``valueAlarm`` initialisers of the field PV of
    ``path`` whose value has element code ``code``: numeric codes get limits (NaN, or 0 for
    integers, when not declared), strings and booleans only units and description."""
    declared = _declared(description, path) or Field()
    if code not in "bhilfd":
        return {"display": {"description": declared.description, "units": declared.units}}
    unset = math.nan if code in "fd" else 0

    def limit(value: float | None) -> Any:
        if value is None:
            return unset
        return value if code in "fd" else int(value)

    low, high = declared.limits or (None, None)
    warn_low, warn_high = declared.warning or (None, None)
    alarm_low, alarm_high = declared.alarm or (None, None)
    return {
        "display": {
            "limitLow": limit(low),
            "limitHigh": limit(high),
            "description": declared.description,
            "units": declared.units,
            "precision": declared.precision or 0,
            "form": {"index": 0, "choices": FORM_CHOICES},
        },
        "control": {"limitLow": limit(low), "limitHigh": limit(high), "minStep": 0},
        "valueAlarm": {
            # The rda server computes the alarms from these limits, not the pvAccess server.
            "active": False,
            "lowAlarmLimit": limit(alarm_low),
            "lowWarningLimit": limit(warn_low),
            "highWarningLimit": limit(warn_high),
            "highAlarmLimit": limit(alarm_high),
            "lowAlarmSeverity": MAJOR if alarm_low is not None else 0,
            "lowWarningSeverity": MINOR if warn_low is not None else 0,
            "highWarningSeverity": MINOR if warn_high is not None else 0,
            "highAlarmSeverity": MAJOR if alarm_high is not None else 0,
            "hysteresis": 0.0,
        },
    }


# QSRV2's choices for display.form, in its order (index 0, "Default", is what is sent).
FORM_CHOICES = ["Default", "String", "Binary", "Decimal", "Hex", "Exponential", "Engineering"]
