"""Direct lanes (issue 11): a blocking get/set goes out on the calling thread's own DEALER and
its reply is read there, with no hand-off through the client dispatcher.

What must hold, over ZeroMQ on tcp loopback: the call takes the lane only when allowed (shared
connection up, nothing routed in flight, ``direct_calls``); deadlines, disconnection and close
end a call waiting in a lane as they end a routed one; a late reply is dropped and counted;
lanes of ended threads are closed; the server neither lists lanes as clients nor heartbeats
them, and forgets an idle one quietly, after which the lane introduces itself again. Every wait
is on a state (bounded), never a sleep standing in for one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError, TimeoutError
from rda.testing import FakeClock, wait_until


@dataclass
class Recorder(RequestReplyCallback):
    """Answers gets with a counter; ``HOLD`` gets wait for ``release`` (or are kept open)."""

    release: threading.Event = field(default_factory=threading.Event)
    held: list[GetRequest] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    lane_flags: list[bool] = field(default_factory=list)
    principals: list[str] = field(default_factory=list)
    sets: int = 0

    def get(self, request: GetRequest) -> None:
        self.lane_flags.append(request.client.info.get("lane") is True)
        self.principals.append(request.client.principal)
        if request.device == "HOLD":
            self.held.append(request)
            self.arrived.set()
            return  # completed later by the test (or never)
        request.complete(Data(n=len(self.lane_flags)))

    def set(self, request: SetRequest) -> None:
        self.lane_flags.append(request.client.info.get("lane") is True)
        self.sets += 1
        request.complete()


def serve(handler: Recorder, heartbeat: tuple[float, float] = (1.0, 10.0)) -> Server:
    return (
        ServerBuilder("LANES")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(handler)
        .devices("*")
        .directory(None)
        .heartbeat(*heartbeat)
        .build()
        .start()
    )


def client_of(server: Server, **settings: Any) -> ClientService:
    config = Config(request_timeout=10.0, **settings)
    return ClientService(StaticDirectory({"*": server.endpoint}), config)


@pytest.fixture
def handler() -> Recorder:
    return Recorder()


@pytest.fixture
def server(handler: Recorder) -> Iterator[Server]:
    s = serve(handler)
    try:
        yield s
    finally:
        for request in handler.held:
            request.complete(Data(n=0))
        s.stop()


def after(event: threading.Event, action: Callable[[], object]) -> None:
    """``action()`` once the server holds the request (a thread's target)."""
    event.wait(10)
    action()


def test_blocking_get_and_set_take_the_callers_lane(server: Server, handler: Recorder) -> None:
    with client_of(server) as client:
        ap = client.access_point("PS1", "Acquisition")
        first = ap.get()  # connects: the first call goes the shared way
        assert ap.get().data["n"] == first.data["n"] + 1
        client.access_point("PS1", "Setting").set(Data(x=1.0))
        stats = client.statistics()
        assert stats.transport.lanes == 1
        assert stats.replies == 3 and stats.pending == 0
        assert handler.lane_flags == [False, True, True]
        srv = server.statistics()
        # The lane is a session of the same client: not another peer or client.
        assert srv.transport.lanes == 1
        assert srv.transport.peers == 1
        assert srv.clients == 1
        assert len(server.clients()) == 1


def test_a_lane_that_polls_for_its_reply_gets_it(server: Server, handler: Recorder) -> None:
    """``Config.lane_spin``: the lane polls before it sleeps; the calls are answered as ever
    (on the lane), and a call past its deadline still ends with TimeoutError."""
    with client_of(server, lane_spin=0.002) as client:
        ap = client.access_point("PS1", "Acquisition")
        first = ap.get()  # connects: the first call goes the shared way
        for i in range(1, 4):
            assert ap.get().data["n"] == first.data["n"] + i
        client.access_point("PS1", "Setting").set(Data(x=1.0))
        assert client.statistics().transport.lanes == 1
        assert handler.lane_flags == [False, True, True, True, True]
        with pytest.raises(TimeoutError, match="HOLD/Acquisition"):
            client.access_point("HOLD", "Acquisition").get(timeout=0.3)
        assert handler.lane_flags[-1] is True
        assert client.statistics().pending == 0


def test_lane_spin_is_bounded() -> None:
    with pytest.raises(ValueError):
        Config(lane_spin=0.5)
    with pytest.raises(ValueError):
        Config(lane_spin=-0.001)


def test_direct_calls_off_keeps_every_request_on_the_shared_connection(
    server: Server, handler: Recorder
) -> None:
    with client_of(server, direct_calls=False) as client:
        ap = client.access_point("PS1", "Acquisition")
        for _ in range(3):
            ap.get()
        assert client.statistics().transport.lanes == 0
        assert handler.lane_flags == [False, False, False]


def test_a_request_routed_and_in_flight_keeps_later_calls_behind_it(
    server: Server, handler: Recorder
) -> None:
    with client_of(server) as client:
        ap = client.access_point("PS1", "Acquisition")
        ap.get()
        ap.get()  # opens the lane
        pending = client.access_point("HOLD", "Acquisition").get_async()
        handler.arrived.wait(10)
        # A lane could overtake the routed request: this set must go the shared way.
        client.access_point("PS1", "Setting").set(Data(x=1.0))
        assert handler.lane_flags[-1] is False
        handler.held.pop().complete(Data(n=-1))
        assert pending.result(10).data["n"] == -1
        ap.get()
        assert handler.lane_flags[-1] is True


def test_deadline_in_a_lane_then_the_late_reply_is_dropped_and_counted(
    server: Server, handler: Recorder
) -> None:
    # The client's clock is a fake one: its deadline passes while the server's (real) one
    # does not, so the server's reply really comes late.
    clock = FakeClock()
    client = ClientService(
        StaticDirectory({"*": server.endpoint}), Config(request_timeout=10.0), clock=clock
    )
    try:
        ap = client.access_point("PS1", "Acquisition")
        ap.get()
        ap.get()
        advancer = threading.Thread(target=after, args=(handler.arrived, lambda: clock.advance(6)))
        advancer.start()
        with pytest.raises(TimeoutError, match="HOLD/Acquisition"):
            client.access_point("HOLD", "Acquisition").get(timeout=5.0)
        advancer.join(20)
        assert handler.lane_flags[-1] is True
        assert client.statistics().timeouts == 1
        handler.held.pop().complete(Data(n=-1))  # the late reply goes to this thread's lane
        # The next call reads the late reply first, drops it, and returns its own.
        assert ap.get().data["n"] == len(handler.lane_flags)
        stats = client.statistics()
        assert stats.transport.lane_stale_replies == 1
        assert stats.pending == 0
    finally:
        client.close()


def test_a_lost_server_ends_a_lane_call_without_waiting_for_its_deadline(
    handler: Recorder,
) -> None:
    server = serve(handler)
    client = client_of(server)
    try:
        ap = client.access_point("PS1", "Acquisition")
        ap.get()
        ap.get()
        assert client.statistics().transport.lanes == 1
        stopper = threading.Thread(target=after, args=(handler.arrived, server.stop))
        stopper.start()
        with pytest.raises(DisconnectedError, match="HOLD/Acquisition"):
            client.access_point("HOLD", "Acquisition").get(timeout=60)
        stopper.join(20)
        assert handler.lane_flags[-1] is True
    finally:
        client.close()
        server.stop()


def test_close_ends_a_call_waiting_in_a_lane(
    server: Server, handler: Recorder, no_thread_leak: None
) -> None:
    client = client_of(server)
    ap = client.access_point("PS1", "Acquisition")
    ap.get()
    ap.get()
    closer = threading.Thread(target=after, args=(handler.arrived, client.close))
    closer.start()
    with pytest.raises(DisconnectedError, match="client closed"):
        client.access_point("HOLD", "Acquisition").get(timeout=60)
    closer.join(20)
    assert not closer.is_alive()
    assert handler.lane_flags[-1] is True
    assert client.statistics().transport.lanes == 0


def test_lanes_of_ended_threads_are_closed(server: Server) -> None:
    with client_of(server) as client:
        ap = client.access_point("PS1", "Acquisition")
        ap.get()

        def two_gets() -> None:
            ap.get()
            ap.get()

        for _ in range(3):
            t = threading.Thread(target=two_gets)
            t.start()
            t.join(20)
        # Each thread's lane is pruned when the next one is made: one left (the last).
        assert client.statistics().transport.lanes == 1
        wait_until(lambda: server.statistics().transport.lanes == 1, timeout=20.0)


def test_an_idle_lane_is_forgotten_quietly_and_introduces_itself_again(handler: Recorder) -> None:
    server = serve(handler, heartbeat=(0.1, 1.0))
    try:
        with client_of(server, heartbeat_interval=0.1, heartbeat_timeout=1.0) as client:
            ap = client.access_point("PS1", "Acquisition")
            ap.get()
            ap.get()
            # The second get went through the lane (lane_flags below); once it has been silent
            # past the server's heartbeat timeout the server forgets it.
            wait_until(lambda: server.statistics().transport.lanes == 0, timeout=20.0)
            assert ap.get().data["n"] == 3
            assert handler.lane_flags == [False, True, True]
            stats = server.statistics().transport
            assert stats.lanes == 1
            # Forgetting a lane is no heartbeat timeout: the client itself is alive.
            assert stats.heartbeat_timeouts == 0
            assert stats.peers == 1
    finally:
        server.stop()


def test_a_call_running_longer_than_the_heartbeat_timeout_gets_its_reply(
    handler: Recorder,
) -> None:
    """Issue 37, item 1: a blocking get (the direct lane) whose handler took 12 s, with the
    server's heartbeat timeout at 10 s, never got its reply: the server forgot the silent lane,
    counted the reply ``ok`` and logged nothing, and the client timed out after its full
    timeout (with ``direct_calls=False`` it returned after 12 s). Checked against main at
    af9bf33: both lanes were forgotten in the same round (``lanes == 0``).

    A positive signal instead of a sleep: a second, idle lane opened after the held one is
    forgotten first; the held lane, older and silent as long, must still be there."""
    server = serve(handler, heartbeat=(0.1, 1.0))
    got: list[object] = []
    try:
        with client_of(server, heartbeat_interval=0.1, heartbeat_timeout=1.0) as client:
            client.access_point("PS1", "Acquisition").get()  # connects (shared way)
            held = client.access_point("HOLD", "Acquisition")

            def call() -> None:
                try:
                    got.append(held.get(timeout=30.0).data["n"])
                except Exception as exc:  # reported by the assertion below
                    got.append(exc)

            caller = threading.Thread(target=call)
            caller.start()
            assert handler.arrived.wait(20)
            assert client.access_point("PS1", "Acquisition").get().data["n"] == 3
            assert handler.lane_flags == [False, True, True]
            # The idle lane (this thread's) is forgotten past the timeout; the held one is not.
            wait_until(lambda: server.statistics().transport.lanes <= 1, timeout=20.0)
            assert server.statistics().transport.lanes == 1
            handler.held.pop().complete(Data(n=42))
            caller.join(30)
            assert got == [42]
            assert server.statistics().transport.messages_dropped == 0
    finally:
        server.stop()


def test_a_restarted_server_gets_a_new_lane_once_the_connection_is_back(
    handler: Recorder,
) -> None:
    server = serve(handler)
    port = int(server.endpoint.rsplit(":", 1)[1])
    client = client_of(server, reconnect_initial=0.02, reconnect_max=0.2)
    try:
        ap = client.access_point("PS1", "Acquisition")
        ap.get()
        ap.get()
        assert handler.lane_flags == [False, True]
        server.stop()
        wait_until(lambda: client.statistics().servers[0].state != "connected", timeout=20.0)
        server = (
            ServerBuilder("LANES")
            .endpoint(f"tcp://127.0.0.1:{port}")
            .request_reply(handler)
            .devices("*")
            .directory(None)
            .build()
            .start()
        )
        wait_until(lambda: client.statistics().servers[0].state == "connected", timeout=20.0)
        ap.get()  # the old lane belonged to the lost connection: replaced, not reused
        assert handler.lane_flags[-1] is True
        stats = client.statistics().transport
        assert stats.lanes == 1
        assert server.statistics().transport.lanes == 1
    finally:
        client.close()
        server.stop()
