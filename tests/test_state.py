"""Connection state table and heartbeat bookkeeping, driven by plain numbers for time."""

from __future__ import annotations

import pytest

from rda.serialization.errors import ProtocolError
from rda.transport.state import (
    ConnEvent,
    ConnState,
    HeartbeatAction,
    HeartbeatTracker,
    next_state,
    state_diagram,
)


def test_client_lifecycle() -> None:
    state = next_state(ConnState.CONNECTING, ConnEvent.ACK_RECEIVED)
    assert state is ConnState.CONNECTED
    assert next_state(state, ConnEvent.HEARTBEAT_TIMEOUT) is ConnState.CLOSED


def test_closed_is_final() -> None:
    with pytest.raises(ProtocolError, match="not allowed in state closed"):
        next_state(ConnState.CLOSED, ConnEvent.ACK_RECEIVED)


def test_diagram_lists_every_transition() -> None:
    diagram = state_diagram()
    assert diagram.count("-->") == 14
    assert "connecting --> connected: connect_ack received" in diagram


def test_heartbeat_sends_after_idle_interval_and_expires_after_timeout() -> None:
    hb = HeartbeatTracker.start(interval=1.0, timeout=10.0, now=100.0)
    assert hb.check(100.9) is HeartbeatAction.NONE
    assert hb.check(101.0) is HeartbeatAction.SEND
    hb.sent(101.0)
    assert hb.check(101.5) is HeartbeatAction.NONE
    assert hb.next_deadline() == 102.0
    hb.received(105.0)  # any traffic from the peer pushes the timeout out
    assert hb.check(114.9) is not HeartbeatAction.EXPIRED
    assert hb.check(115.0) is HeartbeatAction.EXPIRED


def test_heartbeat_rejects_nonpositive_settings() -> None:
    with pytest.raises(ValueError, match="positive"):
        HeartbeatTracker.start(0.0, 1.0, 0.0)
