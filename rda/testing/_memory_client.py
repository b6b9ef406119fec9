"""The in-memory client transport: ``rda.transport.api.ClientTransport`` without sockets.

It runs the client protocol's rules of the ZeroMQ transport itself
(``rda.transport.client_session.ClientSessions``: handshake, heartbeats, RECONNECT, what
waits for the ACK, back-pressure, bad input, the reasons it reports) over
:class:`~rda.testing._dispatch.Link` objects instead of DEALER sockets, and offers direct lanes
and deferred wake-ups as the ZeroMQ client does (``lane``, ``wake_later``), so a business
layer on a ``MemoryNetwork`` takes the same paths as in production.
"""

from __future__ import annotations

import itertools
import logging
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rda.serialization.errors import TransportError
from rda.serialization.message import Message
from rda.testing._dispatch import Dispatcher, Link
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransportStatistics,
    TransportSettings,
    Waker,
)
from rda.transport.client_session import ClientSession, ClientSessions, LaneSession
from rda.transport.lanes import REFRESH_SHARE, WAIT_SLICE, Lane, LanePool, PooledLane
from rda.transport.peer_info import connect_info
from rda.transport.protocol import encode_connect
from rda.transport.ratelog import RateLimitedLog
from rda.transport.state import ConnState

__all__ = ["MemoryClientTransport"]

log = logging.getLogger("rda.testing")
_lane_log = RateLimitedLog(log)


class Network(Protocol):
    """What a client transport uses of its ``MemoryNetwork`` (a protocol, so that this module
    does not import _memory.py, which imports it)."""

    clock: Callable[[], float]

    def bump(self) -> None: ...

    def forget(self, d: Dispatcher) -> None: ...

    def open_link(self, endpoint: str, client: Any, conn: int) -> Link: ...

    def close_link(self, link: Link) -> None: ...

    def client_send(self, link: Link, frames: Sequence[Buffer]) -> None: ...


_instances = itertools.count(1)


@dataclass(slots=True)
class _Open:
    conn: int
    endpoint: str


@dataclass(slots=True)
class _Send:
    conn: int
    frames: list[Buffer]


@dataclass(slots=True)
class _Disconnect:
    conn: int


@dataclass(slots=True)
class _Arrival:
    conn: int
    frames: list[memoryview]
    stamp: float


@dataclass(slots=True)
class _Gone:
    conn: int


class MemoryClientTransport(Dispatcher):
    """A client transport on a :class:`~rda.testing.MemoryNetwork`; see ``rda.transport.api``.

    Build it with ``network.client(handler, settings, client_info)``, then ``start()``.
    """

    def __init__(
        self,
        network: Network,
        handler: ClientHandler,
        settings: TransportSettings,
        client_info: dict[str, Any] | None,
        authenticated_principal: str | None = None,
    ) -> None:
        super().__init__(
            f"rda-memory-client-{next(_instances)}", network.clock, settings.send_hwm, network.bump
        )
        self._network = network
        self._settings = settings
        info = connect_info("memory")
        info.update(client_info or {})
        # Plays ZAP's role: the memory server hands this to its handler as the transport's
        # ``authenticated_principal``, whatever the CONNECT info says.
        self.authenticated_principal = authenticated_principal
        self._ids = itertools.count(1)
        self._routing: dict[int, bytes] = {}
        self._sessions = ClientSessions(
            handler, settings, info, _LinkWire(network, self._inbox), network.clock, log
        )
        self._wakes: list[Waker] = []
        hello = encode_connect({**info, "lane": True})
        self._lanes = LanePool(self._lane_opener(hello))

    # --- api.ClientTransport (any thread) ---

    def start(self) -> None:
        self._start_thread()

    def connect(self, endpoint: str) -> int:
        conn = next(self._ids)
        self._post(_Open(conn, endpoint))
        return conn

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        self._post(_Send(connection, list(frames)))

    def disconnect(self, connection: int) -> None:
        self._post(_Disconnect(connection))

    def close(self, timeout: float | None = None) -> None:
        self._stop(self._settings.close_timeout if timeout is None else timeout, kill=False)

    def statistics(self) -> ClientTransportStatistics:
        return self._sessions.statistics(self._lanes.counts())

    def lane(self, connection: int) -> PooledLane | None:
        """The calling thread's own lane to the server of ``connection`` (a link of its
        own), while that connection is established; None otherwise."""
        session = self._sessions.sessions.get(connection)  # a dict read: safe under the GIL
        if session is None or session.state is not ConnState.CONNECTED or self._closed:
            return None
        refresh = session.server_timeout * REFRESH_SHARE
        return self._lanes.of_thread(session.endpoint, connection, refresh)

    def wake_later(self, waker: Waker) -> None:
        """Set ``waker`` once the dispatcher is done with its batch (on the dispatcher), at
        once from any other thread; as the ZeroMQ client."""
        if self._on_dispatcher() and not self._closed:
            self._wakes.append(waker)
        else:
            waker.set()

    def routing_id(self, connection: int) -> bytes | None:
        """The peer id the server sees for ``connection`` (None before the dispatcher opened it)."""
        return self._routing.get(connection)

    # --- called by the network (any thread) ---

    def link_receive(self, conn: int, frames: list[memoryview], stamp: float) -> None:
        self._inbox.put_network(_Arrival(conn, frames, stamp))

    def link_gone(self, conn: int) -> None:
        self._inbox.put_network(_Gone(conn))

    # --- dispatcher thread ---

    def _handle(self, item: object) -> None:
        sessions = self._sessions
        if isinstance(item, _Arrival):
            session = sessions.sessions.get(item.conn)
            if session is None:
                return  # arrived after we dropped the connection
            message = sessions.received(session, item.frames, item.stamp)
            if message is not None:
                # As the ZeroMQ client: a batch-taking handler gets the replies of one batch
                # (of one connection) in one call, after the batch.
                sessions.hold(session, message)
        elif isinstance(item, _Send):
            sessions.send(item.conn, item.frames)
        elif isinstance(item, _Open):
            link = self._network.open_link(item.endpoint, self, item.conn)
            self._routing[item.conn] = link.peer
            sessions.open(item.conn, item.endpoint, link)
        elif isinstance(item, _Disconnect):
            sessions.disconnect(item.conn)
        elif isinstance(item, _Gone):
            session = sessions.sessions.get(item.conn)
            if session is not None:
                sessions.gone(session)

    def _end_batch(self) -> None:
        self._sessions.end_batch()

    def _after_batch(self) -> None:
        if self._wakes:
            wakes, self._wakes = self._wakes, []
            for waker in wakes:
                waker.set()

    def _check_timers(self, now: float) -> None:
        self._sessions.check_timers(now)

    def _next_deadline(self) -> float | None:
        if not self._sessions.sessions:
            return None
        deadline = self._sessions.next_timer
        return None if deadline == float("inf") else deadline

    def _teardown(self, report: bool) -> None:
        sessions = self._sessions
        if report:
            sessions.close_all()
        else:
            sessions.discard_all()  # a killed process tells nobody
        self._routing.clear()
        self._after_batch()
        self._lanes.close(self._settings.close_timeout)
        self._network.forget(self)

    # --- lanes ---

    def _lane_opener(self, hello: list[bytes]) -> Callable[[str, int, float], PooledLane | None]:
        network = self._network
        max_size = self._settings.max_message_size

        def open_lane(address: str, connection: int, refresh_after: float) -> PooledLane | None:
            session = LaneSession(address, hello, refresh_after, max_size)
            return _MemoryLane(network, session, connection, self.authenticated_principal)

        return open_lane


