"""The protocol's rules, written once (``client_session``, ``server_session``), driven without
sockets or threads: plain lists of frames in, a recording wire and handler out, time as floats.

Both transport families run exactly these objects, so what is shown here holds for the ZeroMQ
and the in-memory transports alike (the conformance suite checks the transports around them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from rda.serialization.errors import DecodeError, ProtocolError, TransportError
from rda.serialization.header import HEADER_FIXED, Header, RequestType
from rda.serialization.message import Message
from rda.transport.api import PeerStatistics, TransportSettings
from rda.transport.client_session import ClientSession, ClientSessions, LaneSession
from rda.transport.peer_info import connect_ack_info, connect_info
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    Reconnect,
    UnsupportedVersion,
    decode_frames,
    encode_connect,
    encode_connect_ack,
    encode_heartbeat,
    encode_message,
    encode_reconnect,
)
from rda.transport.ratelog import RateLimitedLog
from rda.transport.reasons import (
    FORGOTTEN,
    HEARTBEAT_TIMEOUT,
    LANE_IDLE,
    NO_CONNECT_ACK,
    RECONNECTED,
    lost_reason,
    refused_reason,
)
from rda.transport.server_session import (
    HEARTBEAT_BEFORE_CONNECT,
    Peer,
    PeerTable,
    reject_request_before_connect,
    reject_undecodable,
)
from rda.transport.state import ConnState

log = logging.getLogger("test.session")
SETTINGS = TransportSettings(heartbeat_interval=1.0, heartbeat_timeout=5.0, connect_timeout=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(rid: int, kind: Kind = Kind.REQUEST) -> list[Any]:
    return list(encode_message(kind, Header(RequestType.GET, rid, device="D", property="P")))


def reply(rid: int) -> list[Any]:
    return request(rid, Kind.REPLY)


# ------------------------------------------------------------------------------ server


class ServerWire:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list[Any]]] = []
        self.answers: list[tuple[bytes, list[Any]]] = []
        self.full: set[bytes] = set()
        self.wants = 0
        self.new: list[bytes] = []
        self.forgotten: list[bytes] = []

    def write(self, peer: Peer, frames: Sequence[Any]) -> bool | None:
        if peer.rid in self.full:
            return False
        self.sent.append((peer.rid, list(frames)))
        return True

    def answer(self, rid: bytes, io: Any, frames: Sequence[Any]) -> bool:
        self.answers.append((rid, list(frames)))
        return True

    def want_writable(self) -> None:
        self.wants += 1

    def admitted(self, peer: Peer) -> None:
        self.new.append(peer.rid)

    def forget(self, peer: Peer) -> None:
        self.forgotten.append(peer.rid)


class ServerEvents:
    def __init__(self) -> None:
        self.connected: dict[bytes, dict[str, Any]] = {}
        self.gone: list[tuple[bytes, str]] = []
        self.requests: list[tuple[bytes, int]] = []

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        self.connected[peer] = client_info

    def on_message(self, peer: bytes, message: Message) -> None:
        self.requests.append((peer, message.header.id))

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        self.gone.append((peer, reason))


def table(
    settings: TransportSettings = SETTINGS,
) -> tuple[PeerTable, ServerWire, ServerEvents, Clock]:
    wire, events, clock = ServerWire(), ServerEvents(), Clock()
    info = connect_ack_info("srv", "test", settings, None)
    return PeerTable(events, settings, info, wire, clock, log), wire, events, clock


def connect(t: PeerTable, rid: bytes, now: float = 0.0, **info: Any) -> None:
    assert t.received(rid, None, encode_connect({"application": "t", **info}), now) is None


def test_a_connect_is_acknowledged_and_announced_with_the_transports_identity_only() -> None:
    t, wire, events, _ = table()
    connect(t, b"a", authenticated_principal="forged")
    connect(t, b"b", 0.0)
    t.received(b"c", None, encode_connect({"authenticated_principal": "forged"}), 0.0, 7, "alice")
    assert "authenticated_principal" not in events.connected[b"a"]
    assert events.connected[b"c"]["authenticated_principal"] == "alice"
    acks = [decode_frames(f, from_server=True) for _, f in wire.sent]
    assert all(type(e) is ConnectAck for e in acks) and len(acks) == 3
    assert wire.new == [b"a", b"b", b"c"] and t.peers[b"c"].fd == 7
    assert t.statistics().peers == 3


def test_a_request_of_a_peer_is_returned_for_the_business_layer() -> None:
    t, _, events, _ = table()
    connect(t, b"a")
    message = t.received(b"a", None, request(5), 0.5)
    assert message is not None and message.header.id == 5
    t.deliver(b"a", message)
    assert events.requests == [(b"a", 5)]
    assert t.peers[b"a"].heartbeat.last_received == 0.5


def test_bad_input_is_counted_logged_and_answered_where_it_helps() -> None:
    t, wire, events, _ = table()
    assert t.received(b"x", None, request(3), 0.0) is None  # REQUEST before CONNECT
    assert t.received(b"x", None, encode_heartbeat(from_server=False), 0.0) is None
    assert t.received(b"x", None, [b"\x21\x03garbage"], 0.0) is None
    assert t.received(b"x", None, encode_connect({"pid": "not a number"}), 0.0) is None
    answers = [decode_frames(f, from_server=True) for _, f in wire.answers]
    # RECONNECT + EXCEPTION for the request, RECONNECT for the heartbeat, a refusing ACK
    assert [type(a).__name__ for a in answers] == [
        "Reconnect",
        "Incoming",
        "Reconnect",
        "ConnectAck",
    ]
    refusal = answers[-1]
    assert isinstance(refusal, ConnectAck) and "pid" in refusal.info["error"]
    stats = t.statistics()
    assert (stats.decode_errors, stats.protocol_errors, stats.peers) == (4, 3, 0)
    assert events.connected == {}


def test_a_peer_whose_connection_closed_is_not_answered_as_a_stranger() -> None:
    from rda.transport.reasons import PEER_GONE
    from rda.transport.state import ConnEvent

    t, wire, events, _ = table()
    connect(t, b"a")
    t.drop(t.peers[b"a"], PEER_GONE, ConnEvent.PEER_GONE)
    assert t.received(b"a", None, request(1), 0.0) is None
    assert wire.answers == [] and t.statistics().messages_dropped == 1
    assert events.gone == [(b"a", PEER_GONE)] and wire.forgotten == [b"a"]


def test_the_same_routing_id_connecting_again_ends_the_old_session() -> None:
    t, _, events, _ = table()
    connect(t, b"a")
    old = t.peers[b"a"]
    connect(t, b"a", 1.0)
    assert events.gone == [(b"a", RECONNECTED)] and t.peers[b"a"] is not old


def test_a_full_pipe_queues_conflates_and_flushes_in_order() -> None:
    t, wire, _, _ = table(TransportSettings(peer_queue_limit=2))
    connect(t, b"a")
    wire.sent.clear()
    wire.full.add(b"a")
    t.send(b"a", [b"r1"], None)
    t.send(b"a", [b"n1"], 7)
    t.send(b"a", [b"n2"], 7)  # replaces n1 in place
    t.send(b"a", [b"r2"], None)  # the queue is full: dropped
    assert wire.wants == 1 and list(t.blocked) == [b"a"]
    stats = t.statistics()
    assert (stats.peer_queue_depth, stats.notifications_conflated, stats.messages_dropped) == (
        2,
        1,
        1,
    )
    assert t.peer_statistics()[b"a"] == PeerStatistics(2, 1, 1, {7: 1}, {})
    assert not t.retry_blocked()  # still full
    wire.full.clear()
    assert t.retry_blocked()
    assert [f for _, f in wire.sent] == [[b"r1"], [b"n2"]] and not t.blocked
    assert t.statistics().peer_queue_depth == 0


def test_what_waited_for_a_dropped_peer_counts_as_dropped() -> None:
    t, wire, events, _ = table()
    connect(t, b"a")
    wire.full.add(b"a")
    t.send(b"a", [b"r1"], None)
    t.disconnect(b"a")
    stats = t.statistics()
    assert (stats.peer_queue_depth, stats.messages_dropped) == (0, 1)
    assert events.gone == [(b"a", "closed locally")]
    t.send(b"a", [b"late"], None)  # to a peer that is gone
    assert t.statistics().messages_dropped == 2


def test_heartbeat_round_pings_the_idle_drops_the_silent_and_leaves_lanes_alone() -> None:
    t, wire, events, clock = table()
    connect(t, b"quiet", 0.0)
    connect(t, b"idle", 3.0)
    connect(t, b"lane", 0.0, lane=True)
    wire.sent.clear()
    clock.now = 5.0
    next_check = t.heartbeat_round(5.0)
    # quiet: nothing heard for 5 s; the lane too, but a lane is forgotten quietly
    assert events.gone == [(b"quiet", HEARTBEAT_TIMEOUT), (b"lane", LANE_IDLE)]
    assert t.statistics().heartbeat_timeouts == 1 and t.statistics().lanes == 0
    assert [rid for rid, _ in wire.sent] == [b"idle"]  # idle sent nothing for 2 s
    assert next_check == pytest.approx(6.0)


def test_a_lane_is_not_forgotten_while_its_call_runs(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 37, item 1: a lane whose call ran longer than the heartbeat timeout was forgotten
    as idle, and the reply, computed later, went to a departed peer: counted as dropped but
    logged nowhere, while the client waited out its whole timeout (a 12 s get with a 10 s
    heartbeat timeout never returned). Checked against main at af9bf33: the lane was dropped at
    the first round past the timeout. A lane with a call in flight is alive; a message to a
    departed peer is counted and logged."""
    t, wire, events, clock = table()
    connect(t, b"lane", 0.0, lane=True)
    message = t.received(b"lane", None, request(1), 0.0)
    assert message is not None
    clock.now = 12.0  # the handler ran 12 s; the heartbeat timeout is 5 s
    t.heartbeat_round(12.0)
    assert events.gone == [] and t.statistics().lanes == 1
    wire.sent.clear()
    t.send(b"lane", reply(1), None)
    assert [rid for rid, _ in wire.sent] == [b"lane"]
    clock.now = 17.0  # idle now for the timeout: forgotten quietly, as before
    t.heartbeat_round(17.0)
    assert events.gone == [(b"lane", LANE_IDLE)]
    with caplog.at_level(logging.WARNING, logger=log.name):
        t.send(b"lane", reply(2), None)
    assert t.statistics().messages_dropped == 1
    assert "no longer connected" in caplog.text


