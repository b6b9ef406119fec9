"""ZmqClientTransport against a real ZmqServerTransport or a raw pyzmq ROUTER (127.0.0.1)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from rda.serialization.header import PROTOCOL_VERSION, Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.testing import FakeClock, wait_until
from rda.transport.api import TransportSettings
from rda.transport.protocol import (
    Kind,
    encode_connect_ack,
    encode_heartbeat,
    encode_message,
)
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

WAIT = 10.0
WAIT_MS = 10_000


# Seconds without progress that count as "blocked": generous, so that a thread descheduled on
# a loaded machine is not taken for one blocked by back-pressure.
STALLED = 2.0


def unchanged_for(seconds: float, read: Callable[[], int]) -> Callable[[], bool]:
    """A predicate for wait_until: true once ``read()`` has not changed for ``seconds``."""
    seen, since = read(), time.monotonic()

    def check() -> bool:
        nonlocal seen, since
        value, now = read(), time.monotonic()
        if value != seen:
            seen, since = value, now
        return now - since >= seconds

    return check


def request(rid: int, body: bytes = b"payload") -> list[Any]:
    header = Header(RequestType.GET, rid, "DEV", "Prop", "SEL")
    return encode_message(Kind.REQUEST, header, [(BodyKind.DATA, body)])


class ClientRec:
    def __init__(self) -> None:
        self.connected: dict[int, dict[str, Any]] = {}
        self.messages: list[tuple[int, Message]] = []
        self.disconnected: dict[int, str] = {}
        self.on_message_hook: Callable[[int, Message], None] | None = None

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self.connected[connection] = server_info

    def on_message(self, connection: int, message: Message) -> None:
        self.messages.append((connection, message))
        if self.on_message_hook is not None:
            self.on_message_hook(connection, message)

    def on_disconnected(self, connection: int, reason: str) -> None:
        assert connection not in self.disconnected, "reported twice"
        self.disconnected[connection] = reason


class EchoServer:
    """Server handler that echoes every request as a REPLY from the dispatcher thread."""

    def __init__(self) -> None:
        self.transport: ZmqServerTransport | None = None
        self.peers: dict[bytes, dict[str, Any]] = {}
        self.requests: list[Message] = []
        self.gone: dict[bytes, str] = {}

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        self.peers[peer] = client_info

    def on_message(self, peer: bytes, message: Message) -> None:
        self.requests.append(message)
        assert self.transport is not None
        h = message.header
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        self.transport.send(peer, encode_message(Kind.REPLY, reply, message.body))

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        self.gone[peer] = reason


@pytest.fixture
def server() -> Iterator[tuple[ZmqServerTransport, EchoServer]]:
    handler = EchoServer()
    srv = ZmqServerTransport("tcp://127.0.0.1:0", handler)
    handler.transport = srv
    srv.start()
    yield srv, handler
    srv.close()


@pytest.fixture
def client() -> Iterator[tuple[ZmqClientTransport, ClientRec]]:
    rec = ClientRec()
    cl = ZmqClientTransport(rec, client_info={"application": "test-app"})
    cl.start()
    yield cl, rec
    cl.close()


def test_handshake_exchanges_client_and_server_info(
    server: tuple[ZmqServerTransport, EchoServer], client: tuple[ZmqClientTransport, ClientRec]
) -> None:
    srv, sh = server
    cl, rec = client
    conn = cl.connect(srv.endpoint)
    wait_until(lambda: conn in rec.connected and len(sh.peers) == 1)
    info = next(iter(sh.peers.values()))
    assert info["application"] == "test-app"
    assert {"user", "host", "pid", "version"} <= info.keys()
    assert rec.connected[conn]["heartbeat_interval"] == 1.0
    assert rec.connected[conn]["heartbeat_timeout"] == 10.0
    assert cl.statistics().connections == 1
    assert srv.statistics().peers == 1


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_echo_round_trip_keeps_body_as_memoryview(
    scheme: str, tmp_path: Path, client: tuple[ZmqClientTransport, ClientRec]
) -> None:
    sh = EchoServer()
    endpoint = "tcp://127.0.0.1:0" if scheme == "tcp" else f"ipc://{tmp_path}/srv.sock"
    srv = ZmqServerTransport(endpoint, sh)
    sh.transport = srv
    srv.start()
    try:
        cl, rec = client
        conn = cl.connect(srv.endpoint)
        big = bytes(range(256)) * 1024  # 256 KiB: travels without a copy
        cl.send(conn, request(1, b"small"))
        cl.send(conn, request(2, big))
        wait_until(lambda: len(rec.messages) == 2)
        (c1, m1), (_, m2) = rec.messages
        assert c1 == conn
        assert m1.header.request_type is RequestType.REPLY
        assert (m1.header.id, m1.header.device, m1.header.selector) == (1, "DEV", "SEL")
        assert isinstance(m1.body[0][1], memoryview)
        assert bytes(m1.body[0][1]) == b"small"
        assert bytes(m2.body[0][1]) == big
        stats = cl.statistics()
        assert stats.messages_out == 3 and stats.messages_in == 3  # + CONNECT / CONNECT_ACK
        assert stats.bytes_out > len(big)
    finally:
        srv.close()


def raw_router() -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes], str]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    return ctx, router, f"tcp://127.0.0.1:{port}"


def test_requests_sent_before_ack_wait_for_it_then_flush_in_order(
    client: tuple[ZmqClientTransport, ClientRec],
) -> None:
    ctx, router, endpoint = raw_router()
    try:
        cl, rec = client
        conn = cl.connect(endpoint)
        for i in range(3):
            cl.send(conn, request(i))
        assert router.poll(WAIT_MS)
        rid, connect = router.recv_multipart()
        assert connect[:2] == bytes([Kind.CONNECT, PROTOCOL_VERSION])
        # Nothing else may arrive before the ACK.
        assert router.poll(300) == 0
        router.send_multipart([rid, *encode_connect_ack({"name": "raw"})])
        got = []
        for _ in range(3):
            assert router.poll(WAIT_MS)
            frames = router.recv_multipart()
            assert len(frames) == 2 and frames[1][:1] == bytes([Kind.REQUEST])
            got.append(frames)
        ids = [int.from_bytes(f[1][5:13], "little") for f in got]  # kind byte, then the header
        assert ids == [0, 1, 2]
        wait_until(lambda: conn in rec.connected)
        assert cl.statistics().queued_until_connected == 3
    finally:
        router.close(0)
        ctx.term()


def test_no_ack_within_connect_timeout_reports_disconnected() -> None:
    ctx, router, endpoint = raw_router()
    rec = ClientRec()
    cl = ZmqClientTransport(rec, TransportSettings(connect_timeout=0.2))
    cl.start()
    try:
        conn = cl.connect(endpoint)
        wait_until(lambda: conn in rec.disconnected)
        assert "CONNECT_ACK" in rec.disconnected[conn]
        assert conn not in rec.connected
        cl.send(conn, request(1))  # a dead connection: silently ignored
    finally:
        cl.close()
        router.close(0)
        ctx.term()


def test_refused_connection_is_reported_at_once(
    client: tuple[ZmqClientTransport, ClientRec],
) -> None:
    ctx, router, endpoint = raw_router()
    router.close(0)  # nothing listens on that port any more
    ctx.term()
    cl, rec = client
    conn = cl.connect(endpoint)
    wait_until(lambda: conn in rec.disconnected)
    # The monitor's CLOSED event reported it, not the 5 s connect timer (whose reason names
    # the missing CONNECT_ACK): the reason says which, whatever the machine's load.
    assert "CONNECT_ACK" not in rec.disconnected[conn]
    assert cl.statistics().disconnects == 1


def test_server_restart_is_noticed_through_the_monitor_not_the_heartbeat() -> None:
    settings = TransportSettings(heartbeat_interval=10.0, heartbeat_timeout=30.0)
    sh = EchoServer()
    srv = ZmqServerTransport("tcp://127.0.0.1:0", sh, settings)
    sh.transport = srv
    srv.start()
    rec = ClientRec()
    cl = ZmqClientTransport(rec, settings)
    cl.start()
    try:
        conn = cl.connect(srv.endpoint)
        wait_until(lambda: conn in rec.connected)
        srv.close()
        # The reason tells the server's close from the 30 s heartbeat timeout (no timing).
        wait_until(lambda: conn in rec.disconnected, timeout=20.0)
        assert rec.disconnected[conn] == "server closed the connection"
        assert cl.statistics().heartbeat_timeouts == 0
        assert cl.statistics().connections == 0
    finally:
        cl.close()
        srv.close()


def test_silent_server_is_dropped_by_the_client_heartbeat() -> None:
    ctx, router, endpoint = raw_router()
    rec = ClientRec()
    # Real time on purpose: the one test of real heartbeat frames on a real socket (the timer
    # rules are test_client_heartbeat_expiry_with_a_fake_clock's). The timeout is ten
    # intervals, so a dispatcher descheduled for a while still sends heartbeats before the drop.
    cl = ZmqClientTransport(rec, TransportSettings(heartbeat_interval=0.1, heartbeat_timeout=1.0))
    cl.start()
    try:
        conn = cl.connect(endpoint)
        assert router.poll(WAIT_MS)
        rid, _ = router.recv_multipart()
        router.send_multipart([rid, *encode_connect_ack({})])
        wait_until(lambda: conn in rec.disconnected)
        assert rec.disconnected[conn] == "heartbeat timeout"
        assert cl.statistics().heartbeat_timeouts == 1
        # The client did send heartbeats while waiting.
        heartbeat = encode_heartbeat(from_server=False)
        seen = []
        while router.poll(0):
            seen.append(router.recv_multipart()[1:])
        assert heartbeat in seen
    finally:
        cl.close()
        router.close(0)
        ctx.term()


def test_disconnect_reports_closed_locally(
    server: tuple[ZmqServerTransport, EchoServer], client: tuple[ZmqClientTransport, ClientRec]
) -> None:
    srv, _ = server
    cl, rec = client
    conn = cl.connect(srv.endpoint)
    wait_until(lambda: conn in rec.connected)
    cl.disconnect(conn)
    wait_until(lambda: conn in rec.disconnected)
    assert rec.disconnected[conn] == "closed locally"
    cl.disconnect(conn)  # again: nothing more happens (asserted by ClientRec)
    cl.send(conn, request(1))
    conn2 = cl.connect(srv.endpoint)
    assert conn2 != conn
    wait_until(lambda: conn2 in rec.connected)


def test_handler_that_raises_is_counted_and_dispatcher_lives_on(
    server: tuple[ZmqServerTransport, EchoServer], client: tuple[ZmqClientTransport, ClientRec]
) -> None:
    srv, _ = server
    cl, rec = client

    def boom(connection: int, message: Message) -> None:
        if message.header.id == 1:
            raise RuntimeError("business bug")

    rec.on_message_hook = boom
    conn = cl.connect(srv.endpoint)
    cl.send(conn, request(1))
    cl.send(conn, request(2))
    wait_until(lambda: len(rec.messages) == 2)
    assert cl.statistics().handler_errors == 1


def test_back_pressure_blocks_a_producer_while_the_dispatcher_is_stalled(
    server: tuple[ZmqServerTransport, EchoServer],
) -> None:
    srv, sh = server
    hwm = 50
    stall = threading.Event()
    rec = ClientRec()

    def block_on_first(connection: int, message: Message) -> None:
        if message.header.id == 0:
            stall.wait(WAIT)

    rec.on_message_hook = block_on_first
    cl = ZmqClientTransport(rec, TransportSettings(send_hwm=hwm))
    cl.start()
    sent = [0]
    total = 10 * hwm
    try:
        conn = cl.connect(srv.endpoint)
        cl.send(conn, request(0))
        wait_until(lambda: len(rec.messages) == 1)  # the dispatcher now waits on `stall`

        def produce() -> None:
            for i in range(total):
                cl.send(conn, request(i + 1))
                sent[0] += 1

        producer = threading.Thread(target=produce)
        producer.start()
        # The pipe takes at least send_hwm; then the producer must block on it. A descheduled
        # producer can pause anywhere, but only at or above that floor (waited for first) and
        # never above the bound: a slow machine cannot fail this. Without a bound the producer
        # would send all it has long before STALLED seconds without progress.
        wait_until(lambda: sent[0] >= hwm, "the producer to fill the pipe", probe=lambda: sent)
        wait_until(
            unchanged_for(STALLED, lambda: sent[0]), "the producer to block", probe=lambda: sent
        )
        assert producer.is_alive()
        # The pipe holds at most send_hwm at each end (plus a message in flight).
        assert hwm <= sent[0] <= 2 * hwm + 2
        stall.set()
        producer.join(WAIT)
        assert not producer.is_alive()
        wait_until(lambda: len(sh.requests) == total + 1)
    finally:
        stall.set()
        cl.close()


def test_client_heartbeat_expiry_with_a_fake_clock() -> None:
    ctx, router, endpoint = raw_router()
    clock = FakeClock(50.0)
    rec = ClientRec()
    settings = TransportSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    cl = ZmqClientTransport(rec, settings, clock=clock)
    cl.start()
    try:
        conn = cl.connect(endpoint)
        assert router.poll(WAIT_MS)
        rid, _ = router.recv_multipart()
        router.send_multipart([rid, *encode_connect_ack({})])
        wait_until(lambda: conn in rec.connected)
        clock.advance(10.5)
        cl.send(conn, request(1))  # any wake-up makes the dispatcher look at its timers
        wait_until(lambda: conn in rec.disconnected)
        assert rec.disconnected[conn] == "heartbeat timeout"
        assert cl.statistics().heartbeat_timeouts == 1
    finally:
        cl.close()
        router.close(0)
        ctx.term()


def test_a_full_dealer_pipe_loses_nothing_and_keeps_order(
    client: tuple[ZmqClientTransport, ClientRec],
) -> None:
    ctx, router, endpoint = raw_router()
    router.setsockopt(zmq.RCVHWM, 10)
    try:
        cl, rec = client
        conn = cl.connect(endpoint)
        assert router.poll(WAIT_MS)
        rid, _ = router.recv_multipart()
        router.send_multipart([rid, *encode_connect_ack({})])
        wait_until(lambda: conn in rec.connected)
        n = 1500
        body = b"b" * (32 * 1024)  # 48 MB in all: more than libzmq and the kernel buffer
        for i in range(n):
            cl.send(conn, request(i, body))
        ids: list[int] = []
        while len(ids) < n and router.poll(WAIT_MS):
            frames = router.recv_multipart()
            if frames[1][:1] == bytes([Kind.REQUEST]):
                ids.append(int.from_bytes(frames[1][5:13], "little"))
        assert ids == list(range(n))
    finally:
        router.close(0)
        ctx.term()


def test_refusing_ack_and_bad_server_messages(
    client: tuple[ZmqClientTransport, ClientRec],
) -> None:
    ctx, router, endpoint = raw_router()
    try:
        cl, rec = client
        refused = cl.connect(endpoint)
        assert router.poll(WAIT_MS)
        rid, _ = router.recv_multipart()
        router.send_multipart([rid, *encode_connect_ack({"error": "no room"})])
        wait_until(lambda: refused in rec.disconnected)
        assert rec.disconnected[refused] == "refused by the server: no room"
        assert refused not in rec.connected

        conn = cl.connect(endpoint)
        assert router.poll(WAIT_MS)
        rid, _ = router.recv_multipart()
        reply = Header(RequestType.REPLY, 5)
        # A REPLY before the ACK, garbage, a client-only kind: all dropped and counted.
        router.send_multipart([rid, *encode_message(Kind.REPLY, reply)])
        router.send_multipart([rid, *encode_connect_ack({})])
        router.send_multipart([rid, b"\x99", b"junk"])
        router.send_multipart([rid, *encode_message(Kind.REQUEST, reply)])
        router.send_multipart([rid, *encode_message(Kind.REPLY, reply)])
        wait_until(lambda: len(rec.messages) == 1)
        assert rec.messages[0][0] == conn and rec.messages[0][1].header.id == 5
        assert cl.statistics().decode_errors == 3
        assert conn not in rec.disconnected
    finally:
        router.close(0)
        ctx.term()
