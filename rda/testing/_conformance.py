"""``check_transport``: the behaviour every implementation of ``rda.transport.api`` must show.

The suite talks to transports only through ``rda.transport.api`` and a tiny factory, so it runs
unchanged against the in-memory pair and the ZeroMQ transports over tcp and ipc.

The factory protocol
--------------------
``make_pair`` is a zero-argument callable returning a context manager; entering it yields a
:class:`TransportPair`, an object with two methods::

    make_server(handler: ServerHandler, settings: TransportSettings,
                server_info: dict[str, Any]) -> ServerTransport
        # a STARTED server; its .endpoint is the address clients connect to
    make_client(handler: ClientHandler, settings: TransportSettings,
                client_info: dict[str, Any]) -> ClientTransport
        # a STARTED client

and leaving it closes every transport it made (``close()`` is idempotent: the suite closes
some itself) and whatever else it created (contexts, socket directories). Each check enters a
fresh pair. :func:`transport_pair` builds such a factory from two constructors, e.g. for
ZeroMQ over tcp::

    make_pair = transport_pair(
        lambda h, s, info: ZmqServerTransport("tcp://127.0.0.1:0", h, s, info),
        lambda h, s, info: ZmqClientTransport(h, s, info),
    )

    @pytest.mark.parametrize("check", CONFORMANCE_CHECKS)
    def test_zmq_tcp_conformance(check: str) -> None:
        check_transport(make_pair, only=[check])

Every check waits with bounded polls (no sleep is an assertion) and, after leaving the pair,
asserts that no thread started during the check is still alive.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from rda.serialization.header import (
    DataContext,
    Header,
    RequestType,
    encode_context,
    encode_header,
)
from rda.serialization.message import BodyKind, Message
from rda.testing._recorders import RecordingClientHandler, RecordingServerHandler
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransport,
    ClientTransportStatistics,
    ServerHandler,
    ServerTransport,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.protocol import Kind, encode_message, encode_tail

__all__ = ["CONFORMANCE_CHECKS", "MakePair", "TransportPair", "check_transport", "transport_pair"]


class TransportPair(Protocol):
    """What ``make_pair()`` yields; see the module docstring."""

    def make_server(
        self, handler: ServerHandler, settings: TransportSettings, server_info: dict[str, Any]
    ) -> ServerTransport: ...

    def make_client(
        self, handler: ClientHandler, settings: TransportSettings, client_info: dict[str, Any]
    ) -> ClientTransport: ...


MakePair = Callable[[], AbstractContextManager[TransportPair]]
ServerFactory = Callable[[ServerHandler, TransportSettings, dict[str, Any]], ServerTransport]
ClientFactory = Callable[[ClientHandler, TransportSettings, dict[str, Any]], ClientTransport]


class _FactoryPair:
    def __init__(self, server: ServerFactory, client: ClientFactory) -> None:
        self._server, self._client = server, client
        self.servers: list[ServerTransport] = []
        self.clients: list[ClientTransport] = []

    def make_server(
        self, handler: ServerHandler, settings: TransportSettings, server_info: dict[str, Any]
    ) -> ServerTransport:
        server = self._server(handler, settings, server_info)
        self.servers.append(server)
        server.start()
        return server

    def make_client(
        self, handler: ClientHandler, settings: TransportSettings, client_info: dict[str, Any]
    ) -> ClientTransport:
        client = self._client(handler, settings, client_info)
        self.clients.append(client)
        client.start()
        return client


def transport_pair(server: ServerFactory, client: ClientFactory) -> MakePair:
    """A ``make_pair`` from two constructors of UNSTARTED transports ``(handler, settings,
    info)``; it starts what it builds and closes all of it, clients first, on exit."""

    @contextlib.contextmanager
    def make_pair() -> Iterator[TransportPair]:
        pair = _FactoryPair(server, client)
        try:
            yield pair
        finally:
            for c in pair.clients:
                c.close()
            for s in pair.servers:
                s.close()

    return make_pair


# --- helpers ----------------------------------------------------------------------------------

SETTINGS = TransportSettings(close_timeout=5.0, connect_timeout=10.0)
CLIENT_INFO: dict[str, Any] = {"application": "rda-conformance", "user": "tester", "pid": 4242}
SERVER_INFO: dict[str, Any] = {"name": "ConformanceServer"}
WAIT = 10.0  # generous: the machine may be loaded


def _request(
    ident: int, body: list[tuple[BodyKind, Buffer]] | None = None, device: str = "PS1"
) -> list[Buffer]:
    header = Header(RequestType.GET, ident, device, "Acquisition", "CPS.USER.ALL")
    return encode_message(Kind.REQUEST, header, body or [])


def _echo_server(
    pair: TransportPair,
    settings: TransportSettings = SETTINGS,
    extra: Callable[[ServerTransport, bytes, Message], None] | None = None,
) -> tuple[ServerTransport, RecordingServerHandler]:
    """A server that answers every request with a REPLY repeating its header and body."""
    holder: list[ServerTransport] = []

    def echo(peer: bytes, message: Message) -> None:
        h = message.header
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        holder[0].send(peer, encode_message(Kind.REPLY, reply, message.body))
        if extra is not None:
            extra(holder[0], peer, message)

    handler = RecordingServerHandler(on_message=echo)
    holder.append(pair.make_server(handler, settings, dict(SERVER_INFO)))
    return holder[0], handler


def _client(
    pair: TransportPair,
    settings: TransportSettings = SETTINGS,
    hook: Callable[[int, Message], None] | None = None,
) -> tuple[ClientTransport, RecordingClientHandler]:
    handler = RecordingClientHandler(on_message=hook)
    return pair.make_client(handler, settings, dict(CLIENT_INFO)), handler


def _connect(client: ClientTransport, rec: RecordingClientHandler, server: ServerTransport) -> int:
    conn = client.connect(server.endpoint)
    rec.wait_for(lambda: rec.is_connected(conn), WAIT, f"on_connected for connection {conn}")
    return conn


def _round_trip(
    client: ClientTransport, rec: RecordingClientHandler, conn: int, ident: int
) -> None:
    """A full request/reply: proves that everything queued before it was handled."""
    client.send(conn, _request(ident))
    rec.wait_for(
        lambda: any(m.header.id == ident for m in rec.messages_on(conn)), WAIT, f"reply {ident}"
    )


def _has(rec: RecordingClientHandler, conn: int, n: int) -> Callable[[], bool]:
    return lambda: len(rec.messages_on(conn)) == n


def _body(message: Message) -> list[tuple[BodyKind, bytes]]:
    return [(k, bytes(f)) for k, f in message.body]


def _size(frames: Iterable[Buffer]) -> int:
    return sum(len(bytes(f)) for f in frames)


# --- the checks -------------------------------------------------------------------------------


def check_handshake(pair: TransportPair) -> None:
    server, srec = _echo_server(pair)
    client, crec = _client(pair)
    conn = _connect(client, crec, server)
    info = crec.connected[0][1]
    for key, value in SERVER_INFO.items():
        assert info.get(key) == value, f"server info lacks {key}={value!r}: {info}"
    assert "heartbeat_interval" in info and "heartbeat_timeout" in info, info
    srec.wait_for(lambda: len(srec.connected) == 1, WAIT, "on_peer_connected")
    peer, client_info = srec.connected[0]
    assert isinstance(peer, bytes) and peer, peer
    for key, value in CLIENT_INFO.items():
        assert client_info.get(key) == value, f"client info lacks {key}={value!r}: {client_info}"
    conn2 = _connect(client, crec, server)
    srec.wait_for(lambda: len(srec.connected) == 2, WAIT, "second on_peer_connected")
    assert conn2 != conn and srec.connected[1][0] != peer, "connections must be distinct"
    me = threading.current_thread().name
    assert len(crec.threads) == 1 and me not in crec.threads, (
        f"client handler ran on {crec.threads}"
    )
    assert len(srec.threads) == 1 and me not in srec.threads, (
        f"server handler ran on {srec.threads}"
    )


def check_echo(pair: TransportPair) -> None:
    server, _ = _echo_server(pair)
    client, crec = _client(pair)
    conn = _connect(client, crec, server)
    context = encode_context(DataContext("CPS.USER.SFT", 1, 2), 3)
    bodies: list[list[tuple[BodyKind, Buffer]]] = [
        [],
        [(BodyKind.REQUEST_CONTEXT, b"")],
        [(BodyKind.DATA, bytes(range(256))), (BodyKind.DATA_CONTEXT, context)],
        [(BodyKind.DATA, memoryview(bytearray(b"\x00view\xff")))],
        [(BodyKind.EXCEPTION, b"x"), (BodyKind.DATA, b"y"), (BodyKind.REQUEST_CONTEXT, b"z")],
        [(BodyKind.DATA, bytes(1 << 20))],  # 1 MiB
    ]
    for i, body in enumerate(bodies):
        client.send(conn, _request(i, body, device=f"DEV{i}"))
    crec.wait_for(lambda: len(crec.messages_on(conn)) == len(bodies), WAIT, "all echoes")
    for message in crec.messages_on(conn):
        i = message.header.id
        assert message.header == Header(
            RequestType.REPLY, i, f"DEV{i}", "Acquisition", "CPS.USER.ALL"
        ), message.header
        assert _body(message) == [(k, bytes(f)) for k, f in bodies[i]], f"body {i} changed"


def check_many_in_flight(pair: TransportPair) -> None:
    server, srec = _echo_server(pair)
    client, crec = _client(pair)
    conn = _connect(client, crec, server)
    n = 1000
    for i in range(n):
        client.send(conn, _request(i, [(BodyKind.DATA, i.to_bytes(8, "little"))]))
    crec.wait_for(lambda: len(crec.messages_on(conn)) == n, WAIT * 3, f"{n} replies")
    replies = crec.messages_on(conn)
    assert sorted(m.header.id for m in replies) == list(range(n))
    for m in replies:
        assert _body(m) == [(BodyKind.DATA, m.header.id.to_bytes(8, "little"))], m
    assert len(srec.messages) == n


def check_send_before_ack(pair: TransportPair) -> None:
    server, _ = _echo_server(pair)
    client, crec = _client(pair)
    conn = client.connect(server.endpoint)
    for i in range(20):  # no wait for on_connected: these are queued until the ACK
        client.send(conn, _request(i))
    crec.wait_for(lambda: len(crec.messages_on(conn)) == 20, WAIT, "replies to early requests")
    assert [m.header.id for m in crec.messages_on(conn)] == list(range(20)), "order lost"
    assert crec.is_connected(conn)


def check_concurrent_senders(pair: TransportPair) -> None:
    server, _ = _echo_server(pair)
    client, crec = _client(pair)
    conn = _connect(client, crec, server)

    def sender(base: int) -> None:
        for i in range(base, base + 250):
            client.send(conn, _request(i))

    threads = [threading.Thread(target=sender, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    crec.wait_for(lambda: len(crec.messages_on(conn)) == 1000, WAIT * 3, "1000 replies")
    want = sorted(k * 1000 + i for k in range(4) for i in range(250))
    assert sorted(m.header.id for m in crec.messages_on(conn)) == want


def check_isolation(pair: TransportPair) -> None:
    server, srec = _echo_server(pair)
    clients = [_client(pair) for _ in range(3)]
    conns = [_connect(c, rec, server) for c, rec in clients]
    for k, ((client, _), conn) in enumerate(zip(clients, conns, strict=True)):
        for i in range(50):  # the same ids on every client: routing must not mix them up
            client.send(conn, _request(i, [(BodyKind.DATA, b"client%d" % k)]))
    for k, ((_, rec), conn) in enumerate(zip(clients, conns, strict=True)):
        rec.wait_for(_has(rec, conn, 50), WAIT, "replies")
        assert all(_body(m) == [(BodyKind.DATA, b"client%d" % k)] for m in rec.messages_on(conn))
    assert len(set(srec.peers())) == 3
    clients[0][0].disconnect(conns[0])
    clients[0][1].wait_for(lambda: bool(clients[0][1].reasons(conns[0])), WAIT, "disconnect")
    _round_trip(clients[1][0], clients[1][1], conns[1], 999)
    assert clients[1][1].is_connected(conns[1]) and clients[2][1].is_connected(conns[2])


def check_publish(pair: TransportPair) -> None:
    server, srec = _echo_server(pair)
    clients = [_client(pair) for _ in range(3)]
    conns = [_connect(c, rec, server) for c, rec in clients]
    for k, ((client, _), conn) in enumerate(zip(clients, conns, strict=True)):
        client.send(conn, _request(100 + k))  # stands for a SUBSCRIBE with id 100 + k
    srec.wait_for(lambda: len(srec.messages) == 3, WAIT, "subscriptions")
    subs = [(peer, m.header.id) for peer, m in srec.messages]
    context = encode_context(DataContext("CPS.USER.SFT", 5, 6), 1)
    data = b"shared data frame"
    tail = encode_tail([(BodyKind.DATA, data), (BodyKind.DATA_CONTEXT, context)])
    for round_, conflatable in enumerate((False, True)):
        targets: list[tuple[bytes, int, Buffer]] = [
            (peer, sub, encode_header(Header(RequestType.NOTIFICATION_DATA, sub, "PS1", "N")))
            for peer, sub in subs
        ]
        targets.insert(1, (b"no-such-peer", 7, targets[0][2]))  # must not stop the others
        server.publish(targets, tail, conflatable)
        for (_, rec), conn in zip(clients, conns, strict=True):
            rec.wait_for(_has(rec, conn, round_ + 2), WAIT, "notification")
    for k, ((_, rec), conn) in enumerate(zip(clients, conns, strict=True)):
        for note in rec.messages_on(conn)[1:]:
            assert note.header.request_type is RequestType.NOTIFICATION_DATA
            assert note.header.id == 100 + k, "each peer gets its own header"
            assert _body(note) == [(BodyKind.DATA, data), (BodyKind.DATA_CONTEXT, context)]


def check_client_disconnect(pair: TransportPair) -> None:
    server, _ = _echo_server(pair)
    client, crec = _client(pair)
    conn, other = _connect(client, crec, server), _connect(client, crec, server)
    client.disconnect(conn)
    crec.wait_for(lambda: bool(crec.reasons(conn)), WAIT, "on_disconnected")
    client.disconnect(conn)  # again: no second report
    _round_trip(client, crec, other, 1)
    assert crec.reasons(conn) == ["closed locally"], crec.reasons(conn)
    assert crec.is_connected(other)
    stats = client.statistics()
    assert stats.connections == 1 and stats.disconnects == 1, stats


def check_server_disconnect(pair: TransportPair) -> None:
    server, srec = _echo_server(pair)
    clients = [_client(pair) for _ in range(2)]
    conns = [_connect(c, rec, server) for c, rec in clients]
    srec.wait_for(lambda: len(srec.peers()) == 2, WAIT, "two peers")
    peer = srec.connected[0][0]
    server.disconnect(peer)
    srec.wait_for(lambda: bool(srec.reasons(peer)), WAIT, "on_peer_disconnected")
    server.disconnect(peer)  # again: no second report
    _round_trip(clients[1][0], clients[1][1], conns[1], 1)
    assert srec.reasons(peer) == ["closed locally"], srec.reasons(peer)
    assert server.statistics().peers == 1


def check_dead_connection(pair: TransportPair) -> None:
    server, srec = _echo_server(pair)
    client, crec = _client(pair)
    conn, dead = _connect(client, crec, server), _connect(client, crec, server)
    client.disconnect(dead)
    crec.wait_for(lambda: bool(crec.reasons(dead)), WAIT, "on_disconnected")
    client.send(dead, _request(1))  # no-ops, no exception
    client.send(123456, _request(2))
    client.disconnect(123456)
    server.send(b"no-such-peer", _request(3))
    server.send(b"no-such-peer", _request(3), conflate_key=9)
    server.disconnect(b"no-such-peer")
    _round_trip(client, crec, conn, 4)
    assert [c for c, _ in crec.disconnected] == [dead]
    assert not any(p == b"no-such-peer" for p, _ in srec.disconnected)
    assert [m.header.id for m in crec.messages_on(conn)] == [4]


def check_statistics(pair: TransportPair) -> None:
    server, _ = _echo_server(pair)
    client, crec = _client(pair)
    before_c, before_s = client.statistics(), server.statistics()
    assert isinstance(before_c, ClientTransportStatistics), before_c
    assert isinstance(before_s, ServerTransportStatistics), before_s
    conn = _connect(client, crec, server)
    sent = [_request(i, [(BodyKind.DATA, b"x" * 1000)]) for i in range(10)]
    for frames in sent:
        client.send(conn, frames)
    crec.wait_for(lambda: len(crec.messages_on(conn)) == 10, WAIT, "replies")
    # A dispatcher counts a message once its send returned, and the peer may act on it before
    # that: wait until the sender's books include the last reply (the figures stay exact).
    crec.wait_for(lambda: server.statistics().messages_out >= 11, WAIT, "server books")
    c, s = client.statistics(), server.statistics()
    size = sum(_size(f) for f in sent)
    assert c.messages_out >= 11 and c.bytes_out >= size, c  # CONNECT + 10 requests
    assert c.messages_in >= 11 and c.bytes_in >= 10 * 1000, c  # ACK + 10 replies
    assert s.messages_in >= 11 and s.bytes_in >= size, s
    assert s.messages_out >= 11 and s.bytes_out >= 10 * 1000, s
    assert c.connections == 1 and s.peers == 1, (c, s)
    assert c.decode_errors == 0 and s.decode_errors == 0, (c, s)
    # One entry per connected peer; a healthy peer has nothing queued and lost nothing.
    peers = server.peer_statistics()
    assert len(peers) == 1, peers
    ((peer_stats),) = peers.values()
    assert (peer_stats.queue_depth, peer_stats.conflated, peer_stats.dropped) == (0, 0, 0)
    client.disconnect(conn)
    crec.wait_for(lambda: bool(crec.reasons(conn)), WAIT, "on_disconnected")
    c = client.statistics()
    assert c.connections == 0 and c.disconnects == 1, c


def check_close(pair: TransportPair) -> None:
    server, _ = _echo_server(pair)
    client, crec = _client(pair)
    conn = _connect(client, crec, server)
    for i in range(200):  # traffic in flight while closing
        client.send(conn, _request(i))
    start = time.monotonic()
    client.close()
    client.close()
    client.close(timeout=1.0)
    assert time.monotonic() - start < SETTINGS.close_timeout + 5.0, "close is not bounded"
    assert crec.reasons(conn) == ["closed locally"], crec.reasons(conn)
    client.send(conn, _request(1))  # after close: a no-op
    server.close()
    server.close()


def check_close_from_handler(pair: TransportPair) -> None:
    holder: list[ClientTransport] = []

    def close_client(conn: int, message: Message) -> None:
        if message.header.device == "close":
            holder[0].close()  # on the dispatcher: must return, not deadlock on a self-join

    def close_server(server: ServerTransport, peer: bytes, message: Message) -> None:
        if message.header.device == "close-server":
            server.close()

    server, srec = _echo_server(pair, extra=close_server)
    client, crec = _client(pair, hook=close_client)
    holder.append(client)
    conn = _connect(client, crec, server)
    client.send(conn, _request(1, device="close"))
    crec.wait_for(lambda: bool(crec.reasons(conn)), WAIT, "close from the client's handler")
    assert crec.reasons(conn) == ["closed locally"]
    client.close()  # and again from outside: idempotent
    other, orec = _client(pair)
    conn2 = _connect(other, orec, server)
    other.send(conn2, _request(2, device="close-server"))
    srec.wait_for(lambda: bool(srec.disconnected), WAIT, "server closed from its handler")
    server.close()


def check_server_close_noticed(pair: TransportPair) -> None:
    # The heartbeat cannot explain a prompt notice with a 60 s timeout: the closed connection
    # must be seen (socket monitor, or the in-memory link).
    slow = TransportSettings(heartbeat_interval=5.0, heartbeat_timeout=60.0, close_timeout=5.0)
    server, _ = _echo_server(pair, slow)
    client, crec = _client(pair, slow)
    conn = _connect(client, crec, server)
    _round_trip(client, crec, conn, 1)
    server.close()
    crec.wait_for(lambda: bool(crec.reasons(conn)), WAIT, "on_disconnected after server close")
    assert crec.reasons(conn)[0] != "heartbeat timeout", crec.reasons(conn)


def check_heartbeat_keepalive(pair: TransportPair) -> None:
    fast = TransportSettings(heartbeat_interval=0.05, heartbeat_timeout=2.0, close_timeout=5.0)
    server, srec = _echo_server(pair, fast)
    client, crec = _client(pair, fast)
    conn = _connect(client, crec, server)
    c0, s0 = client.statistics().messages_in, server.statistics().messages_in
    # Idle: only heartbeats can make these counters move, in both directions.
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if client.statistics().messages_in >= c0 + 5 and server.statistics().messages_in >= s0 + 5:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("no heartbeats flowed on an idle connection")
    assert not crec.disconnected and not srec.disconnected, (crec.disconnected, srec.disconnected)
    _round_trip(client, crec, conn, 1)


def check_lanes(pair: TransportPair) -> None:
    """A blocking caller's own lane: only while the connection is acknowledged; a session of
    its own at the server (a lane, counted apart from peers); the reply to its request comes
    back on the calling thread; a request whose owner ends it returns None."""
    silent: set[int] = set()

    holder: list[ServerTransport] = []

    def echo(peer: bytes, message: Message) -> None:
        h = message.header
        if h.device == "SILENT":
            silent.add(h.id)
            return
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        holder[0].send(peer, encode_message(Kind.REPLY, reply, message.body))

    srec = RecordingServerHandler(on_message=echo)
    holder.append(pair.make_server(srec, SETTINGS, dict(SERVER_INFO)))
    server = holder[0]
    client, crec = _client(pair)
    assert client.lane(12345) is None, "a lane for an unknown connection"
    conn = _connect(client, crec, server)
    lane = client.lane(conn)
    assert lane is not None, "no lane on an acknowledged connection"
    assert client.lane(conn) is lane, "a thread has one lane per server"
    body: list[tuple[BodyKind, Buffer]] = [(BodyKind.DATA, b"on the lane")]
    reply = lane.call(_request(7, body), 7, lambda: False, time.monotonic())
    assert reply is not None and reply.header.id == 7 and _body(reply) == body, reply
    srec.wait_for(lambda: len(srec.connected) == 2, WAIT, "the lane's own session")
    lane_info = [info for _, info in srec.connected if info.get("lane") is True]
    assert len(lane_info) == 1, srec.connected
    assert server.statistics().lanes == 1 and server.statistics().peers == 1
    assert client.statistics().lanes == 1
    assert not crec.messages_on(conn), "a lane's reply went through the dispatcher"
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(client.lane(conn)))
    thread.start()
    thread.join(WAIT)
    assert other and other[0] is not None and other[0] is not lane, "lanes are per thread"
    ended = threading.Event()
    calls = 0

    def ended_after_a_wait() -> bool:
        nonlocal calls
        calls += 1
        return ended.is_set() or calls > 2

    header = Header(RequestType.GET, 8, "SILENT", "Acquisition", "")
    assert lane.call(encode_message(Kind.REQUEST, header), 8, ended_after_a_wait, 0.0) is None
    assert 8 in silent and calls > 2


def check_wake_later(pair: TransportPair) -> None:
    """``wake_later`` sets at once off the dispatcher; on it (a handler completing a blocking
    request), only once the handler returned."""
    server, _ = _echo_server(pair)
    seen: list[bool] = []
    waker = threading.Event()

    def hook(conn: int, message: Message) -> None:
        client.wake_later(waker)
        seen.append(waker.is_set())  # still on the dispatcher: not yet

    client, crec = _client(pair, hook=hook)
    now = threading.Event()
    client.wake_later(now)
    assert now.is_set(), "wake_later from another thread must set at once"
    conn = _connect(client, crec, server)
    client.send(conn, _request(1))
    assert waker.wait(WAIT), "the deferred wake-up never came"
    assert seen == [False], f"set while the handler still ran: {seen}"


def check_hand_over(pair: TransportPair) -> None:
    """A server that hands over (``hands_over``): a handler blocking on the dispatcher does
    not stop the server; another client's request is answered meanwhile."""
    release = threading.Event()
    holder: list[ServerTransport] = []

    def blocking_echo(peer: bytes, message: Message) -> None:
        h = message.header
        if h.device == "SLOW":
            release.wait(WAIT)
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        holder[0].send(peer, encode_message(Kind.REPLY, reply, message.body))

    srec = RecordingServerHandler(on_message=blocking_echo)
    settings = TransportSettings(handover_after=0.002, close_timeout=WAIT)
    holder.append(pair.make_server(srec, settings, dict(SERVER_INFO)))
    server = holder[0]
    if not server.hands_over:
        return  # the contract allows a transport that never hands over
    slow, srec_slow = _client(pair)
    fast, frec = _client(pair)
    slow_conn = _connect(slow, srec_slow, server)
    fast_conn = _connect(fast, frec, server)
    try:
        slow.send(slow_conn, _request(1, device="SLOW"))
        srec.wait_for(lambda: len(srec.messages) == 1, WAIT, "the slow request")
        _round_trip(fast, frec, fast_conn, 2)  # answered while the slow handler blocks
        assert not srec_slow.messages_on(slow_conn), "the slow reply came before its release"
        assert server.statistics().handovers >= 1
    finally:
        release.set()
    srec_slow.wait_for(_has(srec_slow, slow_conn, 1), WAIT, "the slow reply")


