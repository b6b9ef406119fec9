"""Sans-I/O bookkeeping shared by the ZeroMQ and the in-memory transports.

No zmq here: both transport families call this module, so that what a server answers to bad
input, how peers are pinged and expired, how the statistics are counted and what a handshake
says about this process are written once. The transports only move the frames.

* :class:`ServerCounters` / :class:`ClientCounters` (both :class:`Counters`): the counters behind ``statistics()``,
  plain ints written by the dispatcher only (STYLE.md 12: no metric calls in the hot path);
* :class:`BadInput` and the ``reject_*`` functions: every message a server drops, whether it is
  answered (a version mismatch, a REQUEST before CONNECT) and how it is counted;
* :class:`Peer` and :func:`heartbeat_round`: one client as a server sees it, and the periodic
  heartbeat pass over all of them (state transitions stay in ``rda.transport.state``);
* the disconnect reasons (``CLOSED_LOCALLY`` ..., :func:`lost_reason`), the same everywhere;
* :func:`connect_info` / :func:`connect_ack_info`: what CONNECT and CONNECT_ACK carry.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Annotated, Any, TypeVar

import pydantic

from rda.serialization._header import Header, RequestType
from rda.serialization._message import BodyKind, encode_exception
from rda.serialization.errors import DecodeError, ProtocolError
from rda.transport._outbox import Outbox, PutResult
from rda.transport.api import (
    Buffer,
    ClientTransportStatistics,
    PeerStatistics,
    ServerTransportStatistics,
    TransportSettings,
)
from rda.transport.protocol import (
    Kind,
    UnsupportedVersion,
    encode_connect_ack,
    encode_message,
    encode_reconnect,
    encode_refusal,
)
from rda.transport.state import ConnEvent, ConnState, HeartbeatAction, HeartbeatTracker

__all__ = [
    "CLOSED_LOCALLY",
    "FORGOTTEN",
    "HANDSHAKE_REFUSED",
    "HEARTBEAT_BEFORE_CONNECT",
    "HEARTBEAT_TIMEOUT",
    "LANE_IDLE",
    "NOT_RDA",
    "NO_CONNECT_ACK",
    "PEER_GONE",
    "RECONNECTED",
    "RECONNECT_FRAMES",
    "BadInput",
    "ClientCounters",
    "ClientInfoModel",
    "Counters",
    "Peer",
    "ServerCounters",
    "connect_ack_info",
    "connect_info",
    "heartbeat_round",
    "lost_reason",
    "peer_statistics",
    "rda_version",
    "refused_reason",
    "reject_connect_info",
    "reject_request_before_connect",
    "reject_undecodable",
]


class Counters:
    """What both sides count: a base class of every transport, so that the hot path
    increments the transport's own attributes (``self._messages_in += 1``) and pays no extra
    attribute look-up per message. Written by the dispatcher only, read by ``statistics()``.
    """

    def __init__(self) -> None:
        self._messages_in = 0
        self._messages_out = 0
        self._bytes_in = 0
        self._bytes_out = 0
        self._heartbeat_timeouts = 0
        self._decode_errors = 0
        self._handler_errors = 0
        # Unexpected exceptions the dispatcher survived (logged; not in the statistics).
        self._internal_errors = 0


class ServerCounters(Counters):
    """A server transport's counters; :meth:`_statistics` is its ``statistics()``."""

    def __init__(self) -> None:
        super().__init__()
        self._protocol_errors = 0
        self._queue_depth = 0  # messages waiting in all peers' outboxes
        self._conflated = 0
        self._dropped = 0
        # Connections refused in the ZeroMQ handshake: ZAP denials (unknown or no CURVE key)
        # plus handshakes that failed before ZAP (garbage, wrong mechanism or server key).
        self._auth_failures = 0
        self._handshake_failures = 0

    def _count_bad_input(self, bad: BadInput) -> None:
        # Every dropped message counts as a decode error; the protocol violations among them
        # (wrong side's kind, other version, no CONNECT) are also counted separately.
        self._decode_errors += 1
        if bad.protocol:
            self._protocol_errors += 1

    def _count_put(self, result: PutResult) -> bool:
        """Count what ``Outbox.put`` did; True when the message now waits in the outbox."""
        if result is PutResult.CONFLATED:
            self._conflated += 1
            return False
        if result is PutResult.DROPPED:
            self._dropped += 1
            return False
        self._queue_depth += 1
        return True

    def _statistics(
        self, peers: int, lanes: int = 0, handovers: int = 0
    ) -> ServerTransportStatistics:
        return ServerTransportStatistics(
            messages_in=self._messages_in,
            messages_out=self._messages_out,
            bytes_in=self._bytes_in,
            bytes_out=self._bytes_out,
            peers=peers,
            heartbeat_timeouts=self._heartbeat_timeouts,
            decode_errors=self._decode_errors,
            protocol_errors=self._protocol_errors,
            peer_queue_depth=self._queue_depth,
            notifications_conflated=self._conflated,
            messages_dropped=self._dropped,
            handler_errors=self._handler_errors,
            auth_failures=self._auth_failures,
            lanes=lanes,
            handovers=handovers,
        )


