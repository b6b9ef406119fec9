"""Server runtime logic without a network: a recording transport and a fake clock.

The test thread plays the transport's dispatcher (it calls ``on_message`` etc. directly), so
every reply the server sends is captured and decoded with the real wire codecs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from rda.business import driver
from rda.business.common import AcquiredData
from rda.business.server import runner as runner_module
from rda.business.server import subscriptions as subscriptions_module
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import (
    GetRequest,
    RequestReplyCallback,
    SetRequest,
    SubscriptionRequest,
)
from rda.business.server.subscriptions import (
    SubscriptionCallback,
    SubscriptionSource,
    UnsubscribeRequest,
)
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError
from rda.serialization.header import DataContext, Header, HeaderFlags, RequestType, UpdateType
from rda.serialization.message import BodyKind, Message
from rda.testing import wait_until
from rda.transport.api import (
    Buffer,
    PeerStatistics,
    ServerHandler,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.protocol import Incoming, Kind, decode_frames, encode_message, join_tail

PEER = b"\x00peer-1"
PEER2 = b"\x00peer-2"


class Clock:
    """Minimal fake monotonic clock with the ``on_advance`` hook the server uses."""

    def __init__(self) -> None:
        self.now = 100.0
        self._listeners: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for listener in list(self._listeners):
            listener()

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)


class RecordingTransport:
    """A ServerTransport that decodes and records what the server sends."""

    def __init__(self, handler: ServerHandler) -> None:
        self.peer_stats: dict[bytes, PeerStatistics] = {}
        self.handler = handler
        self.sent: list[tuple[bytes, Message]] = []
        self.publishes = 0
        self.closed = False
        self._cond = threading.Condition()

    @property
    def hands_over(self) -> bool:
        return False

    @property
    def endpoint(self) -> str:
        return "memory://recording"

    def start(self) -> None:
        pass

    def _record(self, peer: bytes, frames: Sequence[Buffer]) -> None:
        event = decode_frames([bytes(f) for f in frames], from_server=True)
        assert isinstance(event, Incoming)
        with self._cond:
            self.sent.append((peer, event.message))
            self._cond.notify_all()

    def send(self, peer: bytes, frames: Sequence[Buffer], conflate_key: int | None = None) -> None:
        self._record(peer, frames)

    def publish(
        self,
        targets: Sequence[tuple[bytes, int, Buffer]],
        tail: Sequence[Buffer],
        conflatable: bool = True,
    ) -> None:
        self.publishes += 1
        for peer, _, header in targets:
            self._record(peer, join_tail(header, tail))

    def wait_for_room(self) -> None:
        pass  # records at once: never full

    def disconnect(self, peer: bytes) -> None:
        self.handler.on_peer_disconnected(peer, "closed locally")

    def close(self, timeout: float | None = None) -> None:
        self.closed = True

    def statistics(self) -> ServerTransportStatistics:
        return ServerTransportStatistics()

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        return self.peer_stats

    def wait(self, count: int, timeout: float = 10.0) -> list[tuple[bytes, Message]]:
        """Wait (bounded) until at least ``count`` messages were sent; return them all."""
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.sent) >= count, timeout), (
                f"expected {count} messages, got {len(self.sent)}: {self.sent}"
            )
            return list(self.sent)


def counted(requests: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The (type, outcome) pairs that moved: every pair exists from the start at zero."""
    return {key: n for key, n in requests.items() if n}


def request(
    rtype: RequestType,
    rid: int,
    device: str = "DEV",
    prop: str = "Prop",
    selector: str = "",
    data: Data | None = None,
    timeout_ms: int | None = 5000,
    filters: Data | None = None,
) -> Message:
    ctx = Data()
    if timeout_ms is not None:
        ctx["timeout_ms"] = timeout_ms
    if filters is not None:
        ctx["filters"] = filters
    body: list[tuple[BodyKind, Buffer]] = []
    if data is not None:
        body.append((BodyKind.DATA, binary.encode(data)))
    if rtype is not RequestType.UNSUBSCRIBE:
        body.append((BodyKind.REQUEST_CONTEXT, binary.encode(ctx)))
    frames = encode_message(Kind.REQUEST, Header(rtype, rid, device, prop, selector), body)
    event = decode_frames([bytes(f) for f in frames], from_server=False)
    assert isinstance(event, Incoming)
    return event.message


class Harness:
    def __init__(self, server: Server, transport: RecordingTransport, clock: Clock) -> None:
        self.server = server
        self.transport = transport
        self.clock = clock

    def send(self, message: Message, peer: bytes = PEER) -> None:
        self.transport.handler.on_message(peer, message)

    def call(self, message: Message, peer: bytes = PEER) -> Message:
        """Send and wait for the next message the server sends."""
        n = len(self.transport.sent)
        self.send(message, peer)
        return self.transport.wait(n + 1)[n][1]


Factory = Callable[..., Harness]