def test_a_peer_with_a_full_pipe_gets_no_heartbeat() -> None:
    t, wire, _, _ = table()
    connect(t, b"a")
    wire.full.add(b"a")
    t.send(b"a", [b"waiting"], None)
    t.heartbeat_round(2.0)
    assert t.peers[b"a"].heartbeat.last_sent == 2.0  # busy, not idle: not pinged again at once
    assert len(t.peers[b"a"].outbox) == 1


def test_answers_for_other_versions_and_requests_before_connect() -> None:
    exc = UnsupportedVersion(2, request_id=7)
    bad = reject_undecodable(exc, [b"\x21", b"header"])
    assert bad.protocol and bad.answer is not None
    event = decode_frames(bad.answer, from_server=True)
    assert type(event) is Incoming and event.message.header.id == 7
    assert reject_undecodable(DecodeError("short"), [b"\x21"]).answer is None
    assert reject_undecodable(ProtocolError("wrong side"), [b"\x02"]).protocol
    assert reject_request_before_connect(41).reconnect
    assert HEARTBEAT_BEFORE_CONNECT.answer is None and HEARTBEAT_BEFORE_CONNECT.reconnect


# ------------------------------------------------------------------------------ client


class ClientWire:
    def __init__(self) -> None:
        self.sent: list[list[Any]] = []
        self.full = False
        self.writable: dict[int, bool] = {}
        self.released: list[int] = []
        self.paused: list[bool] = []

    def write(self, session: ClientSession, frames: Sequence[Any]) -> bool | None:
        if self.full:
            return False
        self.sent.append(list(frames))
        return True

    def want_writable(self, session: ClientSession, on: bool) -> None:
        self.writable[session.id] = on

    def release(self, session: ClientSession) -> None:
        self.released.append(session.id)

    def pause_intake(self, paused: bool) -> None:
        self.paused.append(paused)


