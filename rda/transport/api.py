"""The contract between the transport and the business layer.

Two implementations honour it: the ZeroMQ transports (``rda.transport.zmq_client`` /
``rda.transport.zmq_server``) and the in-memory pair in ``rda.testing``; both run the same
protocol rules (``client_session``, ``server_session``) and the conformance suite
(``rda.testing.check_transport``) runs against both, lanes, wake-ups and hand-over included.

Threading contract (RDA3 paper, "Transport layer"): every handler method is called on the
transport's dispatcher thread. It must be fast and must never block: hand the message to a
scheduler and return. It may call ``send``/``publish``/``disconnect``/``close`` on the
transport (those are safe from any thread, the dispatcher included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.serialization.message import Message

__all__ = [
    "BatchClientHandler",
    "Buffer",
    "ClientHandler",
    "ClientTransport",
    "ClientTransportStatistics",
    "DirectLane",
    "PeerStatistics",
    "ServerHandler",
    "ServerTransport",
    "ServerTransportStatistics",
    "TransportSettings",
    "Waker",
    "batch_receiver",
]

Buffer = bytes | memoryview


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """Knobs shared by client and server transports (seconds, counts, bytes)."""

    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    # Messages a sender may queue towards the dispatcher before ``send`` blocks (back-pressure;
    # the mailbox holds twice this). Small on purpose: a producer that runs ahead holds the GIL
    # the dispatcher needs to send, and a deep mailbox only let it run ahead further, so that
    # the dispatcher, starved for a GIL switch interval (5 ms), then sent a burst bigger than a
    # peer's pipe and the rest was conflated. docs/transport.md, "Threads and sockets".
    send_hwm: int = 128
    # Messages held for one peer whose pipe is full before new ones are dropped and counted.
    peer_queue_limit: int = 10_000
    max_message_size: int = 256 * 1024 * 1024
    # How long ``close`` waits for the dispatcher to finish.
    close_timeout: float = 2.0
    # Server: a dispatcher inside a handler for longer than this hands its sockets to a
    # standby thread, which becomes the dispatcher (``relay``); 0 disables the standby.
    handover_after: float = 0.002
    # Client: a connection still without CONNECT_ACK after this long is reported disconnected.
    connect_timeout: float = 5.0
    # Client: how long a blocking call on its lane polls for the reply before it sleeps
    # (``Config.lane_spin``; 0: it sleeps at once).
    lane_spin: float = 0.0


@dataclass(frozen=True, slots=True)
class ClientTransportStatistics:
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    connections: int = 0
    heartbeat_timeouts: int = 0
    decode_errors: int = 0
    disconnects: int = 0
    queued_until_connected: int = 0
    # Of those, gets and sets never sent: their request had ended (timed out) meanwhile.
    expired_unsent: int = 0
    # Handler calls that raised (logged; the dispatcher carries on).
    handler_errors: int = 0
    # Direct lanes open (zmq_lane: blocking callers' own connections), and replies they read
    # for requests already abandoned (deadline passed) and dropped.
    lanes: int = 0
    lane_stale_replies: int = 0


@dataclass(frozen=True, slots=True)
class ServerTransportStatistics:
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    peers: int = 0
    heartbeat_timeouts: int = 0
    decode_errors: int = 0
    protocol_errors: int = 0
    peer_queue_depth: int = 0
    notifications_conflated: int = 0
    messages_dropped: int = 0
    # Handler calls that raised (logged; the dispatcher carries on).
    handler_errors: int = 0
    # Connections refused in the ZeroMQ handshake (CURVE/ZAP: no or unknown key, garbage).
    auth_failures: int = 0
    # Clients' direct lanes (transport/zmq_lane.py) connected now; not counted in ``peers``.
    lanes: int = 0
    # Handlers that ran on the dispatcher past ``handover_after``: each time a standby took
    # the lead (transport/relay.py). Many of them mean handlers that block belong on workers.
    handovers: int = 0


@dataclass(frozen=True, slots=True)
class PeerStatistics:
    """What one server-side peer has waiting and has lost because its pipe was full.

    ``*_by_key`` count per conflation key (the subscription id of a notification).
    """

    queue_depth: int = 0
    conflated: int = 0
    dropped: int = 0
    conflated_by_key: dict[int, int] = field(default_factory=dict)
    dropped_by_key: dict[int, int] = field(default_factory=dict)


class ClientHandler(Protocol):
    """What the client business layer receives; every call runs on the dispatcher thread."""

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        """CONNECT_ACK arrived: requests queued for ``connection`` are now being sent."""

    def on_message(self, connection: int, message: Message) -> None:
        """A REPLY arrived (header parsed, body undecoded).

        A handler may also define ``on_messages(connection, messages)`` (see
        :class:`BatchClientHandler`): a transport that finds it hands over every REPLY of one
        drained batch in one call, in arrival order, instead of one ``on_message`` each.
        """

    def on_disconnected(self, connection: int, reason: str) -> None:
        """The connection is gone (server closed, heartbeat timeout, refused, closed locally).

        The connection id is dead afterwards; the business layer reconnects by calling
        ``connect`` again. Never called twice for one connection.
        """


class BatchClientHandler(ClientHandler, Protocol):
    """A :class:`ClientHandler` that takes the replies of one drained batch at once.

    ZeroMQ's batching rule: when messages arrive faster than they are handled, the transport
    receives every waiting message first (up to its batch size) and then calls
    ``on_messages`` once, so the business layer can wake each waiting consumer once per batch
    instead of once per message, and no consumer thread competes for the GIL with the
    dispatcher's receive calls. The messages of one call come from one connection, in
    arrival order; ``on_connected``/``on_disconnected`` are never reordered against them.
    When messages come one at a time, a batch is one message: no added latency.
    """

    def on_messages(self, connection: int, messages: Sequence[Message]) -> None: ...


def batch_receiver(
    handler: ClientHandler,
) -> Callable[[int, Sequence[Message]], None] | None:
    """The handler's ``on_messages`` if it takes batches, else None (use ``on_message``)."""
    on_messages = getattr(handler, "on_messages", None)
    return on_messages if callable(on_messages) else None


