"""rda.transport: the wire protocol (sans-I/O) and the dispatcher threads over DEALER/ROUTER.

``protocol`` and ``state`` are pure (no zmq); ``zmq_client``/``zmq_server`` are the only I/O
around them. ``api`` is the contract with the business layer, which ``rda.testing``'s
in-memory transports honour too.
"""

from rda.transport.api import (
    ClientHandler,
    ClientTransport,
    ClientTransportStatistics,
    ServerHandler,
    ServerTransport,
    ServerTransportStatistics,
    TransportSettings,
)
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
