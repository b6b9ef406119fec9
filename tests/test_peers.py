"""The sans-I/O bookkeeping both transport families share, driven with plain lists and numbers."""

from __future__ import annotations

import pytest

from rda.serialization._header import RequestType
from rda.serialization.errors import DecodeError, ProtocolError
from rda.transport._outbox import PutResult
from rda.transport._peers import (
    HEARTBEAT_BEFORE_CONNECT,
    ClientCounters,
    Peer,
    ServerCounters,
    connect_ack_info,
    connect_info,
    heartbeat_round,
    lost_reason,
    peer_statistics,
    refused_reason,
    reject_request_before_connect,
    reject_undecodable,
)
from rda.transport.api import PeerStatistics, TransportSettings
from rda.transport.protocol import ConnectAck, Incoming, UnsupportedVersion, decode_frames
from rda.transport.state import ConnEvent, ConnState, HeartbeatTracker


def _exception_answer(frames: list[bytes | memoryview] | None) -> tuple[int, str, str]:
    assert frames is not None
    event = decode_frames(frames, from_server=True)
    assert type(event) is Incoming
    header = event.message.header
    assert header.request_type is RequestType.EXCEPTION
    exception = event.message.exception
    assert exception is not None
    type_name, message = exception
    return header.id, type_name, message


def test_a_request_of_another_version_is_answered_with_its_id() -> None:
    exc = UnsupportedVersion(2, request_id=7)
    bad = reject_undecodable(exc, [b"\x21", b"header"])
    assert (bad.error, bad.protocol) == (exc, True)
    request_id, type_name, message = _exception_answer(bad.answer)
    assert (request_id, type_name) == (7, "ProtocolError")
    assert "version 2" in message


def test_a_connect_of_another_version_gets_a_refusing_ack() -> None:
    exc = UnsupportedVersion(9)
    bad = reject_undecodable(exc, [memoryview(b"\x20"), b"\x09{}"])
    assert bad.answer is not None
    event = decode_frames(bad.answer, from_server=True)
    assert type(event) is ConnectAck
    assert "version 9" in event.info["error"]


def test_other_undecodable_input_is_dropped_silently() -> None:
    versionless = reject_undecodable(UnsupportedVersion(3), [b"\x22"])
    assert (versionless.protocol, versionless.answer) == (True, None)
    protocol = reject_undecodable(ProtocolError("wrong side"), [b"\x02"])
    assert (protocol.protocol, protocol.answer) == (True, None)
    garbage = reject_undecodable(DecodeError("short"), [b"\x21"])
    assert (garbage.protocol, garbage.answer) == (False, None)


def test_requests_and_heartbeats_before_connect() -> None:
    bad = reject_request_before_connect(41)
    assert bad.protocol
    request_id, _, message = _exception_answer(bad.answer)
    assert request_id == 41
    assert "send CONNECT first" in message
    assert HEARTBEAT_BEFORE_CONNECT.protocol and HEARTBEAT_BEFORE_CONNECT.answer is None


def test_server_counters_count_bad_input_and_outbox_results() -> None:
    c = ServerCounters()
    c._count_bad_input(reject_undecodable(DecodeError("x"), [b"\x21"]))
    c._count_bad_input(HEARTBEAT_BEFORE_CONNECT)
    assert c._count_put(PutResult.QUEUED)
    assert not c._count_put(PutResult.CONFLATED)
    assert not c._count_put(PutResult.DROPPED)
    s = c._statistics(peers=3)
    assert (s.decode_errors, s.protocol_errors, s.peers) == (2, 1, 3)
    assert (s.peer_queue_depth, s.notifications_conflated, s.messages_dropped) == (1, 1, 1)


def test_client_counters_snapshot() -> None:
    c = ClientCounters()
    c._messages_in, c._queued, c._disconnects = 4, 2, 1
    s = c._statistics(connections=5)
    assert (s.messages_in, s.queued_until_connected, s.disconnects, s.connections) == (4, 2, 1, 5)


