"""ZmqServerTransport against raw pyzmq DEALERs and a ZmqClientTransport (127.0.0.1)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from rda.serialization.header import (
    PROTOCOL_VERSION,
    Header,
    HeaderFlags,
    RequestType,
    encode_header,
)
from rda.serialization.message import BodyKind, Message
from rda.testing import FakeClock, wait_until
from rda.transport import _zmq_common as common
from rda.transport._outbox import Outbox, PutResult, RetryBackoff
from rda.transport.api import TransportSettings
from rda.transport.protocol import (
    LARGE_BODY,
    Incoming,
    Kind,
    Reconnect,
    decode_frames,
    encode_connect,
    encode_heartbeat,
    encode_message,
    encode_tail,
)
from rda.transport.reasons import PEER_GONE
from rda.transport.state import ConnEvent
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

WAIT = 10.0
WAIT_MS = 10_000
Ctx = zmq.Context[zmq.Socket[bytes]]
# Raw dealers read "the next message": on a loaded machine a heartbeat (every 1 s by default)
# could come first, so servers of tests that do not test heartbeats send none within a test.
QUIET = TransportSettings(heartbeat_interval=30.0, heartbeat_timeout=60.0)


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
    header = Header(RequestType.GET, rid, "DEV", "Prop")
    return encode_message(Kind.REQUEST, header, [(BodyKind.DATA, body)])


class Rec:
    def __init__(self) -> None:
        self.transport: ZmqServerTransport | None = None
        self.peers: dict[bytes, dict[str, Any]] = {}
        self.requests: list[tuple[bytes, Message]] = []
        self.gone: dict[bytes, str] = {}
        self.echo = True
        self.raise_on: int | None = None

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        self.peers[peer] = client_info

    def on_message(self, peer: bytes, message: Message) -> None:
        self.requests.append((peer, message))
        if message.header.id == self.raise_on:
            raise RuntimeError("business bug")
        if self.echo and self.transport is not None:
            reply = Header(RequestType.REPLY, message.header.id)
            self.transport.send(peer, encode_message(Kind.REPLY, reply, message.body))

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        self.gone[peer] = reason


class NullClient:
    def __init__(self) -> None:
        self.replies: list[Message] = []
        self.connected = threading.Event()

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self.connected.set()

    def on_message(self, connection: int, message: Message) -> None:
        self.replies.append(message)

    def on_disconnected(self, connection: int, reason: str) -> None:
        pass


def start_server(
    endpoint: str = "tcp://127.0.0.1:0",
    settings: TransportSettings | None = None,
    context: Ctx | None = None,
    sndhwm: int = 1000,
) -> tuple[ZmqServerTransport, Rec]:
    rec = Rec()
    srv = ZmqServerTransport(
        endpoint,
        rec,
        settings or QUIET,
        {"name": "TestServer"},
        context,
        sndhwm=sndhwm,
    )
    rec.transport = srv
    srv.start()
    return srv, rec


@pytest.fixture
def ctx() -> Iterator[Ctx]:
    context: Ctx = zmq.Context()
    yield context
    context.term()


def raw_dealer(ctx: Ctx, endpoint: str, rid: bytes, handshake: bool = True) -> zmq.Socket[bytes]:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.ROUTING_ID, rid)
    d.connect(endpoint)
    if handshake:
        d.send_multipart(encode_connect({"application": "raw"}))
        assert d.poll(WAIT_MS)
        ack = decode_frames(d.recv_multipart(), from_server=True)
        assert type(ack).__name__ == "ConnectAck"
    return d


def test_bind_port_zero_reports_the_real_port() -> None:
    srv, _ = start_server()
    try:
        assert srv.endpoint.startswith("tcp://127.0.0.1:")
        assert int(srv.endpoint.rsplit(":", 1)[1]) > 0
    finally:
        srv.close()


@pytest.mark.parametrize("scheme", ["ipc", "inproc"])
def test_ipc_and_inproc_endpoints(scheme: str, tmp_path: Path, ctx: Ctx) -> None:
    endpoint = f"ipc://{tmp_path}/s.sock" if scheme == "ipc" else "inproc://rda-test-server"
    srv, rec = start_server(endpoint, context=ctx)
    d = raw_dealer(ctx, srv.endpoint, b"raw-1")
    try:
        assert srv.endpoint == endpoint
        d.send_multipart(request(5))
        assert d.poll(WAIT_MS)
        reply = decode_frames(d.recv_multipart(), from_server=True)
        assert reply.message.header.id == 5  # type: ignore[union-attr]
        assert rec.peers[b"raw-1"]["application"] == "raw"
    finally:
        d.close(0)
        srv.close()


def test_silent_peer_is_dropped_by_heartbeat(ctx: Ctx) -> None:
    # Real time on purpose: this is the one test of real heartbeat frames on a real socket
    # (test_heartbeat_expiry_with_a_fake_clock has the timer rules). The timeout is ten
    # intervals, so a dispatcher descheduled for a while still sends heartbeats before the drop.
    settings = TransportSettings(heartbeat_interval=0.1, heartbeat_timeout=1.0)
    srv, rec = start_server(settings=settings)
    d = raw_dealer(ctx, srv.endpoint, b"silent")
    try:
        wait_until(lambda: b"silent" in rec.gone)
        assert rec.gone[b"silent"] == "heartbeat timeout"
        stats = srv.statistics()
        assert stats.heartbeat_timeouts == 1 and stats.peers == 0
        # The server sent heartbeats meanwhile (the TCP connection stayed open all along).
        frames = []
        while d.poll(0):
            frames.append(d.recv_multipart())
        assert encode_heartbeat(from_server=True) in frames
    finally:
        d.close(0)
        srv.close()


def test_any_traffic_keeps_a_peer_alive(ctx: Ctx) -> None:
    # On a fake clock: the test is about which peers the timer drops, and with real time a
    # descheduled sender would look silent. Each step waits until the server has read the
    # chatty peer's message before time moves on; a message read in the same drain as the
    # one before carries that drain's (older) time, so the chatty peer is at worst two
    # steps (8 s) behind: under the 10 s timeout. The silent peer is the control: the same
    # timer, over the same 20 s, drops it.
    clock = FakeClock(100.0)
    rec = Rec()
    settings = TransportSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    srv = ZmqServerTransport("tcp://127.0.0.1:0", rec, settings, context=ctx, clock=clock)
    rec.transport = srv
    srv.start()
    chatty = raw_dealer(ctx, srv.endpoint, b"chatty")
    silent = raw_dealer(ctx, srv.endpoint, b"silent")
    try:
        for _ in range(5):  # 5 steps of 4 s: twice the timeout
            clock.advance(4.0)
            heard = srv.statistics().messages_in
            chatty.send_multipart(encode_heartbeat(from_server=False))
            wait_until(
                lambda: srv.statistics().messages_in > heard,  # noqa: B023 (read at once)
                "the server to read the chatty peer's heartbeat",
            )
        wait_until(lambda: b"silent" in rec.gone, "the silent peer to be dropped")
        assert rec.gone == {b"silent": "heartbeat timeout"}
        assert srv.statistics().peers == 1
    finally:
        chatty.close(0)
        silent.close(0)
        srv.close()


def test_closed_peer_connection_is_dropped_at_once(ctx: Ctx) -> None:
    settings = TransportSettings(heartbeat_interval=10.0, heartbeat_timeout=30.0)
    srv, rec = start_server(settings=settings)
    d = raw_dealer(ctx, srv.endpoint, b"leaver")
    try:
        d.close(0)
        wait_until(lambda: b"leaver" in rec.gone, "the closed peer to be dropped")
        assert rec.gone[b"leaver"] == "peer gone"
        assert srv.statistics().heartbeat_timeouts == 0
    finally:
        srv.close()


def test_request_before_connect_gets_reconnect_and_a_protocol_error_reply(ctx: Ctx) -> None:
    srv, rec = start_server()
    d = raw_dealer(ctx, srv.endpoint, b"rude", handshake=False)
    try:
        d.send_multipart(request(77))
        assert d.poll(WAIT_MS)
        # First "connect again" (a client the server forgot acts on it at once), then the
        # answer to the request itself, so that a caller that does not know RECONNECT fails fast.
        assert isinstance(decode_frames(d.recv_multipart(), from_server=True), Reconnect)
        assert d.poll(WAIT_MS)
        event = decode_frames(d.recv_multipart(), from_server=True)
        msg = event.message  # type: ignore[union-attr]
        assert msg.header.request_type is RequestType.EXCEPTION and msg.header.id == 77
        assert msg.exception is not None and msg.exception[0] == "ProtocolError"
        assert srv.statistics().protocol_errors == 1
        assert rec.requests == []
    finally:
        d.close(0)
        srv.close()


def test_publish_fans_one_tail_out_and_disconnect_reports(ctx: Ctx) -> None:
    srv, rec = start_server()
    a = raw_dealer(ctx, srv.endpoint, b"peer-a")
    b = raw_dealer(ctx, srv.endpoint, b"peer-b")
    try:
        tail = encode_tail([(BodyKind.DATA, b"DATA")])
        targets = []
        for peer, sub in ((b"peer-a", 11), (b"peer-b", 22)):
            header = Header(RequestType.NOTIFICATION_DATA, sub, flags=HeaderFlags.CONFLATABLE)
            targets.append((peer, sub, encode_header(header)))
        srv.publish(targets, tail)
        for sock, sub in ((a, 11), (b, 22)):
            assert sock.poll(WAIT_MS)
            msg = decode_frames(sock.recv_multipart(), from_server=True).message  # type: ignore[union-attr]
            assert msg.header.id == sub and bytes(msg.body[0][1]) == b"DATA"
        srv.disconnect(b"peer-a")
        wait_until(lambda: rec.gone.get(b"peer-a") == "closed locally")
        srv.send(b"peer-a", request(1))  # forgotten peer: dropped, counted
        wait_until(lambda: srv.statistics().messages_dropped == 1)
    finally:
        a.close(0)
        b.close(0)
        srv.close()


def test_a_connect_records_the_connections_file_descriptor(ctx: Ctx) -> None:
    """The CONNECT's SRCFD (read by the direct receive before libzmq's message is closed, or
    from the zmq.Frame) is what lets the monitor's DISCONNECTED find the peer at once."""
    srv, rec = start_server()
    d = raw_dealer(ctx, srv.endpoint, b"fd-peer")
    try:
        wait_until(lambda: b"fd-peer" in rec.peers)
        peer = srv._table.peers[b"fd-peer"]
        assert peer.fd >= 0 and srv._wire.by_fd[peer.fd] == b"fd-peer"
    finally:
        d.close(0)
        srv.close()


