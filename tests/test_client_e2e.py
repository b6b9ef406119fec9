"""The client against the real server runtime over ZeroMQ on tcp loopback (random ports)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import rda.serialization.errors as errors
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import (
    GetRequest,
    RequestReplyCallback,
    SetRequest,
    SubscriptionRequest,
)
from rda.business.server.subscriptions import SubscriptionCallback
from rda.serialization.data import Data
from rda.serialization.header import UpdateType
from rda.testing import wait_until


class Handler(RequestReplyCallback):
    def __init__(self) -> None:
        self.current = 0.0

    def get(self, request: GetRequest) -> None:
        if request.device == "BROKEN":
            raise ZeroDivisionError("division by zero")
        if request.device == "SILENT":
            return  # never completed: the client's deadline decides
        request.complete(Data(current=self.current))

    def set(self, request: SetRequest) -> None:
        self.current = float(request.data["current"])
        request.complete()


class Subs(SubscriptionCallback):
    def subscribe(self, request: SubscriptionRequest) -> None:
        if request.device == "SECRET":
            request.reject("not for you")
        else:
            request.accept()


def build(port: int = 0, handler: Handler | None = None) -> Server:
    return (
        ServerBuilder("E2E")
        .endpoint(f"tcp://127.0.0.1:{port}")
        .request_reply(handler or Handler())
        .subscription(Subs())
        .devices("*")
        .directory(None)
        .build()
    )


@pytest.fixture
def served(no_thread_leak: None) -> Iterator[tuple[Server, ClientService]]:
    server = build()
    server.start()
    client = ClientService(
        StaticDirectory({"*": server.endpoint}), Config(request_timeout=5.0, workers=2)
    )
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def test_get_set_subscribe_over_tcp(served: tuple[Server, ClientService]) -> None:
    server, client = served
    ap = client.access_point("PS1", "Acquisition")
    sub = ap.subscribe()
    first = sub.poll(10)
    assert first is not None and first.update_type is UpdateType.FIRST and first.error is None
    ap.set(Data(current=2.5))
    assert ap.get().data["current"] == 2.5
    immediate = sub.poll(10)
    assert immediate is not None and immediate.update_type is UpdateType.IMMEDIATE
    assert immediate.data["current"] == 2.5
    wait_until(lambda: len(server.subscriptions()) == 1)
    for source in server.subscriptions():
        source.notify(Data(current=3.0))
    normal = sub.poll(10)
    assert normal is not None and normal.update_type is UpdateType.NORMAL and normal.gap == 0
    sub.close()
    wait_until(lambda: all(s.subscribers == 0 for s in server.subscriptions()))


def test_errors_over_tcp(served: tuple[Server, ClientService]) -> None:
    _, client = served
    with pytest.raises(errors.RemoteError, match="division by zero") as info:
        client.access_point("BROKEN", "Acquisition").get()
    assert info.value.type == "ZeroDivisionError" and "BROKEN" in str(info.value)
    with pytest.raises(errors.TimeoutError, match="SILENT/Acquisition"):
        client.access_point("SILENT", "Acquisition").get(timeout=0.2)
    rejected = client.access_point("SECRET", "Acquisition").subscribe()
    notes = list(rejected)
    assert len(notes) == 1 and notes[0].error is not None
    assert "not for you" in str(notes[0].error)


def test_many_concurrent_gets_over_one_connection(served: tuple[Server, ClientService]) -> None:
    _, client = served
    ap = client.access_point("PS1", "Acquisition")
    futures = [ap.get_async() for _ in range(500)]
    assert all(f.result(timeout=20).data["current"] == 0.0 for f in futures)
    stats = client.statistics()
    assert stats.replies == 500 and stats.pending == 0 and stats.connections == 1


def test_restart_on_same_port_resumes_subscriptions_with_first(no_thread_leak: None) -> None:
    server = build()
    server.start()
    endpoint = server.endpoint
    port = int(endpoint.rsplit(":", 1)[1])
    client = ClientService(StaticDirectory({"*": endpoint}), Config(workers=2))
    got: list[Any] = []
    arrived = threading.Condition()

    def listener(n: Any) -> None:
        with arrived:
            got.append((time.monotonic(), n))
            arrived.notify_all()

    restarted: Server | None = None
    try:
        sub = client.access_point("PS1", "Acquisition").subscribe(listener=listener)
        wait_until(lambda: len(got) == 1)
        server.stop()
        wait_until(lambda: len(got) == 2)  # the disconnection is reported
        assert isinstance(got[1][1].error, errors.DisconnectedError)
        restarted = build(port)
        restarted.start()
        listening = time.monotonic()
        wait_until(lambda: len(got) == 3)
        when, first = got[2]
        assert first.update_type is UpdateType.FIRST and first.error is None and first.gap == 0
        resume = when - listening
        print(f"tcp resume after restart: {resume * 1000:.1f} ms")
        assert client.statistics().reconnects == 1
        sub.close()
    finally:
        client.close()
        if restarted is not None:
            restarted.stop()
        server.stop()
