"""The client's connections: one ``Endpoint`` per server address, connecting on demand,
background reconnection on the back-off, following devices the directory says have moved, and
the transport's connect/disconnect events.

:class:`Connections` is held by a ``ClientService``. Its lock guards the endpoint table and
every ``Endpoint`` field (including each endpoint's subscriptions); it is never held while
calling into the transport (``send``/``connect`` may block on a full pipe, and the dispatcher
takes it in ``on_connected``/``on_disconnected``: holding it there could deadlock), into the
request table or into the subscriptions. The requests of a lost connection are ended by the
request table (``RequestTable.connection_lost``); SUBSCRIBE frames are sent by the
subscriptions (``Subscriptions.send_subscribe``).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from rda.business.client.endpoints import Endpoint, resolve_again
from rda.business.client.reconnect import Backoff, BackoffPolicy
from rda.business.client.requests import RequestTable, connection_ended
from rda.business.client.statistics import ClientCounters, ServerConnectionStatistics
from rda.business.client.subscription_set import Subscriptions
from rda.business.client.subscriptions import Subscription
from rda.business.client.timer import Timer
from rda.business.directory import Directory, covers, etcd_of, watch_of
from rda.serialization.errors import DisconnectedError, NotAuthorizedError, TransportError
from rda.transport.api import ClientTransport
from rda.transport.reasons import HANDSHAKE_REFUSED

__all__ = ["Connections"]

log = logging.getLogger("rda.business.client.service")


class Connections:
    """Endpoints and connections of a client service (see the module docstring).

    ``owns_directory``: the service made ``directory``, so :meth:`close_directory` closes it
    (an etcd directory runs a thread). ``rng_seed`` seeds the back-off jitter of each endpoint.
    """

    def __init__(
        self,
        directory: Directory,
        transport: ClientTransport,
        requests: RequestTable,
        subscriptions: Subscriptions,
        counters: ClientCounters,
        policy: BackoffPolicy,
        clock: Callable[[], float],
        rng_seed: int | None = None,
        owns_directory: bool = False,
    ) -> None:
        self.directory = directory
        self._transport = transport
        self._requests = requests
        self._timer: Timer = requests.timer
        self._subscriptions = subscriptions
        self._counters = counters
        self._policy = policy
        self._clock = clock
        self._rng_seed = rng_seed
        self._owns_directory = owns_directory
        self._lock = threading.Lock()
        self._closing = False
        self._endpoints: dict[str, Endpoint] = {}
        # device -> the endpoint serving it, as last resolved (see ``resolve``).
        self._device_endpoints: dict[str, str] = {}
        self._by_connection: dict[int, Endpoint] = {}
        # Subscription id -> SUBSCRIBEs the server turned away as overloaded or late in a row
        # (resubscribe_later's back-off); an entry leaves with its subscription (detach).
        self._turned_away: dict[int, int] = {}
        self._jitter = random.Random(rng_seed)
        # Transport events for a connection id not yet registered (a transport may report
        # before ``connect`` returns to us); replayed on registration.
        self._early: dict[int, list[Callable[[], None]]] = {}
        # Connections opened by a thread that lost the race to connect an endpoint; their
        # events are ignored.
        self._discarded: set[int] = set()
        self._unwatch: Callable[[], None] | None = None
        # ``get(address)``: the endpoint at ``address`` if there is one. The table's own
        # ``dict.get`` (a lane caller's lookup, once per call: no Python frame, no lock).
        self.get: Callable[[str], Endpoint | None] = self._endpoints.get
        # ``resolved(device)``: where ``device`` was last resolved, or None (``resolve`` asks
        # the directory then). The table's own ``dict.get``: every request looks here first.
        self.resolved: Callable[[str], str | None] = self._device_endpoints.get

    def __len__(self) -> int:
        return len(self._endpoints)

    # -- endpoints -------------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint]:
        with self._lock:
            return list(self._endpoints.values())

    def endpoint(self, address: str) -> Endpoint:
        """The endpoint at ``address``, made on first use."""
        ep = self._endpoints.get(address)
        if ep is None:
            with self._lock:
                ep = self._endpoint_locked(address)
        return ep

    def resolve(self, device: str) -> str:
        """The endpoint serving ``device``: resolved through the directory on first use, then
        kept, and resolved again whenever its connection is lost (the device may have moved)."""
        address = self._device_endpoints.get(device)
        if address is not None:
            return address
        address = self.directory.resolve(device)
        with self._lock:
            # A concurrent first use may have resolved it already: one answer for everybody.
            address = self._device_endpoints.setdefault(device, address)
            self._endpoint_locked(address).devices.add(device)
        return address

    def current(self, device: str, default: str) -> str:
        """Where ``device`` is served as last resolved, else ``default``."""
        return self._device_endpoints.get(device, default)

    def statistics(self, now: float) -> tuple[tuple[ServerConnectionStatistics, ...], int]:
        """Each endpoint's state, and how many have a connection open or being opened."""
        with self._lock:
            endpoints = list(self._endpoints.values())
            servers = tuple(ep.snapshot(now) for ep in endpoints)
        return servers, sum(1 for ep in endpoints if ep.connection is not None)

    def close(self) -> None:
        """Stop reconnecting and moving; forget the endpoints' subscriptions. Idempotent."""
        with self._lock:
            self._closing = True
            for ep in self._endpoints.values():
                if ep.retry is not None:
                    ep.retry.cancel()
                ep.subs.clear()

    def _endpoint_locked(self, address: str) -> Endpoint:
        # Caller holds self._lock.
        ep = self._endpoints.get(address)
        if ep is None:
            seed = None if self._rng_seed is None else self._rng_seed + len(self._endpoints)
            ep = Endpoint(address, Backoff(self._policy, random.Random(seed)))
            self._endpoints[address] = ep
        return ep

    def connection(self, ep: Endpoint) -> int | None:
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

    def reconnect(self, ep: Endpoint) -> None:
        """Back-off elapsed (timer thread): resolve the endpoint's devices again (following
        those that moved), then connect again if still needed."""
        with self._lock:
            ep.retry = None
            if self._closing or ep.connection is not None:
                return
        dial = self.follow_moves(ep)
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
                    ep.backoff.next_delay(), functools.partial(self.reconnect, ep)
                )
                return
        try:
            self.connection(ep)
        except TransportError:
            if not self._closing:
                raise

    def follow_moves(self, ep: Endpoint) -> bool:
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
        subscribe there; each subscription then starts again with a FIRST update.

        A subscription whose old server still runs (taken over with ``--replace``: only the
        directory said it moved) is ended there first, with an UNSUBSCRIBE on the old
        connection, so the client does not receive both servers' streams; what the old server
        sent before it read the UNSUBSCRIBE is dropped on arrival (``Subscriptions.route``
        takes a subscription's notifications only from the connection its SUBSCRIBE went on)."""
        targets: dict[str, Endpoint] = {}
        leaving: list[tuple[Subscription, int]] = []
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
                    if sub.connection is not None and sub.connection == ep.connection:
                        leaving.append((sub, sub.connection))
                    sub.connection = None
                targets[address] = new
        for sub, old in leaving:
            self._subscriptions.send_unsubscribe(sub, old)
        for address, new in targets.items():
            moved = sorted(d for d, a in moves.items() if a == address)
            log.info("%s moved from %s to %s", ", ".join(moved), ep.address, address)
            try:
                conn = self.connection(new)
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
                self._subscriptions.send_subscribe(sub, conn)

    # -- subscriptions on endpoints ------------------------------------------------------------

    def attach(self, sub: Subscription) -> int | None:
        """Put a new subscription on its endpoint, connecting it if needed. Returns the
        connection to send its SUBSCRIBE on now, or None when the connection's CONNECT_ACK
        will (``on_connected``). Raises DisconnectedError once the client is closing."""
        ep = self.endpoint(sub.endpoint)
        with self._lock:
            ep.subs[sub.id] = sub
        conn = self.connection(ep)
        if conn is None:
            raise DisconnectedError(f"subscribe {sub.device}/{sub.property}: client closed")
        with self._lock:
            send = ep.connection == conn and sub.connection != conn
            if send:
                sub.connection = conn
        return conn if send else None

    def resubscribe_later(self, sub: Subscription, conn: int) -> None:
        """The server answered ``sub``'s SUBSCRIBE on ``conn`` with a passing refusal (its
        queue for the device was full, or it answered too late: a restart storm, a pause):
        send it again on the same connection after a back-off of its own (the endpoint's
        policy), unless the subscription or the connection is gone by then (a new
        connection's CONNECT_ACK sends it anyway). Ending the subscription instead made a
        restarted server lose subscribers for good (issue 36, the simulator)."""
        with self._lock:
            if self._closing:
                return
            attempts = self._turned_away.get(sub.id, 0)
            self._turned_away[sub.id] = attempts + 1
            nominal = self._policy.nominal(attempts)
        delay = nominal * (1.0 - self._policy.jitter * self._jitter.random())
        self._timer.call_later(delay, functools.partial(self._resubscribe, sub, conn))

    def _resubscribe(self, sub: Subscription, conn: int) -> None:
        with self._lock:
            ep = self._endpoints.get(sub.endpoint)
            send = (
                not self._closing
                and ep is not None
                and ep.connection == conn
                and ep.subs.get(sub.id) is sub
                and sub.connection == conn
            )
        if send:
            self._subscriptions.send_subscribe(sub, conn)

    def detach(self, sub: Subscription) -> int | None:
        """Take ``sub`` off its endpoint; returns the live connection its SUBSCRIBE went on
        (where an UNSUBSCRIBE goes), if any."""
        with self._lock:
            self._turned_away.pop(sub.id, None)
            ep = self._endpoints.get(sub.endpoint)
            if ep is None:
                return None
            ep.subs.pop(sub.id, None)
            conn = ep.connection
        if conn is None or sub.connection != conn:
            return None
        return conn

    # -- a directory that reports changes (etcd): follow a moved device at once -----------

    def watch_directory(self) -> None:
        """Ask the directory to report changes, if it can (``EtcdDirectory.watch``)."""
        watch = watch_of(self.directory)
        self._unwatch = None if watch is None else watch(self.on_directory_change)

    def close_directory(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        close = getattr(self.directory, "close", None)
        if self._owns_directory and callable(close):
            close()

    def directory_state(self) -> str:
        """The state of the directories that have one (etcd: its watch, synced or stale)."""
        return "; ".join(d.state().summary() for d in etcd_of(self.directory))  # type: ignore[attr-defined]

    def on_directory_change(self, name: str, endpoint: str | None) -> None:
        """The directory's thread says ``name`` (a device or pattern) changed: follow it on
        the service's timer thread, so the directory's thread never waits on a connect."""
        if endpoint is None or self._closing:
            return  # gone: the lost connection (heartbeat) is what tells its users
        self._timer.call_later(0.0, functools.partial(self.follow_directory_change, name))

    def follow_directory_change(self, name: str) -> None:
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

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        to_send: list[Subscription] = []
        with self._lock:
            ep = self._by_connection.get(connection)
            if ep is None:
                if connection not in self._discarded:
                    self._early.setdefault(connection, []).append(
                        functools.partial(self.on_connected, connection, server_info)
                    )
                return
            if self._closing or ep.connection != connection:
                return
            # The back-off is not reset here but when this connection, lost, proves to have
            # lasted (on_disconnected): a server that acknowledges and drops at once must not
            # be redialled at the initial delay forever (issue 37).
            now = self._clock()
            ep.acked = True
            ep.acked_at = now
            ep.back(now)
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
            self._subscriptions.send_subscribe(sub, connection)

    def on_disconnected(self, connection: int, reason: str) -> None:
        with self._lock:
            ep = self._by_connection.pop(connection, None)
            if ep is None:
                if connection in self._discarded:
                    self._discarded.discard(connection)
                elif not self._closing:
                    self._early.setdefault(connection, []).append(
                        functools.partial(self.on_disconnected, connection, reason)
                    )
                return
            if ep.connection != connection:
                return
            now = self._clock()
            if ep.acked and now - ep.acked_at >= ep.backoff.policy.maximum:
                ep.backoff.reset()  # it lasted: this outage starts from the initial delay
            ep.connection = None
            ep.acked = False
            ep.last_reason = reason
            ep.lost(now)
            subs = list(ep.subs.values())
            refused = ep.refused = reason.startswith(HANDSHAKE_REFUSED)
            if refused:
                # The server refuses this client (no key, a key it does not know, a wrong
                # server key): retrying cannot change that, and must not hammer it. Its
                # subscriptions end; the next request dials again (issue 26).
                for sub in subs:
                    ep.subs.pop(sub.id, None)
            elif ep.wanted() and not self._closing:
                # Subscriptions and access points get the connection back in the background
                # (so the first get after a server restart finds it up); an endpoint only
                # admin requests used reconnects when the next one comes.
                delay = ep.backoff.next_delay()
                ep.retry = self._timer.call_later(delay, functools.partial(self.reconnect, ep))
        self._requests.connection_lost(connection, ep.address, reason)
        for sub in subs:
            if refused:
                self._subscriptions.discard(sub)
                sub.fail(
                    NotAuthorizedError(
                        f"subscribe {sub.device}/{sub.property}: {ep.address}: {reason}"
                    )
                )
                continue
            sub.deliver_error(
                DisconnectedError(
                    f"{sub.device}/{sub.property}: {connection_ended(ep.address, reason)}; retrying"
                )
            )
