"""The panel's Starlette application and its uvicorn runner.

Routes: ``/`` (the page), ``/static/...`` (plain ES modules, CSS, the vendored uPlot),
``/api/tree`` (what the panel knows, as JSON), ``/api/history`` (a field's recorded past, with
``--history``) and the WebSocket ``/ws`` (one per tab, ``rda.panel.session``). A background
task refreshes the tree every ``REFRESH`` seconds and wakes the tabs when it changed; another
reads the client's connection states every ``STATE_POLL`` seconds (no I/O), so a server's badge
agrees with its views within a second of a lost or regained connection.

Every response carries a Content-Security-Policy that allows nothing but this origin: the page
loads nothing from outside, and a WebSocket from a page of another origin is refused. Only
requests for one of the panel's own names are answered (``rda.panel.hosts``: DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from rda.panel.alarms import AlarmWatch
from rda.panel.history import Past, parse_minutes
from rda.panel.hosts import HostCheck, panel_names
from rda.panel.layout import MAX_LAYOUT_BYTES, Layout, LayoutError, parse_layout
from rda.panel.session import PanelState, RenderCache, Session
from rda.panel.source import PanelSource, live_state
from rda.panel.views import describe_error
from rda.serialization.errors import RdaError
from rda.transport.ratelog import RateLimitedLog

__all__ = ["ALARM_POLL", "REFRESH", "STATE_POLL", "STATIC", "create_app", "serve"]

log = logging.getLogger("rda.panel")

STATIC = Path(__file__).parent / "static"
REFRESH = 2.0
STATE_POLL = 0.25
ALARM_POLL = 0.5
_CSP = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; frame-ancestors 'none'"
)


class _SecurityHeaders:
    """Adds the Content-Security-Policy (and friends) to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"content-security-policy", _CSP.encode()))
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def _same_origin(websocket: WebSocket) -> bool:
    """A browser always sends Origin; only a page served from this host may connect."""
    origin = websocket.headers.get("origin")
    host = websocket.headers.get("host")
    if origin is None:
        return True  # not a browser (a script, the benchmark): nothing cross-site to fear
    return host is not None and origin.split("://", 1)[-1] == host


