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

from rda.business.client.subscriptions import Notification
from rda.serialization.errors import DisconnectedError, RdaError, RemoteError, TimeoutError

__all__ = [
    "DEVICE",
    "DRIVER",
    "INVALID",
    "NO_ALARM",
    "AlarmState",
    "Description",
    "describe",
    "error_alarm",
    "error_text",
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

# The property's description as the gateway keeps it (None: not known).
Description = Any


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
    return NO_ALARM


def describe(client: Any, device: str, prop: str) -> Description:
    """The property's description, or None when the server gives none."""
    return None


def field_metadata(description: Description, path: tuple[str, ...], code: str) -> dict[str, Any]:
    """The ``display``, ``control`` and ``valueAlarm`` initialisers of a field PV whose value
    has element code ``code`` (numeric codes get limits; strings and booleans only units and
    description)."""
    numeric = code in "bhilfd"
    units = ""
    description = ""
    if not numeric:
        return {"display": {"description": description, "units": units}}
    nan = math.nan if code in "fd" else 0
    return {
        "display": {
            "limitLow": nan,
            "limitHigh": nan,
            "description": description,
            "units": units,
            "precision": 0,
            "form": {"index": 0, "choices": FORM_CHOICES},
        },
        "control": {"limitLow": nan, "limitHigh": nan, "minStep": 0},
        "valueAlarm": {
            "active": False,
            "lowAlarmLimit": nan,
            "lowWarningLimit": nan,
            "highWarningLimit": nan,
            "highAlarmLimit": nan,
            "lowAlarmSeverity": 0,
            "lowWarningSeverity": 0,
            "highWarningSeverity": 0,
            "highAlarmSeverity": 0,
            "hysteresis": 0.0,
        },
    }


# QSRV2's choices for display.form, in its order (index 0, "Default", is what is sent).
FORM_CHOICES = ["Default", "String", "Binary", "Decimal", "Hex", "Exponential", "Engineering"]
