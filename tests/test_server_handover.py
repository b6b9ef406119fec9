"""Optimistic inline handlers and the leader/followers hand-over (rda.transport.relay).

A get or set starts on the dispatcher; when it runs long, the standby takes the lead, so the
server keeps receiving: per-device order, admin, heartbeats and other devices' requests go on;
the ``workers`` bound and the overflow policy still hold; shutdown stays bounded."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import rda.admin
from rda.admin.metrics import ServerCollector, registry_for
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.serialization.errors import OverloadError
from rda.testing import FakeClock, wait_until
from rda.transport.api import (
    ClientHandler,
    ClientTransport,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.relay import Relay
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

WAIT = 10.0
DISPATCHER = "rda-server-dispatcher"


class Gate(RequestReplyCallback):
    """Gets of selector "block" wait for ``release``; others answer at once. Records
    (device, selector, thread) in call order and the concurrency reached."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[tuple[str, str, str]] = []
        self.started: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0

    def started_event(self, device: str) -> threading.Event:
        with self._lock:
            return self.started.setdefault(device, threading.Event())

    def get(self, request: GetRequest) -> None:
        selector = request.selector or ""
        with self._lock:
            self.calls.append((request.device, selector, threading.current_thread().name))
            self.running += 1
            self.most = max(self.most, self.running)
        self.started_event(request.device).set()
        try:
            if selector == "block":
                assert self.release.wait(30.0)
        finally:
            with self._lock:
                self.running -= 1
        request.complete(Data(value=1.0))

    def set(self, request: SetRequest) -> None:
        request.complete()


def start(
    gate: Gate,
    workers: int = 4,
    queue_limit: int = 1000,
    heartbeat: tuple[float, float] = (1, 10),
    heartbeat_clock: FakeClock | None = None,
) -> tuple[Server, ClientService]:
    """A server and a client over ZeroMQ; ``heartbeat_clock`` drives both transports'
    heartbeats (request deadlines and the hand-over keep real time)."""
    builder = (
        ServerBuilder("HANDOVER")
        .request_reply(gate)
        .devices("*")
        .directory(None)
        .workers(workers)
        .queue_limit(queue_limit)
        .heartbeat(*heartbeat)
    )
    transport_factory = None
    if heartbeat_clock is not None:
        clock = heartbeat_clock
        builder.transport(
            lambda handler, settings, info: ZmqServerTransport(
                "tcp://127.0.0.1:0", handler, settings, info, clock=clock
            )
        )

        def transport_factory(
            handler: ClientHandler, settings: TransportSettings, info: dict[str, Any]
        ) -> ClientTransport:
            return ZmqClientTransport(handler, settings, info, clock=clock)

    server = rda.admin.install(builder).build().start()
    config = Config(workers=1, heartbeat_interval=heartbeat[0], heartbeat_timeout=heartbeat[1])
    client = ClientService(
        StaticDirectory({"*": server.endpoint}), config, transport_factory=transport_factory
    )
    return server, client


def relay_of(server: Server) -> Relay:
    transport = server._transport
    assert isinstance(transport, ZmqServerTransport)
    return transport._relay