_CHECKS: dict[str, Callable[[TransportPair], None]] = {
    "handshake": check_handshake,
    "echo": check_echo,
    "many_in_flight": check_many_in_flight,
    "send_before_ack": check_send_before_ack,
    "concurrent_senders": check_concurrent_senders,
    "isolation": check_isolation,
    "publish": check_publish,
    "client_disconnect": check_client_disconnect,
    "server_disconnect": check_server_disconnect,
    "dead_connection": check_dead_connection,
    "statistics": check_statistics,
    "close": check_close,
    "close_from_handler": check_close_from_handler,
    "server_close_noticed": check_server_close_noticed,
    "heartbeat_keepalive": check_heartbeat_keepalive,
    "lanes": check_lanes,
    "wake_later": check_wake_later,
    "hand_over": check_hand_over,
}
CONFORMANCE_CHECKS: tuple[str, ...] = tuple(_CHECKS)


# Started once per process by libraries, not by a transport: pyzmq's zero-copy send keeps a
# garbage-collector thread for the lifetime of the process.
_PROCESS_THREADS = frozenset({"GarbageCollectorThread"})


def _assert_no_new_threads(before: set[threading.Thread], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and type(t).__name__ not in _PROCESS_THREADS
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked, f"{what}: threads still running: {[t.name for t in leaked]}"


def check_transport(
    make_pair: MakePair, *, only: Iterable[str] | None = None, heartbeats: bool = True
) -> None:
    """Run the conformance checks (all, or those named in ``only``) against ``make_pair``.

    ``heartbeats=False`` skips ``heartbeat_keepalive``, the one check that needs real time to
    pass (about 0.3 s). Raises ``AssertionError`` naming the failing check.
    """
    names = list(CONFORMANCE_CHECKS if only is None else only)
    unknown = [n for n in names if n not in _CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {', '.join(CONFORMANCE_CHECKS)}")
    for name in names:
        if name == "heartbeat_keepalive" and not heartbeats:
            continue
        before = set(threading.enumerate())
        try:
            with make_pair() as pair:
                _CHECKS[name](pair)
        except AssertionError as exc:
            raise AssertionError(f"conformance check {name!r} failed: {exc}") from exc
        _assert_no_new_threads(before, f"conformance check {name!r}")
