"""The server side of the protocol, written once: every rule of a server's peers, no I/O.

Both server transports (``zmq_server`` over one ROUTER, the in-memory one of ``rda.testing``)
run these rules; they only move frames and run timers. :class:`PeerTable` is fed what
happened (frames from a routing id, a pipe writable again, a peer's connection gone, time
passed) and decides:

* validation: what ``decode_frames`` refuses, a REQUEST or HEARTBEAT before CONNECT, an
  invalid CONNECT info, another protocol version; each is counted (``decode_errors``, and
  ``protocol_errors`` for violations), logged at most once per kind per second, and answered
  where an answer helps the peer (:class:`BadInput`): a RECONNECT to a peer it does not know,
  an EXCEPTION reply to a request of another version or before CONNECT, a refusing
  CONNECT_ACK;
* the handshake: a CONNECT makes a peer (the same routing id again ends the old session as
  "reconnected"), with the identity the transport authenticated, never the one it claims;
* back-pressure per peer: a message to a peer whose pipe is full waits in its bounded,
  conflating :class:`~rda.transport._outbox.Outbox`; what it loses is counted;
* heartbeats: idle peers are pinged, silent ones dropped; a client's direct lane gets no
  heartbeats and is forgotten quietly when idle, never while one of its calls runs;
* the events the business layer gets (``ServerHandler``) and the counters behind
  ``statistics()``.

Its only way out is a :class:`ServerWire` and the handler. Threading: one dispatcher at a
time touches a table (``peer_statistics`` excepted: a snapshot, safe from any thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.serialization.errors import DecodeError, ProtocolError, RemoteProtocolError
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind, Message, encode_exception
from rda.transport._outbox import Outbox, PutResult
from rda.transport.api import (
    Buffer,
    PeerStatistics,
    ServerHandler,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.peer_info import authenticated_info, invalid_client_info
from rda.transport.protocol import (
    Connect,
    Heartbeat,
    Incoming,
    Kind,
    UnsupportedVersion,
    decode_frames,
    encode_connect_ack,
    encode_heartbeat,
    encode_message,
    encode_reconnect,
    encode_refusal,
    join_tail,
)
from rda.transport.ratelog import RateLimitedLog
from rda.transport.reasons import CLOSED_LOCALLY, HEARTBEAT_TIMEOUT, LANE_IDLE, RECONNECTED
from rda.transport.state import ConnEvent, ConnState, HeartbeatAction, HeartbeatTracker, next_state

__all__ = [
    "HEARTBEAT_BEFORE_CONNECT",
    "HEARTBEAT_FRAMES",
    "RECONNECT_FRAMES",
    "BadInput",
    "Peer",
    "PeerTable",
    "ServerWire",
    "reject_request_before_connect",
    "reject_undecodable",
]

HEARTBEAT_FRAMES = encode_heartbeat(from_server=True)
#: What a server sends first to a sender it does not know (a :class:`BadInput` with
#: ``reconnect``): connect again now (docs/protocol.md).
RECONNECT_FRAMES = encode_reconnect()
# Routing ids of peers whose connection was confirmed closed, remembered (oldest forgotten
# first) so that their last messages, still in flight when the loss was noticed, are dropped
# and counted instead of answered as "REQUEST before CONNECT".
_GONE_REMEMBERED = 4096


# ------------------------------------------------------------------------- bad input


@dataclass(frozen=True, slots=True)
class BadInput:
    """A message a server drops: why, whether it is a protocol violation, and the answer.

    ``answer`` (frames, or None for silence) goes to the sender best effort and is never
    queued: the sender may not be a registered peer.
    """

    error: DecodeError | ProtocolError
    protocol: bool
    answer: list[Buffer] | None = None
    # What the rate-limited log calls these (one line per kind per second).
    kind: str = "bad messages"
    # The sender is no peer (never connected, or dropped after a heartbeat timeout while it was
    # paused): a RECONNECT goes first, so that a client resumes at once (docs/protocol.md).
    reconnect: bool = False


def _exception_reply(request_id: int, exc: ProtocolError) -> list[Buffer]:
    # "ProtocolError" on the wire: the client's fault, as the server names it (docs/protocol.md,
    # "Whose fault"); the client re-creates rda's own error types by name.
    body = [(BodyKind.EXCEPTION, encode_exception("ProtocolError", str(exc)))]
    return encode_message(Kind.REPLY, Header(RequestType.EXCEPTION, request_id), body)


def reject_undecodable(exc: DecodeError | ProtocolError, frames: Sequence[Buffer]) -> BadInput:
    """What a server does with a message ``decode_frames`` refused with ``exc``.

    A peer of another protocol version is told so (docs/protocol.md, "Versions"): a request
    gets an EXCEPTION reply with its id, a CONNECT a refusing CONNECT_ACK; everything else is
    dropped without an answer.
    """
    if isinstance(exc, UnsupportedVersion):
        other = "messages of another protocol version"
        if exc.request_id is not None:
            return BadInput(exc, True, _exception_reply(exc.request_id, exc), other)
        first = frames[0]
        if len(first) and first[0] == Kind.CONNECT:
            return BadInput(exc, True, list(encode_refusal(exc)), other)
        return BadInput(exc, True, None, other)
    if isinstance(exc, ProtocolError):
        return BadInput(exc, True, None, "protocol errors")
    return BadInput(exc, False)


_BEFORE_CONNECT = "messages before CONNECT"


def reject_request_before_connect(request_id: int) -> BadInput:
    """A REQUEST from a peer that never sent CONNECT: answered, so its caller fails fast."""
    err = RemoteProtocolError("REQUEST before CONNECT: send CONNECT first")
    return BadInput(err, True, _exception_reply(request_id, err), _BEFORE_CONNECT, True)


HEARTBEAT_BEFORE_CONNECT = BadInput(
    RemoteProtocolError("HEARTBEAT before CONNECT"), True, None, _BEFORE_CONNECT, True
)


def _reject_connect(problems: str) -> BadInput:
    err = RemoteProtocolError(f"CONNECT refused: invalid client info: {problems}")
    refusal: list[Buffer] = list(encode_connect_ack({"error": str(err)}))
    return BadInput(err, True, refusal, "invalid CONNECTs")


# ------------------------------------------------------------------------- peers


@dataclass(slots=True, eq=False)
class Peer:
    """One client connection as the server sees it (``last_received``/``last_sent`` live in
    ``heartbeat``); ``io`` is the I/O layer's own record of it (a link), if any."""

    rid: bytes
    info: dict[str, Any]
    heartbeat: HeartbeatTracker
    fd: int = -1  # the connection's file descriptor (SRCFD of its CONNECT), -1 if unknown
    state: ConnState = ConnState.CONNECTED
    # on_peer_connected was delivered (so on_peer_disconnected is due when it goes).
    announced: bool = False
    # A client's direct lane (CONNECT with "lane": True): its owner cannot answer heartbeats
    # between calls, so it gets none and, silent for the heartbeat timeout, is forgotten
    # quietly (the lane introduces itself again before that).
    lane: bool = False
    # A lane's calls received and not yet answered. A lane waiting for its reply is silent
    # because its owner is blocked on this server, not because it is gone: it is not forgotten
    # while a call runs, however long the handler takes.
    calls: int = 0
    outbox: Outbox = field(default_factory=Outbox)
    io: Any = None


