"""Issue 27 (2): a remote peer cannot flood the log.

Before, each malformed message wrote one WARNING line and each refused CURVE handshake one
more (50,000 bad messages: 50,000 lines in 2 s). Now every line a peer can cause goes through
``rda.transport.ratelog.RateLimitedLog``: one line per kind per second, the next one saying how
many were not logged, while the counters count every event (the helper itself:
tests/test_ratelog.py). The server's clock is a FakeClock
that only moves when told, so "within one second" is exact, not a race with the machine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from rda.serialization.message import Message
from rda.testing import FakeClock, wait_until
from rda.transport.api import TransportSettings
from rda.transport.protocol import encode_heartbeat
from rda.transport.zmq_server import ZmqServerTransport

Ctx = zmq.Context[zmq.Socket[bytes]]
SERVER_LOG = "rda.transport.server"


class Quiet:
    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        pass

    def on_message(self, peer: bytes, message: Message) -> None:
        pass

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        pass


@pytest.fixture
def frozen_server() -> Iterator[tuple[ZmqServerTransport, FakeClock, Ctx]]:
    clock = FakeClock()
    settings = TransportSettings(max_message_size=4096, heartbeat_timeout=3600.0)
    server = ZmqServerTransport("tcp://127.0.0.1:0", Quiet(), settings, clock=clock)
    server.start()
    ctx: Ctx = zmq.Context()
    yield server, clock, ctx
    server.close()
    ctx.term()


def test_bad_messages_from_a_peer_are_counted_each_but_logged_once_a_second(
    frozen_server: tuple[ZmqServerTransport, FakeClock, Ctx], caplog: pytest.LogCaptureFixture
) -> None:
    server, clock, ctx = frozen_server
    garbage, heartbeats = 2000, 500
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.endpoint)
    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        for n in range(garbage):
            raw.send(b"\xff garbage %d" % n)  # unknown kind byte: a DecodeError each
        for _ in range(heartbeats):
            raw.send_multipart(encode_heartbeat(from_server=False))  # before any CONNECT
        wait_until(lambda: server.statistics().decode_errors == garbage + heartbeats, timeout=20.0)
        lines = [r.getMessage() for r in caplog.records if r.name == SERVER_LOG]
        # The fake clock stood still: one line per kind, every event counted.
        assert len(lines) == 2, lines
        assert lines[0].startswith("dropped a bad message from peer")
        assert "HEARTBEAT before CONNECT" in lines[1]
        assert server.statistics().protocol_errors == heartbeats
        clock.advance(1.0)
        raw.send(b"\xff one more")
        wait_until(
            lambda: server.statistics().decode_errors == garbage + heartbeats + 1, timeout=20.0
        )
    raw.close()
    lines = [r.getMessage() for r in caplog.records if r.name == SERVER_LOG]
    assert len(lines) == 3, lines
    assert lines[2].endswith(f"({garbage - 1} more bad messages not logged)")


def test_refused_curve_handshakes_are_logged_once_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rda.transport.curve import ServerCurve

    public, secret = zmq.curve_keypair()
    stranger_public, stranger_secret = zmq.curve_keypair()
    curve = ServerCurve(public.decode(), secret.decode(), {})  # nobody is welcome
    ctx: Ctx = zmq.Context()
    server = ZmqServerTransport("tcp://127.0.0.1:0", Quiet(), curve=curve)
    attempts = 30
    with caplog.at_level(logging.WARNING, logger="rda.transport.security"):
        server.start()
        socks = []
        try:
            for _ in range(attempts):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.CURVE_SERVERKEY, public)
                s.setsockopt(zmq.CURVE_PUBLICKEY, stranger_public)
                s.setsockopt(zmq.CURVE_SECRETKEY, stranger_secret)
                s.connect(server.endpoint)
                socks.append(s)
            wait_until(lambda: server.statistics().auth_failures >= attempts, timeout=20.0)
        finally:
            for s in socks:
                s.close()
            server.close()
            ctx.term()
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    # 30 refusals within a few seconds of a real clock: a handful of lines, never one each.
    assert 1 <= len(lines) <= 10, lines
    assert len(lines) < attempts