def test_a_long_handler_hands_the_dispatching_over_and_order_and_admin_hold(
    no_thread_leak: None,
) -> None:
    gate = Gate()
    server, client = start(gate)
    try:
        d1 = client.access_point("D1", "P")
        slow = d1.get_async(selector="block", timeout=WAIT)
        assert gate.started_event("D1").wait(WAIT)
        # The first dispatcher runs it; the standby takes the lead and receives the rest.
        queued = [d1.get_async(selector=f"S{i}", timeout=WAIT) for i in range(3)]
        assert client.access_point("D2", "P").get(timeout=WAIT).data["value"] == 1.0
        assert client.admin(server.endpoint, "ping", timeout=WAIT, echo="x")["echo"] == "x"
        assert not slow.done() and not any(f.done() for f in queued)
        gate.release.set()
        for future in [slow, *queued]:
            assert future.result(WAIT).data["value"] == 1.0
        order = [(device, selector) for device, selector, _ in gate.calls]
        assert order == [("D1", "block"), ("D2", ""), ("D1", "S0"), ("D1", "S1"), ("D1", "S2")]
        threads = {selector or device: name for device, selector, name in gate.calls}
        assert threads["block"] == DISPATCHER
        # D2 started on the dispatcher that took the lead, not on a worker.
        assert threads["D2"].startswith(DISPATCHER + "-")
        relay = relay_of(server)
        assert relay.handovers >= 1
        # Counted where an operator looks: the transport's statistics, admin stats, metrics.
        handovers = server.statistics().transport.handovers
        assert handovers == relay.handovers
        stats = client.admin(server.endpoint, "stats", timeout=WAIT)
        assert stats["transport"]["handovers"] == handovers
        registry = registry_for(ServerCollector(server), process=False)
        metric = registry.get_sample_value("rda_handler_handovers_total", {"server": "HANDOVER"})
        assert metric == handovers
        # The thread that ran the long handler stands by again or ends: a leader and one
        # standby remain.
        wait_until(lambda: len(relay.threads()) == 2)
    finally:
        gate.release.set()
        client.close()
        server.stop()


@pytest.mark.timeout(120)
def test_heartbeats_and_other_devices_flow_while_a_handler_blocks() -> None:
    # Heartbeats on a fake clock (1 s interval, 10 s timeout) in both transports: the test is
    # about the server still hearing and answering while a handler holds the dispatcher that
    # started it, not about the wall clock, where a descheduled thread would look silent. The
    # hand-over itself keeps real time (the standby's tick), as in production.
    clock = FakeClock(1000.0)
    gate = Gate()
    server, client = start(gate, heartbeat_clock=clock)
    try:
        slow = client.access_point("D1", "P").get_async(selector="block", timeout=60.0)
        assert gate.started_event("D1").wait(WAIT)
        assert gate.calls[0][2] == DISPATCHER  # it holds a dispatcher: what the hand-over is for
        # 24 s of nothing but heartbeats, in 3 s steps. Each step waits until each side has
        # heard from the other again (a message drained with the time of the step before is
        # at most 6 s old at the next check: under the timeout). Without the hand-over the
        # blocked server would neither send nor read, and the client would drop it.
        for _ in range(8):
            to_client = client.statistics().transport.messages_in
            to_server = server_transport(server).messages_in
            clock.advance(3.0)
            wait_until(
                lambda: client.statistics().transport.messages_in > to_client,  # noqa: B023
                "the client to hear the server's heartbeat",
            )
            wait_until(
                lambda: server_transport(server).messages_in > to_server,  # noqa: B023
                "the server to hear the client's heartbeat",
            )
        assert client.statistics().transport.heartbeat_timeouts == 0
        assert server_transport(server).heartbeat_timeouts == 0
        assert client.statistics().reconnects == 0
        assert server_transport(server).handovers == 1
        # Other devices are answered meanwhile, and the blocked one completes when released.
        other = client.access_point("D2", "P")
        for _ in range(3):
            assert other.get(timeout=WAIT).data["value"] == 1.0
        assert not slow.done()
        gate.release.set()
        assert slow.result(WAIT).data["value"] == 1.0
        assert client.statistics().reconnects == 0
    finally:
        gate.release.set()
        client.close()
        server.stop()


def server_transport(server: Server) -> ServerTransportStatistics:
    stats = server.statistics().transport
    assert stats is not None
    return stats


