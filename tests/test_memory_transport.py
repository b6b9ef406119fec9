"""The in-memory transports: the conformance suite, plus what needs a fake clock or faults."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from rda.serialization.header import (
    PROTOCOL_VERSION,
    Header,
    HeaderFlags,
    RequestType,
    encode_header,
)
from rda.serialization.message import BodyKind, Message
from rda.testing import (
    CONFORMANCE_CHECKS,
    FakeClock,
    MemoryNetwork,
    RecordingClientHandler,
    RecordingServerHandler,
    check_transport,
    memory_pair,
    transport_pair,
    wait_until,
)
from rda.transport.api import (
    Buffer,
    ClientTransport,
    ClientTransportStatistics,
    DirectLane,
    TransportSettings,
    Waker,
)
from rda.transport.protocol import (
    Incoming,
    Kind,
    Reconnect,
    decode_frames,
    encode_connect,
    encode_heartbeat,
    encode_message,
    encode_tail,
)
from rda.transport.reasons import FORGOTTEN


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS)
def test_conformance(check: str) -> None:
    check_transport(memory_pair, only=[check])


class _ClientWithoutStatistics:
    """Delegates to a real client but reports no statistics: the suite must notice."""

    def __init__(self, inner: ClientTransport) -> None:
        self._inner = inner

    def lane(self, connection: int) -> DirectLane | None:
        return self._inner.lane(connection)

    def wake_later(self, waker: Waker) -> None:
        self._inner.wake_later(waker)

    def start(self) -> None:
        self._inner.start()

    def connect(self, endpoint: str) -> int:
        return self._inner.connect(endpoint)

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        self._inner.send(connection, frames)

    def disconnect(self, connection: int) -> None:
        self._inner.disconnect(connection)

    def close(self, timeout: float | None = None) -> None:
        self._inner.close(timeout)

    def statistics(self) -> ClientTransportStatistics:
        return ClientTransportStatistics()


def test_conformance_catches_a_broken_transport() -> None:
    network = MemoryNetwork()
    pair = transport_pair(
        lambda h, s, info: network.server("", h, s, info),
        lambda h, s, info: _ClientWithoutStatistics(network.client(h, s, info)),
    )
    try:
        with pytest.raises(AssertionError, match="'statistics' failed"):
            check_transport(pair, only=["statistics"])
    finally:
        network.close()
    with pytest.raises(ValueError, match="unknown checks"):
        check_transport(memory_pair, only=["no-such-check"])


# --- fake-clock and fault tests ---------------------------------------------------------------

SETTINGS = TransportSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0, connect_timeout=5.0)


class World:
    """A fake clock, a network on it, an echo server and one client, all closed at the end."""

    def __init__(self, settings: TransportSettings = SETTINGS) -> None:
        self.clock = FakeClock()
        self.net = MemoryNetwork(self.clock)
        self.srec = RecordingServerHandler(on_message=self._echo)
        self.server = self.net.server("demo", self.srec, settings, {"name": "Demo"})
        self.server.start()
        self.crec = RecordingClientHandler()
        self.client = self.net.client(self.crec, settings, {"application": "test"})
        self.client.start()

    def _echo(self, peer: bytes, message: Message) -> None:
        h = message.header
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        self.server.send(peer, encode_message(Kind.REPLY, reply, message.body))

    def connect(self) -> tuple[int, bytes]:
        conn = self.client.connect(self.server.endpoint)
        self.crec.wait_for(lambda: self.crec.is_connected(conn), 10.0, "connected")
        self.net.settle()
        return conn, self.srec.peers()[-1]

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.net.settle()


@pytest.fixture
def world(no_thread_leak: None) -> Iterator[World]:
    w = World()
    yield w
    w.net.close()
    assert w.clock.listeners == 0, "a closed transport still listens to the clock"


def request(ident: int, device: str = "PS1", body: bytes = b"") -> list[Buffer]:
    header = Header(RequestType.GET, ident, device, "Acquisition")
    return encode_message(Kind.REQUEST, header, [(BodyKind.DATA, body)] if body else [])


def reply(ident: int) -> list[Buffer]:
    return encode_message(Kind.REPLY, Header(RequestType.REPLY, ident, "PS1", "Acquisition"))


def notification(sub: int, payload: bytes) -> list[Buffer]:
    header = Header(
        RequestType.NOTIFICATION_DATA, sub, "PS1", "Acquisition", flags=HeaderFlags.CONFLATABLE
    )
    return encode_message(Kind.REPLY, header, [(BodyKind.DATA, payload)])


def note_header(sub: int) -> bytes:
    return encode_header(Header(RequestType.NOTIFICATION_DATA, sub, "PS1", "Acquisition"))


def tail(payload: bytes) -> list[Buffer]:
    return encode_tail([(BodyKind.DATA, payload)])


def test_silent_peer_is_dropped_exactly_at_the_timeout(world: World) -> None:
    raw = world.net.raw_peer(world.server.endpoint)
    raw.send(encode_connect({"application": "silent"}))
    assert raw.recv()[0][:1] == bytes([Kind.CONNECT_ACK])
    world.net.settle()
    world.advance(9.5)
    assert world.srec.disconnected == []
    assert raw.recv() == encode_heartbeat(from_server=True)  # the server was idle for 1 s
    world.advance(0.5)
    assert world.srec.disconnected == [(raw.peer, "heartbeat timeout")]
    assert world.server.statistics().heartbeat_timeouts == 1
    assert world.server.statistics().peers == 0


def test_heartbeat_is_sent_after_the_idle_interval_not_before(world: World) -> None:
    world.connect()
    c0, s0 = world.client.statistics(), world.server.statistics()
    world.advance(0.75)
    assert world.client.statistics().messages_out == c0.messages_out
    assert world.server.statistics().messages_out == s0.messages_out
    world.advance(0.25)
    assert world.client.statistics().messages_out == c0.messages_out + 1
    assert world.server.statistics().messages_out == s0.messages_out + 1
    assert world.server.statistics().messages_in == s0.messages_in + 1


def test_traffic_counts_as_a_heartbeat(world: World) -> None:
    conn, _ = world.connect()
    out0 = world.client.statistics().messages_out
    for i in range(8):  # a request every 0.5 s: the client never idles for 1 s
        world.client.send(conn, request(i))
        world.advance(0.5)
    assert world.client.statistics().messages_out == out0 + 8


def test_heartbeats_keep_a_healthy_connection_alive_for_60_s(world: World) -> None:
    conn, _ = world.connect()
    c0, s0 = world.client.statistics(), world.server.statistics()
    for _ in range(240):
        world.advance(0.25)
    assert world.crec.disconnected == [] and world.srec.disconnected == []
    c, s = world.client.statistics(), world.server.statistics()
    assert c.messages_out - c0.messages_out >= 59 and s.messages_out - s0.messages_out >= 59
    assert c.heartbeat_timeouts == 0 and s.heartbeat_timeouts == 0
    world.client.send(conn, request(1))
    world.crec.wait_for(lambda: len(world.crec.messages_on(conn)) == 1, 10.0, "reply")


def test_a_partition_expires_both_sides_at_the_timeout(world: World) -> None:
    conn, peer = world.connect()
    world.net.partition(world.server.endpoint)
    for _ in range(19):
        world.advance(0.5)  # t = 9.5: heartbeats go out and are lost
    assert world.crec.disconnected == [] and world.srec.disconnected == []
    world.advance(0.5)
    assert world.crec.disconnected == [(conn, "heartbeat timeout")]
    assert world.srec.disconnected == [(peer, "heartbeat timeout")]
    world.net.heal(world.server.endpoint)
    world.connect()  # the business layer's reconnect works once healed


def test_server_kill_is_noticed_at_once_and_a_restarted_server_accepts(world: World) -> None:
    conn, _ = world.connect()
    world.server.kill()
    world.crec.wait_for(lambda: bool(world.crec.disconnected), 10.0, "on_disconnected")
    assert world.crec.disconnected == [(conn, "server closed the connection")]
    assert world.srec.disconnected == []  # a killed process reports nothing
    assert world.clock.now() == 0.0  # no time had to pass
    world.server = world.net.restart_server("demo")
    conn2, _ = world.connect()
    world.client.send(conn2, request(5))
    world.crec.wait_for(lambda: len(world.crec.messages_on(conn2)) == 1, 10.0, "reply")


def test_client_close_is_noticed_by_the_server_at_once(world: World) -> None:
    conn, peer = world.connect()
    world.client.disconnect(conn)
    world.srec.wait_for(lambda: bool(world.srec.disconnected), 10.0, "on_peer_disconnected")
    assert world.srec.disconnected == [(peer, "peer gone")]


def test_a_peer_the_server_forgot_is_told_to_reconnect_at_its_next_heartbeat(
    world: World,
) -> None:
    """Issue 27 (3): before, the server answered a forgotten peer's HEARTBEATs with nothing (a
    log line), and the client stayed blind for its own heartbeat timeout (10 s). Now the
    server answers RECONNECT and the client reports the connection lost at once."""
    conn, peer = world.connect()
    world.server.disconnect(peer)  # as a heartbeat timeout does while the client is paused
    world.net.settle()
    assert world.crec.disconnected == []
    world.advance(SETTINGS.heartbeat_interval)  # the client's next heartbeat
    assert world.crec.disconnected == [(conn, FORGOTTEN)]
    assert world.server.statistics().protocol_errors == 1  # its heartbeat, from a stranger
    assert world.client.statistics().heartbeat_timeouts == 0


def test_stalled_client_gets_conflated_notifications_in_order(world: World) -> None:
    conn, peer = world.connect()
    world.net.stall_client(peer)
    for i in range(5):
        world.server.send(peer, notification(1, b"v%d" % i), conflate_key=1)
    world.server.send(peer, reply(9))  # never conflated
    world.server.publish([(peer, 2, note_header(2))], [*tail(b"a")], conflatable=True)
    world.server.publish([(peer, 2, note_header(2))], [*tail(b"b")], conflatable=True)
    world.net.settle()
    s = world.server.statistics()
    assert (s.notifications_conflated, s.peer_queue_depth) == (5, 3), s
    assert world.crec.messages_on(conn) == []
    world.net.unstall_client(peer)
    world.crec.wait_for(lambda: len(world.crec.messages_on(conn)) == 3, 10.0, "flushed queue")
    got = [
        (m.header.id, bytes(m.body[0][1]) if m.body else b"") for m in world.crec.messages_on(conn)
    ]
    assert got == [(1, b"v4"), (9, b""), (2, b"b")]
    assert world.server.statistics().peer_queue_depth == 0


def test_a_full_peer_queue_drops_and_counts(no_thread_leak: None) -> None:
    w = World(TransportSettings(peer_queue_limit=3))
    try:
        conn, peer = w.connect()
        w.net.stall_client(peer)
        for i in range(5):
            w.server.send(peer, reply(i))
        w.net.settle()
        s = w.server.statistics()
        assert (s.peer_queue_depth, s.messages_dropped) == (3, 2), s
        w.net.unstall_client(peer)
        w.crec.wait_for(lambda: len(w.crec.messages_on(conn)) == 3, 10.0, "flushed")
        assert [m.header.id for m in w.crec.messages_on(conn)] == [0, 1, 2]
    finally:
        w.net.close()


def test_requests_wait_for_a_server_that_binds_later(no_thread_leak: None) -> None:
    with MemoryNetwork(FakeClock()) as net:
        crec = RecordingClientHandler()
        client = net.client(crec, SETTINGS)
        client.start()
        conn = client.connect("mem://later")
        for i in range(3):
            client.send(conn, request(i))
        net.settle()
        assert client.statistics().queued_until_connected == 3
        srec = RecordingServerHandler()
        net.server("later", srec, SETTINGS).start()
        srec.wait_for(lambda: len(srec.messages) == 3, 10.0, "queued requests")
        assert [m.header.id for _, m in srec.messages] == [0, 1, 2]
        assert crec.is_connected(conn)


def test_connect_times_out_without_an_ack(world: World) -> None:
    conn = world.client.connect("mem://nobody")
    world.net.settle()
    world.advance(4.5)
    assert world.crec.disconnected == []
    world.advance(0.5)
    assert world.crec.disconnected == [(conn, "no CONNECT_ACK within connect_timeout")]


def test_bad_input_is_counted_and_answered_and_others_are_unaffected(world: World) -> None:
    conn, _ = world.connect()
    raw = world.net.raw_peer("demo")
    raw.send([b"\x99", b"garbage"])  # unknown kind
    raw.send([])  # 0 frames
    raw.send([bytes([Kind.REPLY, PROTOCOL_VERSION])])  # a server kind from a client
    raw.send(request(4))  # REQUEST before CONNECT: told to connect, and answered
    assert isinstance(decode_frames(raw.recv(), from_server=True), Reconnect)
    reply = raw.recv()
    event = decode_frames(reply, from_server=True)
    assert isinstance(event, Incoming)
    assert [k for k, _ in event.message.body] == [BodyKind.EXCEPTION]
    first = bytes(request(77)[0])
    v3 = [first[:1] + bytes([PROTOCOL_VERSION + 1]) + first[2:]]
    raw.send(v3)  # another protocol version: answered with the request id
    answer = decode_frames(raw.recv(), from_server=True)
    assert isinstance(answer, Incoming) and answer.message.header.id == 77
    assert answer.message.exception is not None
    assert answer.message.exception[0] == "ProtocolError"
    raw.send([bytes([Kind.CONNECT, 5]) + b"{}"])  # handshake of another version: refused
    ack = raw.recv()
    assert ack[0][:1] == bytes([Kind.CONNECT_ACK]) and b"error" in ack[0]
    world.net.settle()
    s = world.server.statistics()
    assert (s.decode_errors, s.protocol_errors) == (6, 4), s
    assert s.peers == 1  # the raw peer never got registered; the real client still is
    world.client.send(conn, request(1))
    world.crec.wait_for(lambda: len(world.crec.messages_on(conn)) == 1, 10.0, "reply")


def test_send_blocks_at_the_high_water_mark_while_the_dispatcher_is_busy(
    no_thread_leak: None,
) -> None:
    release = threading.Event()
    settings = TransportSettings(send_hwm=5)
    with MemoryNetwork() as net:
        srec = RecordingServerHandler()
        server = net.server("s", srec, settings)
        server.start()

        def block(conn: int, message: Message) -> None:
            release.wait(10.0)

        crec = RecordingClientHandler(on_message=block)
        client = net.client(crec, settings)
        client.start()
        conn = client.connect(server.endpoint)
        crec.wait_for(lambda: crec.is_connected(conn), 10.0, "connected")
        peer = srec.peers()[0]
        server.send(peer, reply(1))  # the client's dispatcher now blocks in on_message
        crec.wait_for(lambda: len(crec.messages) == 1, 10.0, "blocking message")
        done: list[int] = []

        def flood() -> None:
            for i in range(20):
                client.send(conn, request(i))
                done.append(i)

        sender = threading.Thread(target=flood)
        sender.start()
        wait_until(lambda: len(done) >= 5, "five sends")
        assert 5 <= len(done) < 20, "the sender was not held back"
        release.set()
        sender.join(10.0)
        assert len(done) == 20
        srec.wait_for(lambda: len(srec.messages) == 20, 10.0, "all requests")


def test_handler_errors_are_counted_and_the_dispatcher_lives_on(world: World) -> None:
    def boom(conn: int, message: Message) -> None:
        raise RuntimeError("handler bug")

    crec = RecordingClientHandler(on_message=boom)
    client = world.net.client(crec, SETTINGS)
    client.start()
    conn = client.connect("demo")
    crec.wait_for(lambda: crec.is_connected(conn), 10.0, "connected")
    client.send(conn, request(1))
    client.send(conn, request(2))
    crec.wait_for(lambda: len(crec.messages) == 2, 10.0, "both replies")
    world.net.settle()
    assert client.statistics().handler_errors == 2


def test_fake_clock() -> None:
    clock = FakeClock(5.0)
    calls: list[float] = []
    remove = clock.on_advance(lambda: calls.append(clock.now()))
    assert clock() == clock.now() == 5.0
    assert clock.advance(1.5) == 6.5
    clock.set(10.0)
    assert calls == [6.5, 10.0]
    remove()
    clock.advance(1.0)
    assert calls == [6.5, 10.0] and clock.listeners == 0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1.0)
    threads = [threading.Thread(target=lambda: [clock.advance(0.5) for _ in range(100)])]
    threads += [threading.Thread(target=lambda: [clock.advance(0.25) for _ in range(100)])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.now() == 11.0 + 75.0
