"""Connection states and heartbeat bookkeeping: the one place that owns the transitions.

Everything that changes a connection's state lives in :data:`TRANSITIONS`; the diagram in
docs/protocol.md is generated from it (``python -m rda.transport.state``). Sans-I/O: times are
plain floats handed in by the caller (a real monotonic clock or a fake one in tests).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rda.serialization.errors import LocalProtocolError

__all__ = [
    "TRANSITIONS",
    "ConnEvent",
    "ConnState",
    "HeartbeatAction",
    "HeartbeatTracker",
    "next_state",
    "state_diagram",
    "update_document",
]


class ConnState(enum.Enum):
    CONNECTING = "connecting"  # client: CONNECT sent, waiting for CONNECT_ACK
    CONNECTED = "connected"
    CLOSED = "closed"


class ConnEvent(enum.Enum):
    CONNECT_RECEIVED = "connect received"  # server: a new peer introduced itself
    ACK_RECEIVED = "connect_ack received"  # client: the server accepted
    ACK_REFUSED = "connect_ack refused"  # client: the server refused (e.g. version)
    # client: the server does not know this connection any more (RECONNECT): connect again
    RECONNECT_RECEIVED = "reconnect received"
    HEARTBEAT_TIMEOUT = "heartbeat timeout"  # nothing heard for heartbeat_timeout
    PEER_GONE = "peer gone"  # TCP connection closed (socket monitor)
    LOCAL_CLOSE = "local close"  # this side closed or dropped the peer


TRANSITIONS: dict[tuple[ConnState, ConnEvent], ConnState] = {
    (ConnState.CONNECTING, ConnEvent.ACK_RECEIVED): ConnState.CONNECTED,
    (ConnState.CONNECTING, ConnEvent.CONNECT_RECEIVED): ConnState.CONNECTED,
    (ConnState.CONNECTING, ConnEvent.ACK_REFUSED): ConnState.CLOSED,
    (ConnState.CONNECTING, ConnEvent.HEARTBEAT_TIMEOUT): ConnState.CLOSED,
    (ConnState.CONNECTING, ConnEvent.PEER_GONE): ConnState.CLOSED,
    (ConnState.CONNECTING, ConnEvent.LOCAL_CLOSE): ConnState.CLOSED,
    # A client that reconnects under the same routing id re-introduces itself.
    (ConnState.CONNECTED, ConnEvent.CONNECT_RECEIVED): ConnState.CONNECTED,
    (ConnState.CONNECTED, ConnEvent.HEARTBEAT_TIMEOUT): ConnState.CLOSED,
    (ConnState.CONNECTED, ConnEvent.RECONNECT_RECEIVED): ConnState.CLOSED,
    (ConnState.CONNECTED, ConnEvent.PEER_GONE): ConnState.CLOSED,
    (ConnState.CONNECTED, ConnEvent.LOCAL_CLOSE): ConnState.CLOSED,
    (ConnState.CLOSED, ConnEvent.LOCAL_CLOSE): ConnState.CLOSED,
}


def next_state(state: ConnState, event: ConnEvent) -> ConnState:
    """The state after ``event``; an event the table does not allow is a ``LocalProtocolError``.

    Local: the transports check what a peer sent before they ask for a transition (a second
    CONNECT_ACK is ignored, not passed here), so a forbidden one is a bug of this side."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise LocalProtocolError(
            f"'{event.value}' is not allowed in state {state.value} (a bug of this side)"
        ) from None


def state_diagram() -> str:
    """A Mermaid state diagram generated from :data:`TRANSITIONS`."""
    lines = ["stateDiagram-v2", "    [*] --> connecting"]
    for (src, event), dst in TRANSITIONS.items():
        lines.append(f"    {src.value} --> {dst.value}: {event.value}")
    lines.append("    closed --> [*]")
    return "\n".join(lines)


class HeartbeatAction(enum.Enum):
    NONE = "none"
    SEND = "send"  # idle for the interval: send a HEARTBEAT
    EXPIRED = "expired"  # silent for the timeout: drop the peer


@dataclass(slots=True)
class HeartbeatTracker:
    """Symmetric heartbeats for one peer: any message counts, in either direction.

    ``interval``: send a heartbeat when nothing was *sent* for this long.
    ``timeout``: the peer is gone when nothing was *received* for this long.
    """

    interval: float
    timeout: float
    last_received: float
    last_sent: float

    @classmethod
    def start(cls, interval: float, timeout: float, now: float) -> HeartbeatTracker:
        if interval <= 0 or timeout <= 0:
            raise ValueError("heartbeat interval and timeout must be positive")
        return cls(interval, timeout, now, now)

    def received(self, now: float) -> None:
        self.last_received = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    def check(self, now: float) -> HeartbeatAction:
        if now - self.last_received >= self.timeout:
            return HeartbeatAction.EXPIRED
        if now - self.last_sent >= self.interval:
            return HeartbeatAction.SEND
        return HeartbeatAction.NONE

    def next_deadline(self) -> float:
        """The earliest time at which :meth:`check` can return something new."""
        return min(self.last_sent + self.interval, self.last_received + self.timeout)


_BEGIN = "<!-- state-diagram:begin -->"
_END = "<!-- state-diagram:end -->"


def update_document(text: str) -> str:
    """``text`` with the Mermaid block between the state-diagram markers regenerated."""
    begin = text.index(_BEGIN) + len(_BEGIN)
    end = text.index(_END, begin)
    return f"{text[:begin]}\n```mermaid\n{state_diagram()}\n```\n{text[end:]}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    # ``--update docs/protocol.md`` rewrites the diagram in place; otherwise print it.
    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        path = Path(sys.argv[2])
        path.write_text(update_document(path.read_text()))
    else:
        print(state_diagram())
