"""CURVE key material and the ZAP handler for the ZeroMQ transports.

The transport cannot import ``rda.business`` (dependency direction), so the business layer
hands it plain Z85 key strings in the two frozen dataclasses below. The server answers ZeroMQ's
authentication requests (ZAP, RFC 27) itself, on its own dispatcher thread: a REP socket bound
to ``inproc://zeromq.zap.01`` in the server's context, polled beside the ROUTER. That needs no
extra thread (nothing to stop at shutdown but one socket) and keeps every decision in one place:
a client key found in ``clients`` is accepted with the principal name as ZAP User-Id, which
libzmq then attaches to every message of that connection (``frame.get("User-Id")``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.utils.z85

from rda.serialization.errors import TransportError
from rda.transport.ratelog import RateLimitedLog

__all__ = [
    "ZAP_ENDPOINT",
    "ClientCurve",
    "ServerCurve",
    "ZapHandler",
    "apply_client",
    "apply_server",
    "authenticated_info",
]

log = logging.getLogger("rda.transport.security")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_ZAP_VERSION = b"1.0"
_KEY_LENGTH = 40  # Z85 text of a 32-byte CURVE key


def _check_key(key: str, what: str) -> None:
    if not isinstance(key, str) or len(key) != _KEY_LENGTH:
        raise ValueError(f"{what} must be a {_KEY_LENGTH}-character Z85 CURVE key")
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{what} is not valid Z85 text") from exc


@dataclass(frozen=True, slots=True)
class ServerCurve:
    """A server's key pair and the client keys it accepts: ``clients`` maps principal -> key."""

    public: str
    secret: str = field(repr=False)
    clients: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_key(self.public, "the server public key")
        _check_key(self.secret, "the server secret key")
        for name, key in self.clients.items():
            _check_key(key, f"the public key of client {name!r}")


@dataclass(frozen=True, slots=True)
class ClientCurve:
    """A client's key pair and how it learns a server's public key.

    ``server_key`` is used for every endpoint; ``server_key_for(endpoint)`` (e.g. a directory
    look-up) is asked first when given. An endpoint without a known server key is refused at
    ``connect``: a CURVE client cannot talk to a server whose key it does not know.
    """

    public: str
    secret: str = field(repr=False)
    server_key: str | None = None
    server_key_for: Callable[[str], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _check_key(self.public, "the client public key")
        _check_key(self.secret, "the client secret key")
        if self.server_key is not None:
            _check_key(self.server_key, "the server key")

    def key_for(self, endpoint: str) -> str:
        key = None
        if self.server_key_for is not None:
            key = self.server_key_for(endpoint)
        if key is None:
            key = self.server_key
        if key is None:
            raise TransportError(
                f"no CURVE server key known for {endpoint}: give one (server_key=, --server-key) "
                "or register the server with its key in the directory"
            )
        return key


def authenticated_info(info: dict[str, Any], user_id: str | None, curve: bool) -> dict[str, Any]:
    """``info`` with the ZAP User-Id as ``authenticated_principal``; a value the client sent
    under that name is never believed. No ZAP verdict on a connection cannot happen with
    ZAP_DOMAIN set (``curve``): then absent."""
    info = dict(info)
    info.pop("authenticated_principal", None)
    if curve and user_id is not None:
        info["authenticated_principal"] = user_id
    return info


def apply_server(sock: zmq.Socket[bytes], curve: ServerCurve) -> None:
    """Make ``sock`` a CURVE server; call before ``bind``."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public.encode("ascii"))
    # Every handshake must go through our ZAP handler, also for an empty ZAP domain.
    sock.setsockopt(zmq.ZAP_DOMAIN, b"rda")


def apply_client(sock: zmq.Socket[bytes], curve: ClientCurve, endpoint: str) -> None:
    """Make ``sock`` a CURVE client of the server at ``endpoint``; call before ``connect``."""
    server_key = curve.key_for(endpoint)
    try:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret.encode("ascii"))
    except zmq.ZMQError as exc:
        raise TransportError(f"bad CURVE key for {endpoint}: {exc}", exc.errno) from exc


class ZapHandler:
    """Answers ZAP requests for one server; every method runs on the server's dispatcher.

    ``denied`` counts refused handshakes (unknown key, not CURVE, malformed request).
    """

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], curve: ServerCurve) -> None:
        # Binary public key -> principal: what a ZAP request carries is the raw 32 bytes.
        self._principals = {zmq.utils.z85.decode(k): name for name, k in curve.clients.items()}
        self.denied = 0
        self.accepted = 0
        # Anyone can attempt a handshake: its lines are rate-limited (``ratelog``).
        self._log = RateLimitedLog(log)
        sock = context.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise TransportError(
                f"cannot bind the ZAP handler ({exc}): another authenticator already serves "
                "this ZeroMQ context; give the secured server a context of its own",
                exc.errno,
            ) from exc
        self.socket = sock

    def drain(self) -> None:
        """Answer every waiting request (REP: one receive, one send, in turn)."""
        while True:
            try:
                request = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = self._decide(request)
            try:
                self.socket.send_multipart(reply, zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                self._log.log("ZAP errors", "could not answer a ZAP request: %s", exc)

    def _decide(self, request: list[bytes]) -> list[bytes]:
        # version, request id, domain, address, identity, mechanism, credentials...
        request_id = request[1] if len(request) > 1 else b""
        if len(request) < 6 or request[0] != _ZAP_VERSION:
            return self._deny(request_id, b"malformed ZAP request", "?")
        address = request[3].decode("ascii", "replace")
        if request[5] != b"CURVE" or len(request) != 7:
            return self._deny(request_id, b"CURVE required", address)
        principal = self._principals.get(request[6])
        if principal is None:
            return self._deny(request_id, b"unknown client key", address)
        self.accepted += 1
        return [_ZAP_VERSION, request_id, b"200", b"OK", principal.encode(), b""]

    def _deny(self, request_id: bytes, why: bytes, address: str) -> list[bytes]:
        self.denied += 1
        self._log.log(
            "refused connections", "refused a connection from %s: %s", address, why.decode()
        )
        return [_ZAP_VERSION, request_id, b"400", why, b"", b""]

    def close(self) -> None:
        self._log.flush()
        if not self.socket.closed:
            self.socket.close(linger=0)
