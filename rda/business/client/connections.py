"""The connection side of a ``ClientService``: one ``Endpoint`` per server address, connecting
on demand, background reconnection on the back-off, following devices the directory says have
moved, and the transport's connect/disconnect events.

A mixin of :class:`rda.business.client.service.ClientService`, which owns the state declared below
(created in its ``__init__``) and the request/subscription side this part calls back into
(``_send_subscribe``, ``_disconnected``). Kept apart so each file has one job: requests and
subscriptions there, connections here. Every method takes ``_lock`` for the shared maps and
calls the transport outside it.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rda.business.client.endpoints import Endpoint, resolve_again
from rda.business.client.reconnect import Backoff, BackoffPolicy
from rda.business.client.replies import Pending
from rda.business.client.statistics import ClientCounters
from rda.business.client.subscriptions import Subscription
from rda.business.client.timer import Timer
from rda.business.directory import Directory, covers, etcd_of, watch_of
from rda.serialization.errors import DisconnectedError, NotAuthorizedError, TransportError
from rda.transport.api import ClientTransport
from rda.transport.reasons import HANDSHAKE_REFUSED

__all__ = ["ClientConnections"]

log = logging.getLogger("rda.business.client.service")


class ClientConnections:
    """Endpoints and connections of a client service (see the module docstring)."""

    directory: Directory
    _lock: threading.Lock
    _rng_seed: int | None
    _policy: BackoffPolicy
    _closing: bool
    _transport: ClientTransport
    _timer: Timer
    _counters: ClientCounters
    _pending: dict[int, Pending]
    _lane_pending: dict[int, Pending]
    _endpoints: dict[str, Endpoint]
    _subs: dict[int, Subscription]
    _device_endpoints: dict[str, str]
    _by_connection: dict[int, Endpoint]
    _early: dict[int, list[Callable[[], None]]]
    _discarded: set[int]
    _clock: Callable[[], float]
    _unwatch: Callable[[], None] | None = None  # set by _watch_directory
    _owns_directory = False  # a directory the service made is closed by it (etcd: a thread)

    if TYPE_CHECKING:  # provided by ClientService, the request/subscription side

        def _send_subscribe(self, sub: Subscription, conn: int) -> None: ...

        def _disconnected(self, rid: int, address: str, reason: str) -> None: ...

    def _endpoint(self, address: str) -> Endpoint:
        ep = self._endpoints.get(address)
        if ep is None:
            with self._lock:
                ep = self._endpoint_locked(address)
        return ep

    def _endpoint_locked(self, address: str) -> Endpoint:
        # Caller holds self._lock.
        ep = self._endpoints.get(address)
        if ep is None:
            seed = None if self._rng_seed is None else self._rng_seed + len(self._endpoints)
            ep = Endpoint(address, Backoff(self._policy, random.Random(seed)))
            self._endpoints[address] = ep
        return ep

    def _connection(self, ep: Endpoint) -> int | None:
        """The endpoint's current connection, opening one now if there is none."""
        conn = ep.connection
        if conn is not None:
            return conn
        with self._lock:
            if self._closing:
                return None
            if ep.connection is not None:
                return ep.connection
            if ep.retry is not None:
                # Someone wants this server now: try at once rather than after the back-off.
                ep.retry.cancel()
                ep.retry = None
        conn = self._transport.connect(ep.address)
        return self._register(ep, conn)

    def _register(self, ep: Endpoint, conn: int) -> int:
        with self._lock:
            if ep.connection is not None and ep.connection != conn:
                # Another thread connected first: keep its connection, drop ours.
                keep = ep.connection
                drop: int | None = conn
                self._discarded.add(conn)
            else:
                keep, drop = conn, None
                ep.connection = conn
                ep.connections += 1
                self._by_connection[conn] = ep
            early = self._early.pop(conn, [])
        if drop is not None:
            self._transport.disconnect(drop)
        for event in early:
            event()
        return keep

    def _reconnect(self, ep: Endpoint) -> None:
        """Back-off elapsed (timer thread): resolve the endpoint's devices again (following
        those that moved), then connect again if still needed."""
        with self._lock:
            ep.retry = None
            if self._closing or ep.connection is not None:
                return
        dial = self._follow_moves(ep)
        with self._lock:
            if self._closing or ep.connection is not None or ep.retry is not None:
                return  # closed, or a request connected it meanwhile
            if not ep.wanted():
                # Everything it served moved away: forget it rather than dial it forever.
                if self._endpoints.get(ep.address) is ep:
                    del self._endpoints[ep.address]
                return
            if not dial:
                # The directory lists none of its devices right now (their server stopped and
                # unregistered): ask it again after the next back-off instead of dialling an
                # address nobody listens on.
                ep.retry = self._timer.call_later(
                    ep.backoff.next_delay(), functools.partial(self._reconnect, ep)
                )
                return
        try:
            self._connection(ep)
        except TransportError:
            if not self._closing:
                raise

    def _follow_moves(self, ep: Endpoint) -> bool:
        """Resolve ``ep``'s devices again and move those now served elsewhere, with their
        subscriptions, to their new endpoint. True when ``ep``'s own address is still worth
        dialling: a device still resolves there, the directory failed, or it has no devices
        (an endpoint given directly)."""
        with self._lock:
            devices = sorted(ep.devices)
        dial, moves = resolve_again(self.directory, ep.address, devices)
        if moves:
            self._move(ep, moves)
        return dial

    def _move(self, ep: Endpoint, moves: dict[str, str]) -> None:
        """Re-home devices (and their subscriptions) from ``ep`` to their new endpoints and
        subscribe there; each subscription then starts again with a FIRST update."""
        targets: dict[str, Endpoint] = {}
        with self._lock:
            if self._closing:
                return
            for device, address in moves.items():
                new = self._endpoint_locked(address)
                ep.devices.discard(device)
                new.devices.add(device)
                self._device_endpoints[device] = address
                for sub in [s for s in ep.subs.values() if s.device == device]:
                    del ep.subs[sub.id]
                    new.subs[sub.id] = sub
                    sub.endpoint = address
                    sub.connection = None
                targets[address] = new
        for address, new in targets.items():
            moved = sorted(d for d, a in moves.items() if a == address)
            log.info("%s moved from %s to %s", ", ".join(moved), ep.address, address)
            try:
                conn = self._connection(new)
            except TransportError:
                if not self._closing:
                    raise
                return
            if conn is None:
                return
            with self._lock:
                send = [s for s in new.subs.values() if new.connection == conn]
                send = [s for s in send if s.connection != conn]
                for sub in send:
                    sub.connection = conn
            for sub in send:
                self._send_subscribe(sub, conn)

    # -- a directory that reports changes (etcd): follow a moved device at once -----------

    def _watch_directory(self, owns: bool) -> None:
        """Ask the directory to report changes, if it can (``EtcdDirectory.watch``); ``owns``:
        the service made it, so closes it."""
        self._owns_directory = owns
        watch = watch_of(self.directory)
        self._unwatch = None if watch is None else watch(self._on_directory_change)

    def _close_directory(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        close = getattr(self.directory, "close", None)
        if self._owns_directory and callable(close):
            close()

    def _directory_state(self) -> str:
        """The state of the directories that have one (etcd: its watch, synced or stale)."""
        return "; ".join(d.state().summary() for d in etcd_of(self.directory))  # type: ignore[attr-defined]

    def _on_directory_change(self, name: str, endpoint: str | None) -> None:
        """The directory's thread says ``name`` (a device or pattern) changed: follow it on
        the service's timer thread, so the directory's thread never waits on a connect."""
        if endpoint is None or self._closing:
            return  # gone: the lost connection (heartbeat) is what tells its users
        self._timer.call_later(0.0, functools.partial(self._follow_directory_change, name))

    def _follow_directory_change(self, name: str) -> None:
        """Move every device ``name`` covers that now resolves elsewhere, with its
        subscriptions (FIRST update from the new server), without waiting for the old
        connection's heartbeat to time out."""
        with self._lock:
            affected = [(d, a) for d, a in self._device_endpoints.items() if covers(name, d)]
        moves: dict[str, dict[str, str]] = {}
        for device, old in affected:
            try:
                new = self.directory.resolve(device)
            except Exception:
                continue  # no answer now: the connection's own loss handling takes over
            if new != old:
                moves.setdefault(old, {})[device] = new
        for old, devices in moves.items():
            ep = self._endpoints.get(old)
            if ep is not None:
                self._move(ep, devices)

    def _on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        to_send: list[Subscription] = []
        with self._lock:
            ep = self._by_connection.get(connection)
            if ep is None:
                if connection not in self._discarded:
                    self._early.setdefault(connection, []).append(
                        functools.partial(self._on_connected, connection, server_info)
                    )
                return
            if self._closing or ep.connection != connection:
                return
            ep.backoff.reset()
            ep.acked = True
            ep.back(self._clock())
            ep.refused = False
            if ep.was_connected:
                self._counters.reconnects += 1
                ep.reconnects += 1
            ep.was_connected = True
            for sub in ep.subs.values():
                if sub.connection != connection:
                    sub.connection = connection
                    to_send.append(sub)
        for sub in to_send:
            self._send_subscribe(sub, connection)

    def _on_disconnected(self, connection: int, reason: str) -> None:
        with self._lock:
            ep = self._by_connection.pop(connection, None)
            if ep is None:
                if connection in self._discarded:
                    self._discarded.discard(connection)
                elif not self._closing:
                    self._early.setdefault(connection, []).append(
                        functools.partial(self._on_disconnected, connection, reason)
                    )
                return
            if ep.connection != connection:
                return
            ep.connection = None
            ep.acked = False
            ep.last_reason = reason
            ep.lost(self._clock())
            lost = [
                rid
                for table in (self._pending, self._lane_pending)
                for rid, p in table.items()
                if p.connection == connection
            ]
            subs = list(ep.subs.values())
            refused = ep.refused = reason.startswith(HANDSHAKE_REFUSED)
            if refused:
                # The server refuses this client (no key, a key it does not know, a wrong
                # server key): retrying cannot change that, and must not hammer it. Its
                # subscriptions end; the next request dials again (issue 26).
                for sub in subs:
                    ep.subs.pop(sub.id, None)
                    self._subs.pop(sub.id, None)
            elif ep.wanted() and not self._closing:
                # Subscriptions and access points get the connection back in the background
                # (so the first get after a server restart finds it up); an endpoint only
                # admin requests used reconnects when the next one comes.
                delay = ep.backoff.next_delay()
                ep.retry = self._timer.call_later(delay, functools.partial(self._reconnect, ep))
        for rid in lost:
            self._disconnected(rid, ep.address, reason)
        for sub in subs:
            if refused:
                sub.fail(
                    NotAuthorizedError(
                        f"subscribe {sub.device}/{sub.property}: {ep.address}: {reason}"
                    )
                )
                continue
            sub.deliver_error(
                DisconnectedError(
                    f"{sub.device}/{sub.property}: connection to {ep.address} lost ({reason}); "
                    "reconnecting"
                )
            )