@pytest.fixture
def make() -> Iterator[Factory]:
    servers: list[Server] = []

    def factory(builder: ServerBuilder | None = None, **kw: Any) -> Harness:
        clock = Clock()
        holder: list[RecordingTransport] = []

        def transport(
            handler: ServerHandler, settings: TransportSettings, info: dict[str, Any]
        ) -> RecordingTransport:
            holder.append(RecordingTransport(handler))
            return holder[0]

        b = builder if builder is not None else ServerBuilder("Test")
        for name, value in kw.items():
            getattr(b, name)(value)
        server = b.directory(None).transport(transport).clock(clock).build()
        servers.append(server)
        server.start()
        holder[0].handler.on_peer_connected(PEER, {"application": "test", "pid": 42})
        holder[0].handler.on_peer_connected(PEER2, {"application": "other"})
        return Harness(server, holder[0], clock)

    before = set(threading.enumerate())
    yield factory
    for server in servers:
        server.stop()
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


class Echo(RequestReplyCallback):
    """Get answers the last set value; records the requests it saw."""

    def __init__(self) -> None:
        self.value = 1.0
        self.requests: list[GetRequest | SetRequest] = []

    def get(self, request: GetRequest) -> None:
        self.requests.append(request)
        if request.device == "MISSING":
            raise NoSuchDeviceError("MISSING: no such device")
        if request.property == "Boom":
            raise ValueError("boom in the handler")
        ctx = DataContext("CPS.USER.MD1", 11, 22, request.selector)
        request.complete(AcquiredData(Data(value=self.value), ctx))

    def set(self, request: SetRequest) -> None:
        self.requests.append(request)
        self.value = float(request.data["value"])
        request.complete()


def test_get_reply_carries_data_context_and_is_counted(make: Factory) -> None:
    h = make(request_reply=Echo())
    reply = h.call(request(RequestType.GET, 7, selector="CPS.USER.ALL"))
    assert reply.header.request_type is RequestType.REPLY
    assert (reply.header.id, reply.header.device, reply.header.selector) == (
        7,
        "DEV",
        "CPS.USER.ALL",
    )
    assert reply.data == Data(value=1.0)
    assert reply.context == DataContext("CPS.USER.MD1", 11, 22, "CPS.USER.ALL")
    assert reply.seq == 0
    stats = h.server.statistics()
    assert counted(stats.requests) == {("get", "ok"): 1}
    assert stats.durations["get"].count == 1


def test_set_decodes_data_and_replies_without_body(make: Factory) -> None:
    echo = Echo()
    h = make(request_reply=echo)
    reply = h.call(request(RequestType.SET, 3, data=Data(value=4.5)))
    assert reply.header.request_type is RequestType.REPLY
    assert reply.body == ()
    assert echo.value == 4.5
    assert echo.requests[0].client.application == "test"
    assert echo.requests[0].client.pid == 42


@pytest.mark.parametrize(
    ("device", "prop", "type_name", "text", "outcome", "faults"),
    [
        ("DEV", "Boom", "ValueError", "boom in the handler", "handler_error", 1),
        # A client's typo is its outcome, not a server fault (issue 25).
        ("MISSING", "Prop", "NoSuchDeviceError", "MISSING: no such device", "not_found", 0),
    ],
)
def test_handler_exception_becomes_exception_reply(
    make: Factory, device: str, prop: str, type_name: str, text: str, outcome: str, faults: int
) -> None:
    h = make(request_reply=Echo())
    reply = h.call(request(RequestType.GET, 1, device, prop))
    assert reply.header.request_type is RequestType.EXCEPTION
    assert reply.exception == (type_name, text)
    assert h.server.statistics().handler_errors == faults
    assert counted(h.server.statistics().requests) == {("get", outcome): 1}


def test_default_callback_answers_no_such_device(make: Factory) -> None:
    h = make()
    reply = h.call(request(RequestType.SET, 1, data=Data(value=1)))
    assert reply.exception == ("NoSuchDeviceError", "DEV/Prop: no set handler")


class Later(RequestReplyCallback):
    """Keeps requests for the test to answer (or not)."""

    def __init__(self) -> None:
        self.pending: list[GetRequest | SetRequest] = []
        self.arrived = threading.Semaphore(0)

    def get(self, request: GetRequest) -> None:
        self.pending.append(request)
        self.arrived.release()

    def set(self, request: SetRequest) -> None:
        self.pending.append(request)
        self.arrived.release()


def test_complete_from_another_thread_later(make: Factory) -> None:
    later = Later()
    h = make(request_reply=later)
    h.send(request(RequestType.GET, 9))
    assert later.arrived.acquire(timeout=10)
    assert h.transport.sent == []
    worker = threading.Thread(target=later.pending[0].complete, args=(Data(x=3),))
    worker.start()
    worker.join()
    reply = h.transport.wait(1)[0][1]
    assert reply.data == Data(x=3)
    # Exactly once: a second answer is ignored and counted.
    later.pending[0].fail("too late")
    assert len(h.transport.sent) == 1
    assert h.server.statistics().late_completions == 1


