"""An in-memory network of rda transports, with hooks that make real-world faults reproducible.

The transports it builds (:class:`MemoryClientTransport`, :class:`MemoryServerTransport`)
implement ``rda.transport.api`` exactly and carry the same frames as the ZeroMQ ones, encoded
and decoded by ``rda.transport.protocol``, so business-layer tests exercise the real protocol
logic without sockets. What travels is modelled on ZeroMQ over TCP:

* a client connection is a :class:`~rda.testing._dispatch.Link` to an endpoint
  ``"mem://name"``; frames sent before any server bound the name wait in the link, as in a
  DEALER, and are delivered when one binds;
* a server that closes or is killed closes every link: the clients hear it at once (the socket
  monitor); a client that closes or disconnects closes its link: the server hears it at once;
* :meth:`MemoryNetwork.partition` loses every message in both directions, closes included,
  so only heartbeats can tell (a half-open connection);
* :meth:`MemoryNetwork.stall_client` makes one client's pipe full, so the server's per-peer
  queue and conflation come into play.

With a :class:`~rda.testing.FakeClock`, time moves only through ``clock.advance()``; every
dispatcher re-checks its heartbeats then, and :meth:`MemoryNetwork.settle` waits until the
consequences have played out, so a test can assert what has *not* happened yet.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rda.serialization.errors import TransportError
from rda.testing._dispatch import Dispatcher, Link, wire_copy
from rda.testing._memory_client import MemoryClientTransport
from rda.testing._memory_server import MemoryServerTransport
from rda.transport.api import (
    Buffer,
    ClientHandler,
    ClientTransport,
    ServerHandler,
    ServerTransport,
    TransportSettings,
)

__all__ = ["MemoryNetwork", "MemoryPair", "OneServerDirectory", "RawPeer", "memory_pair"]

_SCHEME = "mem://"


def _endpoint(name: str) -> str:
    return name if name.startswith(_SCHEME) else _SCHEME + name


class MemoryNetwork:
    """Endpoints, connections and faults shared by a set of in-memory transports.

    ``clock`` is what every transport built here reads time from (``time.monotonic`` by
    default; a :class:`~rda.testing.FakeClock` for deterministic heartbeat tests).
    :meth:`close` closes everything built here; use the network as a context manager.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock: Callable[[], float] = clock or time.monotonic
        # Guards the topology below; the inboxes' locks nest inside it, never the other way.
        self._lock = threading.RLock()
        self._bound: dict[str, MemoryServerTransport] = {}
        # The latest server built for each endpoint, kept for restart_server.
        self._last_server: dict[str, MemoryServerTransport] = {}
        self._links: dict[bytes, Link] = {}
        self._waiting: dict[str, list[Link]] = {}
        self._partitioned: set[str] = set()
        self._stalled: set[bytes] = set()
        self._dispatchers: list[Dispatcher] = []
        self._raw: list[RawPeer] = []
        self._peer_ids = itertools.count(1)
        self._names = itertools.count(1)
        self._activity = itertools.count()
        self._last_activity = 0

    def __enter__(self) -> MemoryNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- building transports ---

    def server(
        self,
        name: str = "",
        handler: ServerHandler | None = None,
        settings: TransportSettings | None = None,
        server_info: dict[str, Any] | None = None,
    ) -> MemoryServerTransport:
        """A server transport for ``"mem://<name>"`` (a fresh name when empty); call start()."""
        if handler is None:
            raise TypeError("a server transport needs a handler")
        endpoint = _endpoint(name or f"server-{next(self._names)}")
        server = MemoryServerTransport(
            self, endpoint, handler, settings or TransportSettings(), server_info
        )
        with self._lock:
            self._dispatchers.append(server)
            self._last_server[endpoint] = server
        return server

    def client(
        self,
        handler: ClientHandler,
        settings: TransportSettings | None = None,
        client_info: dict[str, Any] | None = None,
        authenticated_principal: str | None = None,
    ) -> MemoryClientTransport:
        """A client transport that can ``connect("mem://<name>")``; call start().

        ``authenticated_principal`` plays CURVE/ZAP's role for RBAC tests: servers on this
        network see it as the identity the transport authenticated (a client's CONNECT info
        cannot forge it)."""
        client = MemoryClientTransport(
            self, handler, settings or TransportSettings(), client_info, authenticated_principal
        )
        with self._lock:
            self._dispatchers.append(client)
        return client

    def raw_peer(self, endpoint: str) -> RawPeer:
        """A bare connection to ``endpoint`` that sends any frames and never heartbeats."""
        peer = RawPeer(self, _endpoint(endpoint))
        with self._lock:
            self._raw.append(peer)
        return peer

    # --- fault injection ---

    def partition(self, endpoint: str) -> None:
        """Lose every message to and from ``endpoint`` (both ways) until :meth:`heal`."""
        with self._lock:
            self._partitioned.add(_endpoint(endpoint))

    def heal(self, endpoint: str) -> None:
        with self._lock:
            self._partitioned.discard(_endpoint(endpoint))

    def stall_client(self, peer: bytes) -> None:
        """Make the pipe towards ``peer`` (a server-side peer id) full until unstalled."""
        with self._lock:
            self._stalled.add(peer)

    def unstall_client(self, peer: bytes) -> None:
        with self._lock:
            self._stalled.discard(peer)
            link = self._links.get(peer)
            if link is not None and link.server is not None:
                link.server.link_writable(peer)

    def restart_server(
        self, endpoint: str, handler: ServerHandler | None = None
    ) -> MemoryServerTransport:
        """Kill the server bound to ``endpoint`` and start a fresh one there (same handler,
        settings and info unless ``handler`` is given); returns the new, started server."""
        endpoint = _endpoint(endpoint)
        with self._lock:
            old = self._last_server.get(endpoint)
        if old is None:
            raise TransportError(f"no server was ever bound to {endpoint}")
        old.kill()
        new = self.server(endpoint, handler or old.handler, old.settings, old.server_info)
        new.start()
        return new

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every dispatcher has handled everything, including what that caused.

        Use it after ``clock.advance()`` or a burst of sends to assert on a quiet network.
        Raises ``TimeoutError`` if traffic keeps flowing for ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                before = self._last_activity
                dispatchers = list(self._dispatchers)
            barriers = [b for b in (d.barrier() for d in dispatchers) if b is not None]
            for barrier in barriers:
                if not barrier.event.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"the memory network did not settle within {timeout} s")
            with self._lock:
                if self._last_activity == before:
                    return

    def close(self) -> None:
        """Close every transport and raw peer built on this network (idempotent)."""
        with self._lock:
            dispatchers = list(self._dispatchers)
            raw = list(self._raw)
        for peer in raw:
            peer.close()
        for d in reversed(dispatchers):
            if isinstance(d, MemoryClientTransport | MemoryServerTransport):
                d.close()

    # --- used by the transports (public so that the transports need no private access;
    # a test has no reason to call them) ---

    def bump(self) -> None:
        with self._lock:
            self._last_activity = next(self._activity)

    def forget(self, d: Dispatcher) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._dispatchers.remove(d)

    def bind(self, server: MemoryServerTransport) -> None:
        with self._lock:
            if server.endpoint in self._bound:
                raise TransportError(f"cannot bind {server.endpoint}: address already in use")
            self._bound[server.endpoint] = server
            for link in self._waiting.pop(server.endpoint, []):
                link.server = server
                frames_list, link.waiting = link.waiting, []
                if server.endpoint not in self._partitioned:
                    for frames in frames_list:
                        server.link_arrival(link, frames, self.clock())

    def unbind(self, server: MemoryServerTransport) -> None:
        with self._lock:
            if self._bound.get(server.endpoint) is server:
                del self._bound[server.endpoint]
            lost = server.endpoint in self._partitioned
            for peer, link in list(self._links.items()):
                if link.server is server:
                    link.closed = True
                    del self._links[peer]
                    if not lost:
                        link.client.link_gone(link.conn)
            if self._dispatchers.count(server):
                self._dispatchers.remove(server)

    def open_link(self, endpoint: str, client: Any, conn: int) -> Link:
        endpoint = _endpoint(endpoint)
        link = Link(endpoint, b"mem-%d" % next(self._peer_ids), client, conn)
        with self._lock:
            self._links[link.peer] = link
            server = self._bound.get(endpoint)
            if server is None:
                self._waiting.setdefault(endpoint, []).append(link)
            else:
                link.server = server
        return link

    def close_link(self, link: Link) -> None:
        with self._lock:
            if link.closed:
                return
            link.closed = True
            self._links.pop(link.peer, None)
            self._stalled.discard(link.peer)
            if link.server is None:
                waiting = self._waiting.get(link.endpoint, [])
                if link in waiting:
                    waiting.remove(link)
            elif link.endpoint not in self._partitioned:
                link.server.link_closed(link.peer)

    def client_send(self, link: Link, frames: Sequence[Buffer]) -> None:
        with self._lock:
            if link.closed or link.endpoint in self._partitioned:
                return  # lost, as on a broken network
            if link.server is None:
                link.waiting.append(wire_copy(frames))
            else:
                link.server.link_arrival(link, wire_copy(frames), self.clock())

    def server_send(self, link: Link, frames: Sequence[Buffer]) -> bool:
        """Deliver to the client; False when its pipe is full (stalled)."""
        with self._lock:
            if link.peer in self._stalled and not link.closed:
                return False
            if not link.closed and link.endpoint not in self._partitioned:
                link.client.link_receive(link.conn, wire_copy(frames), self.clock())
            return True


