"""Issue 27 (5): the client information of CONNECT is validated, not taken as sent.

Before, ``pid: "x"``, ``application: 5`` and a 60 kB string were accepted, kept for the
connection's life and shown by ``rda admin SERVER clients``. Now ``peer_info.ClientInfoModel``
(pydantic, strict) checks types, string lengths and the number of extra keys; a CONNECT that
fails gets a refusing CONNECT_ACK naming the fields at fault, is counted, and no peer is made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import rda
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError
from rda.serialization.message import Message
from rda.testing import wait_until
from rda.transport.api import TransportSettings
from rda.transport.peer_info import connect_info, rda_version
from rda.transport.protocol import ConnectAck, decode_frames, encode_connect
from rda.transport.zmq_server import ZmqServerTransport

Ctx = zmq.Context[zmq.Socket[bytes]]


class Recorder:
    def __init__(self) -> None:
        self.connected: list[dict[str, Any]] = []

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        self.connected.append(client_info)

    def on_message(self, peer: bytes, message: Message) -> None:
        pass

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[ZmqServerTransport, Recorder, Ctx]]:
    recorder = Recorder()
    srv = ZmqServerTransport(
        "tcp://127.0.0.1:0",
        recorder,
        TransportSettings(heartbeat_interval=30.0, heartbeat_timeout=60.0),
    )
    srv.start()
    ctx: Ctx = zmq.Context()
    yield srv, recorder, ctx
    srv.close()
    ctx.term()


def handshake(srv: ZmqServerTransport, ctx: Ctx, info: dict[str, Any]) -> dict[str, Any]:
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, 20_000)
    raw.connect(srv.endpoint)
    try:
        raw.send_multipart(encode_connect(info))
        event = decode_frames(raw.recv_multipart(), from_server=True)
    finally:
        raw.close()
    assert isinstance(event, ConnectAck)
    return event.info


BAD_INFOS = [
    ({"pid": "x", "application": 5}, ["pid: Input should be a valid integer", "application:"]),
    ({"application": "a" * 60_000}, ["application: String should have at most 256 characters"]),
    ({"pid": -1}, ["pid: Input should be greater than or equal to 0"]),
    ({"lane": "yes"}, ["lane: Input should be a valid boolean"]),
    ({"custom": {"nested": [1, 2]}}, ["custom:"]),
    ({f"key{i}": i for i in range(17)}, ["extra: Dictionary should have at most 16 items"]),
]


@pytest.mark.parametrize(("info", "faults"), BAD_INFOS)
def test_an_invalid_connect_is_refused_with_the_fields_at_fault_and_counted(
    server: tuple[ZmqServerTransport, Recorder, Ctx], info: dict[str, Any], faults: list[str]
) -> None:
    srv, recorder, ctx = server
    before = srv.statistics()
    ack = handshake(srv, ctx, info)
    error = ack["error"]
    assert error.startswith("CONNECT refused: invalid client info: ")
    for fault in faults:
        assert fault in error
    assert len(json.dumps(ack)) < 2048  # the refusal does not echo a 60 kB value
    stats = srv.statistics()
    assert stats.protocol_errors == before.protocol_errors + 1
    assert stats.decode_errors == before.decode_errors + 1
    assert stats.peers == 0 and recorder.connected == []


def test_a_valid_connect_with_application_keys_is_accepted(
    server: tuple[ZmqServerTransport, Recorder, Ctx],
) -> None:
    srv, recorder, ctx = server
    info = {**connect_info(rda_version()), "lane": False, "principal": "olga", "shift": 3}
    ack = handshake(srv, ctx, info)
    assert "error" not in ack
    wait_until(lambda: len(recorder.connected) == 1, timeout=20.0)
    assert recorder.connected[0]["shift"] == 3


class Supply(Device):
    @Device.property("Current")
    def current(self, request: GetRequest) -> Data:
        return Data(value=1.0)


def test_the_client_is_told_why_and_admin_clients_never_shows_it() -> None:
    server = rda.ServerBuilder("Srv").device("PS1", Supply()).directory(None).build().start()
    directory = StaticDirectory({"*": server.endpoint})
    liar = ClientService(directory, Config(), client_info={"pid": "x", "application": 5})
    honest = ClientService(directory, Config())
    try:
        with pytest.raises(DisconnectedError, match=r"refused by the server: CONNECT refused"):
            liar.access_point("PS1", "Current").get(timeout=20)
        assert honest.access_point("PS1", "Current").get(timeout=20).data["value"] == 1.0
        (client,) = server.clients()  # the one `rda admin SERVER clients` lists
        assert client.info["pid"] != "x"
        transport = server.statistics().transport
        assert transport is not None and transport.protocol_errors >= 1
    finally:
        liar.close()
        honest.close()
        server.stop()
