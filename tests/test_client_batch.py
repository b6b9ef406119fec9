"""Batched delivery on the client (issue 11): one drained batch, one wake-up per consumer.

Transport level: a handler with ``on_messages`` (``api.BatchClientHandler``) gets the replies
of one drained batch in one call, in order, never reordered against connection events (the
in-memory transport, where a batch can be formed deterministically, and the ZeroMQ client).
Business level: ``ClientService._on_messages`` fills each subscription's queue once per batch
and wakes a waiting ``poll`` once, with the same order, gaps and drop-oldest accounting as one
notification at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification, Subscription
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import (
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    encode_context,
)
from rda.serialization.message import BodyKind, Message, encode_exception
from rda.testing import MemoryNetwork, RecordingClientHandler, RecordingServerHandler, wait_until
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransportStatistics,
    DirectLane,
    TransportSettings,
    Waker,
    batch_receiver,
)
from rda.transport.protocol import Incoming, Kind, decode_frames, encode_message

WAIT = 10.0
ENDPOINT = "tcp://127.0.0.1:1"


# --- transport level ------------------------------------------------------------------------


class BatchRecorder(RecordingClientHandler):
    """Records each ``on_messages`` call as one batch (and the order of every event); the
    first batch can be held until ``release`` is set, stalling the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []
        self.events: list[str] = []
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()

    def on_messages(self, connection: int, messages: Sequence[Message]) -> None:
        if self.hold.is_set() and not self.release.is_set():
            self.holding.set()
            assert self.release.wait(WAIT)
        ids = [m.header.id for m in messages]

        def record() -> None:
            self.batches.append(ids)
            self.events.append(f"batch{ids}")

        self._record(record)

    def on_disconnected(self, connection: int, reason: str) -> None:
        self._record(lambda: self.events.append("disconnected"))
        super().on_disconnected(connection, reason)


def reply(rid: int) -> list[Buffer]:
    return encode_message(Kind.REPLY, Header(RequestType.REPLY, rid, "DEV", "Prop"))


def test_batch_receiver_finds_on_messages_only_where_defined() -> None:
    assert batch_receiver(RecordingClientHandler()) is None
    rec = BatchRecorder()
    assert batch_receiver(rec) == rec.on_messages


def test_memory_client_hands_a_drained_batch_over_in_one_call_before_the_disconnect(
    no_thread_leak: None,
) -> None:
    net = MemoryNetwork()
    try:
        srec = RecordingServerHandler()
        server = net.server("demo", srec, TransportSettings(), {})
        server.start()
        rec = BatchRecorder()
        client = net.client(rec, TransportSettings(), {})
        client.start()
        conn = client.connect(server.endpoint)
        rec.wait_for(lambda: rec.is_connected(conn), WAIT, "connected")
        net.settle()
        peer = srec.peers()[-1]
        rec.hold.set()
        server.send(peer, reply(1))
        assert rec.holding.wait(WAIT)  # the client's dispatcher now sits in on_messages([1])
        sent_before = server.statistics().messages_out
        for rid in range(2, 22):
            server.send(peer, reply(rid))
        # The in-memory server hands each message to the client's inbox as it sends it.
        wait_until(lambda: server.statistics().messages_out == sent_before + 20, "20 sent")
        client.disconnect(conn)  # queued behind the 20 replies
        rec.release.set()
        rec.wait_for(lambda: "disconnected" in rec.events, WAIT, "the disconnection")
        assert rec.batches == [[1], list(range(2, 22))]
        assert rec.events == ["batch[1]", f"batch{list(range(2, 22))}", "disconnected"]
        assert rec.messages == []  # on_message is not called when on_messages exists
    finally:
        net.close()


