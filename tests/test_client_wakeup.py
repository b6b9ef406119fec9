"""How a blocking get/set is woken: the per-thread ``Wakeup`` and ``wake_later``.

The caller waits on its thread's wake-up; the client dispatcher sets it right before it polls
again (``ZmqClientTransport.wake_later``), any other thread (timer, close) at once. Real
ZeroMQ sockets on 127.0.0.1; deadlines driven by a fake clock; no sleep-based timing.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rda.serialization.errors as errors
from rda.business.client.replies import ReplyWaiter
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.testing import FakeClock, wait_until
from rda.transport.api import TransportSettings
from rda.transport.mailbox import Wakeup
from rda.transport.protocol import Kind, encode_message
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

WAIT = 10.0


def in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, name="waiter", daemon=True)
    thread.start()
    return thread


def waiting_on(wakeup: Wakeup) -> tuple[threading.Thread, threading.Event]:
    """A thread blocked in ``wakeup.wait()``, and the event it sets once that returns."""
    woken = threading.Event()

    def wait() -> None:
        wakeup.wait()
        woken.set()

    return in_thread(wait), woken


def a_message(rid: int = 1) -> Message:
    return Message(Header(RequestType.REPLY, rid, "DEV", "Prop", ""), ())


# --------------------------------------------------------------------------- Wakeup


def test_a_set_before_the_wait_ends_it_at_once() -> None:
    wakeup = Wakeup()
    try:
        wakeup.set()
        wakeup.wait()  # returns: the set was pending (a hang would hit the test timeout)
    finally:
        wakeup.close()


def test_a_set_from_another_thread_wakes_the_waiter() -> None:
    wakeup = Wakeup()
    thread, woken = waiting_on(wakeup)
    try:
        wakeup.set()
        thread.join(WAIT)
        assert woken.is_set()
    finally:
        wakeup.close()


def test_each_thread_has_its_own_wakeup_closed_when_the_thread_ends() -> None:
    mine = Wakeup.of_thread()
    assert Wakeup.of_thread() is mine
    theirs: list[weakref.ref[Wakeup]] = []
    thread = in_thread(lambda: theirs.append(weakref.ref(Wakeup.of_thread())))
    thread.join(WAIT)
    del thread
    gc.collect()
    assert len(theirs) == 1
    assert theirs[0]() is None  # gone (and its descriptors closed) with its thread
    assert Wakeup.of_thread() is mine


# --------------------------------------------------------------------------- ReplyWaiter


def test_a_waiter_completed_before_result_returns_at_once() -> None:
    waiter = ReplyWaiter(lambda m: ("converted", m.header.id))
    waiter.set_result(a_message(7))
    waiter.set_result(a_message(8))  # a second completion is ignored
    assert waiter.result() == ("converted", 7)
    assert waiter.result() == ("converted", 7)  # a second result() returns too


def test_a_waiter_completed_from_another_thread_wakes_its_caller() -> None:
    waiter = ReplyWaiter(lambda m: m.header.id)
    results: list[Any] = []
    thread = in_thread(lambda: results.append(waiter.result()))
    waiter.set_result(a_message(3))
    thread.join(WAIT)
    assert results == [3]


def test_a_stale_set_does_not_end_a_later_wait_early() -> None:
    # An earlier request of this thread left a set pending (it was interrupted before it
    # read it): the next waiter must still wait for its own outcome.
    Wakeup.of_thread().set()
    waiter = ReplyWaiter(lambda m: m.header.id)
    completer = in_thread(lambda: waiter.set_result(a_message(5)))
    assert waiter.result() == 5
    completer.join(WAIT)


def test_a_deferred_wake_leaves_the_caller_asleep_until_it_is_set() -> None:
    deferred: list[Wakeup] = []
    waiter = ReplyWaiter(lambda m: m.header.id, deferred.append)
    waiter.set_exception(errors.DisconnectedError("gone"))
    assert deferred == [Wakeup.of_thread()]  # handed over, not set
    deferred[0].set()
    with pytest.raises(errors.DisconnectedError, match="gone"):
        waiter.result()


# --------------------------------------------------------------------------- wake_later


class _Echo:
    def __init__(self) -> None:
        self.transport: ZmqServerTransport | None = None

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        pass

    def on_message(self, peer: bytes, message: Message) -> None:
        assert self.transport is not None
        h = message.header
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        self.transport.send(peer, encode_message(Kind.REPLY, reply, message.body))

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        pass


class _Rec:
    def __init__(self) -> None:
        self.connected = threading.Event()
        self.on_reply: Callable[[Message], None] = lambda m: None

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self.connected.set()

    def on_message(self, connection: int, message: Message) -> None:
        self.on_reply(message)

    def on_disconnected(self, connection: int, reason: str) -> None:
        pass


@pytest.fixture
def pair() -> Iterator[tuple[ZmqClientTransport, _Rec, int]]:
    echo = _Echo()
    server = ZmqServerTransport("tcp://127.0.0.1:0", echo)
    echo.transport = server
    server.start()
    rec = _Rec()
    client = ZmqClientTransport(rec)
    client.start()
    try:
        conn = client.connect(server.endpoint)
        assert rec.connected.wait(WAIT)
        yield client, rec, conn
    finally:
        client.close()
        server.close()


def request(rid: int) -> list[Any]:
    header = Header(RequestType.GET, rid, "DEV", "Prop", "")
    return encode_message(Kind.REQUEST, header, [(BodyKind.DATA, b"x")])


def test_wake_later_off_the_dispatcher_sets_at_once(
    pair: tuple[ZmqClientTransport, _Rec, int],
) -> None:
    client, _, _ = pair
    wakeup = Wakeup()
    try:
        client.wake_later(wakeup)
        wakeup.wait()  # already set
    finally:
        wakeup.close()


def test_wake_later_on_the_dispatcher_sets_before_it_polls_again(
    pair: tuple[ZmqClientTransport, _Rec, int],
) -> None:
    client, rec, conn = pair
    wakeup = Wakeup()
    on_dispatcher: list[bool] = []

    def reply(message: Message) -> None:
        on_dispatcher.append(threading.current_thread().name == "rda-client-dispatcher")
        client.wake_later(wakeup)

    rec.on_reply = reply
    thread, woken = waiting_on(wakeup)
    try:
        client.send(conn, request(1))
        thread.join(WAIT)
        assert woken.is_set() and on_dispatcher == [True]
    finally:
        wakeup.close()


def test_a_wake_deferred_by_a_handler_that_closes_the_transport_still_happens(
    pair: tuple[ZmqClientTransport, _Rec, int],
) -> None:
    client, rec, conn = pair
    wakeup = Wakeup()

    def reply(message: Message) -> None:
        client.wake_later(wakeup)
        client.close()  # on the dispatcher: it stops after this handler, without polling

    rec.on_reply = reply
    thread, woken = waiting_on(wakeup)
    try:
        client.send(conn, request(1))
        thread.join(WAIT)
        assert woken.is_set()
    finally:
        wakeup.close()


# --------------------------------------------------------------------------- the service


class _Silent(RequestReplyCallback):
    """Never completes a get (the client's deadline or close decides)."""

    def __init__(self) -> None:
        self.got = threading.Event()

    def get(self, request: GetRequest) -> None:
        self.got.set()

    def set(self, request: SetRequest) -> None:
        request.complete()


@pytest.fixture
def silent(no_thread_leak: None) -> Iterator[tuple[Server, _Silent]]:
    handler = _Silent()
    server = (
        ServerBuilder("WAKE")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(handler)
        .devices("*")
        .directory(None)
        .build()
    )
    server.start()
    try:
        yield server, handler
    finally:
        server.stop()


def test_a_blocking_get_still_times_out_with_a_fake_clock(
    silent: tuple[Server, _Silent],
) -> None:
    server, handler = silent
    clock = FakeClock()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(), clock=clock)
    try:
        errors_seen: list[BaseException] = []

        def get() -> None:
            try:
                client.access_point("DEV", "Prop").get(timeout=5.0)
            except BaseException as exc:
                errors_seen.append(exc)

        thread = in_thread(get)
        assert handler.got.wait(WAIT)  # the request is out and its deadline registered
        wait_until(lambda: client.statistics().pending == 1)
        clock.advance(4.9)
        assert thread.is_alive()
        clock.advance(0.2)
        thread.join(WAIT)
        assert len(errors_seen) == 1 and isinstance(errors_seen[0], errors.TimeoutError)
        assert client.statistics().timeouts == 1
    finally:
        client.close()