def request_check(handler: ClientHandler) -> Callable[[int], bool] | None:
    """The handler's ``awaits(request_id)`` if it has one, else None.

    A client transport asks it before sending a GET or SET that waited for its connection's
    CONNECT_ACK: a request the business layer stopped waiting for (it timed out, or was
    abandoned) must not reach a server after its user was told it failed (a set would then
    take effect after a later one, acknowledged meanwhile)."""
    awaits = getattr(handler, "awaits", None)
    return awaits if callable(awaits) else None


class Waker(Protocol):
    """What a blocked caller waits on (``rda.transport.mailbox.Wakeup``): set once the
    reply it waits for is there."""

    def set(self) -> None: ...


class DirectLane(Protocol):
    """A calling thread's own connection to one server (``ClientTransport.lane``): its
    request and reply never pass through the dispatcher. Only the thread that got it calls
    :meth:`call`."""

    def call(
        self,
        frames: Sequence[Buffer],
        request_id: int,
        ended: Callable[[], bool],
        now: float,
    ) -> Message | None:
        """Send one REQUEST and wait on this thread for the REPLY with ``request_id``; None
        once ``ended()`` is true first. Raises ``TransportError`` when the lane failed."""
        ...


class ClientTransport(Protocol):
    def start(self) -> None: ...

    def connect(self, endpoint: str) -> int:
        """Open a DEALER to ``endpoint`` and start the handshake; returns a new connection id.

        Thread-safe, does not wait for the handshake. Requests sent before CONNECT_ACK are
        queued and flushed on it.
        """
        ...

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        """Send one message (frames from ``protocol.encode_message``). Thread-safe; blocks
        when ``send_hwm`` messages are already queued. Sending on a dead connection is a
        silent no-op (its ``on_disconnected`` was or will be delivered)."""
        ...

    def disconnect(self, connection: int) -> None:
        """Close one connection; ``on_disconnected`` follows with reason "closed locally"."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Idempotent, callable from any thread (a handler too); bounded by ``timeout``."""
        ...

    def statistics(self) -> ClientTransportStatistics: ...

    def lane(self, connection: int) -> DirectLane | None:
        """The calling thread's own lane to the server of ``connection`` while that
        connection is established (CONNECT_ACK received); None otherwise, or when no lane can
        be made: then use :meth:`send`. A lane is a session of its own at the server (a
        CONNECT with ``"lane": True``): not heartbeated, forgotten quietly when idle, replaced
        when ``connection`` is."""
        ...

    def wake_later(self, waker: Waker) -> None:
        """Set ``waker`` once the dispatcher is done with what is ready, right before it
        waits again, when called on the dispatcher (a handler completing a blocking
        request); at once from any other thread."""
        ...