def test_zmq_client_delivers_every_reply_through_on_messages_in_order(
    no_thread_leak: None,
) -> None:
    from rda.transport.zmq_client import ZmqClientTransport
    from rda.transport.zmq_server import ZmqServerTransport

    def echo(peer: bytes, message: Message) -> None:
        server.send(peer, reply(message.header.id))

    srec = RecordingServerHandler(on_message=echo)
    server = ZmqServerTransport("tcp://127.0.0.1:0", srec, TransportSettings())
    server.start()
    rec = BatchRecorder()
    client = ZmqClientTransport(rec, TransportSettings())
    client.start()
    try:
        conn = client.connect(server.endpoint)
        rec.wait_for(lambda: rec.is_connected(conn), WAIT, "connected")
        for rid in range(1, 201):
            header = Header(RequestType.GET, rid, "DEV", "Prop")
            client.send(conn, encode_message(Kind.REQUEST, header))
        rec.wait_for(lambda: sum(map(len, rec.batches)) == 200, WAIT, "200 replies")
        assert [rid for batch in rec.batches for rid in batch] == list(range(1, 201))
        assert all(batch for batch in rec.batches)
        # After a quiet spell (the ACK came alone) the first reply is handed over alone, at
        # once; what queues up behind it is batched.
        assert rec.batches[0] == [1]
        assert rec.messages == []
        assert client.statistics().messages_in == 201  # the ACK and 200 replies
    finally:
        client.close()
        server.close()


# --- business level ---------------------------------------------------------------------------


class FakeTransport:
    """A client transport that only records; the test plays the dispatcher."""

    def __init__(self, handler: ClientHandler, settings: TransportSettings, info: Any) -> None:
        self.handler = handler
        self.sent: list[Sequence[Buffer]] = []

    def lane(self, connection: int) -> DirectLane | None:
        return None  # no lanes: blocking calls take the shared connection

    def wake_later(self, waker: Waker) -> None:
        waker.set()

    def start(self) -> None:
        pass

    def connect(self, endpoint: str) -> int:
        return 1

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        self.sent.append(frames)

    def disconnect(self, connection: int) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass

    def statistics(self) -> ClientTransportStatistics:
        return ClientTransportStatistics()


Fixture = tuple[ClientService, FakeTransport]


@pytest.fixture
def service(no_thread_leak: None) -> Iterator[Fixture]:
    made: list[FakeTransport] = []

    def factory(h: ClientHandler, s: TransportSettings, i: dict[str, Any]) -> FakeTransport:
        made.append(FakeTransport(h, s, i))
        return made[0]

    client = ClientService(
        StaticDirectory({"*": ENDPOINT}), Config(workers=2), transport_factory=factory
    )
    try:
        yield client, made[0]
    finally:
        client.close()


BODY = binary.encode(Data(current=1.0))


def notification(
    sub: Subscription,
    seq: int,
    update: UpdateType = UpdateType.NORMAL,
    rtype: RequestType = RequestType.NOTIFICATION_DATA,
) -> Message:
    header = Header(rtype, sub.id, sub.device, sub.property, "", update, HeaderFlags.NONE)
    context = (BodyKind.DATA_CONTEXT, encode_context(DataContext(acq_stamp=1), seq))
    if rtype is RequestType.NOTIFICATION_DATA:
        body: list[tuple[BodyKind, Buffer]] = [(BodyKind.DATA, BODY), context]
    else:
        body = [(BodyKind.EXCEPTION, encode_exception("RuntimeError", "gone")), context]
    event = decode_frames(encode_message(Kind.REPLY, header, body), from_server=True)
    assert isinstance(event, Incoming)
    return event.message


def numbered(sub: Subscription, seqs: Sequence[int]) -> list[Message]:
    """FIRST for the first sequence number, NORMAL after."""
    return [
        notification(sub, s, UpdateType.FIRST if i == 0 else UpdateType.NORMAL)
        for i, s in enumerate(seqs)
    ]


def on_messages(transport: FakeTransport) -> Callable[[int, Sequence[Message]], None]:
    receive = batch_receiver(transport.handler)
    assert receive is not None, "the client service takes batches"
    return receive


def drain(sub: Subscription) -> list[tuple[int, int]]:
    out = []
    while (n := sub.poll_nowait()) is not None:
        out.append((n.seq, n.gap))
    return out


class CountingCondition(threading.Condition):
    notifies = 0

    def notify(self, n: int = 1) -> None:
        self.notifies += 1
        super().notify(n)


def test_a_batch_wakes_a_waiting_poll_once_and_keeps_order_and_gaps(service: Fixture) -> None:
    client, transport = service
    sub = client.access_point("PS1", "Acquisition").subscribe(queue_size=100)
    inbox = sub._inbox
    counting = CountingCondition(inbox._lock)
    inbox._cond = counting
    got: list[Notification | None] = []
    poller = threading.Thread(target=lambda: got.append(sub.poll(WAIT)))
    poller.start()
    wait_until(lambda: inbox._waiting == 1, "the poll to wait")
    stats0 = client.statistics()
    on_messages(transport)(1, numbered(sub, [1, 2, 3, 6, 7]))
    poller.join(WAIT)
    assert counting.notifies == 1  # once for the batch, not once per notification
    first = got[0]
    assert first is not None and (first.seq, first.gap) == (1, 0)
    assert first.update_type is UpdateType.FIRST
    assert drain(sub) == [(2, 0), (3, 0), (6, 2), (7, 0)]
    stats1 = client.statistics()
    assert stats1.notifications - stats0.notifications == 5
    assert stats1.gaps - stats0.gaps == 2
    assert stats1.dropped == stats0.dropped