def test_a_new_connection_on_a_closed_peers_descriptor_has_that_peer_probed_and_dropped(
    ctx: Ctx, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the monitor's DISCONNECTED for a closed connection can be read after the
    CONNECT of a new one that got the same descriptor; it then names the new peer. The
    CONNECT itself proves the old connection closed: the old peer goes at once, not at its
    next heartbeat (30 s here; a client's lane gets none, and went after its timeout)."""
    settings = TransportSettings(heartbeat_interval=30.0, heartbeat_timeout=60.0)
    srv, rec = start_server(settings=settings)

    def unread(monitor: zmq.Socket[bytes]) -> None:  # DISCONNECTED comes too late to help
        while monitor.poll(0):
            monitor.recv_multipart()

    monkeypatch.setattr(srv._wire, "on_monitor", unread)
    peers = [raw_dealer(ctx, srv.endpoint, b"old-peer")]
    try:
        wait_until(lambda: b"old-peer" in rec.peers)
        fd = srv._table.peers[b"old-peer"].fd
        peers.pop().close(0)
        # Wait until libzmq has closed the descriptor (the server runs in this process).
        wait_until(lambda: not os.path.exists(f"/proc/self/fd/{fd}") or _other(fd))

        # The kernel gives the next connection the lowest free descriptor, often ``fd`` but
        # not always in a full run: the new peer is told it got ``fd``, as it would have.
        # The new peer's CONNECT is received as if its connection had got ``fd`` (a CONNECT
        # comes as (frames, srcfd, user_id), frames[0] the routing id), on either receive.
        def reusing_the_descriptor(recv: Callable[..., Any]) -> Callable[..., Any]:
            def received(*args: Any) -> Any:
                got = recv(*args)
                if type(got) is tuple and got[0][0] == b"new-peer":
                    return (got[0], fd, got[2])
                return got

            return received

        if common.direct_recv_routed is not None:
            patched = reusing_the_descriptor(common.direct_recv_routed)
            monkeypatch.setattr(common, "direct_recv_routed", patched)
        monkeypatch.setattr(common, "recv_routed", reusing_the_descriptor(common.recv_routed))
        peers.append(raw_dealer(ctx, srv.endpoint, b"new-peer"))
        wait_until(lambda: b"new-peer" in srv._table.peers)
        assert srv._wire.by_fd[fd] == b"new-peer"
        wait_until(lambda: rec.gone.get(b"old-peer") is not None, timeout=5.0)
        assert rec.gone[b"old-peer"] == PEER_GONE and b"new-peer" in srv._table.peers
    finally:
        for sock in peers:
            sock.close(0)
        srv.close()


def _other(fd: int) -> bool:
    """``fd`` was closed and is reused already by something that is no TCP socket."""
    try:
        return not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:
        return True


def test_small_messages_cross_as_one_frame_and_large_bodies_as_their_own(ctx: Ctx) -> None:
    """Protocol v2 on a real socket: what a raw DEALER receives, frame by frame."""
    srv, rec = start_server()
    d = raw_dealer(ctx, srv.endpoint, b"peer")
    try:
        d.send_multipart(request(1, b"small"))
        assert d.poll(WAIT_MS)
        (frame,) = d.recv_multipart()  # one frame: kind, header, body table, body
        assert frame[:2] == bytes([Kind.REPLY, PROTOCOL_VERSION]) and frame.endswith(b"small")
        big = bytes(range(256)) * (LARGE_BODY // 256 + 1)
        d.send_multipart(request(2, big))
        assert d.poll(WAIT_MS)
        packed, body = d.recv_multipart()
        assert body == big  # its own frame, untouched
        event = decode_frames([packed, body], from_server=True)
        assert isinstance(event, Incoming) and event.message.header.id == 2
        assert [k for k, _ in event.message.body] == [BodyKind.DATA]
        assert [m.header.id for _, m in rec.requests] == [1, 2]
    finally:
        d.close(0)
        srv.close()


def test_handler_that_raises_is_counted_and_dispatcher_lives_on(ctx: Ctx) -> None:
    srv, rec = start_server()
    rec.raise_on = 1
    d = raw_dealer(ctx, srv.endpoint, b"p")
    try:
        d.send_multipart(request(1))
        d.send_multipart(request(2))
        assert d.poll(WAIT_MS)
        msg = decode_frames(d.recv_multipart(), from_server=True).message  # type: ignore[union-attr]
        assert msg.header.id == 2
        assert srv.statistics().handler_errors == 1
    finally:
        d.close(0)
        srv.close()


def test_slow_client_is_isolated_bounded_and_conflated(ctx: Ctx) -> None:
    limit = 20
    srv, rec = start_server(settings=TransportSettings(peer_queue_limit=limit), sndhwm=4)
    slow = ctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.LINGER, 0)
    slow.setsockopt(zmq.RCVHWM, 1)
    slow.setsockopt(zmq.RCVBUF, 64 * 1024)
    slow.setsockopt(zmq.ROUTING_ID, b"slow")
    slow.connect(srv.endpoint)
    slow.send_multipart(encode_connect({"application": "slow"}))
    fast = NullClient()
    client = ZmqClientTransport(fast)
    client.start()
    try:
        wait_until(lambda: b"slow" in rec.peers)
        big = b"x" * (256 * 1024)
        header = encode_header(Header(RequestType.NOTIFICATION_DATA, 9))
        # Flood the slow peer with conflatable notifications of one subscription ...
        for _ in range(200):
            srv.publish([(b"slow", 9, header)], encode_tail([(BodyKind.DATA, big)]))
        wait_until(lambda: srv.statistics().notifications_conflated > 0)
        # ... then with plain messages until its queue overflows.
        for i in range(limit * 3):
            srv.send(b"slow", request(i, big))
        wait_until(lambda: srv.statistics().messages_dropped > 0)
        assert srv.statistics().peer_queue_depth <= limit
        # The per-peer view says who lost what: the slow peer, on subscription 9.
        slow_stats = srv.peer_statistics()[b"slow"]
        assert slow_stats.conflated_by_key.get(9, 0) > 0
        assert slow_stats.dropped > 0
        assert slow_stats.queue_depth <= limit
        # Meanwhile another client is served normally.
        conn = client.connect(srv.endpoint)
        for i in range(20):
            client.send(conn, request(1000 + i))
        wait_until(lambda: len(fast.replies) == 20)
        assert b"slow" not in rec.gone
    finally:
        client.close()
        slow.close(0)
        srv.close()


def test_heartbeat_expiry_with_a_fake_clock(ctx: Ctx) -> None:
    clock = FakeClock(100.0)
    rec = Rec()
    settings = TransportSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    srv = ZmqServerTransport("tcp://127.0.0.1:0", rec, settings, context=ctx, clock=clock)
    rec.transport = srv
    srv.start()
    a = raw_dealer(ctx, srv.endpoint, b"a")
    b = c = None
    try:
        clock.advance(9.9)
        b = raw_dealer(ctx, srv.endpoint, b"b")  # wakes the dispatcher: a has not expired yet
        assert rec.gone == {}
        clock.advance(0.2)
        c = raw_dealer(ctx, srv.endpoint, b"c")  # wakes the dispatcher again: a has expired
        wait_until(lambda: b"a" in rec.gone)
        assert rec.gone == {b"a": "heartbeat timeout"}  # b heard from 0.2 s ago, c just now
        assert srv.statistics().heartbeat_timeouts == 1
    finally:
        for sock in (a, b, c):
            if sock is not None:
                sock.close(0)
        srv.close()


def test_back_pressure_blocks_a_worker_while_the_server_dispatcher_is_stalled(ctx: Ctx) -> None:
    hwm = 20
    # No standby: with one, a stalled handler no longer stalls the dispatching (_relay).
    settings = TransportSettings(send_hwm=hwm, handover_after=0)
    srv, rec = start_server(settings=settings, context=ctx)
    stall = threading.Event()
    entered = threading.Event()
    rec.echo = False
    d = raw_dealer(ctx, srv.endpoint, b"p")
    orig = rec.on_message

    def blocking(peer: bytes, message: Message) -> None:
        orig(peer, message)
        entered.set()
        stall.wait(WAIT)

    rec.on_message = blocking  # type: ignore[method-assign]
    sent = [0]
    total = 10 * hwm

    def worker() -> None:
        for i in range(total):
            srv.send(b"p", request(i))
            sent[0] += 1

    producer = threading.Thread(target=worker)
    try:
        d.send_multipart(request(0))
        assert entered.wait(WAIT)  # the dispatcher is now stuck in the handler
        producer.start()
        # The pipe takes at least send_hwm; then the worker must block. A descheduled worker
        # can pause anywhere, but only at or above that floor (waited for first) and never
        # above the bound: a slow machine cannot fail this. Without a bound the worker would
        # send all it has long before STALLED seconds without progress.
        wait_until(lambda: sent[0] >= hwm, "the worker to fill the pipe", probe=lambda: sent)
        wait_until(
            unchanged_for(STALLED, lambda: sent[0]), "the worker to block", probe=lambda: sent
        )
        assert producer.is_alive()
        assert hwm <= sent[0] <= 2 * hwm + 2
        stall.set()
        producer.join(WAIT)
        assert not producer.is_alive()
        got = 0
        while got < total and d.poll(WAIT_MS):
            d.recv_multipart()
            got += 1
        assert got == total
    finally:
        stall.set()
        if producer.is_alive() or producer.ident is not None:
            producer.join(WAIT)
        d.close(0)
        srv.close()


def test_outbox_keeps_order_conflates_by_key_and_bounds() -> None:
    box = Outbox()
    assert box.put(["a"], None, limit=3) is PutResult.QUEUED
    assert box.put(["n1"], 7, limit=3) is PutResult.QUEUED
    assert box.put(["n2"], 7, limit=3) is PutResult.CONFLATED  # latest wins, same place
    assert box.put(["b"], None, limit=3) is PutResult.QUEUED
    assert box.put(["c"], None, limit=3) is PutResult.DROPPED
    assert box.put(["n3"], 7, limit=3) is PutResult.CONFLATED  # replacing needs no room
    assert box.put(["m"], 8, limit=3) is PutResult.DROPPED
    out = []
    while box:
        out.append(box.head()[0])
        box.pop()
    assert out == ["a", "n3", "b"]
    assert box.put(["n4"], 7, limit=3) is PutResult.QUEUED  # key 7 left the queue with n3
    assert box.clear() == 1 and len(box) == 0


def test_retry_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = RetryBackoff(first=0.001, cap=0.004)
    assert [backoff.next_delay() for _ in range(4)] == [0.001, 0.002, 0.004, 0.004]
    backoff.reset()
    assert backoff.next_delay() == 0.001


def test_messages_queued_for_a_dropped_peer_are_counted_as_dropped(ctx: Ctx) -> None:
    # No heartbeat in the window: every message out below is one that left the queue.
    settings = TransportSettings(peer_queue_limit=50, heartbeat_interval=60, heartbeat_timeout=120)
    srv, rec = start_server(settings=settings, sndhwm=2)
    slow = ctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.LINGER, 0)
    slow.setsockopt(zmq.RCVHWM, 1)
    slow.setsockopt(zmq.RCVBUF, 64 * 1024)
    slow.setsockopt(zmq.ROUTING_ID, b"slow")
    slow.connect(srv.endpoint)
    slow.send_multipart(encode_connect({"application": "slow"}))
    try:
        wait_until(lambda: b"slow" in rec.peers)
        big = b"x" * (256 * 1024)
        for i in range(30):
            srv.send(b"slow", request(i, big))
        wait_until(lambda: srv.statistics().peer_queue_depth > 0)
        before = srv.statistics()
        srv.disconnect(b"slow")
        wait_until(lambda: b"slow" in rec.gone)
        after = srv.statistics()
        assert after.peer_queue_depth == 0
        # Nothing the peer never received disappears uncounted: each message queued at `before`
        # was either sent (the dispatcher retries the queue until it handles the disconnect,
        # and libzmq may have made room meanwhile) or counted as dropped, exactly once.
        sent_meanwhile = after.messages_out - before.messages_out
        dropped = after.messages_dropped - before.messages_dropped
        assert dropped > 0 and dropped + sent_meanwhile == before.peer_queue_depth
    finally:
        slow.close(0)
        srv.close()


def test_messages_read_after_the_peer_was_found_gone_are_dropped_not_answered(ctx: Ctx) -> None:
    """The monitor's verdict (connection closed) can come before the peer's last messages are
    read: those are counted as dropped, not answered as REQUEST before CONNECT."""
    srv, rec = start_server()
    rec.echo = False
    plain_on_message = rec.on_message

    def first_then_gone(peer: bytes, message: Message) -> None:
        plain_on_message(peer, message)
        if message.header.id == 1:  # as the monitor probe would, on the dispatcher
            srv._table.drop(srv._table.peers[peer], PEER_GONE, ConnEvent.PEER_GONE)

    rec.on_message = first_then_gone  # type: ignore[method-assign]
    d = raw_dealer(ctx, srv.endpoint, b"leaver")
    try:
        for rid in range(1, 6):
            d.send_multipart(request(rid))
        wait_until(lambda: srv.statistics().messages_dropped == 4)
        assert [m.header.id for _, m in rec.requests] == [1]
        assert rec.gone == {b"leaver": "peer gone"}
        stats = srv.statistics()
        assert stats.protocol_errors == 0 and stats.decode_errors == 0
        # The same routing id introducing itself again is a new session, served as usual.
        d.send_multipart(encode_connect({"application": "raw"}))
        d.send_multipart(request(6))
        # Its CONNECT_ACK is the first thing the dealer receives: an answer to any of the
        # dropped messages would have come before it, on the same pipe.
        assert d.poll(WAIT_MS)
        assert type(decode_frames(d.recv_multipart(), from_server=True)).__name__ == "ConnectAck"
        wait_until(lambda: [m.header.id for _, m in rec.requests] == [1, 6])
        assert srv.statistics().messages_dropped == 4
    finally:
        d.close(0)
        srv.close()
