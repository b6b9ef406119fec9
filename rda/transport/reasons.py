"""Why a connection ended: the reasons handed to ``on_disconnected`` / ``on_peer_disconnected``.

They are part of the ``rda.transport.api`` contract (the business layer and the tests compare
them) and the same for every transport, so they are defined once here.
"""

from __future__ import annotations

from rda.transport.state import ConnState

__all__ = [
    "CLOSED_LOCALLY",
    "CONNECT_FAILED",
    "FORGOTTEN",
    "HANDSHAKE_REFUSED",
    "HEARTBEAT_TIMEOUT",
    "LANE_IDLE",
    "NEVER_CONNECTED",
    "NOT_RDA",
    "NO_CONNECT_ACK",
    "PEER_GONE",
    "RECONNECTED",
    "lost_reason",
    "refused_reason",
]

CLOSED_LOCALLY = "closed locally"
HEARTBEAT_TIMEOUT = "heartbeat timeout"
LANE_IDLE = "lane idle"  # server: a client's direct lane was silent for the heartbeat timeout
PEER_GONE = "peer gone"  # server: the client's connection closed
RECONNECTED = "reconnected"  # server: the same routing id sent CONNECT again
NO_CONNECT_ACK = "no CONNECT_ACK within connect_timeout"
# Client: the ZeroMQ security handshake failed (the business layer raises NotAuthorizedError).
HANDSHAKE_REFUSED = "security handshake refused"
# Client: the server answered RECONNECT (it dropped this connection, e.g. after a heartbeat
# timeout while this process was paused).
FORGOTTEN = "the server no longer knew this connection"
# Client: the peer at the endpoint is no ZeroMQ socket (rda.transport._handshake); the business
# layer raises DisconnectedError, not NotAuthorizedError: no key would help.
NOT_RDA = "the peer does not speak the rda protocol"
# Client: the socket closed before the connection was up (nothing listens there, or the peer
# closed during the handshake).
CONNECT_FAILED = "connection refused or closed"
# The reasons of a connection that never was: "lost" would name one that never existed.
NEVER_CONNECTED = frozenset({CONNECT_FAILED, NO_CONNECT_ACK})


def lost_reason(state: ConnState) -> str:
    """Client: why a connection whose socket closed under it is over."""
    if state is ConnState.CONNECTING:
        return CONNECT_FAILED
    return "server closed the connection"


def refused_reason(error: object) -> str:
    """Client: the server's CONNECT_ACK carried ``error``."""
    return f"refused by the server: {error}"
