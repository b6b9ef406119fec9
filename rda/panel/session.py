"""One browser tab: its WebSocket, its views, its frames.

The browser sends JSON requests (``open``/``close`` a view, ``set`` a property); the session
answers on the same socket with ``hello``, ``tree`` (servers, devices, properties, states),
``frames`` (the views that changed since the last frame) and ``set_result``. One sender task
per tab sends at most ``MAX_FPS`` messages of frames per second: what arrives in between is
folded by the views' slots (``rda.panel.views``), so a tab gets only what it displays.

A tab may open at most ``MAX_VIEWS`` views; a bad request is answered with an ``error``
message naming it and the session carries on (nothing a browser sends grows the panel
without bound).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from rda.business.client.subscriptions import Notification
from rda.panel.render import data_json
from rda.panel.source import PanelSource, SetRefused
from rda.panel.views import MAX_FPS, Frame, ViewSlot, describe_error

__all__ = ["MAX_VIEWS", "PanelState", "RenderCache", "Session"]

log = logging.getLogger("rda.panel")

MAX_VIEWS = 256
_COLUMNS = (16, 4000)


class RenderCache:
    """Rendered values by notification: 20 views of one property render it once per frame."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        # Keyed by id(); the notification is kept in the value so its id is not reused.
        self._cache: OrderedDict[tuple[int, int], tuple[Notification, Any]] = OrderedDict()

    def fields(self, n: Notification, columns: int) -> Any:
        key = (id(n), columns)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is n:
            return hit[1]
        rendered = data_json(n.data, columns)
        self._cache[key] = (n, rendered)
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return rendered


@dataclass
class PanelState:
    """What every session of one panel shares (``app.state.panel``)."""

    source: PanelSource
    allow_set: bool
    history: str  # "store", "service" or "" (none)
    heartbeat_timeout: float
    renders: RenderCache
    tree: list[dict[str, Any]]
    tree_version: int = 0
    kiosk: bool = False  # read-only wall display: no sets, no editing controls
    layout: dict[str, Any] | None = None  # rda panel --layout FILE, validated (rda.panel.layout)
    # The alarm summary (rda.panel.alarms): {"alarms": rows, "severities", "unwatched"}.
    alarms: dict[str, Any] = field(
        default_factory=lambda: {"alarms": [], "severities": {}, "unwatched": 0}
    )
    alarms_version: int = 0
    tabs_closed: int = 0  # tabs whose socket ended, however they left
    hosts_refused: int = 0  # requests for a Host that is not the panel's (rda.panel.hosts)


@dataclass
class _View:
    device: str
    prop: str
    selector: str
    columns: int
    slot: ViewSlot
    # Off the tab's screen: its slot keeps folding updates, nothing is sent until it shows.
    hidden: bool = False