class ClientCounters(Counters):
    """A client transport's counters; :meth:`_statistics` is its ``statistics()``."""

    def __init__(self) -> None:
        super().__init__()
        self._disconnects = 0
        self._queued = 0  # messages sent before CONNECT_ACK (they waited for it)

    def _statistics(self, connections: int) -> ClientTransportStatistics:
        return ClientTransportStatistics(
            messages_in=self._messages_in,
            messages_out=self._messages_out,
            bytes_in=self._bytes_in,
            bytes_out=self._bytes_out,
            connections=connections,
            heartbeat_timeouts=self._heartbeat_timeouts,
            decode_errors=self._decode_errors,
            disconnects=self._disconnects,
            queued_until_connected=self._queued,
            handler_errors=self._handler_errors,
        )


# ------------------------------------------------------------------------- reasons

# The reasons handed to ``on_disconnected`` / ``on_peer_disconnected`` (the api.py contract;
# the business layer and the tests compare them), defined once for every transport.
CLOSED_LOCALLY = "closed locally"
HEARTBEAT_TIMEOUT = "heartbeat timeout"
LANE_IDLE = "lane idle"  # server: a client's direct lane was silent for the heartbeat timeout
PEER_GONE = "peer gone"  # server: the client's connection closed
RECONNECTED = "reconnected"  # server: the same routing id sent CONNECT again
NO_CONNECT_ACK = "no CONNECT_ACK within connect_timeout"
# Client: the ZeroMQ security handshake failed (the business layer raises NotAuthorizedError).
HANDSHAKE_REFUSED = "security handshake refused"
# Client: the server answered RECONNECT (it dropped this connection, e.g. after a heartbeat
# timeout while this process was paused).
FORGOTTEN = "the server no longer knew this connection"
# Client: the peer at the endpoint is no ZeroMQ socket (rda.transport._handshake); the business
# layer raises DisconnectedError, not NotAuthorizedError: no key would help.
NOT_RDA = "the peer does not speak the rda protocol"


def lost_reason(state: ConnState) -> str:
    """Client: why a connection whose socket closed under it is over."""
    if state is ConnState.CONNECTING:
        return "connection refused or closed"
    return "server closed the connection"


def refused_reason(error: object) -> str:
    """Client: the server's CONNECT_ACK carried ``error``."""
    return f"refused by the server: {error}"


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
    # What the rate-limited log calls these (``_ratelog``: one line per kind per second).
    kind: str = "bad messages"
    # The sender is no peer (never connected, or dropped after a heartbeat timeout while it was
    # paused): a RECONNECT goes first, so that a client resumes at once (docs/protocol.md).
    reconnect: bool = False


def _exception_reply(request_id: int, exc: ProtocolError) -> list[Buffer]:
    # Always "ProtocolError": the client re-creates rda's own error types by name.
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