class ServerWire(Protocol):
    """What the rules ask of a server transport's I/O layer (the dispatcher only)."""

    def write(self, peer: Peer, frames: Sequence[Any]) -> bool | None:
        """Send one message to ``peer`` now, without blocking: True when sent, False when its
        pipe is full, None when the peer turned out gone (the I/O layer dropped it with
        :meth:`PeerTable.drop`) or the send failed for good (then counted as dropped)."""
        ...

    def answer(self, rid: bytes, io: Any, frames: Sequence[Any]) -> bool:
        """Best effort to a sender that may be no peer (``io`` as given to ``received``);
        False when it could not be sent."""
        ...

    def want_writable(self) -> None:
        """Some peer's outbox holds messages: call :meth:`PeerTable.retry_blocked` (or
        :meth:`PeerTable.flush`) once pipes may have room."""
        ...

    def admitted(self, peer: Peer) -> None:
        """A new peer was registered (before its CONNECT_ACK): the I/O layer may record it."""
        ...

    def forget(self, peer: Peer) -> None:
        """``peer`` is no longer a peer: the I/O layer drops its own records of it."""
        ...


class PeerTable:
    """The peers of one server transport and the rules they follow (see the module text).

    ``info`` is the CONNECT_ACK info; ``clock`` the transport's clock; ``log`` where lines
    about peers go (rate-limited: one per kind per second).
    """

    def __init__(
        self,
        handler: ServerHandler,
        settings: TransportSettings,
        info: dict[str, Any],
        wire: ServerWire,
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self._handler = handler
        self._settings = settings
        self._ack = encode_connect_ack(info)
        self._wire = wire
        self._clock = clock
        self._log = log
        self.peer_log = RateLimitedLog(log, clock=clock)
        self.peers: dict[bytes, Peer] = {}
        # Peers whose outbox holds messages (their pipe was full).
        self.blocked: dict[bytes, Peer] = {}
        self._gone: dict[bytes, None] = {}  # insertion-ordered: see _GONE_REMEMBERED
        # The earliest time heartbeat_round may have something to do.
        self.next_check = float("inf")
        # The counters behind statistics(); written by the dispatcher only.
        self.messages_in = 0
        self.messages_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.heartbeat_timeouts = 0
        self.decode_errors = 0
        self.protocol_errors = 0
        self.queue_depth = 0  # messages waiting in all peers' outboxes
        self.conflated = 0
        self.dropped = 0
        self.handler_errors = 0
        self.lanes = 0  # peers that are clients' direct lanes

    # ------------------------------------------------------------------------ statistics

    def statistics(self, auth_failures: int = 0, handovers: int = 0) -> ServerTransportStatistics:
        lanes = self.lanes
        return ServerTransportStatistics(
            messages_in=self.messages_in,
            messages_out=self.messages_out,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            peers=len(self.peers) - lanes,
            heartbeat_timeouts=self.heartbeat_timeouts,
            decode_errors=self.decode_errors,
            protocol_errors=self.protocol_errors,
            peer_queue_depth=self.queue_depth,
            notifications_conflated=self.conflated,
            messages_dropped=self.dropped,
            handler_errors=self.handler_errors,
            auth_failures=auth_failures,
            lanes=lanes,
            handovers=handovers,
        )

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        """Every peer's outbox counters; safe from any thread: ``list(values())`` and
        ``dict(...)`` copy under the GIL, so a dispatcher adding or removing peers meanwhile
        cannot break the iteration."""
        result: dict[bytes, PeerStatistics] = {}
        for p in list(self.peers.values()):
            box = p.outbox
            result[p.rid] = PeerStatistics(
                len(box),
                box.conflated,
                box.dropped,
                dict(box.conflated_by_key),
                dict(box.dropped_by_key),
            )
        return result

    # ------------------------------------------------------------------------- receiving

    def received(
        self,
        rid: bytes,
        io: Any,
        frames: Sequence[Any],
        now: float,
        fd: int = -1,
        principal: str | None = None,
    ) -> Message | None:
        """One message from ``rid`` (``io``: the I/O layer's record of the sender, for
        answers). Returns a REQUEST of a connected peer for the business layer (hand it over
        with :meth:`deliver`); None when the rules dealt with the message. ``fd`` and
        ``principal`` matter for a CONNECT: the connection's descriptor (-1 if unknown) and
        the identity the transport authenticated (None: none)."""
        self.messages_in += 1
        self.bytes_in += sum(map(len, frames))
        p = self.peers.get(rid)
        if p is not None:
            p.heartbeat.last_received = now  # any message is proof of life
        try:
            event = decode_frames(
                frames, from_server=False, max_size=self._settings.max_message_size
            )
        except (DecodeError, ProtocolError) as exc:
            self.reject(rid, io, reject_undecodable(exc, frames))
            return None
        if p is None and type(event) is not Connect and rid in self._gone:
            # A message the peer sent before its connection closed, read after its loss was
            # noticed: nobody is there to answer; not the peer's fault.
            self.dropped += 1
            return None
        if type(event) is Incoming:
            if p is None:
                self.reject(rid, io, reject_request_before_connect(event.message.header.id))
                return None
            if p.lane:
                p.calls += 1
            return event.message
        if type(event) is Connect:
            problems = invalid_client_info(event.info)
            if problems is not None:
                self.reject(rid, io, _reject_connect(problems))
            else:
                self._connect(rid, io, authenticated_info(event.info, principal), fd, now)
        elif type(event) is Heartbeat and p is None:
            self.reject(rid, io, HEARTBEAT_BEFORE_CONNECT)
        return None

    def deliver(self, rid: bytes, message: Message) -> None:
        """Hand a REQUEST to the business layer."""
        try:
            self._handler.on_message(rid, message)
        except Exception:
            self._handler_failed("on_message")

    def reject(self, rid: bytes, io: Any, bad: BadInput) -> None:
        """Drop a bad message: count, log, answer (best effort, never queued) if due."""
        # Every dropped message counts as a decode error; the protocol violations among them
        # (wrong side's kind, other version, no CONNECT) are also counted separately.
        self.decode_errors += 1
        if bad.protocol:
            self.protocol_errors += 1
        self.peer_log.log(bad.kind, "dropped a bad message from peer %s: %s", rid.hex(), bad.error)
        for answer in (RECONNECT_FRAMES if bad.reconnect else None, bad.answer):
            if answer is None:
                continue
            if self._wire.answer(rid, io, answer):
                self.messages_out += 1
                self.bytes_out += sum(map(len, answer))
            else:
                self.dropped += 1

    def _connect(self, rid: bytes, io: Any, info: dict[str, Any], fd: int, now: float) -> None:
        self._gone.pop(rid, None)  # a client with a fixed routing id, back on a new connection
        old = self.peers.get(rid)
        if old is not None:
            # The same routing id introduced itself again: report the old session over.
            self.drop(old, RECONNECTED)
        s = self._settings
        hb = HeartbeatTracker.start(s.heartbeat_interval, s.heartbeat_timeout, now)
        p = Peer(rid, info, hb, fd, lane=info.get("lane") is True, io=io)
        p.state = next_state(ConnState.CONNECTING, ConnEvent.CONNECT_RECEIVED)
        self.peers[rid] = p
        if p.lane:
            self.lanes += 1
        self._wire.admitted(p)
        self.next_check = min(self.next_check, hb.next_deadline())
        self._send(p, self._ack, None)
        if self.peers.get(rid) is p:
            p.announced = True
            try:
                self._handler.on_peer_connected(rid, info)
            except Exception:
                self._handler_failed("on_peer_connected")

    # --------------------------------------------------------------------------- sending

    def send(self, rid: bytes, frames: Sequence[Any], key: int | None) -> None:
        """Send now, or queue behind the peer's full pipe; never blocks."""
        p = self.peers.get(rid)
        if p is None:
            # The peer is gone (its on_peer_disconnected was delivered): a computed reply or a
            # notification nobody can receive, counted and said, never lost silently.
            self.dropped += 1
            self.peer_log.log(
                "messages for departed peers",
                "dropped a message for peer %s, which is no longer connected",
                rid.hex(),
            )
            return
        if p.calls:
            p.calls -= 1  # a lane carries calls only: whatever goes to it answers one
        self._send(p, frames, key)

    def publish(
        self,
        targets: Sequence[tuple[bytes, int, Buffer]],
        tail: Sequence[Buffer],
        conflatable: bool,
    ) -> None:
        """One notification to each target, the shared ``tail`` joined to its header."""
        send = self.send
        for rid, sub, header in targets:
            send(rid, join_tail(header, tail), sub if conflatable else None)

    def _send(self, p: Peer, frames: Sequence[Any], key: int | None) -> None:
        if p.outbox or not self._write(p, frames):
            self._enqueue(p, frames, key)

    def _write(self, p: Peer, frames: Sequence[Any]) -> bool:
        """True when sent (or when the peer turned out gone); False on a full pipe."""
        ok = self._wire.write(p, frames)
        if ok:
            self.messages_out += 1
            n = 0
            for frame in frames:  # compiled: a C loop (sum(map(len, ...)) made an iterator)
                n += len(frame)
            self.bytes_out += n
            p.heartbeat.last_sent = self._clock()
            return True
        if ok is None and self.peers.get(p.rid) is p:
            self.dropped += 1  # the send failed for good, the peer is still there
        return ok is None

    def _enqueue(self, p: Peer, frames: Sequence[Any], key: int | None) -> None:
        if self.peers.get(p.rid) is not p:
            self.dropped += 1
            return
        result = p.outbox.put(frames, key, self._settings.peer_queue_limit)
        if result is PutResult.CONFLATED:
            self.conflated += 1
        elif result is PutResult.DROPPED:
            self.dropped += 1
        else:
            self.queue_depth += 1
            if p.rid not in self.blocked:
                self.blocked[p.rid] = p
                self._wire.want_writable()

    def flush(self, p: Peer) -> bool:
        """Send what waits for ``p`` while its pipe takes it; True when something moved."""
        outbox = p.outbox
        moved = False
        while outbox and self.peers.get(p.rid) is p:
            if not self._write(p, outbox.head()) or self.peers.get(p.rid) is not p:
                break  # still full, or the peer turned out gone (outbox already freed)
            outbox.pop()
            self.queue_depth -= 1
            moved = True
        if not outbox:
            self.blocked.pop(p.rid, None)
        return moved

    def retry_blocked(self) -> bool:
        """Flush every blocked peer; True when something moved."""
        moved = False
        for p in list(self.blocked.values()):
            moved = self.flush(p) or moved
        return moved

    # ---------------------------------------------------------------------- time and loss

    def heartbeat_round(self, now: float) -> float:
        """Drop the silent peers, ping the idle ones; returns (and keeps) the next deadline."""
        peers = self.peers
        next_check = float("inf")
        for p in list(peers.values()):
            action = p.heartbeat.check(now)
            if p.lane:
                if action is HeartbeatAction.EXPIRED:
                    if not p.calls:
                        self.drop(p, LANE_IDLE, ConnEvent.HEARTBEAT_TIMEOUT)
                        continue
                    p.heartbeat.last_received = now  # waiting for our reply: alive
                if action is HeartbeatAction.SEND:
                    p.heartbeat.last_sent = now
            elif action is HeartbeatAction.EXPIRED:
                self.heartbeat_timeouts += 1
                self.drop(p, HEARTBEAT_TIMEOUT, ConnEvent.HEARTBEAT_TIMEOUT)
                continue
            elif action is HeartbeatAction.SEND:
                if p.outbox or not self._write(p, HEARTBEAT_FRAMES):
                    # A full pipe takes no heartbeat: the peer is busy, not idle; calling it
                    # sent keeps the next round from pinging it again at once.
                    p.heartbeat.last_sent = now
                if peers.get(p.rid) is not p:
                    continue
            next_check = min(next_check, p.heartbeat.next_deadline())
        self.next_check = next_check
        self.peer_log.flush()
        return next_check

    def disconnect(self, rid: bytes) -> None:
        """Forget a peer on the business layer's request."""
        p = self.peers.get(rid)
        if p is not None:
            self.drop(p, CLOSED_LOCALLY)

    def drop(self, p: Peer, reason: str, event: ConnEvent = ConnEvent.LOCAL_CLOSE) -> None:
        """End ``p`` (once): what still waited for it is lost and counted, the business
        layer hears of it if it heard of the peer."""
        if self.peers.get(p.rid) is not p:
            return
        del self.peers[p.rid]
        if event is ConnEvent.PEER_GONE:
            self._gone[p.rid] = None
            if len(self._gone) > _GONE_REMEMBERED:
                del self._gone[next(iter(self._gone))]
        if p.lane:
            self.lanes -= 1
        p.state = next_state(p.state, event)
        self._wire.forget(p)
        # What was still queued for the peer is lost with it: count it, never lose silently.
        lost = p.outbox.clear()
        self.queue_depth -= lost
        self.dropped += lost
        self.blocked.pop(p.rid, None)
        if not p.announced:
            return
        try:
            self._handler.on_peer_disconnected(p.rid, reason)
        except Exception:
            self._handler_failed("on_peer_disconnected")

    def close_all(self) -> None:
        """The transport closes: every peer ends "closed locally"."""
        for p in list(self.peers.values()):
            self.drop(p, CLOSED_LOCALLY)
        self.peer_log.flush()

    def _handler_failed(self, what: str) -> None:
        # The dispatcher must survive any business-layer bug: log, count, carry on.
        self.handler_errors += 1
        self._log.exception("server handler %s raised; the transport carries on", what)