def create_app(
    source: PanelSource,
    *,
    allow_set: bool = False,
    history: Past | None = None,
    heartbeat_timeout: float = 10.0,
    refresh: float = REFRESH,
    hosts: frozenset[str] | None = None,
    layout: Layout | None = None,
    kiosk: bool = False,
) -> Starlette:
    """The panel as an ASGI application over ``source`` (which the app closes at shutdown),
    answering requests for IP literals and ``hosts`` (default: ``localhost``; see
    ``rda.panel.hosts.panel_names``) only. ``layout`` is what a new tab opens (unless its URL
    carries one); ``kiosk`` makes every tab read-only (sets refused, whatever ``allow_set``)."""
    state = PanelState(
        source=source,
        allow_set=allow_set and not kiosk,
        kiosk=kiosk,
        layout=None if layout is None else layout.model_dump(),
        history="" if history is None else history.kind,
        heartbeat_timeout=heartbeat_timeout,
        renders=RenderCache(),
        tree=[],
    )
    sessions: set[Session] = set()
    alarms = AlarmWatch(source)
    refusals = RateLimitedLog(log, interval=60.0)

    def refuse_host(host: str) -> None:
        # A page of a rebound name, or a name the panel was not told: counted, logged sparingly
        # (any page can make a browser send these).
        state.hosts_refused += 1
        refusals.log("refused hosts", "panel: refused a request for Host %r", host)

    async def refresh_tree() -> None:
        while True:
            try:
                tree = await asyncio.to_thread(source.discover)
            except Exception:
                log.exception("panel: discovering the servers failed")
            else:
                if tree != state.tree:
                    state.tree = tree
                    publish_tree()
            await asyncio.sleep(refresh)

    def publish_tree() -> None:
        state.tree_version += 1
        for session in list(sessions):
            session.tree_changed()

    async def watch_alarms() -> None:
        followed = -1
        while True:
            await asyncio.sleep(ALARM_POLL)
            try:
                if followed != state.tree_version:
                    followed = state.tree_version
                    await asyncio.to_thread(alarms.follow, state.tree)
                if await asyncio.to_thread(alarms.evaluate):
                    state.alarms = {
                        "alarms": alarms.summary(),
                        "severities": alarms.severities(),
                        "unwatched": alarms.unwatched,
                    }
                    state.alarms_version += 1
                    for session in list(sessions):
                        session.tree_changed()
            except Exception:
                log.exception("panel: watching the alarms failed")

    async def watch_states() -> None:
        while True:
            await asyncio.sleep(STATE_POLL)
            try:
                connections = await asyncio.to_thread(source.states)
            except Exception:
                log.exception("panel: reading the connection states failed")
                continue
            changed = False
            for server in state.tree:
                shown = live_state(server["state"], connections.get(server["endpoint"]))
                if shown != server["state"]:
                    server["state"] = shown
                    changed = True
            if changed:
                publish_tree()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(refresh_tree(), name="rda-panel-discovery"),
            asyncio.create_task(watch_states(), name="rda-panel-states"),
            asyncio.create_task(watch_alarms(), name="rda-panel-alarms"),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.to_thread(alarms.close)
            await asyncio.to_thread(source.close)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def tree(request: Request) -> Response:
        return JSONResponse({"servers": state.tree, "version": state.tree_version})

    async def past(request: Request) -> Response:
        if history is None:
            return JSONResponse({"error": "no history store (rda panel --history STORE)"}, 404)
        q = request.query_params
        try:
            series = await asyncio.to_thread(
                history.series,
                q["device"],
                q["property"],
                q["field"],
                parse_minutes(q.get("minutes", "10")),
                q.get("selector") or None,
            )
        except (KeyError, ValueError) as exc:
            return JSONResponse({"error": f"bad request: {exc}"}, 400)
        except RdaError as exc:  # no recorder serves it, denied, unreachable: no past, say why
            return JSONResponse({"error": describe_error(exc)}, 404)
        except Exception as exc:  # a store that cannot be read: say so, keep serving
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, 500)
        return JSONResponse(series)

    async def check_layout(request: Request) -> Response:
        """A layout from the browser (a loaded file, a shared link), validated: the normalised
        layout, or 400 with what is wrong. Nothing is stored."""
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_LAYOUT_BYTES:
                return JSONResponse({"error": f"a layout is at most {MAX_LAYOUT_BYTES} bytes"}, 413)
        try:
            checked = parse_layout(bytes(body))
        except LayoutError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse(checked.model_dump())

    async def ws(websocket: WebSocket) -> None:
        if not _same_origin(websocket):
            await websocket.close(code=1008, reason="cross-origin WebSocket refused")
            return
        session = Session(websocket, state)
        sessions.add(session)
        try:
            await session.run()
        finally:
            sessions.discard(session)

    routes = [
        Route("/", index),
        Route("/api/tree", tree),
        Route("/api/history", past),
        Route("/api/layout", check_layout, methods=["POST"]),
        WebSocketRoute("/ws", ws),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    names = panel_names() if hosts is None else hosts
    middleware = [
        Middleware(HostCheck, names=names, on_refused=refuse_host),
        Middleware(_SecurityHeaders),
    ]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


def serve(
    app: Starlette,
    bind: str,
    port: int,
    announce: Callable[[str], Any] = print,
) -> None:
    """Serve ``app`` on ``bind:port`` (0: a free port) until SIGINT/SIGTERM; ``announce``
    gets the URL once the socket is bound (before the first request can arrive)."""
    import uvicorn

    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, port))
    sock.listen(128)  # before the URL is announced: a client may connect at once
    host, actual = sock.getsockname()[:2]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="websockets-sansio")
    server = uvicorn.Server(config)
    announce(f"http://{shown}:{actual}/")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
