"""The server over ``rda.testing.MemoryNetwork`` (the real wire frames, no sockets) with a
``FakeClock`` driving the deadline watcher, and ``ClientService`` on the same network."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import Header, RequestType, UpdateType
from rda.serialization.message import BodyKind
from rda.testing import FakeClock, MemoryNetwork, OneServerDirectory, RawPeer
from rda.transport.api import ClientHandler, ServerHandler, TransportSettings
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_message,
)

CONFIG = Config(heartbeat_interval=1.0, heartbeat_timeout=30.0)


class Holding(RequestReplyCallback):
    """Completes ``Value`` at once and keeps ``Held`` requests unanswered."""

    def __init__(self) -> None:
        self.held: list[GetRequest] = []
        self.arrived = threading.Semaphore(0)

    def get(self, request: GetRequest) -> None:
        if request.property == "Held":
            self.held.append(request)
            self.arrived.release()
            return
        request.complete(Data(value=request.device))


@pytest.fixture
def net() -> Iterator[tuple[MemoryNetwork, FakeClock, Server, Holding]]:
    clock = FakeClock()
    network = MemoryNetwork(clock=clock)
    handler = Holding()

    def transport(
        handler_: ServerHandler, settings: TransportSettings, info: dict[str, Any]
    ) -> Any:
        return network.server("srv", handler_, settings, info)

    server = (
        ServerBuilder("Mem")
        .config(CONFIG)
        .request_reply(handler)
        .directory(None)
        .transport(transport)
        .clock(clock)
        .build()
        .start()
    )
    before_listeners = clock.listeners
    yield network, clock, server, handler
    server.stop()
    assert clock.listeners < before_listeners  # the server unhooked its deadline watcher
    network.close()


def _connect(network: MemoryNetwork) -> RawPeer:
    peer = network.raw_peer("srv")
    peer.send(encode_connect({"application": "raw"}))
    assert isinstance(decode_frames(peer.recv(), from_server=True), ConnectAck)
    return peer


def _next_reply(peer: RawPeer, timeout: float = 10.0) -> Incoming | None:
    """The next REPLY, skipping heartbeats; None when none arrives within ``timeout``."""
    while True:
        try:
            frames = peer.recv(timeout)
        except TimeoutError:
            return None
        event = decode_frames(frames, from_server=True)
        if isinstance(event, Incoming):
            return event


def _get(peer: RawPeer, rid: int, prop: str, timeout_ms: int) -> None:
    ctx = binary.encode(Data(timeout_ms=timeout_ms))
    header = Header(RequestType.GET, rid, "DEV", prop)
    peer.send(encode_message(Kind.REQUEST, header, [(BodyKind.REQUEST_CONTEXT, ctx)]))


def test_fake_clock_deadline_answers_a_never_completed_request(
    net: tuple[MemoryNetwork, FakeClock, Server, Holding],
) -> None:
    network, clock, server, handler = net
    peer = _connect(network)
    _get(peer, 11, "Held", timeout_ms=3000)
    assert handler.arrived.acquire(timeout=10)
    clock.advance(2.5)
    network.settle()
    assert server.check_deadlines() == 0
    assert _next_reply(peer, 0.05) is None  # nothing before the deadline
    clock.advance(1.0)  # the watcher wakes on advance
    event = _next_reply(peer)
    assert event is not None
    reply = event.message
    assert reply.header.request_type is RequestType.EXCEPTION and reply.header.id == 11
    assert reply.exception is not None and reply.exception[0] == "TimeoutError"
    assert "3 s" in reply.exception[1]
    assert {k: n for k, n in server.statistics().requests.items() if n} == {("get", "timeout"): 1}
    handler.held[0].complete(Data(value="late"))
    assert server.statistics().late_completions == 1
    peer.close()


def test_client_service_over_the_memory_network(
    net: tuple[MemoryNetwork, FakeClock, Server, Holding],
) -> None:
    network, clock, server, _ = net

    def transport(handler: ClientHandler, settings: TransportSettings, info: dict[str, Any]) -> Any:
        return network.client(handler, settings, info)

    with ClientService(
        directory=OneServerDirectory(server.endpoint),
        config=CONFIG,
        transport_factory=transport,
        clock=clock,
    ) as client:
        assert client.access_point("DEV", "Value").get(timeout=5).data == Data(value="DEV")
        sub = client.access_point("PS1", "Value").subscribe()
        first = sub.poll(10)
        assert first is not None and first.update_type is UpdateType.FIRST
        assert first.data == Data(value="PS1")
        server.subscriptions()[0].notify(Data(value="next"))
        n = sub.poll(10)
        assert n is not None and n.update_type is UpdateType.NORMAL and n.seq == 2
        assert [c.info.get("application") is not None for c in server.clients()] == [True]