def test_fail_with_a_message_reaches_the_client(make: Factory) -> None:
    later = Later()
    h = make(request_reply=later)
    h.send(request(RequestType.SET, 2, data=Data(v=1)))
    assert later.arrived.acquire(timeout=10)
    later.pending[0].fail("power supply tripped")
    reply = h.transport.wait(1)[0][1]
    assert reply.exception == ("ServerError", "power supply tripped")


def test_never_completed_request_times_out_at_the_client_deadline(make: Factory) -> None:
    later = Later()
    h = make(request_reply=later)
    h.send(request(RequestType.GET, 5, timeout_ms=2000))
    assert later.arrived.acquire(timeout=10)
    h.clock.advance(1.9)
    assert h.server.check_deadlines() == 0
    assert h.transport.sent == []
    h.clock.advance(0.2)  # the watcher wakes on advance; check_deadlines races it harmlessly
    h.server.check_deadlines()
    reply = h.transport.wait(1)[0][1]
    assert reply.header.request_type is RequestType.EXCEPTION
    assert reply.exception is not None
    assert reply.exception[0] == "TimeoutError"
    assert "DEV/Prop" in reply.exception[1]
    assert counted(h.server.statistics().requests) == {("get", "timeout"): 1}
    later.pending[0].complete(Data(x=1))  # too late: ignored
    assert len(h.transport.sent) == 1
    assert h.server.statistics().late_completions == 1


class Overrun(RequestReplyCallback):
    """A synchronous handler that runs past the deadline (the fake clock moves while it runs)
    and then answers: completes a get, raises on a set."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.clock: Clock | None = None  # the server's, once built
        self.done = threading.Semaphore(0)

    def get(self, request: GetRequest) -> None:
        assert self.clock is not None
        self.clock.advance(self.seconds)
        request.complete(Data(x=1))
        self.done.release()

    def set(self, request: SetRequest) -> None:
        assert self.clock is not None
        self.clock.advance(self.seconds)
        self.done.release()
        raise RuntimeError("the supply answered too late")


def test_handler_past_the_client_deadline_counts_timeout_and_sends_nothing(
    make: Factory,
) -> None:
    """Issue 27 (4): the watcher was armed only after a synchronous handler returned, so a get
    whose handler ran past the client's timeout was sent late and counted ``get:ok``."""
    overrun = Overrun(2.5)
    h = make(request_reply=overrun)
    overrun.clock = h.clock
    h.send(request(RequestType.GET, 7, timeout_ms=2000))
    assert overrun.done.acquire(timeout=10)
    h.send(request(RequestType.SET, 8, data=Data(v=1), timeout_ms=2000))
    assert overrun.done.acquire(timeout=10)
    wait_until(lambda: sum(h.server.statistics().requests.values()) >= 2, "both requests counted")
    stats = h.server.statistics()
    assert counted(stats.requests) == {("get", "timeout"): 1, ("set", "timeout"): 1}
    assert stats.late_completions == 2
    assert h.transport.sent == []  # the client gave up at its deadline: no reply after it
    # On time, the same handler is answered and counted ok.
    overrun.seconds = 0.5
    assert h.call(request(RequestType.GET, 9, timeout_ms=2000)).data == Data(x=1)
    assert h.server.statistics().requests[("get", "ok")] == 1


def test_handler_past_the_default_deadline_tells_a_client_without_one(make: Factory) -> None:
    """A request without a deadline of its own (the server's default applies) is still
    waiting: it gets the TimeoutError the watcher would have sent, not the late value."""
    overrun = Overrun(60.0)
    h = make(request_reply=overrun)
    overrun.clock = h.clock
    reply = h.call(request(RequestType.GET, 3, timeout_ms=None))
    assert reply.exception is not None and reply.exception[0] == "TimeoutError"
    assert counted(h.server.statistics().requests) == {("get", "timeout"): 1}
    assert h.server.statistics().late_completions == 1


def test_completed_request_leaves_no_deadline_behind(make: Factory) -> None:
    later = Later()
    h = make(request_reply=later)
    h.send(request(RequestType.GET, 5, timeout_ms=1000))
    assert later.arrived.acquire(timeout=10)
    later.pending[0].complete(Data(x=1))
    h.transport.wait(1)
    h.clock.advance(5)
    assert h.server.check_deadlines() == 0
    assert len(h.transport.sent) == 1


class Blocking(RequestReplyCallback):
    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls: list[str] = []

    def get(self, request: GetRequest) -> None:
        self.calls.append(request.device)
        if request.device == "SLOW":
            self.started.set()
            assert self.release.wait(10)
        request.complete(Data(device=request.device))