class ClientEvents:
    def __init__(self, batches: bool = True) -> None:
        self.log: list[tuple[str, Any]] = []
        if batches:
            self.on_messages = self._on_messages

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self.log.append(("connected", connection))

    def on_message(self, connection: int, message: Message) -> None:
        self.log.append(("message", message.header.id))

    def _on_messages(self, connection: int, messages: Sequence[Message]) -> None:
        self.log.append(("batch", [m.header.id for m in messages]))

    def on_disconnected(self, connection: int, reason: str) -> None:
        self.log.append(("disconnected", reason))


def sessions(
    settings: TransportSettings = SETTINGS, batches: bool = True
) -> tuple[ClientSessions, ClientWire, ClientEvents, Clock]:
    wire, events, clock = ClientWire(), ClientEvents(batches), Clock()
    info = connect_info("test")
    return ClientSessions(events, settings, info, wire, clock, log), wire, events, clock


ACK = encode_connect_ack({"name": "srv", "heartbeat_timeout": 8.0})


def kinds(frames: list[list[Any]]) -> list[int]:
    return [bytes(f[0])[0] for f in frames]


def test_only_the_connect_goes_before_the_ack_then_the_queue_in_order() -> None:
    s, wire, events, _ = sessions()
    session = s.open(1, "mem://x", None)
    s.send(1, request(1))
    s.send(1, request(2))
    assert kinds(wire.sent) == [Kind.CONNECT]
    assert s.statistics().queued_until_connected == 2
    assert s.received(session, ACK, 0.1) is None
    assert events.log == [("connected", 1)]
    assert kinds(wire.sent) == [Kind.CONNECT, Kind.REQUEST, Kind.REQUEST]
    assert session.server_timeout == 8.0 and s.statistics().connections == 1