def test_the_wakeup_callback_runs_once_per_batch_into_an_empty_queue(service: Fixture) -> None:
    client, transport = service
    sub = client.access_point("PS1", "Acquisition").subscribe(queue_size=100)
    calls: list[int] = []
    sub.set_wakeup(lambda: calls.append(len(sub._inbox)))
    receive = on_messages(transport)
    receive(1, numbered(sub, [1, 2, 3, 4]))
    assert calls == [4]  # one call, after the whole batch landed
    receive(1, [notification(sub, s) for s in (5, 6)])
    assert calls == [4]  # the queue was not empty: the consumer has not drained it yet
    assert [s for s, _ in drain(sub)] == [1, 2, 3, 4, 5, 6]
    receive(1, [notification(sub, 7)])
    assert calls == [4, 1]


def test_drop_oldest_in_a_batch_counts_exactly_as_one_at_a_time(service: Fixture) -> None:
    client, transport = service
    ap = client.access_point("PS1", "Acquisition")
    batched = ap.subscribe(queue_size=3)
    single = ap.subscribe(queue_size=3)
    stats0 = client.statistics()
    on_messages(transport)(1, numbered(batched, [1, 2, 3, 4, 5, 6, 9, 10]))
    for message in numbered(single, [1, 2, 3, 4, 5, 6, 9, 10]):
        transport.handler.on_message(1, message)
    stats1 = client.statistics()
    # The FIRST stays (a consumer must see where its sequence starts); 2..6 dropped or
    # reported missing: the first kept update after it carries them all as its gap.
    expected = [(1, 0), (9, 7), (10, 0)]
    assert drain(batched) == expected
    assert drain(single) == expected
    assert stats1.dropped - stats0.dropped == 2 * 5
    assert stats1.gaps - stats0.gaps == 2 * 2


def test_a_listener_gets_a_batch_in_order_with_its_gaps(service: Fixture) -> None:
    client, transport = service
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def listener(n: Notification) -> None:
        seen.append((n.seq, n.gap))
        if n.seq == 60:
            done.set()

    sub = client.access_point("PS1", "Acquisition").subscribe(listener=listener)
    seqs = [*range(1, 31), *range(41, 61)]
    on_messages(transport)(1, numbered(sub, seqs))
    assert done.wait(WAIT)
    assert [s for s, _ in seen] == seqs
    assert sum(g for _, g in seen) == 10
    assert dict(seen)[41] == 10


def test_a_listener_drains_a_burst_in_one_task_and_its_backlog_is_bounded(
    service: Fixture,
) -> None:
    # Issue 28: a listener used to cost one scheduler task (two closures, a lock, a queue
    # entry) per notification; now the queue that poll reads feeds it, one task per burst,
    # bounded by queue_size with drop-oldest counted as a gap, exactly as for poll.
    client, transport = service
    seen: list[tuple[int, int]] = []
    entered, release, done = threading.Event(), threading.Event(), threading.Event()

    def listener(n: Notification) -> None:
        if n.seq == 1:
            entered.set()
            assert release.wait(WAIT)  # the listener is slow: the next ones back up
        seen.append((n.seq, n.gap))
        if n.seq == 50:
            done.set()

    sub = client.access_point("PS1", "Acquisition").subscribe(listener=listener, queue_size=10)
    stats0 = client.statistics()
    on_messages(transport)(1, numbered(sub, [1]))
    assert entered.wait(WAIT)
    on_messages(transport)(1, numbered(sub, range(2, 51)))  # 49 behind a 10-slot queue
    release.set()
    assert done.wait(WAIT)
    stats1 = client.statistics()
    # The second burst starts with a FIRST (seq 2, ``numbered``): it stays; 3..41 go.
    assert [s for s, _ in seen] == [1, 2, *range(42, 51)]
    assert dict(seen)[42] == 39  # the dropped ones show as the gap of the next one
    assert stats1.dropped - stats0.dropped == 39
    scheduler = client._subscriptions.scheduler
    assert scheduler is not None
    # Two bursts, two drain tasks (a third may run when the last put raced the drain's end).
    assert scheduler.statistics().executed <= 3