def test_overload_replies_overload_error_and_other_devices_still_answer(make: Factory) -> None:
    blocking = Blocking()
    h = make(request_reply=blocking, workers=2, queue_limit=1)
    try:
        h.send(request(RequestType.GET, 1, "SLOW"))
        assert blocking.started.wait(10)
        h.send(request(RequestType.GET, 2, "SLOW"))  # waits in the queue (limit 1)
        reply = h.call(request(RequestType.GET, 3, "SLOW"))  # overflows
        assert reply.header.id == 3
        assert reply.exception is not None
        assert reply.exception[0] == "OverloadError"
        assert "SLOW" in reply.exception[1]
        other = h.call(request(RequestType.GET, 4, "FAST"))
        assert other.data == Data(device="FAST")
    finally:
        blocking.release.set()
    replies = {m.header.id: m for _, m in h.transport.wait(4)}
    assert replies[1].data == Data(device="SLOW") and replies[2].data == Data(device="SLOW")
    assert h.server.statistics().requests[("get", "overload")] == 1


def test_request_that_waited_past_its_deadline_is_not_run(make: Factory) -> None:
    blocking = Blocking()
    h = make(request_reply=blocking, workers=1)
    h.send(request(RequestType.GET, 1, "SLOW", timeout_ms=60_000))
    assert blocking.started.wait(10)
    h.send(request(RequestType.GET, 2, "SLOW", timeout_ms=1000))
    h.clock.advance(2)
    blocking.release.set()
    replies = {m.header.id: m for _, m in h.transport.wait(2)}
    assert replies[2].exception is not None and replies[2].exception[0] == "TimeoutError"
    assert blocking.calls == ["SLOW"]


def test_admin_answers_in_its_own_group_while_a_device_is_blocked(make: Factory) -> None:
    blocking = Blocking()
    seen: list[tuple[str, Data]] = []

    def admin(server: Server, command: str, args: Data, client: Any) -> Data:
        seen.append((command, args))
        return Data(pong=server.name, clients=len(server.clients()))

    h = make(request_reply=blocking, workers=2, admin_handler=admin)
    try:
        h.send(request(RequestType.GET, 1, "SLOW"))
        assert blocking.started.wait(10)
        frames = encode_message(
            Kind.REQUEST,
            Header(RequestType.ADMIN, 77, "ping"),
            [(BodyKind.DATA, binary.encode(Data(n=1)))],
        )
        event = decode_frames(frames, from_server=False)
        assert isinstance(event, Incoming)
        reply = h.call(event.message)
        assert reply.header.request_type is RequestType.REPLY and reply.header.id == 77
        assert reply.data == Data(pong="Test", clients=2)
        assert seen == [("ping", Data(n=1))]
    finally:
        blocking.release.set()
    h.transport.wait(2)
    assert h.server.statistics().requests[("admin", "ok")] == 1


def test_admin_without_hook_is_no_such_device(make: Factory) -> None:
    h = make()
    event = decode_frames(
        encode_message(Kind.REQUEST, Header(RequestType.ADMIN, 1, "stats")), from_server=False
    )
    assert isinstance(event, Incoming)
    reply = h.call(event.message)
    assert reply.exception == ("NoSuchDeviceError", "no admin interface")


def test_bad_request_context_is_a_decode_error_reply(make: Factory) -> None:
    h = make(request_reply=Echo())
    frames = encode_message(
        Kind.REQUEST,
        Header(RequestType.GET, 1, "DEV", "Prop"),
        [(BodyKind.REQUEST_CONTEXT, b"\xff\xfe garbage")],
    )
    event = decode_frames(frames, from_server=False)
    assert isinstance(event, Incoming)
    reply = h.call(event.message)
    assert reply.exception is not None and reply.exception[0] == "DecodeError"


def test_server_only_kinds_from_a_client_are_a_protocol_error(make: Factory) -> None:
    h = make()
    event = decode_frames(
        encode_message(Kind.REQUEST, Header(RequestType.NOTIFICATION_DATA, 4, "D", "P")),
        from_server=False,
    )
    assert isinstance(event, Incoming)
    reply = h.call(event.message)
    assert reply.exception is not None and reply.exception[0] == "ProtocolError"


class Subs(SubscriptionCallback):
    def __init__(self, reject: bool = False) -> None:
        self.reject = reject
        self.added: list[SubscriptionSource] = []
        self.removed: list[SubscriptionSource] = []
        self.unsubscribed: list[UnsubscribeRequest] = []
        self.events = threading.Semaphore(0)

    def subscribe(self, request: SubscriptionRequest) -> None:
        if self.reject:
            request.reject("not for you")
        else:
            request.accept()

    def unsubscribe(self, request: UnsubscribeRequest) -> None:
        self.unsubscribed.append(request)
        self.events.release()

    def source_added(self, source: SubscriptionSource) -> None:
        self.added.append(source)

    def source_removed(self, source: SubscriptionSource) -> None:
        self.removed.append(source)
        self.events.release()