class Session:
    """Serves one WebSocket until the browser goes away."""

    def __init__(self, websocket: WebSocket, state: PanelState) -> None:
        self.ws = websocket
        self.state = state
        self.views: dict[str, _View] = {}
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._tree_sent = -1
        self._alarms_sent = -1
        self._sets: set[asyncio.Task[None]] = set()
        client = websocket.client
        self.browser = f"{client.host}:{client.port}" if client else "unknown"

    def wake(self) -> None:
        """Thread-safe: a listener thread's way of saying a slot has a frame."""
        self._loop.call_soon_threadsafe(self._wake.set)

    def tree_changed(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Serve the tab until it leaves. Leaving is normal, whenever it happens: a write to a
        departed browser fails with ``WebSocketDisconnect``, and Starlette then refuses the
        next read with ``WebSocketDisconnected``; both end the session quietly (counted in
        ``PanelState.tabs_closed``, one DEBUG line)."""
        sender: asyncio.Task[None] | None = None
        try:
            await self.ws.accept()
            await self.ws.send_json(
                {
                    "type": "hello",
                    "allow_set": self.state.allow_set,
                    "history": self.state.history,
                    "heartbeat_timeout": self.state.heartbeat_timeout,
                    "max_fps": MAX_FPS,
                    "kiosk": self.state.kiosk,
                    "layout": self.state.layout,
                }
            )
            self._wake.set()  # the tree goes first
            sender = asyncio.create_task(self._send_loop(), name="rda-panel-sender")
            while True:
                text = await self.ws.receive_text()
                await self._handle(text)
        except (WebSocketDisconnect, WebSocketDisconnected):
            pass
        finally:
            self.state.tabs_closed += 1
            log.debug("panel tab %s: gone (%d views)", self.browser, len(self.views))
            if sender is not None:
                sender.cancel()
            for task in list(self._sets):
                task.cancel()
            for view in list(self.views.values()):
                await asyncio.to_thread(self._detach, view)
            self.views.clear()

    def _detach(self, view: _View) -> None:
        self.state.source.detach(view.device, view.prop, view.selector, view.slot)

    async def _handle(self, text: str) -> None:
        try:
            request = json.loads(text)
            op = request["op"]
            if op == "open":
                await self._open(request)
            elif op == "close":
                view = self.views.pop(str(request["view"]), None)
                if view is not None:
                    await asyncio.to_thread(self._detach, view)
            elif op == "show":  # the browser scrolled a view off or onto its screen
                view = self.views.get(str(request["view"]))
                if view is not None:
                    view.hidden = not bool(request["visible"])
                    self._wake.set()
            elif op == "set":
                self._beside(self._set(request))
            else:
                raise ValueError(f"unknown op {op!r}")
        except (ValueError, KeyError, TypeError) as exc:
            await self.ws.send_json({"type": "error", "error": f"bad request: {exc}"})

    async def _open(self, request: dict[str, Any]) -> None:
        view_id = str(request["view"])
        if view_id in self.views:
            raise ValueError(f"view {view_id!r} is already open")
        if len(self.views) >= MAX_VIEWS:
            raise ValueError(f"at most {MAX_VIEWS} views per tab")
        columns = min(max(int(request.get("columns", 1000)), _COLUMNS[0]), _COLUMNS[1])
        slot = ViewSlot(view_id, self.wake, series=bool(request.get("series", False)))
        view = _View(
            str(request["device"]),
            str(request["property"]),
            str(request.get("selector") or ""),
            columns,
            slot,
        )
        self.views[view_id] = view
        await asyncio.to_thread(
            self.state.source.attach, view.device, view.prop, view.selector, slot
        )
        if not slot.series:  # units, precision and limits for the view's value and set form
            self._beside(self._describe(view_id, view.device, view.prop))

    def _beside(self, reply: Coroutine[Any, Any, None]) -> None:
        """Run ``reply`` (a set's result, a view's description) beside the request loop."""
        task = asyncio.create_task(reply)
        self._sets.add(task)  # kept until done (the loop holds tasks weakly)
        task.add_done_callback(self._reply_done)

    def _reply_done(self, task: asyncio.Task[None]) -> None:
        self._sets.discard(task)
        # Retrieved here, or asyncio logs "Task exception was never retrieved" with two
        # tracebacks: a tab that left while its reply was computed is no error (its session
        # ends in run()); anything else is a bug, logged once with its traceback.
        error = None if task.cancelled() else task.exception()
        if error is not None and not isinstance(error, WebSocketDisconnect | WebSocketDisconnected):
            log.error("panel tab %s: a reply failed", self.browser, exc_info=error)

    async def _describe(self, view_id: str, device: str, prop: str) -> None:
        description = await asyncio.to_thread(self.state.source.describe, device, prop)
        await self.ws.send_json({"type": "describe", "view": view_id, "description": description})

    async def _set(self, request: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"type": "set_result", "id": request.get("id")}
        if not self.state.allow_set:
            reply.update(ok=False, error="sets are disabled (start the panel with --allow-set)")
        else:
            try:
                await asyncio.to_thread(
                    self.state.source.set,
                    str(request["device"]),
                    str(request["property"]),
                    str(request.get("selector") or ""),
                    dict(request["values"]),
                    self.browser,
                )
                reply["ok"] = True
            except SetRefused as exc:
                reply.update(ok=False, error=str(exc), field=exc.field)
            except (KeyError, TypeError, ValueError) as exc:
                reply.update(ok=False, error=f"bad request: {exc}")
        await self.ws.send_json(reply)

    def _frame_json(self, frame: Frame) -> dict[str, Any]:
        out = frame.header()
        view = self.views.get(frame.view)
        n = frame.notification
        if frame.points:
            out["points"] = frame.points
        if view is not None and not view.slot.series and n is not None and n.error is None:
            try:
                out["fields"] = self.state.renders.fields(n, view.columns)
            except Exception as exc:  # a value the panel cannot decode is shown as an error
                out.update(status="error", error=describe_error(exc))
        return out

    async def _send_loop(self) -> None:
        period = 1.0 / MAX_FPS
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._tree_sent != self.state.tree_version:
                    self._tree_sent = self.state.tree_version
                    await self.ws.send_json({"type": "tree", "servers": self.state.tree})
                if self._alarms_sent != self.state.alarms_version:
                    self._alarms_sent = self.state.alarms_version
                    await self.ws.send_json({"type": "alarms", **self.state.alarms})
                frames = []
                for view in list(self.views.values()):
                    if view.hidden:
                        continue
                    frame = view.slot.take()
                    if frame is not None:
                        frames.append(self._frame_json(frame))
                if frames:
                    await self.ws.send_text(
                        json.dumps({"type": "frames", "frames": frames}, separators=(",", ":"))
                    )
                # Updates arriving during this pause fold into the next frame.
                await asyncio.sleep(period)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            log.debug("panel tab %s: sender stopped: %s", self.browser, exc)
