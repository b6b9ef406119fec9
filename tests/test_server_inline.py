"""Inline handlers (``ServerBuilder.inline_handlers``, on by default): a get or set starts on
the transport's dispatcher when its device group is idle; per-group FIFO and the admin group
still hold; ``blocking`` declarations send a property to a worker always. What happens when
such a handler takes long (the standby takes the lead) is in test_server_handover.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import rda.admin
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.scheduler import GroupTaskScheduler
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.testing import wait_until

WAIT = 10.0


# -- the scheduler's inline path ---------------------------------------------------------------


@pytest.fixture
def scheduler() -> Iterator[GroupTaskScheduler]:
    sched = GroupTaskScheduler(workers=2, name="inline-test")
    yield sched
    sched.close()


def test_an_idle_group_runs_inline_in_the_calling_thread(scheduler: GroupTaskScheduler) -> None:
    ran: list[str] = []
    assert scheduler.run_inline("D", lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]
    stats = scheduler.statistics()
    assert (stats.executed, stats.running, stats.groups) == (1, 0, 0)


def test_a_busy_group_is_not_run_inline_and_keeps_its_order(
    scheduler: GroupTaskScheduler,
) -> None:
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def blocker() -> None:
        started.set()
        assert release.wait(WAIT)
        order.append("first")

    assert scheduler.submit("D", blocker)
    assert started.wait(WAIT)
    assert not scheduler.run_inline("D", lambda: order.append("inline"))  # nothing ran
    assert scheduler.submit("D", lambda: order.append("second"))
    assert scheduler.run_inline("OTHER", lambda: order.append("other"))  # other groups may
    release.set()
    wait_until(lambda: len(order) == 3)
    assert order == ["other", "first", "second"]


def test_a_task_submitted_while_an_inline_one_runs_waits_for_it(
    scheduler: GroupTaskScheduler,
) -> None:
    order: list[tuple[str, str]] = []
    done = threading.Event()

    def later() -> None:
        order.append(("later", threading.current_thread().name))
        done.set()

    def inline() -> None:
        assert scheduler.submit("D", later)  # arrives while the group runs inline
        # Then a task of another group. Ready groups are served in order, so a worker that
        # wrongly took `later` would have taken it first: once the other task has run,
        # `later` had its chance (and its place: the inline task holds one of the two).
        assert scheduler.submit("OTHER", lambda: order.append(("other", "")))
        wait_until(lambda: ("other", "") in order, "the other group's task to run")
        order.append(("inline", threading.current_thread().name))

    assert scheduler.run_inline("D", inline)
    assert done.wait(WAIT)
    assert [what for what, _ in order] == ["other", "inline", "later"]
    assert order[2][1].startswith("inline-test")  # a worker ran it after the inline task


def test_a_failing_inline_task_is_counted_and_the_group_freed(
    scheduler: GroupTaskScheduler,
) -> None:
    def boom() -> None:
        raise RuntimeError("handler bug")

    assert scheduler.run_inline("D", boom)
    assert scheduler.statistics().failed == 1
    assert scheduler.run_inline("D", lambda: None)


def test_a_closed_scheduler_runs_nothing_inline() -> None:
    sched = GroupTaskScheduler(workers=1)
    sched.close()
    ran: list[int] = []
    assert not sched.run_inline("D", lambda: ran.append(1))
    assert ran == []


# -- end to end over tcp -------------------------------------------------------------------------


class ThreadRecorder(RequestReplyCallback):
    def __init__(self) -> None:
        self.threads: list[str] = []
        self.order: list[str] = []

    def get(self, request: GetRequest) -> None:
        self.threads.append(threading.current_thread().name)
        self.order.append(request.selector or "")
        request.complete(Data(value=1.0))

    def set(self, request: SetRequest) -> None:
        self.threads.append(threading.current_thread().name)
        request.complete()


def start(inline: bool) -> tuple[Server, ClientService, ThreadRecorder]:
    handler = ThreadRecorder()
    builder = (
        ServerBuilder("Inline")
        .request_reply(handler)
        .devices("D1", "D2")
        .directory(None)
        .workers(2)
    )
    if not inline:
        builder.inline_handlers(False)
    server = rda.admin.install(builder).build().start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))
    return server, client, handler


@pytest.mark.parametrize("inline", [True, False])
def test_gets_and_sets_run_on_the_dispatcher_only_when_inline(inline: bool) -> None:
    server, client, handler = start(inline)
    try:
        assert client.access_point("D1", "P").get().data["value"] == 1.0
        client.access_point("D1", "P").set(Data(value=2.0))
        # The dispatcher threads are rda-server-dispatcher, -1, -2 ... (one leads at a time).
        expected = "rda-server-dispatcher" if inline else "rda-server-Inline-"
        assert len(handler.threads) == 2
        assert all(name.startswith(expected) for name in handler.threads), handler.threads
        assert server.settings()["inline_handlers"] is inline
    finally:
        client.close()
        server.stop()


def test_inline_keeps_per_device_fifo_and_the_admin_group_independent() -> None:
    server, client, handler = start(True)
    scheduler = server._scheduler
    assert scheduler is not None
    started, release = threading.Event(), threading.Event()

    def pin() -> None:
        started.set()
        assert release.wait(WAIT)

    try:
        assert scheduler.submit("D1", pin)  # D1 busy on a worker
        assert started.wait(WAIT)
        ap = client.access_point("D1", "P")
        futures: list[Any] = [ap.get_async(selector=f"S{i}") for i in range(3)]
        # D2 is idle: inline, answered although D1 is busy.
        assert client.access_point("D2", "P").get().data["value"] == 1.0
        assert handler.threads[0].startswith("rda-server-dispatcher")
        # Admin requests are never inlined: answered by a worker while D1 stays busy.
        assert client.admin(server.endpoint, "ping", timeout=WAIT, echo="x")["echo"] == "x"
        assert not any(f.done() for f in futures)
        release.set()
        for f in futures:
            assert f.result(WAIT).data["value"] == 1.0
        assert handler.order == ["", "S0", "S1", "S2"]  # D2's, then D1's in arrival order
        assert all(t.startswith("rda-server-Inline-") for t in handler.threads[1:])
    finally:
        release.set()
        client.close()
        server.stop()


# -- some properties only (inline_properties, Device blocking=False) ---------------------------


def test_inline_properties_run_only_the_matching_device_properties_inline() -> None:
    handler = ThreadRecorder()
    server = (
        ServerBuilder("Some")
        .request_reply(handler)
        .devices("PS1", "BPM1")
        .directory(None)
        .inline_handlers(False)
        .inline_properties("PS*/Acquisition")
        .build()
        .start()
    )
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))
    try:
        client.access_point("PS1", "Acquisition").get()
        client.access_point("PS1", "Setting").get()
        client.access_point("BPM1", "Acquisition").get()
        client.access_point("PS1", "Acquisition").set(Data(value=1.0))
        on_dispatcher = [name == "rda-server-dispatcher" for name in handler.threads]
        assert on_dispatcher == [True, False, False, True]
        assert server.settings()["inline_handlers"] == ["PS*/Acquisition"]
    finally:
        client.close()
        server.stop()


def test_an_inline_property_pattern_needs_a_device_and_a_property() -> None:
    with pytest.raises(ValueError, match="DEVICE/PROPERTY"):
        ServerBuilder("Bad").inline_properties("Acquisition")


class Cached(Device):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    @Device.property("Cached", blocking=False)
    def cached(self, request: GetRequest) -> Data:
        self.threads.append(threading.current_thread().name)
        return Data(value=1.0)

    @Device.property("Hardware", blocking=True)
    def hardware(self, request: GetRequest) -> Data:
        self.threads.append(threading.current_thread().name)
        return Data(value=2.0)


@pytest.mark.parametrize("inline", [True, False])
def test_declared_blocking_runs_on_a_worker_and_declared_non_blocking_inline(
    inline: bool,
) -> None:
    # A device name with glob characters matches only itself.
    device = Cached()
    builder = ServerBuilder("Dev").device("PS[1]*", device).directory(None)
    server = builder.inline_handlers(inline).build().start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))
    try:
        assert client.access_point("PS[1]*", "Cached").get().data["value"] == 1.0
        assert client.access_point("PS[1]*", "Hardware").get().data["value"] == 2.0
        assert device.threads[0] == "rda-server-dispatcher"
        assert device.threads[1].startswith("rda-server-Dev-")
        settings = server.settings()
        assert settings["inline_handlers"] == (True if inline else ["PS[[]1][*]/Cached"])
        assert settings["blocking_properties"] == ["PS[[]1][*]/Hardware"]
    finally:
        client.close()
        server.stop()


def test_blocking_properties_always_run_on_a_worker() -> None:
    handler = ThreadRecorder()
    server = (
        ServerBuilder("Blk")
        .request_reply(handler)
        .devices("PS1", "BPM1")
        .directory(None)
        .blocking_properties("BPM*/*")
        .build()
        .start()
    )
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))
    try:
        client.access_point("PS1", "Acquisition").get()
        client.access_point("BPM1", "Acquisition").get()
        client.access_point("BPM1", "Acquisition").set(Data(value=1.0))
        on_dispatcher = [name.startswith("rda-server-dispatcher") for name in handler.threads]
        assert on_dispatcher == [True, False, False]
        assert server.settings()["blocking_properties"] == ["BPM*/*"]
    finally:
        client.close()
        server.stop()


# -- notifying from an inline handler while another thread publishes ------------------------


class _NotifyOnSet(RequestReplyCallback):
    server: Server | None = None

    def get(self, request: GetRequest) -> None:
        request.complete(Data(v=1.0))

    def set(self, request: SetRequest) -> None:
        assert self.server is not None
        for source in self.server.subscriptions():
            source.notify(Data(v=2.0))
        request.complete()


@pytest.mark.timeout(60)
def test_a_set_that_notifies_on_the_dispatcher_never_waits_for_a_blocked_publisher() -> None:
    # A publisher that found the dispatcher's mailbox full used to wait for room while it held
    # the source's ordering lock; the inline set handler, on the dispatcher, then waited for
    # that lock: neither moved again (every set timed out). A 4-message mailbox and five
    # subscribers that never read fill it at once. Publishers now wait for room before they
    # take the lock (ServerTransport.wait_for_room) and publish never blocks.
    from dataclasses import replace

    from rda.transport.zmq_server import ZmqServerTransport

    handler = _NotifyOnSet()

    def transport(h: Any, settings: Any, info: dict[str, Any]) -> ZmqServerTransport:
        return ZmqServerTransport("tcp://127.0.0.1:0", h, replace(settings, send_hwm=2), info)

    server = (
        ServerBuilder("NOTIFY")
        .request_reply(handler)
        .devices("*")
        .directory(None)
        .transport(transport)
        .build()
    )
    handler.server = server
    server.start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=2))
    stop = threading.Event()
    published = [0]

    def publish() -> None:
        while not stop.is_set():
            for source in server.subscriptions():
                source.notify(Data(v=3.0))
                published[0] += 1

    publisher = threading.Thread(target=publish, name="test-publisher")
    try:
        subs = [client.access_point("D", "P").subscribe(queue_size=2) for _ in range(5)]
        for sub in subs:
            assert sub.poll(WAIT) is not None
        publisher.start()
        wait_until(lambda: published[0] > 1000)
        ap = client.access_point("D", "P")
        for _ in range(50):
            ap.set(Data(v=1.0), timeout=WAIT)  # a TimeoutError here is the deadlock
    finally:
        stop.set()
        if publisher.is_alive():
            publisher.join(WAIT)
        client.close()
        server.stop()
    assert not publisher.is_alive()