def notes(h: Harness, peer: bytes | None = None) -> list[tuple[int, UpdateType, int, Any]]:
    """(subscription id, update type, seq, value) of every notification sent so far."""
    out = []
    for p, m in h.transport.sent:
        if peer is not None and p != peer:
            continue
        if m.header.request_type is RequestType.NOTIFICATION_DATA:
            assert m.data is not None
            out.append((m.header.id, m.header.update_type, m.seq, m.data["value"]))
        elif m.header.request_type is RequestType.NOTIFICATION_EXC:
            assert m.exception is not None
            out.append((m.header.id, m.header.update_type, m.seq, m.exception[0]))
    return out


def test_first_normal_immediate_sequence_per_subscriber(make: Factory) -> None:
    subs = Subs()
    h = make(request_reply=Echo(), subscription=subs)
    h.send(request(RequestType.SUBSCRIBE, 100))
    h.transport.wait(1)
    assert len(subs.added) == 1
    source = h.server.subscriptions()[0]
    assert (source.device, source.property, source.selector, source.filters) == (
        "DEV",
        "Prop",
        "",
        None,
    )
    source.notify(AcquiredData(Data(value=2.0)))
    h.transport.wait(2)
    h.send(request(RequestType.SET, 5, data=Data(value=3.0)))
    h.transport.wait(4)  # the set reply and the IMMEDIATE update
    assert notes(h) == [
        (100, UpdateType.FIRST, 1, 1.0),
        (100, UpdateType.NORMAL, 2, 2.0),
        (100, UpdateType.IMMEDIATE, 3, 3.0),
    ]
    flags = [
        m.header.flags
        for _, m in h.transport.sent
        if m.header.request_type is RequestType.NOTIFICATION_DATA
    ]
    assert flags == [HeaderFlags.NONE, HeaderFlags.CONFLATABLE, HeaderFlags.NONE]
    # A later subscriber gets its own FIRST (seq 1), alone; then both get NORMAL updates.
    h.send(request(RequestType.SUBSCRIBE, 200), PEER2)
    h.transport.wait(5)
    assert notes(h, PEER2) == [(200, UpdateType.FIRST, 1, 3.0)]
    source.notify(Data(value=4.0))
    h.transport.wait(7)
    assert notes(h, PEER)[-1] == (100, UpdateType.NORMAL, 4, 4.0)
    assert notes(h, PEER2)[-1] == (200, UpdateType.NORMAL, 2, 4.0)
    assert len(subs.added) == 1
    snap = h.server.sources()[0]
    assert snap.subscribers == 2 and snap.notifications_sent == 6


class Held(RequestReplyCallback):
    """Get reads its value at once and completes when the test says (as a handler that
    answers from another thread may)."""

    def __init__(self) -> None:
        self.value = 1.0
        self.pending: list[GetRequest] = []
        self.arrived = threading.Event()

    def get(self, request: GetRequest) -> None:
        self.pending.append(request)
        self.arrived.set()

    def set(self, request: SetRequest) -> None:
        request.complete()


def test_updates_published_while_the_first_is_prepared_are_counted_as_missed(
    make: Factory,
) -> None:
    """Found by the simulation (``--late-gets``, issue 36): an update published after the
    FIRST's get handler ran but before the FIRST went out reached neither the subscriber nor
    its gap count. Now the FIRST's successor skips their seqs: the client counts them."""
    held = Held()
    h = make(request_reply=held)
    h.send(request(RequestType.SUBSCRIBE, 100))
    assert held.arrived.wait(10), "the FIRST's get never reached the handler"
    source = h.server.subscriptions()[0]
    source.notify(AcquiredData(Data(value=2.0)))
    source.notify(AcquiredData(Data(value=3.0)))
    held.pending[0].complete(AcquiredData(Data(value=1.0)))
    h.transport.wait(1)
    source.notify(AcquiredData(Data(value=4.0)))
    h.transport.wait(2)
    assert notes(h) == [
        (100, UpdateType.FIRST, 1, 1.0),
        (100, UpdateType.NORMAL, 4, 4.0),  # seqs 2 and 3: the two published meanwhile
    ]
    # A later subscriber whose get answers at once misses nothing: seqs follow on.
    h.send(request(RequestType.SUBSCRIBE, 200), PEER2)
    assert wait_until(lambda: len(held.pending) == 2, timeout=10)
    held.pending[1].complete(AcquiredData(Data(value=4.0)))
    h.transport.wait(3)
    source.notify(AcquiredData(Data(value=5.0)))
    h.transport.wait(5)
    assert notes(h, PEER2) == [(200, UpdateType.FIRST, 1, 4.0), (200, UpdateType.NORMAL, 2, 5.0)]
    assert notes(h, PEER)[-1] == (100, UpdateType.NORMAL, 5, 5.0)