class _LinkWire:
    """The links of a :class:`MemoryClientTransport` as the session rules see them."""

    __slots__ = ("_inbox", "_network")

    def __init__(self, network: Network, inbox: Any) -> None:
        self._network = network
        self._inbox = inbox

    def write(self, session: ClientSession, frames: Sequence[Any]) -> bool | None:
        self._network.client_send(session.io, frames)  # a client's link is never full
        return True

    def want_writable(self, session: ClientSession, on: bool) -> None:
        return  # never full: nothing to wait for

    def release(self, session: ClientSession) -> None:
        self._network.close_link(session.io)

    def pause_intake(self, paused: bool) -> None:
        self._inbox.pause_commands(paused)


class _MemoryLane(Lane):
    """A calling thread's own link to one server (see ``lanes.Lane``), as
    ``zmq_lane.ZmqLane`` is its own DEALER."""

    __slots__ = ("_gone", "_link", "_network", "_replies", "authenticated_principal")

    def __init__(
        self, network: Network, session: LaneSession, connection: int, principal: str | None
    ) -> None:
        super().__init__(connection, session)
        self._network = network
        # The same identity as the transport's connections, as a ZeroMQ lane has the same
        # CURVE keys: the server reads it here (``MemoryServerTransport``).
        self.authenticated_principal = principal
        self._replies: queue.SimpleQueue[list[memoryview] | None] = queue.SimpleQueue()
        self._gone = False
        self._link: Link | None = network.open_link(session.address, self, 0)

    @property
    def closed(self) -> bool:
        return self._link is None or self._gone

    def _send(self, frames: Sequence[Buffer], hello: bool) -> None:
        link = self._link
        assert link is not None  # checked under the lock by call()
        if hello:
            self._network.client_send(link, self.session.hello)
        self._network.client_send(link, frames)

    def _wait(self, request_id: int, ended: Callable[[], bool]) -> Message | None:
        session = self.session
        while True:
            try:
                got = self._replies.get(timeout=WAIT_SLICE)
            except queue.Empty:
                if ended():
                    return None
                continue
            if got is None:
                raise TransportError(f"the lane to {session.address} was closed by the server")
            message = session.received(got, request_id, _lane_log)
            if message is not None:
                return message

    def _release(self) -> None:
        if self._link is not None:
            self._network.close_link(self._link)
            self._link = None

    # --- called by the network (any thread) ---

    def link_receive(self, conn: int, frames: list[memoryview], stamp: float) -> None:
        self._replies.put(frames)

    def link_gone(self, conn: int) -> None:
        self._gone = True
        self._replies.put(None)