def reject_request_before_connect(request_id: int) -> BadInput:
    """A REQUEST from a peer that never sent CONNECT: answered, so its caller fails fast."""
    err = ProtocolError("REQUEST before CONNECT: send CONNECT first")
    return BadInput(err, True, _exception_reply(request_id, err), _BEFORE_CONNECT, True)


_BEFORE_CONNECT = "messages before CONNECT"
HEARTBEAT_BEFORE_CONNECT = BadInput(
    ProtocolError("HEARTBEAT before CONNECT"), True, None, _BEFORE_CONNECT, True
)
#: What a transport sends with a BadInput whose ``reconnect`` is set.
RECONNECT_FRAMES = encode_reconnect()


# What a client may say about itself in CONNECT (docs/protocol.md, "CONNECT"). The server keeps
# it for the peer's lifetime and shows it (``rda admin SERVER clients``): wrong types are
# refused, and every string and the number of extra keys are bounded, so that a client cannot
# make the server hold (and print) 60 kB per connection.
_NAME_MAX = 256
_EXTRA_KEYS_MAX = 16
_Text = Annotated[str, pydantic.StringConstraints(max_length=_NAME_MAX)]
_Key = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]
_Extra = _Text | int | float | bool | None
_EXTRA_VALUE = f"must be a string of at most {_NAME_MAX} characters, a number, a boolean or null"


class ClientInfoModel(pydantic.BaseModel):
    """The CONNECT info object: the standard fields (``connect_info``), the flags the business
    layer and the lanes set, and up to 16 further scalar keys of the application's own."""

    model_config = pydantic.ConfigDict(strict=True, frozen=True, extra="forbid")

    application: _Text = ""
    user: _Text = ""
    host: _Text = ""
    pid: int = pydantic.Field(0, ge=0, le=2**63 - 1)
    version: _Text = ""
    lane: bool = False
    principal: _Text | None = None
    # Never believed (the transport sets it from ZAP); accepted here so that the server can
    # discard it as documented rather than refuse the client.
    authenticated_principal: _Text | None = None
    extra: dict[_Key, _Extra] = pydantic.Field(default_factory=dict, max_length=_EXTRA_KEYS_MAX)

    @classmethod
    def check(cls, info: dict[str, Any]) -> None:
        """Raise ``pydantic.ValidationError`` when ``info`` is not a valid client info."""
        fields = cls.model_fields
        known = {k: v for k, v in info.items() if k in fields and k != "extra"}
        extra = {k: v for k, v in info.items() if k not in known}
        cls.model_validate({**known, "extra": extra})


def reject_connect_info(info: dict[str, Any]) -> BadInput | None:
    """None when ``info`` is a valid CONNECT info; else the refusal: a CONNECT_ACK whose
    ``error`` names each field at fault (the client reports its connection refused)."""
    try:
        ClientInfoModel.check(info)
    except pydantic.ValidationError as exc:
        problems: dict[str, str] = {}
        for e in exc.errors():
            loc = e["loc"]
            if loc[0] == "extra" and len(loc) > 2:  # an application key: one line, not four
                problems.setdefault(str(loc[1]), _EXTRA_VALUE)
            else:
                problems.setdefault(".".join(map(str, loc)), e["msg"])
        listed = "; ".join(f"{k}: {m}" for k, m in list(problems.items())[:5])
        err = ProtocolError(f"CONNECT refused: invalid client info: {listed}")
        refusal: list[Buffer] = list(encode_connect_ack({"error": str(err)}))
        return BadInput(err, True, refusal, "invalid CONNECTs")
    return None


# ------------------------------------------------------------------------- peers


@dataclass(slots=True, eq=False)
class Peer:
    """One client as the server sees it (``last_received``/``last_sent`` live in heartbeat)."""

    rid: bytes
    info: dict[str, Any]
    heartbeat: HeartbeatTracker
    fd: int = -1  # the connection's file descriptor (SRCFD of its CONNECT), -1 if unknown
    state: ConnState = ConnState.CONNECTED
    # on_peer_connected was delivered (so on_peer_disconnected is due when it goes).
    announced: bool = False
    # A client's direct lane (CONNECT with "lane": True, transport/zmq_lane.py): its owner
    # cannot answer heartbeats between calls, so it gets none and, silent for the heartbeat
    # timeout, is forgotten quietly (the lane introduces itself again before that).
    lane: bool = False
    outbox: Outbox = field(default_factory=Outbox)