def _peer(rid: bytes, now: float) -> Peer:
    return Peer(rid, {}, HeartbeatTracker.start(interval=1.0, timeout=5.0, now=now))


def test_heartbeat_round_drops_the_silent_and_pings_the_idle() -> None:
    peers = {p.rid: p for p in (_peer(b"quiet", 0.0), _peer(b"idle", 3.0), _peer(b"busy", 3.0))}
    peers[b"busy"].heartbeat.last_sent = 4.5
    pinged: list[bytes] = []

    def ping(p: Peer) -> bool:
        pinged.append(p.rid)
        p.heartbeat.last_sent = 5.0  # what a real send does
        return True

    dropped: list[tuple[bytes, str, ConnEvent]] = []

    def drop(p: Peer, reason: str, event: ConnEvent) -> None:
        dropped.append((p.rid, reason, event))
        del peers[p.rid]

    counters = ServerCounters()
    next_check = heartbeat_round(peers, 5.0, counters, ping, drop)
    assert dropped == [(b"quiet", "heartbeat timeout", ConnEvent.HEARTBEAT_TIMEOUT)]
    assert counters._statistics(peers=0).heartbeat_timeouts == 1
    assert pinged == [b"idle"]  # busy sent something 0.5 s ago
    assert next_check == pytest.approx(5.5)  # busy's next heartbeat; idle's is at 6.0


def test_heartbeat_round_skips_a_full_pipe_and_forgets_a_peer_lost_on_ping() -> None:
    full, lost = _peer(b"full", 0.0), _peer(b"lost", 0.0)
    full.outbox.put([b"waiting"], None, 10)
    peers = {full.rid: full, lost.rid: lost}

    def ping(p: Peer) -> bool:
        assert p is lost, "a peer with a queued message gets no heartbeat"
        del peers[p.rid]  # the send found the peer gone
        return True

    next_check = heartbeat_round(peers, 2.0, ServerCounters(), ping, lambda *_: None)
    assert full.heartbeat.last_sent == 2.0  # busy, not idle: not pinged again at once
    assert next_check == pytest.approx(3.0)  # only the remaining peer counts


def test_heartbeat_round_over_no_peers_has_no_deadline() -> None:
    assert heartbeat_round({}, 1.0, ServerCounters(), lambda p: True, lambda *_: None) == float(
        "inf"
    )


def test_handshake_infos() -> None:
    info = connect_info("1.2")
    assert set(info) == {"application", "user", "host", "pid", "version"}
    assert info["version"] == "1.2"
    settings = TransportSettings(heartbeat_interval=0.5, heartbeat_timeout=4.0)
    ack = connect_ack_info("srv", "memory", settings, {"name": "other", "extra": 1})
    assert ack == {
        "name": "other",
        "version": "memory",
        "heartbeat_interval": 0.5,
        "heartbeat_timeout": 4.0,
        "extra": 1,
    }


def test_client_disconnect_reasons() -> None:
    assert lost_reason(ConnState.CONNECTING) == "connection refused or closed"
    assert lost_reason(ConnState.CONNECTED) == "server closed the connection"
    assert refused_reason("version 9") == "refused by the server: version 9"


def test_outbox_counts_conflation_and_drops_per_key_and_peer_statistics_snapshots_them() -> None:
    peer = Peer(b"p", {}, HeartbeatTracker.start(1.0, 10.0, 0.0))
    box = peer.outbox
    assert box.put([b"n1"], 7, limit=2) is PutResult.QUEUED
    assert box.put([b"n2"], 7, limit=2) is PutResult.CONFLATED  # latest wins, in place
    assert box.put([b"r1"], None, limit=2) is PutResult.QUEUED
    assert box.put([b"n3"], 8, limit=2) is PutResult.DROPPED  # full
    assert box.put([b"n4"], 7, limit=2) is PutResult.CONFLATED  # still replaceable when full
    stats = peer_statistics({b"p": peer})[b"p"]
    assert stats == PeerStatistics(2, 2, 1, {7: 2}, {8: 1})
    assert box.head() == [b"n4"]
