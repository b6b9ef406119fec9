"""Garbage from a raw pyzmq DEALER: dropped and counted, other peers unaffected, no crash."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from rda.serialization.header import (
    HEADER_FIXED,
    PROTOCOL_VERSION,
    Header,
    RequestType,
    encode_header,
)
from rda.serialization.message import BodyKind, Message
from rda.testing import wait_until
from rda.transport.api import TransportSettings
from rda.transport.protocol import (
    EXTERNAL,
    ConnectAck,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_heartbeat,
    encode_message,
)
from rda.transport.zmq_server import ZmqServerTransport

WAIT = 10.0
WAIT_MS = 10_000
MAX = 4096
Ctx = zmq.Context[zmq.Socket[bytes]]


class Echo:
    def __init__(self) -> None:
        self.transport: ZmqServerTransport | None = None
        self.gone: dict[bytes, str] = {}
        self.requests = 0

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        pass

    def on_message(self, peer: bytes, message: Message) -> None:
        self.requests += 1
        assert self.transport is not None
        reply = Header(RequestType.REPLY, message.header.id)
        self.transport.send(peer, encode_message(Kind.REPLY, reply, message.body))

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        self.gone[peer] = reason


@pytest.fixture
def env() -> Iterator[tuple[ZmqServerTransport, Echo, Ctx]]:
    handler = Echo()
    srv = ZmqServerTransport(
        "tcp://127.0.0.1:0",
        handler,
        TransportSettings(max_message_size=MAX, heartbeat_interval=30.0, heartbeat_timeout=60.0),
    )
    handler.transport = srv
    srv.start()
    ctx: Ctx = zmq.Context()
    yield srv, handler, ctx
    srv.close()
    ctx.term()


def dealer(ctx: Ctx, endpoint: str, rid: bytes) -> zmq.Socket[bytes]:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    # Like the rda client: no silent reconnection under the same routing id.
    d.setsockopt(zmq.RECONNECT_IVL, -1)
    d.setsockopt(zmq.ROUTING_ID, rid)
    d.connect(endpoint)
    d.send_multipart(encode_connect({"application": "raw"}))
    assert d.poll(WAIT_MS)
    assert isinstance(decode_frames(d.recv_multipart(), from_server=True), ConnectAck)
    return d


def request(rid: int, body: bytes = b"ok") -> list[Any]:
    return encode_message(Kind.REQUEST, Header(RequestType.GET, rid), [(BodyKind.DATA, body)])


def echo_works(d: zmq.Socket[bytes], rid: int) -> bool:
    d.send_multipart(request(rid))
    if not d.poll(WAIT_MS):
        return False
    event = decode_frames(d.recv_multipart(), from_server=True)
    return isinstance(event, Incoming) and event.message.header.id == rid


GOOD_HEADER = encode_header(Header(RequestType.GET, 5, "D", "P"))
REQ = bytes([Kind.REQUEST])
V = bytes([PROTOCOL_VERSION])


def table(kinds: list[int], sizes: list[int]) -> bytes:
    """A v2 body table: u8 count, the kind bytes, the u32 lengths."""
    return struct.pack(f"<B{len(kinds)}B{len(sizes)}I", len(kinds), *kinds, *sizes)


DATA = int(BodyKind.DATA)
LARGE = DATA | EXTERNAL

BAD: dict[str, tuple[list[bytes], bool]] = {
    # name: (frames, is a protocol error rather than undecodable bytes)
    "empty single frame": ([b""], False),
    "wrong kind byte": ([b"\x99" + GOOD_HEADER + b"\x00"], False),
    "server kind from a client": ([bytes([Kind.REPLY]) + GOOD_HEADER + b"\x00"], True),
    "short header": ([REQ + GOOD_HEADER[:10]], False),
    "header longer than its names": ([REQ + GOOD_HEADER + b"zz"], False),
    "name lengths past the frame": (
        [REQ + HEADER_FIXED.pack(PROTOCOL_VERSION, 0, 0, 0, 5, 999, 0, 0) + b"D\x00"],
        False,
    ),
    "unknown request type": (
        [REQ + HEADER_FIXED.pack(PROTOCOL_VERSION, 99, 0, 0, 5, 0, 0, 0) + b"\x00"],
        False,
    ),
    "missing body table": ([REQ + GOOD_HEADER], False),
    "body table count mismatch": (
        [REQ + GOOD_HEADER + table([DATA, DATA], [4, 4]) + b"body"],
        False,
    ),
    "body longer than announced": ([REQ + GOOD_HEADER + table([DATA], [3]) + b"body"], False),
    "extra frames": ([REQ + GOOD_HEADER + table([DATA], [1]) + b"a", b"b"], False),
    "missing large body frame": ([REQ + GOOD_HEADER + table([LARGE], [70000])], False),
    "unknown body kind": ([REQ + GOOD_HEADER + table([9], [1]) + b"a"], False),
    "heartbeat with frames": ([bytes([Kind.HEARTBEAT]) + V, b"x"], False),
    "connect with junk info": ([bytes([Kind.CONNECT]) + V + b"{not json"], False),
    "connect info not an object": ([bytes([Kind.CONNECT]) + V + b"[1,2]"], False),
    "over max_message_size in parts": (
        [
            REQ + GOOD_HEADER + table([LARGE, LARGE], [MAX // 2, MAX // 2]),
            b"a" * (MAX // 2),
            b"b" * (MAX // 2),
        ],
        False,
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_message_is_dropped_counted_and_others_unaffected(
    name: str, env: tuple[ZmqServerTransport, Echo, Ctx]
) -> None:
    srv, handler, ctx = env
    frames, protocol = BAD[name]
    bad = dealer(ctx, srv.endpoint, b"bad")
    good = dealer(ctx, srv.endpoint, b"good")
    try:
        bad.send_multipart(frames)
        wait_until(lambda: srv.statistics().decode_errors == 1)
        assert srv.statistics().protocol_errors == (1 if protocol else 0)
        assert handler.requests == 0
        # The offender and everybody else are still served; the offender's echo is the first
        # thing it receives: an answer to the dropped message would have come before it.
        assert echo_works(good, 1)
        assert echo_works(bad, 2)
        assert handler.gone == {}
    finally:
        bad.close(0)
        good.close(0)


def test_unknown_protocol_version_gets_an_explicit_error_reply(
    env: tuple[ZmqServerTransport, Echo, Ctx],
) -> None:
    srv, handler, ctx = env
    d = dealer(ctx, srv.endpoint, b"future")
    try:
        header = HEADER_FIXED.pack(7, 0, 0, 0, 4242, 0, 0, 0)
        d.send_multipart([REQ + header + b"\x00"])
        assert d.poll(WAIT_MS)
        event = decode_frames(d.recv_multipart(), from_server=True)
        assert isinstance(event, Incoming)
        msg = event.message
        assert msg.header.request_type is RequestType.EXCEPTION and msg.header.id == 4242
        assert msg.exception is not None
        assert msg.exception[0] == "ProtocolError" and "version 7" in msg.exception[1]
        stats = srv.statistics()
        assert stats.protocol_errors == 1 and stats.decode_errors == 1
        assert handler.requests == 0
    finally:
        d.close(0)


def test_connect_of_another_version_is_refused_in_the_ack(
    env: tuple[ZmqServerTransport, Echo, Ctx],
) -> None:
    srv, _, ctx = env
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(srv.endpoint)
    try:
        d.send_multipart([bytes([Kind.CONNECT, 7]) + b"{}"])
        assert d.poll(WAIT_MS)
        event = decode_frames(d.recv_multipart(), from_server=True)
        assert isinstance(event, ConnectAck)
        assert "version 7" in event.info["error"]
        assert srv.statistics().peers == 0
    finally:
        d.close(0)


def test_a_version_1_client_is_told_both_versions_and_the_server_keeps_serving(
    env: tuple[ZmqServerTransport, Echo, Ctx],
) -> None:
    srv, handler, ctx = env
    old = ctx.socket(zmq.DEALER)
    old.setsockopt(zmq.LINGER, 0)
    old.connect(srv.endpoint)
    good = dealer(ctx, srv.endpoint, b"good")
    try:
        # Exactly what an rda 1.x client sends: the kind byte, then version 1 + client info.
        old.send_multipart([bytes([Kind.CONNECT]), b"\x01" + json.dumps({"pid": 1}).encode()])
        assert old.poll(WAIT_MS)
        # The refusal comes in version 1's framing, which that client's decoder parses.
        kind, handshake = old.recv_multipart()
        assert kind == bytes([Kind.CONNECT_ACK]) and handshake[:1] == b"\x01"
        error = json.loads(handshake[1:])["error"]
        assert "version 1" in error and f"speaks {PROTOCOL_VERSION}" in error
        # A version 1 request that follows anyway is dropped and counted, never handled.
        old.send_multipart([REQ, b"\x01" + GOOD_HEADER[1:], b""])
        old.send_multipart([bytes([Kind.HEARTBEAT])])
        wait_until(lambda: srv.statistics().protocol_errors == 3)
        stats = srv.statistics()
        assert (stats.decode_errors, stats.peers) == (3, 1)
        assert handler.requests == 0
        assert echo_works(good, 4)
        # Introducing itself in version 2, the same socket is served, and the CONNECT_ACK is
        # the first thing it receives: an answer to the dropped messages would have come first.
        old.send_multipart(encode_connect({"application": "upgraded"}))
        assert old.poll(WAIT_MS)
        ack = decode_frames(old.recv_multipart(), from_server=True)
        assert isinstance(ack, ConnectAck) and "error" not in ack.info
    finally:
        old.close(0)
        good.close(0)


def test_giant_frame_is_cut_off_by_libzmq_and_others_unaffected(
    env: tuple[ZmqServerTransport, Echo, Ctx],
) -> None:
    srv, handler, ctx = env
    bad = dealer(ctx, srv.endpoint, b"giant")
    good = dealer(ctx, srv.endpoint, b"good")
    try:
        # One frame above MAXMSGSIZE: libzmq closes that connection without handing it over.
        big = table([LARGE], [MAX * 4])
        bad.send_multipart([REQ + GOOD_HEADER + big, b"x" * (MAX * 4)])
        wait_until(lambda: b"giant" in handler.gone)
        assert handler.gone[b"giant"] == "peer gone"
        assert handler.requests == 0
        assert echo_works(good, 3)
    finally:
        bad.close(0)
        good.close(0)


def test_random_garbage_never_kills_the_dispatcher(
    env: tuple[ZmqServerTransport, Echo, Ctx],
) -> None:
    srv, _, ctx = env
    bad = dealer(ctx, srv.endpoint, b"fuzz")
    good = dealer(ctx, srv.endpoint, b"good")
    try:
        rng = random.Random(1234)
        for _ in range(200):
            n = rng.randint(1, 5)
            frames = [rng.randbytes(rng.randint(0, 40)) for _ in range(n)]
            if rng.random() < 0.5:
                frames[0] = bytes([rng.choice([0x20, 0x21, 0x22]), PROTOCOL_VERSION]) + frames[0]
            bad.send_multipart(frames)
        bad.send_multipart(encode_heartbeat(from_server=False))
        assert echo_works(good, 9)
        wait_until(lambda: srv.statistics().decode_errors > 100)
    finally:
        bad.close(0)
        good.close(0)