def test_the_workers_bound_and_the_overflow_policy_hold_with_inline_handlers() -> None:
    gate = Gate()
    server, client = start(gate, workers=2, queue_limit=2)
    scheduler = server._scheduler
    assert scheduler is not None
    try:
        blocked = []
        for device in ("D1", "D2"):
            ap = client.access_point(device, "P")
            blocked.append(ap.get_async(selector="block", timeout=WAIT))
            assert gate.started_event(device).wait(WAIT)
        # Both places are taken (two inline handlers, handed over): D3 waits in the queue.
        third = client.access_point("D3", "P").get_async(selector="x", timeout=WAIT)
        # D1 holds its running handler and takes queue_limit=2 more; the third is refused.
        d1 = client.access_point("D1", "P")
        more = [d1.get_async(selector=f"S{i}", timeout=WAIT) for i in range(3)]
        with pytest.raises(OverloadError):
            more[2].result(WAIT)
        # The overload answer came after D3's request was taken in (one connection, in order).
        assert scheduler.queue_depth("D3") == 1
        stats = scheduler.statistics()
        assert stats.running == 2 and stats.rejected == 1
        assert not third.done()
        gate.release.set()
        for future in [*blocked, third, *more[:2]]:
            assert future.result(WAIT).data["value"] == 1.0
        assert gate.most == 2
    finally:
        gate.release.set()
        client.close()
        server.stop()


def test_stop_is_bounded_with_a_handler_stuck_in_user_code(no_thread_leak: None) -> None:
    gate = Gate()
    server, client = start(gate)
    stuck: list[threading.Thread] = []
    try:
        client.access_point("D1", "P").get_async(selector="block", timeout=WAIT)
        assert gate.started_event("D1").wait(WAIT)
        stuck = [t for t in relay_of(server).threads() if t.name == DISPATCHER]
        assert len(stuck) == 1
        client.close()
        began = time.monotonic()
        server.stop(timeout=2.0)
        # Bounded: the standby led the shutdown; the stuck thread was not waited for.
        assert time.monotonic() - began < WAIT
        assert stuck[0].is_alive()
        assert relay_of(server).finished.is_set()  # sockets closed, by the new leader
        assert not [t for t in relay_of(server).threads() if t is not stuck[0]]
    finally:
        gate.release.set()
        client.close()
        server.stop()
    # Released, the stuck thread finds the transport closed and ends.
    stuck[0].join(WAIT)
    assert not stuck[0].is_alive()


def test_without_a_standby_only_declared_handlers_run_on_the_dispatcher() -> None:
    gate = Gate()
    builder = ServerBuilder("NOSTANDBY").request_reply(gate).devices("*").directory(None)
    server = builder.handover_after(0).inline_properties("FAST/*").build().start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))
    try:
        assert client.access_point("D1", "P").get(timeout=WAIT).data["value"] == 1.0
        assert client.access_point("FAST", "P").get(timeout=WAIT).data["value"] == 1.0
        assert [t.name for t in relay_of(server).threads()] == [DISPATCHER]
        # Nothing would dispatch while an undeclared handler blocked: those go to workers.
        assert gate.calls[0][2].startswith("rda-server-NOSTANDBY-")
        assert gate.calls[1][2] == DISPATCHER
        assert server.settings()["inline_handlers"] == ["FAST/*"]
    finally:
        client.close()
        server.stop()


def test_a_quiet_server_parks_its_standby_and_wakes_it_for_the_next_request() -> None:
    gate = Gate()
    server, client = start(gate)
    relay = relay_of(server)
    try:
        assert client.access_point("D1", "P").get(timeout=WAIT).data["value"] == 1.0
        wait_until(lambda: relay._parked)  # about 200 ticks of 1 ms without a request
        slow = client.access_point("D1", "P").get_async(selector="block", timeout=WAIT)
        assert gate.started_event("D1").wait(WAIT)
        # The parked standby was woken by the request and takes over: D2 is answered.
        assert client.access_point("D2", "P").get(timeout=WAIT).data["value"] == 1.0
        gate.release.set()
        assert slow.result(WAIT).data["value"] == 1.0
    finally:
        gate.release.set()
        client.close()
        server.stop()
