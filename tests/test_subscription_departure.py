"""A departed client's subscriptions end with ``unsubscribe`` (issue 12, defect 2): once for each
of them, whether the client was disconnected, went silent past the heartbeat timeout or closed;
then ``source_removed`` for each source it left empty, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.business.server.subscriptions import (
    SubscriptionCallback,
    SubscriptionSource,
    UnsubscribeRequest,
)
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import Header, RequestType, UpdateType
from rda.serialization.message import BodyKind
from rda.testing import FakeClock, MemoryNetwork, RawPeer
from rda.transport.api import ServerHandler, TransportSettings
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_message,
)

CONFIG = Config(heartbeat_interval=1.0, heartbeat_timeout=10.0)


class Value(RequestReplyCallback):
    def get(self, request: GetRequest) -> None:
        request.complete(Data(value=1))


class Recording(SubscriptionCallback):
    """Records ("unsubscribe", id, device, application) and ("removed", device) in call order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.cond = threading.Condition()

    def _add(self, event: tuple[Any, ...]) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def unsubscribe(self, request: UnsubscribeRequest) -> None:
        assert request.source is not None and request.source.device == request.device
        self._add(("unsubscribe", request.id, request.device, request.client.application))

    def source_removed(self, source: SubscriptionSource) -> None:
        self._add(("removed", source.device))

    def wait(self, count: int, timeout: float = 10.0) -> list[tuple[Any, ...]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= count, timeout), self.events
            return list(self.events)


def _check_departure(events: list[tuple[Any, ...]], ids: dict[int, str], application: str) -> None:
    """Each subscription unsubscribed exactly once, each source removed exactly once, after the
    unsubscribe of its last subscriber."""
    unsubscribed = [e[1] for e in events if e[0] == "unsubscribe"]
    assert sorted(unsubscribed) == sorted(ids)
    assert all(e[3] == application for e in events if e[0] == "unsubscribe")
    assert {e[2] for e in events if e[0] == "unsubscribe"} == set(ids.values())
    removed = [e[1] for e in events if e[0] == "removed"]
    assert sorted(removed) == sorted(set(ids.values()))
    for device in set(ids.values()):
        last_unsubscribe = max(
            i for i, e in enumerate(events) if e[0] == "unsubscribe" and e[2] == device
        )
        assert events.index(("removed", device)) > last_unsubscribe


# -- over the memory network, with a fake clock -----------------------------------------------


@pytest.fixture
def memory(no_thread_leak: None) -> Iterator[tuple[MemoryNetwork, FakeClock, Server, Recording]]:
    clock = FakeClock()
    network = MemoryNetwork(clock=clock)
    subs = Recording()

    def transport(h: ServerHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.server("srv", h, s, info)

    server = (
        ServerBuilder("Departure")
        .config(CONFIG)
        .request_reply(Value())
        .subscription(subs)
        .directory(None)
        .transport(transport)
        .clock(clock)
        .build()
        .start()
    )
    try:
        yield network, clock, server, subs
    finally:
        server.stop()
        network.close()


SUBSCRIPTIONS = {1: "PS1", 2: "PS1", 3: "PS2"}


def _subscribed_raw_peer(network: MemoryNetwork) -> RawPeer:
    """A raw client that subscribes to SUBSCRIPTIONS, has their FIRST updates, then is silent."""
    peer = network.raw_peer("srv")
    peer.send(encode_connect({"application": "raw"}))
    assert isinstance(decode_frames(peer.recv(), from_server=True), ConnectAck)
    context = binary.encode(Data(timeout_ms=5000))
    for sub_id, device in SUBSCRIPTIONS.items():
        header = Header(RequestType.SUBSCRIBE, sub_id, device, "Acquisition")
        peer.send(encode_message(Kind.REQUEST, header, [(BodyKind.REQUEST_CONTEXT, context)]))
    firsts: set[int] = set()
    while len(firsts) < len(SUBSCRIPTIONS):
        event = decode_frames(peer.recv(), from_server=True)
        if isinstance(event, Incoming):
            assert event.message.header.update_type is UpdateType.FIRST
            firsts.add(event.message.header.id)
    return peer


def test_heartbeat_timeout_unsubscribes_each_subscription_once(
    memory: tuple[MemoryNetwork, FakeClock, Server, Recording],
) -> None:
    network, clock, server, subs = memory
    _subscribed_raw_peer(network)
    assert server.statistics().subscriptions == 3
    network.settle()
    clock.advance(9.0)
    network.settle()
    assert subs.events == []  # not yet timed out: nothing ended
    clock.advance(1.5)  # past the 10 s heartbeat timeout
    network.settle()
    events = subs.wait(5)
    _check_departure(events, SUBSCRIPTIONS, "raw")
    assert server.statistics().transport.heartbeat_timeouts == 1
    assert server.statistics().subscriptions == 0 and server.subscriptions() == []
    server.stop()
    assert len(subs.events) == 5  # nothing called twice, not even at stop


def test_disconnect_unsubscribes_each_subscription_once(
    memory: tuple[MemoryNetwork, FakeClock, Server, Recording],
) -> None:
    network, _, server, subs = memory
    peer = _subscribed_raw_peer(network)
    assert server.disconnect_client(peer.peer.hex())
    events = subs.wait(5)
    _check_departure(events, SUBSCRIPTIONS, "raw")
    assert server.statistics().subscriptions == 0
    server.stop()
    assert len(subs.events) == 5


def test_explicit_unsubscribe_then_disconnect_calls_it_once(
    memory: tuple[MemoryNetwork, FakeClock, Server, Recording],
) -> None:
    network, _, server, subs = memory
    peer = _subscribed_raw_peer(network)
    peer.send(
        encode_message(Kind.REQUEST, Header(RequestType.UNSUBSCRIBE, 3, "PS2", "Acquisition"))
    )
    assert subs.wait(2) == [("unsubscribe", 3, "PS2", "raw"), ("removed", "PS2")]
    assert server.disconnect_client(peer.peer.hex())
    events = subs.wait(5)
    _check_departure(events, SUBSCRIPTIONS, "raw")  # 3 is not unsubscribed a second time
    server.stop()
    assert len(subs.events) == 5


# -- a real client over ZeroMQ that closes -----------------------------------------------------


def test_client_close_unsubscribes_each_subscription_once(no_thread_leak: None) -> None:
    subs = Recording()
    server = (
        ServerBuilder("DepartureTcp")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(Value())
        .subscription(subs)
        .devices("*")
        .directory(None)
        .build()
        .start()
    )
    client = ClientService(
        StaticDirectory({"*": server.endpoint}), Config(), client_info={"application": "closer"}
    )
    try:
        for device in ("PS1", "PS1", "PS2"):
            sub = client.access_point(device, "Acquisition").subscribe()
            first = sub.poll(10)
            assert first is not None and first.update_type is UpdateType.FIRST
        ids = {s.id: s.device for s in client._subscriptions.live()}
        client.close()
        events = subs.wait(5)
        _check_departure(events, ids, "closer")
        assert server.statistics().subscriptions == 0
    finally:
        client.close()
        server.stop()
    assert len(subs.events) == 5
