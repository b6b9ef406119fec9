"""The alarm summary: every property in alarm, in error or disconnected, across all servers.

:class:`AlarmWatch` follows every property the tree lists (recorders excepted), at most
``MAX_WATCHED``, through the panel's shared subscriptions (one per property, shared with the
views that show it). Its listener only keeps each property's latest notification (the rda
listener threads must not work); :meth:`AlarmWatch.evaluate`, called a few times a second,
reads their alarms and errors and says whether the summary changed. Each entry keeps the time
its state began, so the summary is sorted newest first.

A property's state: ``alarm`` (the server's alarm, MINOR or MAJOR, or INVALID), ``error`` (an
error notification, or the subscription refused) or ``disconnected`` (its server is lost).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from rda.business.client.subscriptions import Notification
from rda.panel.source import PanelSource
from rda.panel.views import describe_error
from rda.serialization.errors import DisconnectedError

__all__ = ["MAX_WATCHED", "AlarmWatch", "Watched"]

MAX_WATCHED = 500


@dataclass(frozen=True, slots=True)
class _State:
    state: str  # "ok", "alarm", "error" or "disconnected"
    severity: str  # "NONE", "MINOR", "MAJOR" or "INVALID"
    message: str
    field: str


_OK = _State("ok", "NONE", "", "")


def _state_of(n: Notification) -> _State:
    error = n.error
    if error is not None:
        kind = "disconnected" if isinstance(error, DisconnectedError) else "error"
        return _State(kind, "INVALID", describe_error(error), "")
    alarm = n.alarm
    if not alarm:
        return _OK
    return _State("alarm", alarm.severity.name, alarm.message, alarm.field)


class Watched:
    """One watched property: the latest notification (set by listener threads), and the state
    the last evaluation found (read by the event loop)."""

    def __init__(self, server: str, device: str, prop: str) -> None:
        self.server = server
        self.device = device
        self.prop = prop
        self._latest: Notification | None = None
        self._failed: _State | None = None
        self.state = _OK
        self.since = 0.0

    def offer(self, n: Notification) -> None:
        self._latest = n  # one reference store: the listener thread does nothing else

    def fail(self, error: BaseException) -> None:
        self._failed = _State("error", "INVALID", describe_error(error), "")

    def evaluate(self, now: float) -> bool:
        """Read the latest notification; True when the state changed."""
        latest = self._latest
        state = self._failed or (_OK if latest is None else _state_of(latest))
        if state == self.state:
            return False
        self.state, self.since = state, now
        return True

    def row(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "device": self.device,
            "property": self.prop,
            "state": self.state.state,
            "severity": self.state.severity,
            "message": self.state.message,
            "field": self.state.field,
            "since": self.since,
        }


class AlarmWatch:
    """Follows the tree's properties and keeps the alarm summary."""

    def __init__(self, source: PanelSource, limit: int = MAX_WATCHED) -> None:
        self._source = source
        self._limit = limit
        self._lock = threading.Lock()
        self._watched: dict[tuple[str, str], Watched] = {}
        self.unwatched = 0  # properties beyond the limit: said on the page

    def follow(self, tree: list[dict[str, Any]]) -> None:
        """Watch every property ``tree`` lists (up to the limit), stop watching those it no
        longer lists. Blocking (subscribes): run on a worker thread."""
        wanted: dict[tuple[str, str], str] = {}
        for server in tree:
            for device in server["devices"]:
                if device.get("kind") == "recorder":
                    continue
                for prop in device["properties"]:
                    wanted.setdefault((device["name"], prop["name"]), server["name"])
        keys = sorted(wanted)
        self.unwatched = max(0, len(keys) - self._limit)
        keep = set(keys[: self._limit])
        with self._lock:
            gone = [w for k, w in self._watched.items() if k not in keep]
            new = [k for k in keep if k not in self._watched]
        for watched in gone:
            self._source.detach(watched.device, watched.prop, "", watched)
            with self._lock:
                self._watched.pop((watched.device, watched.prop), None)
        for device, prop in new:
            watched = Watched(wanted[(device, prop)], device, prop)
            with self._lock:
                self._watched[(device, prop)] = watched
            self._source.attach(device, prop, "", watched)

    def evaluate(self, now: float | None = None) -> bool:
        """Read every watched property's latest state; True when the summary changed."""
        now = time.time() if now is None else now
        with self._lock:
            watched = list(self._watched.values())
        changed = False
        for w in watched:
            changed |= w.evaluate(now)
        return changed

    def summary(self) -> list[dict[str, Any]]:
        """Every property not ``ok``, newest state first."""
        with self._lock:
            rows = [w.row() for w in self._watched.values() if w.state.state != "ok"]
        rows.sort(key=lambda r: r["since"], reverse=True)
        return rows

    def severities(self) -> dict[str, str]:
        """``DEVICE/PROPERTY`` -> severity, for the tree's colours (those not in alarm left out)."""
        with self._lock:
            return {
                f"{w.device}/{w.prop}": w.state.severity
                for w in self._watched.values()
                if w.state.state != "ok"
            }

    def close(self) -> None:
        with self._lock:
            watched, self._watched = list(self._watched.values()), {}
        for w in watched:
            self._source.detach(w.device, w.prop, "", w)