P = TypeVar("P", bound=Peer)


def peer_statistics(peers: Mapping[bytes, Peer]) -> dict[bytes, PeerStatistics]:
    """A snapshot of every peer's outbox counters, safe to take from a non-dispatcher thread:
    ``list(values())`` and ``dict(...)`` copy under the GIL, so a dispatcher adding or removing
    peers meanwhile cannot break the iteration."""
    result: dict[bytes, PeerStatistics] = {}
    for p in list(peers.values()):
        box = p.outbox
        result[p.rid] = PeerStatistics(
            len(box),
            box.conflated,
            box.dropped,
            dict(box.conflated_by_key),
            dict(box.dropped_by_key),
        )
    return result


def heartbeat_round(
    peers: Mapping[bytes, P],
    now: float,
    counters: ServerCounters,
    ping: Callable[[P], bool],
    drop: Callable[[P, str, ConnEvent], None],
) -> float:
    """One pass over every peer: drop the silent ones, ping the idle ones.

    ``ping`` sends a HEARTBEAT and returns False when the peer's pipe is full; ``drop`` removes
    the peer (and may be called by ``ping`` too). Returns the earliest next deadline of the
    peers that remain (``inf`` for none).
    """
    next_check = float("inf")
    for p in list(peers.values()):
        action = p.heartbeat.check(now)
        if p.lane:
            if action is HeartbeatAction.EXPIRED:
                drop(p, LANE_IDLE, ConnEvent.HEARTBEAT_TIMEOUT)
                continue
            if action is HeartbeatAction.SEND:
                p.heartbeat.last_sent = now
        elif action is HeartbeatAction.EXPIRED:
            counters._heartbeat_timeouts += 1
            drop(p, HEARTBEAT_TIMEOUT, ConnEvent.HEARTBEAT_TIMEOUT)
            continue
        elif action is HeartbeatAction.SEND:
            if p.outbox or not ping(p):
                # A full pipe takes no heartbeat: the peer is busy, not idle; calling it sent
                # keeps the next round from pinging it again at once.
                p.heartbeat.last_sent = now
            if peers.get(p.rid) is not p:
                continue
        next_check = min(next_check, p.heartbeat.next_deadline())
    return next_check


# ------------------------------------------------------------------------- handshakes


def rda_version() -> str:
    try:
        return metadata.version("rda")
    except metadata.PackageNotFoundError:
        return "unknown"


def connect_info(version: str) -> dict[str, Any]:
    """What CONNECT tells the server about this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in some containers
        user = str(os.getuid())
    return {
        "application": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
        "user": user,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "version": version,
    }


def connect_ack_info(
    name: str, version: str, settings: TransportSettings, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """What CONNECT_ACK tells a client: who answers and the heartbeat it expects."""
    info: dict[str, Any] = {
        "name": name,
        "version": version,
        "heartbeat_interval": settings.heartbeat_interval,
        "heartbeat_timeout": settings.heartbeat_timeout,
    }
    info.update(extra or {})
    return info


def probe_round(
    suspects: dict[bytes, int],
    peers: Mapping[bytes, Peer],
    probe: Callable[[Peer, float], bool],
    first: float,
    probes: int,
    now: float,
) -> float | None:
    """One round of probes of the peers whose connection the monitor reported closed (the
    server's ``_probe_suspects``); ``probe`` is False when the peer turned out forgotten (and
    was dropped). A probe that still succeeds is repeated after ``first``, 2 x ``first`` ...
    up to ``probes`` times; then the heartbeat decides. The next round's time, or None."""
    for rid, attempt in list(suspects.items()):
        p = peers.get(rid)
        if p is None or not probe(p, now) or attempt >= probes:
            del suspects[rid]
        else:
            suspects[rid] = attempt + 1
    return now + first * 2 ** min(suspects.values()) if suspects else None