class OneServerDirectory:
    """A directory that sends every device to one endpoint, a memory network's included
    (``StaticDirectory`` accepts only tcp://, ipc:// and inproc:// endpoints)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def resolve(self, device: str) -> str:
        return self.endpoint

    def devices(self) -> dict[str, str]:
        return {"*": self.endpoint}


class RawPeer:
    """A bare client connection for bad-input tests: sends any frames, records what arrives,
    never heartbeats (so it is also the simplest silent peer)."""

    def __init__(self, network: MemoryNetwork, endpoint: str) -> None:
        self._network = network
        self._received: queue.Queue[list[bytes]] = queue.Queue()
        self._gone = threading.Event()
        self._link = network.open_link(endpoint, self, 0)

    @property
    def peer(self) -> bytes:
        """The peer id the server sees."""
        return self._link.peer

    @property
    def gone(self) -> bool:
        """True once the server side closed the connection."""
        return self._gone.is_set()

    def send(self, frames: Sequence[Buffer]) -> None:
        self._network.client_send(self._link, frames)

    def recv(self, timeout: float = 10.0) -> list[bytes]:
        """The next message the server sent; ``TimeoutError`` when none comes in time."""
        try:
            return self._received.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"raw peer received nothing within {timeout} s") from None

    def wait_gone(self, timeout: float = 10.0) -> bool:
        return self._gone.wait(timeout)

    def close(self) -> None:
        self._network.close_link(self._link)

    def link_receive(self, conn: int, frames: list[memoryview], stamp: float) -> None:
        self._received.put([bytes(f) for f in frames])

    def link_gone(self, conn: int) -> None:
        self._gone.set()


class MemoryPair:
    """The ``TransportPair`` of ``rda.testing.check_transport`` for the in-memory transports."""

    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network

    def make_server(
        self, handler: ServerHandler, settings: TransportSettings, server_info: dict[str, Any]
    ) -> ServerTransport:
        server = self.network.server("", handler, settings, server_info)
        server.start()
        return server

    def make_client(
        self, handler: ClientHandler, settings: TransportSettings, client_info: dict[str, Any]
    ) -> ClientTransport:
        client = self.network.client(handler, settings, client_info)
        client.start()
        return client


@contextlib.contextmanager
def memory_pair(clock: Callable[[], float] | None = None) -> Iterator[MemoryPair]:
    """A fresh :class:`MemoryNetwork` wrapped for ``check_transport(memory_pair)``; closes
    everything it built on exit. With a :class:`~rda.testing.FakeClock`, pass
    ``heartbeats=False`` to ``check_transport`` (its keep-alive check needs real time)."""
    network = MemoryNetwork(clock)
    try:
        yield MemoryPair(network)
    finally:
        network.close()
