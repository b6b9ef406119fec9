"""rda.transport: the wire protocol (sans-I/O) and the dispatcher threads over DEALER/ROUTER.

``protocol``, ``state`` and the session cores (``client_session``, ``server_session``) are pure
(no zmq); ``zmq_client``/``zmq_server`` are the only I/O around them. ``api`` is the contract
with the business layer, which ``rda.testing``'s in-memory transports honour too. The ZeroMQ
transports are loaded on first use (PEP 562), so that importing any module of this package
(``rda.transport.api`` for its types) does not load zmq.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rda.transport.api import (
    ClientHandler,
    ClientTransport,
    ClientTransportStatistics,
    ServerHandler,
    ServerTransport,
    ServerTransportStatistics,
    TransportSettings,
)

if TYPE_CHECKING:
    from rda.transport.zmq_client import ZmqClientTransport, default_client_info
    from rda.transport.zmq_server import ZmqServerTransport

__all__ = [
    "ClientHandler",
    "ClientTransport",
    "ClientTransportStatistics",
    "ServerHandler",
    "ServerTransport",
    "ServerTransportStatistics",
    "TransportSettings",
    "ZmqClientTransport",
    "ZmqServerTransport",
    "default_client_info",
]

_LAZY = {
    "ZmqClientTransport": "rda.transport.zmq_client",
    "default_client_info": "rda.transport.zmq_client",
    "ZmqServerTransport": "rda.transport.zmq_server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rda.transport' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