def test_an_exception_ending_a_batch_comes_after_the_updates_before_it(
    service: Fixture,
) -> None:
    client, transport = service
    sub = client.access_point("PS1", "Acquisition").subscribe(queue_size=10)
    ended = notification(sub, 3, rtype=RequestType.SUBSCRIBE_EXCEPTION)
    on_messages(transport)(1, [*numbered(sub, [1, 2]), ended])
    polled = [sub.poll(WAIT) for _ in range(3)]
    assert [n.seq for n in polled if n is not None] == [1, 2, 3]
    last = polled[2]
    assert last is not None and last.error is not None and "gone" in str(last.error)
    assert sub.poll(WAIT) is None  # ended: no waiting once drained
    assert sub.closed


def test_one_failing_message_does_not_cost_the_rest_of_its_batch(service: Fixture) -> None:
    client, transport = service
    ap = client.access_point("PS1", "Acquisition")
    good, bad = ap.subscribe(queue_size=10), ap.subscribe(queue_size=10)

    class Broken:
        """Stands in for ``bad`` in the subscription table (compiled, a Subscription's
        methods cannot be patched): its delivery fails where bad's would run."""

        connection = bad.connection

        def deliver_message(self, message: Message, staged: list[Subscription] | None) -> None:
            raise RuntimeError("a bug in delivery")

    table = client._subscriptions._subs
    table[bad.id] = Broken()  # type: ignore[assignment]
    batch = [*numbered(good, [1, 2]), notification(bad, 1), notification(good, 3)]
    try:
        with pytest.raises(RuntimeError, match="a bug in delivery"):
            on_messages(transport)(1, batch)
    finally:
        table[bad.id] = bad  # the service's close ends it like any other
    assert drain(good) == [(1, 0), (2, 0), (3, 0)]


def test_zmq_client_copies_small_frames_out_and_keeps_big_ones_zero_copy() -> None:
    # No no_thread_leak here: sending the big frame without a copy starts pyzmq's own
    # process-wide garbage-collector thread, which lives on by design.
    import zmq

    from rda.transport import _zmq_common as common
    from rda.transport.zmq_client import ZmqClientTransport
    from rda.transport.zmq_server import ZmqServerTransport

    def echo(peer: bytes, message: Message) -> None:
        h = message.header
        header = Header(RequestType.REPLY, h.id, h.device, h.property)
        server.send(peer, encode_message(Kind.REPLY, header, message.body))

    srec = RecordingServerHandler(on_message=echo)
    server = ZmqServerTransport("tcp://127.0.0.1:0", srec, TransportSettings())
    server.start()
    rec = RecordingClientHandler()
    client = ZmqClientTransport(rec, TransportSettings())
    client.start()
    try:
        conn = client.connect(server.endpoint)
        rec.wait_for(lambda: rec.is_connected(conn), WAIT, "connected")
        big = bytes(range(256)) * 256  # 64 KiB: the size from which a copy is avoided
        for rid, body in ((1, b"small"), (2, big)):
            header = Header(RequestType.GET, rid, "DEV", "Prop")
            client.send(conn, encode_message(Kind.REQUEST, header, [(BodyKind.DATA, body)]))
        rec.wait_for(lambda: len(rec.messages) == 2, WAIT, "both replies")
        (_, small_reply), (_, big_reply) = rec.messages
        small_frame, big_frame = small_reply.body[0][1], big_reply.body[0][1]
        assert isinstance(small_frame, memoryview) and isinstance(big_frame, memoryview)
        assert isinstance(small_frame.obj, bytes)  # copied: no zmq.Frame kept alive
        # libzmq's buffer, not copied: a zmq.Frame, or the direct receive's own owner of the
        # libzmq message (transport/_czmq.pyx) when that is in use.
        owners: tuple[type, ...] = (zmq.Frame,)
        if common.direct_recv is not None:
            from rda.transport._czmq import ReceivedFrame

            owners = (zmq.Frame, ReceivedFrame)
        assert isinstance(big_frame.obj, owners) and big_frame.readonly
        assert bytes(small_frame) == b"small" and bytes(big_frame) == big
    finally:
        client.close()
        server.close()
