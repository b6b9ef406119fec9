"""The server end to end over tcp loopback: real ZeroMQ transport, ``ClientService`` and a raw
DEALER speaking the protocol; a tmp FileDirectory for registration."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import FileDirectory, StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError, OverloadError, RemoteError, TimeoutError
from rda.serialization.header import DataContext, Header, RequestType, UpdateType
from rda.serialization.message import BodyKind, Message
from rda.testing import wait_until
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_message,
)

CONFIG = Config(heartbeat_interval=0.2, heartbeat_timeout=5.0, request_timeout=5.0)


class Handler(RequestReplyCallback):
    def __init__(self) -> None:
        self.value = 0.0
        self.release = threading.Event()
        self.held: list[GetRequest] = []

    def get(self, request: GetRequest) -> None:
        if request.device == "SLOW":
            assert self.release.wait(10)
        if request.property == "Fails":
            raise RuntimeError("sensor offline")
        if request.property == "Never":
            self.held.append(request)
            return
        if request.property == "Async":
            threading.Thread(target=request.complete, args=(Data(value=-1.0),)).start()
            return
        request.complete(AcquiredData(Data(value=self.value), DataContext("CYCLE", 1, 2)))

    def set(self, request: SetRequest) -> None:
        if request.device != "PS1":
            raise NoSuchDeviceError(f"{request.device}: no such device")
        self.value = float(request.data["value"])
        request.complete()


@pytest.fixture
def server() -> Iterator[tuple[Server, Handler]]:
    handler = Handler()
    before = set(threading.enumerate())
    srv = (
        ServerBuilder("E2E")
        .config(CONFIG)
        .request_reply(handler)
        .devices("PS1", "SLOW")
        .directory(None)
        .workers(2)
        .queue_limit(2)
        .build()
    )
    srv.start()
    yield srv, handler
    handler.release.set()
    srv.stop()
    wait_until(lambda: not [t for t in threading.enumerate() if t not in before])


@pytest.fixture
def client(server: tuple[Server, Handler]) -> Iterator[ClientService]:
    directory = StaticDirectory({"*": server[0].endpoint})
    with ClientService(directory=directory, config=CONFIG) as svc:
        yield svc


def test_get_set_and_errors_through_the_client(
    server: tuple[Server, Handler], client: ClientService
) -> None:
    srv, _ = server
    ap = client.access_point("PS1", "Current")
    ap.set(Data(value=2.5))
    acq = ap.get(timeout=5)
    assert acq.data == Data(value=2.5)
    assert acq.context.cycle_name == "CYCLE"
    assert client.access_point("PS1", "Async").get(timeout=5).data == Data(value=-1.0)
    with pytest.raises(RemoteError) as info:
        client.access_point("PS1", "Fails").get(timeout=5)
    assert info.value.type == "RuntimeError" and "sensor offline" in info.value.message
    assert ap.get(timeout=5).data == Data(value=2.5)  # the server serves on
    stats = srv.statistics()
    assert stats.requests[("get", "ok")] == 3 and stats.requests[("get", "handler_error")] == 1


def test_unknown_device_reaches_the_client_as_no_such_device(client: ClientService) -> None:
    with pytest.raises(NoSuchDeviceError, match="PS9: no such device"):
        client.access_point("PS9", "X").set(Data(value=1), timeout=5)


def test_never_completed_get_is_answered_with_a_timeout(
    server: tuple[Server, Handler], client: ClientService
) -> None:
    # Client and server time out at the same deadline; whichever answer wins, the caller sees
    # rda.TimeoutError, and the server answers (and counts) the request it never completed.
    with pytest.raises(TimeoutError):
        client.access_point("PS1", "Never").get(timeout=0.3)
    wait_until(lambda: server[0].statistics().requests.get(("get", "timeout"), 0) == 1)


def test_overload_is_reported_as_overload_error(
    server: tuple[Server, Handler], client: ClientService
) -> None:
    srv, handler = server
    ap = client.access_point("SLOW", "Value")
    futures = [ap.get_async(timeout=10)]
    wait_until(lambda: srv.statistics().scheduler.running == 1)
    futures += [ap.get_async(timeout=10) for _ in range(2)]  # fill the queue (limit 2)
    wait_until(lambda: srv.statistics().scheduler.queued == 2)
    with pytest.raises(OverloadError, match="SLOW"):
        ap.get(timeout=10)
    handler.release.set()
    assert [f.result(10).data for f in futures] == [Data(value=0.0)] * 3


def test_subscription_first_immediate_normal(
    server: tuple[Server, Handler], client: ClientService
) -> None:
    srv, _ = server
    sub = client.access_point("PS1", "Current").subscribe()
    first = sub.poll(10)
    assert first is not None and first.update_type is UpdateType.FIRST
    assert first.data == Data(value=0.0)
    client.access_point("PS1", "Current").set(Data(value=7.0), timeout=5)
    immediate = sub.poll(10)
    assert immediate is not None and immediate.update_type is UpdateType.IMMEDIATE
    assert immediate.data == Data(value=7.0)
    for i in range(3):
        for source in srv.subscriptions():
            source.notify(Data(value=float(i)))
        n = sub.poll(10)
        assert n is not None and n.update_type is UpdateType.NORMAL and n.data["value"] == i
        assert n.gap == 0
    sub.close()
    wait_until(lambda: srv.subscriptions() == [])


class RawClient:
    """A bare DEALER speaking the wire protocol (no client runtime)."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.sock.send_multipart(encode_connect({"application": "raw"}))
        assert isinstance(self.recv(), ConnectAck)

    def recv(self) -> object:
        while True:
            assert self.sock.poll(10_000), "no message from the server"
            event = decode_frames(self.sock.recv_multipart(), from_server=True)
            if isinstance(event, Incoming | ConnectAck):
                return event

    def request(self, rtype: RequestType, rid: int, device: str, prop: str) -> Message:
        ctx = binary.encode(Data(timeout_ms=5000))
        header = Header(rtype, rid, device, prop)
        self.sock.send_multipart(
            encode_message(Kind.REQUEST, header, [(BodyKind.REQUEST_CONTEXT, ctx)])
        )
        event = self.recv()
        assert isinstance(event, Incoming)
        return event.message

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def test_raw_dealer_disconnect_removes_its_subscribers(server: tuple[Server, Handler]) -> None:
    srv, _ = server
    raw = RawClient(srv.endpoint)
    try:
        first = raw.request(RequestType.SUBSCRIBE, 42, "PS1", "Current")
        assert first.header.update_type is UpdateType.FIRST and first.seq == 1
        assert [s.subscribers for s in srv.sources()] == [1]
        assert [c.info["application"] for c in srv.clients()] == ["raw"]
    finally:
        raw.close()
    # The transport notices the closed TCP connection (socket monitor) and tells the server.
    wait_until(lambda: srv.subscriptions() == [] and srv.clients() == [])


def test_directory_registration_on_start_and_stop(tmp_path: Path) -> None:
    directory = FileDirectory(tmp_path / "directory.json")
    srv = (
        ServerBuilder("Registered")
        .config(CONFIG)
        .endpoint("tcp://*:0")
        .devices("PS7")
        .directory(directory)
        .build()
    )
    with srv:
        assert directory.resolve("PS7").startswith("tcp://127.0.0.1:")
        assert directory.resolve("PS7").rsplit(":", 1)[1] == srv.endpoint.rsplit(":", 1)[1]
    with pytest.raises(NoSuchDeviceError):
        directory.resolve("PS7")