def test_a_connect_that_cannot_go_yet_waits_for_the_pipe() -> None:
    s, wire, _, _ = sessions()
    wire.full = True
    session = s.open(1, "tcp://127.0.0.1:1", None)
    assert wire.sent == [] and wire.writable[1] is True
    wire.full = False
    s.writable(session)
    assert kinds(wire.sent) == [Kind.CONNECT] and wire.writable[1] is False


def test_replies_before_the_ack_and_a_second_ack_are_the_servers_faults() -> None:
    s, _, events, _ = sessions()
    session = s.open(1, "mem://x", None)
    assert s.received(session, reply(1), 0.0) is None
    s.received(session, ACK, 0.0)
    s.received(session, ACK, 0.0)
    s.received(session, [b"garbage"], 0.0)
    assert s.statistics().decode_errors == 3
    assert events.log == [("connected", 1)]


def test_a_refusing_ack_ends_the_connection_with_the_servers_reason() -> None:
    s, wire, events, _ = sessions()
    session = s.open(1, "mem://x", None)
    s.received(session, encode_connect_ack({"error": "version 9"}), 0.0)
    assert events.log == [("disconnected", refused_reason("version 9"))]
    assert wire.released == [1] and s.sessions == {}


def test_reconnect_ends_a_connected_session_at_once() -> None:
    s, _, events, _ = sessions()
    session = s.open(1, "mem://x", None)
    s.received(session, ACK, 0.0)
    s.received(session, list(encode_reconnect()), 0.5)
    assert events.log[-1] == ("disconnected", FORGOTTEN)
    assert session.state is ConnState.CLOSED


def test_replies_of_a_batch_come_in_one_call_and_before_a_connection_event() -> None:
    s, _, events, _ = sessions()
    session = s.open(1, "mem://x", None)
    s.received(session, ACK, 0.0)
    for rid in (1, 2, 3):
        message = s.received(session, reply(rid), 0.0)
        assert message is not None
        s.hold(session, message)
    s.received(session, list(encode_reconnect()), 0.0)  # a connection event: batch first
    assert events.log[1:] == [("batch", [1, 2, 3]), ("disconnected", FORGOTTEN)]


def test_a_handler_without_batches_gets_each_reply_at_once() -> None:
    s, _, events, _ = sessions(batches=False)
    session = s.open(1, "mem://x", None)
    s.received(session, ACK, 0.0)
    for rid in (1, 2):
        message = s.received(session, reply(rid), 0.0)
        assert message is not None
        s.hold(session, message)
    s.end_batch()
    assert events.log[1:] == [("message", 1), ("message", 2)]