def test_immediate_updates_can_be_turned_off(make: Factory) -> None:
    h = make(request_reply=Echo(), immediate_updates=False)
    h.send(request(RequestType.SUBSCRIBE, 100))
    h.transport.wait(1)
    h.call(request(RequestType.SET, 5, data=Data(value=3.0)))
    h.server.subscriptions()[0].notify(Data(value=9.0))
    h.transport.wait(3)
    assert [n[1] for n in notes(h)] == [UpdateType.FIRST, UpdateType.NORMAL]


def test_many_subscribers_one_encoding_one_publish(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make(request_reply=Echo())
    for i in range(20):
        h.send(request(RequestType.SUBSCRIBE, 1000 + i), PEER if i % 2 else PEER2)
    h.transport.wait(20)
    assert len(h.server.subscriptions()) == 1
    encodes: list[Data] = []
    real = subscriptions_module._encode_data

    def counting(data: Data) -> list[tuple[BodyKind, Buffer]]:
        encodes.append(data)
        return real(data)

    monkeypatch.setattr(subscriptions_module, "_encode_data", counting)
    publishes = h.transport.publishes
    h.server.subscriptions()[0].notify(Data(value=5.0))
    sent = h.transport.wait(40)[20:]
    assert len(encodes) == 1
    assert h.transport.publishes == publishes + 1
    assert sorted(m.header.id for _, m in sent) == list(range(1000, 1020))
    assert {m.seq for _, m in sent} == {2}


def test_filters_and_selectors_make_distinct_sources(make: Factory) -> None:
    h = make(request_reply=Echo())
    h.send(request(RequestType.SUBSCRIBE, 1, selector="A"))
    h.send(request(RequestType.SUBSCRIBE, 2, selector="B"))
    h.send(request(RequestType.SUBSCRIBE, 3, selector="A", filters=Data(n=1)))
    h.send(request(RequestType.SUBSCRIBE, 4, selector="A", filters=Data(n=1)), PEER2)
    h.transport.wait(4)
    snaps = sorted(h.server.sources(), key=lambda s: (s.selector, s.filters is not None))
    assert [(s.selector, s.filters, s.subscribers) for s in snaps] == [
        ("A", None, 1),
        ("A", {"n": 1}, 2),
        ("B", None, 1),
    ]


def test_rejected_subscription_gets_subscribe_exception(make: Factory) -> None:
    subs = Subs(reject=True)
    h = make(request_reply=Echo(), subscription=subs)
    reply = h.call(request(RequestType.SUBSCRIBE, 100))
    assert reply.header.request_type is RequestType.SUBSCRIBE_EXCEPTION
    assert reply.exception == ("SubscriptionRejected", "not for you")
    assert h.server.subscriptions() == []
    assert counted(h.server.statistics().requests) == {("subscribe", "bad_request"): 1}


def test_failing_first_update_is_a_first_notification_exc(make: Factory) -> None:
    h = make(request_reply=Echo())
    reply = h.call(request(RequestType.SUBSCRIBE, 100, prop="Boom"))
    assert reply.header.request_type is RequestType.NOTIFICATION_EXC
    assert reply.header.update_type is UpdateType.FIRST
    assert reply.exception == ("ValueError", "boom in the handler")
    assert reply.seq == 1
    # The subscription lives on: the next update reaches it.
    h.server.subscriptions()[0].notify(Data(value=1.0))
    assert notes(h)[-1] == (100, UpdateType.NORMAL, 2, 1.0)


def test_unsubscribe_removes_and_reports_source_removed(make: Factory) -> None:
    subs = Subs()
    h = make(request_reply=Echo(), subscription=subs)
    h.send(request(RequestType.SUBSCRIBE, 100))
    h.transport.wait(1)
    h.send(request(RequestType.UNSUBSCRIBE, 100))
    assert subs.events.acquire(timeout=10) and subs.events.acquire(timeout=10)
    assert [u.id for u in subs.unsubscribed] == [100]
    assert len(subs.removed) == 1 and subs.removed[0] is subs.added[0]
    assert h.server.subscriptions() == []
    subs.removed[0].notify(Data(value=1.0))  # an orphaned source is silent
    assert len(h.transport.sent) == 1


def test_disconnect_removes_subscribers_and_calls_source_removed(make: Factory) -> None:
    subs = Subs()
    h = make(request_reply=Echo(), subscription=subs)
    h.send(request(RequestType.SUBSCRIBE, 1))
    h.send(request(RequestType.SUBSCRIBE, 2, prop="Other"))
    h.send(request(RequestType.SUBSCRIBE, 3), PEER2)
    h.transport.wait(3)
    assert h.server.statistics().subscriptions == 3
    assert {c.peer: c.subscriptions for c in h.server.clients()} == {
        PEER.hex(): 2,
        PEER2.hex(): 1,
    }
    assert h.server.disconnect_client(PEER.hex())
    # PEER's two subscriptions are unsubscribed (issue 12), then "Other", which lost its only
    # subscriber, is removed: three callbacks, in that order.
    assert all(subs.events.acquire(timeout=10) for _ in range(3))
    assert [s.property for s in subs.removed] == ["Other"]
    assert [(s.property, s.subscribers) for s in h.server.sources()] == [("Prop", 1)]
    assert [c.peer for c in h.server.clients()] == [PEER2.hex()]
    assert not h.server.disconnect_client(PEER.hex())


def test_unsubscribe_overtaking_its_queued_subscribe_leaks_nothing(make: Factory) -> None:
    blocking = Blocking()
    h = make(request_reply=blocking, workers=1)
    try:
        h.send(request(RequestType.GET, 1, "SLOW"))
        assert blocking.started.wait(10)
        h.send(request(RequestType.SUBSCRIBE, 50, "SLOW"))  # queued behind the blocked get
        h.send(request(RequestType.UNSUBSCRIBE, 50, "SLOW"))  # handled before it
    finally:
        blocking.release.set()
    h.transport.wait(1)
    wait_until(lambda: h.server.statistics().scheduler.executed >= 2, "both tasks executed")
    assert h.server.subscriptions() == []
    assert notes(h) == []


def test_subscriptions_from_a_gone_peer_are_refused(make: Factory) -> None:
    h = make(request_reply=Echo())
    h.transport.handler.on_peer_disconnected(PEER2, "heartbeat timeout")
    h.send(request(RequestType.SUBSCRIBE, 1), PEER2)
    h.send(request(RequestType.GET, 2))  # same device group: runs after the subscribe
    h.transport.wait(1)
    assert h.server.subscriptions() == []


def test_stop_is_idempotent_and_reports_remaining_sources(make: Factory) -> None:
    subs = Subs()
    h = make(request_reply=Echo(), subscription=subs)
    h.send(request(RequestType.SUBSCRIBE, 1))
    h.transport.wait(1)
    h.server.stop()
    h.server.stop()
    assert h.transport.closed
    assert len(subs.removed) == 1
    assert not h.server.running


def test_introspection(make: Factory) -> None:
    b = ServerBuilder("Intro").devices("PS*", "BPM1").request_reply(Echo()).workers(3)
    h = make(b)
    assert h.server.devices() == ["PS*", "BPM1"]
    settings = h.server.settings()
    assert settings["workers"] == 3 and settings["name"] == "Intro"
    assert h.server.endpoint == "memory://recording"
    assert h.server.started_at > 0
    clients = {c.peer: c for c in h.server.clients()}
    assert clients[PEER.hex()].info == {"application": "test", "pid": 42}
    h.call(request(RequestType.GET, 1))
    stats = h.server.statistics()
    assert stats.clients == 2 and stats.scheduler.executed >= 1


def test_uptime_and_connected_for_ignore_wall_clock_steps(make: Factory) -> None:
    """A step of the wall clock (NTP, a hand-set date) changes the wall-clock stamps but not
    how long the server has run or a client has been connected: those are on the monotonic
    clock. Before, ``info``'s uptime was ``time.time() - started_at`` (0 after a step back,
    an hour too much after a step forward), found by the simulation's fault clock-step."""
    wall = [1_800_000_000.0]
    with driver.wall_clock(lambda: wall[0], lambda: round(wall[0] * 1e9)):
        h = make()
        started = h.server.started_at
        assert started == 1_800_000_000.0
        wall[0] -= 3600.0  # stepped back an hour; the monotonic clock runs on
        h.clock.advance(5.0)
        assert h.server.uptime() == 5.0
        assert {c.connected_for for c in h.server.clients()} == {5.0}
        wall[0] += 7200.0  # and forward two
        h.clock.advance(1.0)
        assert h.server.uptime() == 6.0
        assert {c.connected_for for c in h.server.clients()} == {6.0}
        assert h.server.started_at == started  # the stamp for people stays what it was


def test_start_hooks_and_metrics_port(make: Factory) -> None:
    events: list[str] = []
    b = (
        ServerBuilder("Hooks")
        .metrics_port(9999)
        .on_start(lambda s: events.append(f"start {s.name}"))
        .on_stop(lambda s: events.append(f"stop {s.name}"))
    )
    assert b.metrics_port_value == 9999
    h = make(b)
    assert events == ["start Hooks"]
    h.server.stop()
    assert events == ["start Hooks", "stop Hooks"]


def test_drop_oldest_answers_the_evicted_request_with_overload(make: Factory) -> None:
    blocking = Blocking()
    h = make(request_reply=blocking, workers=1, queue_limit=1, overflow_policy="drop_oldest")
    try:
        h.send(request(RequestType.GET, 1, "SLOW"))
        assert blocking.started.wait(10)
        h.send(request(RequestType.GET, 2, "SLOW"))
        evicted = h.call(request(RequestType.GET, 3, "SLOW"))  # pushes 2 out
        assert evicted.header.id == 2
        assert evicted.exception is not None and evicted.exception[0] == "OverloadError"
    finally:
        blocking.release.set()
    replies = {m.header.id: m for _, m in h.transport.wait(3)}
    assert replies[3].data == Data(device="SLOW")


def test_concurrent_notifiers_and_churn_keep_each_subscribers_seq_contiguous(
    make: Factory,
) -> None:
    h = make(request_reply=Echo())
    h.send(request(RequestType.SUBSCRIBE, 1))
    h.transport.wait(1)
    source = h.server.subscriptions()[0]
    stop = threading.Event()

    def notifier() -> None:
        i = 0
        while not stop.is_set() and i < 300:
            source.notify(Data(value=float(i)))
            i += 1

    threads = [threading.Thread(target=notifier) for _ in range(3)]
    for t in threads:
        t.start()
    for sub_id in range(100, 140):  # subscribers come and go meanwhile
        h.send(request(RequestType.SUBSCRIBE, sub_id), PEER2)
        if sub_id % 3 == 0:
            h.send(request(RequestType.UNSUBSCRIBE, sub_id), PEER2)
    for t in threads:
        t.join(30)
    stop.set()
    by_sub: dict[int, list[tuple[UpdateType, int]]] = {}
    for _, m in list(h.transport.sent):
        if m.header.request_type is RequestType.NOTIFICATION_DATA:
            by_sub.setdefault(m.header.id, []).append((m.header.update_type, m.seq))
    assert len(by_sub[1]) == 1 + 900
    for sub_id, updates in by_sub.items():
        assert updates[0] == (UpdateType.FIRST, 1), sub_id
        assert [seq for _, seq in updates] == list(range(1, len(updates) + 1)), sub_id


class Unencodable(RequestReplyCallback):
    def get(self, request: GetRequest) -> None:
        request.complete(AcquiredData(Data(x=1), DataContext(cycle_name="C" * 70_000)))


def test_a_reply_that_cannot_be_encoded_is_an_error_reply(make: Factory) -> None:
    h = make(request_reply=Unencodable())
    reply = h.call(request(RequestType.GET, 1))
    assert reply.header.request_type is RequestType.EXCEPTION
    assert reply.exception is not None and reply.exception[0] == "ValueError"
    assert "cycle name" in reply.exception[1]
    assert counted(h.server.statistics().requests) == {("get", "handler_error"): 1}


def test_a_failure_in_rdas_own_code_still_answers_the_client(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the runner before the handler (seen: a stale build whose Message lacked a
    slot) used to leave the client waiting for its timeout: it gets an error now, counted as
    the server's fault, and the server goes on answering."""
    h = make(request_reply=Echo())

    def broken(message: Message) -> float | None:
        raise AttributeError("'Message' object has no attribute '_request_context'")

    monkeypatch.setattr(runner_module, "client_timeout", broken)
    reply = h.call(request(RequestType.GET, 1))
    assert reply.header.request_type is RequestType.EXCEPTION
    assert reply.exception is not None
    assert reply.exception[0] == "ServerError"
    assert "DEV/Prop: the server failed before answering (AttributeError:" in reply.exception[1]
    assert counted(h.server.statistics().requests) == {("get", "handler_error"): 1}
    monkeypatch.undo()
    assert h.call(request(RequestType.GET, 2)).data == Data(value=1.0)


def test_a_first_update_that_cannot_be_encoded_arrives_as_an_error(make: Factory) -> None:
    h = make(request_reply=Unencodable())
    first = h.call(request(RequestType.SUBSCRIBE, 9))
    assert first.header.request_type is RequestType.NOTIFICATION_EXC
    assert first.header.update_type is UpdateType.FIRST and first.seq == 1
    assert first.exception is not None and "cycle name" in first.exception[1]


def test_clients_and_sources_show_what_slow_subscribers_lost(make: Factory) -> None:
    """The "why is my subscription blind?" view: per client and per source, from the
    transport's per-peer counters keyed by subscription id."""
    h = make(request_reply=Echo())
    h.send(request(RequestType.SUBSCRIBE, 1))
    h.send(request(RequestType.SUBSCRIBE, 2, prop="Other"))
    h.send(request(RequestType.SUBSCRIBE, 3), PEER2)
    h.transport.wait(3)
    h.transport.peer_stats = {
        PEER: PeerStatistics(
            queue_depth=4,
            conflated=7,
            dropped=2,
            conflated_by_key={1: 5, 2: 2},
            dropped_by_key={1: 2},
        ),
        PEER2: PeerStatistics(conflated=1, conflated_by_key={3: 1}),
    }
    clients = {c.peer: (c.queue_depth, c.conflated, c.dropped) for c in h.server.clients()}
    assert clients == {PEER.hex(): (4, 7, 2), PEER2.hex(): (0, 1, 0)}
    sources = {s.property: (s.subscribers, s.conflated, s.dropped) for s in h.server.sources()}
    # "Prop" has subscription 1 of PEER and 3 of PEER2; "Other" has subscription 2 of PEER.
    assert sources == {"Prop": (2, 6, 2), "Other": (1, 2, 0)}