def test_close_wakes_a_blocked_get(silent: tuple[Server, _Silent]) -> None:
    server, handler = silent
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config())
    errors_seen: list[BaseException] = []

    def get() -> None:
        try:
            client.access_point("DEV", "Prop").get(timeout=60.0)
        except BaseException as exc:
            errors_seen.append(exc)

    thread = in_thread(get)
    try:
        assert handler.got.wait(WAIT)
    finally:
        client.close()
    thread.join(WAIT)
    assert len(errors_seen) == 1 and isinstance(errors_seen[0], errors.DisconnectedError)


def test_many_blocking_callers_each_get_their_own_reply() -> None:
    class Echo(RequestReplyCallback):
        def get(self, request: GetRequest) -> None:
            request.complete(Data(device=request.device))

        def set(self, request: SetRequest) -> None:
            request.complete()

    server = (
        ServerBuilder("WAKE")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(Echo())
        .devices("*")
        .directory(None)
        .build()
    )
    server.start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=2))
    wrong: list[str] = []

    def caller(name: str) -> None:
        ap = client.access_point(name, "Prop")
        for _ in range(50):
            got = ap.get().data["device"]
            if got != name:
                wrong.append(f"{name} got {got}")

    threads = [
        threading.Thread(target=caller, args=(f"D{i}",), name="caller", daemon=True)
        for i in range(8)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(WAIT * 3)
        assert not any(t.is_alive() for t in threads)
        assert wrong == []
    finally:
        client.close()
        server.stop()


def test_requests_sent_by_the_reply_handler_never_stall_the_dispatcher() -> None:
    """64 requests in flight, each reply's handler sends the next one from the dispatcher.

    A send may process the socket's pending commands (and so consume the signal that would
    wake the poll for a reply that already arrived): the dispatcher must not mark the socket
    settled after such a send. The heartbeat is an hour away, so a missed wake-up would stall
    for good and the bounded wait below fails.
    """
    echo = _Echo()
    server = ZmqServerTransport("tcp://127.0.0.1:0", echo)
    echo.transport = server
    server.start()
    rec = _Rec()
    settings = TransportSettings(heartbeat_interval=3600.0, heartbeat_timeout=7200.0)
    client = ZmqClientTransport(rec, settings)
    client.start()
    total = 4000
    sent = [0]
    done = threading.Event()
    replies = [0]
    try:
        conn = client.connect(server.endpoint)
        assert rec.connected.wait(WAIT)

        def reply(message: Message) -> None:
            replies[0] += 1
            if sent[0] < total:
                sent[0] += 1
                client.send(conn, request(sent[0]))
            elif replies[0] == total:
                done.set()

        rec.on_reply = reply
        for _ in range(64):
            sent[0] += 1
            client.send(conn, request(sent[0]))
        assert done.wait(30), f"stalled after {replies[0]} of {total} replies"
    finally:
        client.close()
        server.close()