def test_connect_timeout_heartbeats_and_heartbeat_timeout() -> None:
    s, wire, events, clock = sessions()
    s.open(1, "mem://never", None)
    late = s.open(2, "mem://x", None)
    s.received(late, ACK, 0.0)
    wire.sent.clear()
    clock.now = 1.0
    s.check_timers(1.0)  # 1 s without sending: a heartbeat on the connected one
    assert kinds(wire.sent) == [Kind.HEARTBEAT]
    clock.now = 2.0
    s.check_timers(2.0)
    assert ("disconnected", NO_CONNECT_ACK) in events.log
    clock.now = 5.0
    s.check_timers(5.0)  # nothing heard since 0.0
    assert events.log[-1] == ("disconnected", HEARTBEAT_TIMEOUT)
    assert s.statistics().heartbeat_timeouts == 1 and s.sessions == {}


def test_back_pressure_pauses_the_intake_and_resumes_at_half() -> None:
    s, wire, _, _ = sessions(TransportSettings(peer_queue_limit=4))
    session = s.open(1, "mem://x", None)
    s.received(session, ACK, 0.0)
    wire.full = True
    for rid in range(4):
        s.send(1, request(rid))
    assert wire.paused == [True]
    wire.full = False
    s.writable(session)
    assert wire.paused == [True, False] and len(wire.sent) == 5  # CONNECT + 4 requests


def test_a_lost_socket_reports_the_reason_for_its_state() -> None:
    s, _, events, _ = sessions()
    s.gone(s.open(1, "mem://x", None))
    session = s.open(2, "mem://x", None)
    s.received(session, ACK, 0.0)
    s.gone(session)
    disconnects = [e for e in events.log if e[0] == "disconnected"]
    assert disconnects == [
        ("disconnected", lost_reason(ConnState.CONNECTING)),
        ("disconnected", lost_reason(ConnState.CONNECTED)),
    ]
    assert s.statistics().disconnects == 2


# -------------------------------------------------------------------------------- lanes


def test_a_lane_introduces_itself_when_new_or_idle_and_waits_for_its_own_reply() -> None:
    lane = LaneSession(
        "mem://x", encode_connect({"lane": True}), refresh_after=2.0, max_size=1 << 20
    )
    rate_log = RateLimitedLog(log)
    assert lane.needs_hello(0.0)
    lane.sent(request(1), 0.0, with_hello=True)
    assert not lane.needs_hello(1.0) and lane.needs_hello(2.5)
    assert lane.received(reply(0), 1, rate_log) is None  # an abandoned request's reply
    assert lane.received(list(encode_reconnect()), 1, rate_log) is None
    assert lane.needs_hello(0.5)  # forgotten by the server: introduce again
    message = lane.received(reply(1), 1, rate_log)
    assert message is not None and message.header.id == 1
    assert lane.counts() == (3, 2, lane.bytes_in, lane.bytes_out, 0, 1)
    with pytest.raises(TransportError, match="refused the lane"):
        lane.received(encode_connect_ack({"error": "no"}), 1, rate_log)


def test_reconnect_frames_decode_as_reconnect() -> None:
    assert type(decode_frames(list(encode_reconnect()), from_server=True)) is Reconnect


def test_a_get_or_set_whose_request_ended_while_it_waited_for_the_ack_is_never_sent() -> None:
    # Found by rda.testing.simulation (seed 2464, every fault; tests/test_simulation.py): a
    # set made while its server was away timed out for its user, then went out on the ACK
    # and took effect after a later set acknowledged meanwhile. Checked to fail before the
    # fix: the three requests were sent.
    s, wire, events, _ = sessions()
    ended = {2}
    events.awaits = lambda rid: rid not in ended  # type: ignore[attr-defined]
    s = ClientSessions(events, SETTINGS, connect_info("test"), wire, Clock(), log)
    session = s.open(1, "mem://x", None)
    for rid in (1, 2, 3):
        s.send(1, request(rid))
    assert s.received(session, ACK, 0.1) is None
    sent = [HEADER_FIXED.unpack_from(bytes(f[0]), 1)[4] for f in wire.sent[1:]]
    assert sent == [1, 3]
    assert s.statistics().expired_unsent == 1
