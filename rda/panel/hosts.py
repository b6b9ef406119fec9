"""Which ``Host`` the panel answers to: its defence against DNS rebinding.

A page from ``http://evil.example:8080`` whose name the attacker's DNS then points at
127.0.0.1 talks to the panel as a same-origin page: the browser sends ``Host:
evil.example:8080`` and an ``Origin`` that matches it, so neither the same-origin policy nor
the WebSocket's Origin check stops it reading ``/api/tree`` or setting properties (issue 37).
What the attacker cannot choose is a name the panel knows: :class:`HostCheck` answers a
request (HTTP or WebSocket) only when its ``Host`` is

- an IP address literal (``127.0.0.1:8080``, ``[::1]:8080``, the machine's address): a page
  whose origin is an address cannot be rebound, its origin *is* the address;
- ``localhost`` (browsers resolve it to the loopback themselves);
- the name the panel is bound to, or one given with ``rda panel --allowed-host NAME`` (the
  machine's own name, a proxy's public name).

Anything else gets a 400 (a WebSocket is refused before its handshake completes), counted
by the caller's ``on_refused``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["HostCheck", "host_allowed", "host_name", "panel_names"]

_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower case, without port, brackets or a final dot."""
    header = header.strip().lower()
    if header.startswith("["):  # [v6]:port
        return header[1:].partition("]")[0]
    name, _, _port = header.partition(":")
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def panel_names(bind: str = "", allowed: Iterable[str] = ()) -> frozenset[str]:
    """The names (besides IP literals) a panel bound to ``bind`` answers to: ``localhost``,
    ``bind`` itself when it is a name, and every ``allowed`` one."""
    names = {"localhost"}
    for name in (bind, *allowed):
        if name.strip().lower() not in _WILDCARDS:
            names.add(host_name(name))
    return frozenset(names)


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """True when a request with this ``Host`` header is the panel's to answer."""
    if not header:
        return False  # every browser sends one: a request without it is nobody's page
    name = host_name(header)
    return name in names or _is_address(name)


class HostCheck:
    """ASGI middleware: passes on only the requests whose ``Host`` is one of ``names`` or an
    IP literal (:func:`host_allowed`); refuses the others, calling ``on_refused(host)``."""

    def __init__(
        self, app: ASGIApp, names: frozenset[str], on_refused: Callable[[str], None]
    ) -> None:
        self.app = app
        self.names = names
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        host = None
        for key, value in scope.get("headers", ()):
            if key == b"host":
                host = value.decode("latin-1")
                break
        if host_allowed(host, self.names):
            await self.app(scope, receive, send)
            return
        self.on_refused(host or "")
        if scope["type"] == "websocket":
            # A close before the accept: the server refuses the handshake (HTTP 403).
            await send({"type": "websocket.close", "code": 1008})
            return
        body = (
            f"rda panel: Host {host!r} is not one of this panel's names; "
            "start it with --allowed-host NAME to answer to NAME\n"
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
