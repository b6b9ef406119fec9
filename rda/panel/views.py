"""Coalescing between rda listener threads and a browser tab.

A property updating at 10 kHz must not flood a browser. Each open view of a tab has a
:class:`ViewSlot`: the rda listener (a client scheduler thread) *offers* every notification
to it, which only keeps the latest one, counts what arrives, and, for strip-chart views, keeps
the numeric fields' points; the tab's sender *takes* at most ``MAX_FPS`` frames per second
from it. A frame says how many updates it folds (``folded``), the gaps the rda client counted
(``gap``), the update rate, and the update type of the newest value.

The listener wakes the tab only when a slot turns from clean to dirty, so the event loop sees
at most one wake-up per frame per view, whatever the update rate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.business.client.subscriptions import Notification
from rda.panel.render import context_json, numeric_fields
from rda.serialization.errors import DisconnectedError
from rda.serialization.header import UpdateType

__all__ = ["MAX_FPS", "MAX_POINTS", "Frame", "ViewSlot", "Viewer", "alarm_json", "describe_error"]

MAX_FPS = 30.0
# Strip-chart points kept per field between two frames: beyond that every other point is
# dropped (the chart has no more pixels than this per frame anyway).
MAX_POINTS = 256


class Viewer(Protocol):
    """What a shared subscription feeds (a view's slot, the alarm watch's entry): called on a
    listener thread, it must only store and count."""

    def offer(self, n: Notification) -> None: ...

    def fail(self, error: BaseException) -> None: ...


def alarm_json(n: Notification | None) -> dict[str, Any] | None:
    """The alarm a value carries (``{"severity": "MAJOR", "message", "field"}``), None when in
    no alarm. An error or a disconnection is the view's status, not repeated here."""
    if n is None or n.error is not None:
        return None
    alarm = n.alarm
    return alarm.to_dict() if alarm else None


def describe_error(error: BaseException) -> str:
    """``DisconnectedError: PS1/Acquisition: ...``: the type first, as the operator sees it."""
    return f"{type(error).__name__}: {error}"


@dataclass(slots=True)
class Frame:
    """What one view sends to the browser in one frame (JSON made by the session)."""

    view: str
    notification: Notification | None
    folded: int
    gap: int
    received: int
    rate: float
    status: str
    error: str | None
    update_type: str | None
    first: bool = False
    disconnected: bool = False
    points: dict[str, list[list[float]]] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        n = self.notification
        return {
            "view": self.view,
            "folded": self.folded,
            "gap": self.gap,
            "received": self.received,
            "rate": round(self.rate, 2),
            "status": self.status,
            "error": self.error,
            "update_type": self.update_type,
            "first": self.first,
            "disconnected": self.disconnected,
            "context": None if n is None or n.error is not None else context_json(n.context),
            "alarm": alarm_json(n),
        }


class ViewSlot:
    """The latest state of one view, written by listener threads, read by the tab's sender."""

    def __init__(
        self,
        view: str,
        wake: Callable[[], None],
        *,
        series: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = view
        self.series = series
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: Notification | None = None
        self._dirty = False
        self._folded = 0
        self._gap = 0
        self._received = 0
        self._status = "waiting"
        self._error: str | None = None
        self._disconnected = False
        self._update_type: str | None = None
        self._first = False
        self._points: dict[str, list[list[float]]] = {}
        self._rate = 0.0
        self._rate_mark = (clock(), 0)

    def offer(self, n: Notification) -> None:
        """Called on a listener thread for every notification of the view's subscription."""
        error: BaseException | None = n.error
        points = None
        if error is None and self.series:
            try:
                values = numeric_fields(n.data)
            except Exception as exc:  # a value that cannot be decoded is shown, not charted
                error = exc
            else:
                stamp = (n.context.acq_stamp or time.time_ns()) / 1e9
                points = {name: [stamp, value] for name, value in values.items()}
        with self._lock:
            self._received += 1
            self._folded += 1
            self._gap += n.gap
            self._latest = n
            self._update_type = n.update_type.name
            # A FIRST folded under later updates still tells the tab the stream (re)started.
            self._first = self._first or n.update_type is UpdateType.FIRST
            if error is not None:
                self._status, self._error = "error", describe_error(error)
            else:
                self._status, self._error = "ok", None
            # The browser disables the view's set form while its server is unreachable.
            self._disconnected = isinstance(error, DisconnectedError)
            if points:
                for name, point in points.items():
                    kept = self._points.setdefault(name, [])
                    kept.append(point)
                    if len(kept) > MAX_POINTS:
                        del kept[::2]
            wake, self._dirty = not self._dirty, True
        if wake:
            self._wake()

    def fail(self, error: BaseException) -> None:
        """The subscription could not be made (e.g. unknown device): shown like an update."""
        with self._lock:
            self._status, self._error = "error", describe_error(error)
            self._disconnected = isinstance(error, DisconnectedError)
            self._latest = None
            wake, self._dirty = not self._dirty, True
        if wake:
            self._wake()

    def take(self) -> Frame | None:
        """The frame to send now, or None when nothing changed since the last one."""
        with self._lock:
            if not self._dirty:
                return None
            now = self._clock()
            mark_time, mark_count = self._rate_mark
            if now - mark_time >= 1.0:
                self._rate = (self._received - mark_count) / (now - mark_time)
                self._rate_mark = (now, self._received)
            frame = Frame(
                view=self.view,
                notification=self._latest,
                folded=self._folded,
                gap=self._gap,
                received=self._received,
                rate=self._rate,
                status=self._status,
                error=self._error,
                update_type=self._update_type,
                first=self._first,
                disconnected=self._disconnected,
                points=self._points,
            )
            self._dirty = False
            self._folded = 0
            self._first = False
            self._points = {}
            return frame