class ServerHandler(Protocol):
    """What the server business layer receives; every call runs on the dispatcher thread."""

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None: ...

    def on_message(self, peer: bytes, message: Message) -> None:
        """A REQUEST arrived from a connected peer (header parsed, body undecoded)."""

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None: ...


class ServerTransport(Protocol):
    @property
    def endpoint(self) -> str:
        """The bound endpoint, with the real port when bound to port 0."""
        ...

    @property
    def hands_over(self) -> bool:
        """True when a handler that runs long on the dispatcher (``on_message``) is handed
        over: after ``settings.handover_after`` a standby thread takes the lead of the
        sockets and the handler finishes on its own thread (leader/followers), so the
        business layer may run any handler inline. False: an inline handler blocks the
        dispatcher."""
        ...

    def start(self) -> None: ...

    def send(self, peer: bytes, frames: Sequence[Buffer], conflate_key: int | None = None) -> None:
        """Queue one message for ``peer``. Thread-safe. With ``conflate_key`` (a subscription
        id) the message may replace an older queued one with the same key while the peer's
        pipe is full (counted in ``notifications_conflated``)."""
        ...

    def publish(
        self,
        targets: Sequence[tuple[bytes, int, Buffer]],
        tail: Sequence[Buffer],
        conflatable: bool = True,
    ) -> None:
        """Fan one notification out with a single hand-off to the dispatcher.

        ``targets`` are ``(peer, subscription_id, header_frame)``; each peer gets
        ``protocol.join_tail(header_frame, tail)`` (one packed frame: REPLY kind byte, its
        header, the shared tail), where ``tail`` (``protocol.encode_tail``: body table and
        bodies) was encoded once and is shared. With ``conflatable`` the ``subscription_id`` is the
        conflation key, as in ``send``.

        Never blocks, also when the dispatcher's hand-off is full: a notifier calls it while it
        holds the lock that orders its notifications, which a handler notifying from the
        dispatcher thread may also need; a publish that waited there for the dispatcher could
        wait forever. The notifier paces itself with :meth:`wait_for_room` first.
        """
        ...

    def wait_for_room(self) -> None:
        """Block while the hand-off to the dispatcher is full (back-pressure for notifiers,
        called with no lock held); returns at once on the dispatcher thread and once closed."""
        ...

    def peer_statistics(self) -> dict[bytes, PeerStatistics]:
        """Per connected peer: queue depth and what conflation or a full queue cost it.

        Safe from any thread (a snapshot; counters may move while it is taken)."""
        ...

    def disconnect(self, peer: bytes) -> None:
        """Forget a peer; ``on_peer_disconnected`` follows with reason "closed locally"."""
        ...

    def close(self, timeout: float | None = None) -> None: ...

    def statistics(self) -> ServerTransportStatistics: ...
