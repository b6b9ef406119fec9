"""The server runtime: a built :class:`Server` runs transport, scheduler, callbacks and directory.

How a request travels (docs/architecture.md): the transport calls :meth:`Server.on_message` on its
dispatcher thread; that only builds a request object (header already parsed, body untouched)
and submits it to the scheduler in the device's group (``"__admin__"`` for ADMIN). A worker
decodes what it needs and calls the user callback; the answer (``complete``/``fail``, a raised
exception, an overload drop or the deadline watcher) encodes the reply and hands it to the
transport. The server holds the objects that do this, each with its own state: the RBAC gate
(``rda.business.policy.AccessGate``), the transport's handler and peer table
(``rda.business.server.dispatch``), the request runner (``rda.business.server.runner``) and
the subscription lifecycle (``rda.business.server.lifecycle``); the builder that makes a
``Server`` lives in ``rda.business.server.builder``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rda.business import driver
from rda.business.config import Config
from rda.business.directory import Registry
from rda.business.metadata import PropertyDescription, Severity
from rda.business.policy import AccessGate, Policy, reload_file
from rda.business.scheduler import GroupTaskScheduler, InlineRule, SchedulerStatistics
from rda.business.server.devices import Device
from rda.business.server.dispatch import Dispatch
from rda.business.server.lifecycle import SubscriptionLifecycle
from rda.business.server.properties import PropertyTable
from rda.business.server.requests import ClientInfo, DeadlineWatcher, RequestReplyCallback
from rda.business.server.runner import RequestRunner
from rda.business.server.statistics import (
    ClientSnapshot,
    RequestCounters,
    ServerStatistics,
    SourceSnapshot,
)
from rda.business.server.subscriptions import (
    SubscriptionCallback,
    SubscriptionRegistry,
    SubscriptionSource,
)
from rda.serialization.data import Data
from rda.serialization.errors import RdaError
from rda.transport.api import (
    PeerStatistics,
    ServerHandler,
    ServerTransport,
    ServerTransportStatistics,
    TransportSettings,
)

if TYPE_CHECKING:  # zmq stays unloaded for servers on the in-memory transport
    from rda.transport.curve import ServerCurve

__all__ = ["AdminHandler", "Hook", "Server", "TransportFactory"]

log = logging.getLogger("rda.server")

# What ``ServerBuilder.admin_handler`` takes: (server, command, arguments, client) -> reply.
AdminHandler = Callable[["Server", str, Data, ClientInfo], Data]

TransportFactory = Callable[[ServerHandler, TransportSettings, dict[str, Any]], ServerTransport]
Hook = Callable[["Server"], None]

_NO_SCHEDULER = SchedulerStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0)


class Server:
    """A running (or ready to run) server; build it with :class:`ServerBuilder`."""

    def __init__(
        self,
        *,
        name: str,
        endpoint: str,
        config: Config,
        request_reply: RequestReplyCallback,
        subscription: SubscriptionCallback,
        devices: list[str],
        device_objects: dict[str, Device],
        immediate_updates: bool,
        described: dict[tuple[str, str], PropertyDescription] | None = None,
        raw_devices: bool = True,
        directory: Registry | None,
        transport_factory: TransportFactory | None,
        clock: Callable[[], float],
        admin_handler: AdminHandler | None,
        admin_commands: Callable[[str], bool] | None = None,
        metrics_port: int | None,
        on_start: list[Hook],
        on_stop: list[Hook],
        policy: Policy | None = None,
        policy_file: Path | None = None,
        trust_declared: bool = False,
        inline_handlers: InlineRule | None = None,
        curve: ServerCurve | None = None,
        replace: bool = False,
        owns_directory: bool = False,
    ) -> None:
        self.name = name
        self._inline = inline_handlers if inline_handlers is not None else InlineRule()
        self.config = config
        self.metrics_port = metrics_port
        self.started_at = 0.0  # wall clock: when, for people
        self._started = 0.0  # monotonic clock: how long (uptime), whatever the wall clock does
        self._requested_endpoint = endpoint
        self._endpoint = endpoint
        self._devices = devices
        self._device_objects = device_objects
        self._properties = PropertyTable(device_objects, described or {}, raw_devices)
        self._immediate = immediate_updates
        self._directory = directory
        # The builder's default registry (etcd's HTTP pool, or the file directory) is the
        # server's own: closed at stop. One given to ``directory()`` belongs to the caller.
        self._owns_directory = owns_directory
        self._replace = replace
        self._factory = transport_factory
        self._clock = clock
        self._admin = admin_handler
        self._on_start = on_start
        self._on_stop = on_stop
        self._curve = curve
        self._rr = request_reply
        self._subs = subscription
        self._counters = RequestCounters(config.metrics_devices)
        self._gate = AccessGate(name, policy, admin_commands, clock)
        self._policy_file = policy_file
        self._trust_declared = trust_declared
        self._reload_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._state = "built"
        self._transport: ServerTransport | None = None
        self._scheduler: GroupTaskScheduler | None = None
        self._deadlines: DeadlineWatcher | None = None
        self._registry: SubscriptionRegistry | None = None
        self._dispatch: Dispatch | None = None
        self._runner: RequestRunner | None = None
        self._unhook_clock: Callable[[], None] | None = None
        self._registered = False

    def __repr__(self) -> str:
        return f"<Server {self.name!r} {self._state} {self._endpoint}>"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Server:
        """Bind, start the workers and the deadline watcher, register in the directory."""
        with self._state_lock:
            if self._state != "built":
                raise RdaError(f"server {self.name!r} is {self._state}; a server starts once")
            self._state = "starting"
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        config = self.config
        settings = dataclasses.replace(config.transport_settings())
        info = {"name": self.name, "devices": list(self._devices)}
        self._scheduler = GroupTaskScheduler(
            workers=config.workers,
            queue_limit=config.queue_limit,
            policy=config.overflow_policy,
            name=f"rda-server-{self.name}",
        )
        self._deadlines = DeadlineWatcher(self._clock, name=f"rda-deadlines-{self.name}")
        self._deadlines.start()
        on_advance = getattr(self._clock, "on_advance", None)
        if callable(on_advance):
            self._unhook_clock = on_advance(self._deadlines.wake)
        subscriptions = SubscriptionLifecycle(
            scheduler=self._scheduler,
            counters=self._counters,
            subscription=self._subs,
            clock=self._clock,
        )
        runner = RequestRunner(
            scheduler=self._scheduler,
            deadlines=self._deadlines,
            counters=self._counters,
            request_reply=self._rr,
            subscription=self._subs,
            admin_handler=None if self._admin is None else functools.partial(self._admin, self),
            clock=self._clock,
            default_timeout=config.request_timeout,
            inline=self._inline,
            accepted=subscriptions.accepted,
            updated=subscriptions.updated if self._immediate else None,
            properties=self._properties,
        )
        self._runner = runner
        dispatch = Dispatch(
            gate=self._gate,
            runner=runner,
            subscriptions=subscriptions,
            counters=self._counters,
            clock=self._clock,
            trust_declared=self._trust_declared,
        )
        self._dispatch = dispatch
        if self._factory is not None:
            transport = self._factory(dispatch, settings, info)
        else:
            from rda.transport.zmq_server import ZmqServerTransport

            transport = ZmqServerTransport(
                self._requested_endpoint,
                dispatch,
                settings=settings,
                server_info=info,
                sndhwm=config.peer_hwm,
                curve=self._curve,
            )
        self._transport = transport
        self._registry = SubscriptionRegistry(
            transport, self._properties.encoder if self._properties else None
        )
        runner.attach(transport)
        subscriptions.attach(self._registry, runner.fetch)
        if self._inline.everything and not transport.hands_over:
            # Nobody would dispatch while a long handler runs: only the declared ones inline.
            self._inline = self._inline.declared_only()
            runner.inline = self._inline or None
        for name, device in self._device_objects.items():
            device.bind(name, self._publisher(name))
        transport.start()
        self._endpoint = transport.endpoint
        self.started_at = driver.wall_time()
        self._started = self._clock()
        if self._directory is not None and self._devices:
            self._directory.register(
                self.name,
                _connectable(self._endpoint),
                self._devices,
                server_key=None if self._curve is None else self._curve.public,
                replace=self._replace,
            )
            self._registered = True
        with self._state_lock:
            self._state = "running"
        for hook in self._on_start:
            hook(self)

    def _publisher(self, device: str) -> Callable[[str], list[SubscriptionSource]]:
        def sources(prop: str) -> list[SubscriptionSource]:
            registry = self._registry
            return [] if registry is None else registry.find(device, prop)

        return sources

    def stop(self, timeout: float = 2.0) -> None:
        """Stop serving: idempotent and bounded by roughly ``timeout`` seconds in total."""
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            was_running = self._state == "running"
            self._state = "stopping"
        deadline = time.monotonic() + timeout
        if was_running:
            for hook in self._on_stop:
                _call(hook, self, "on_stop hook")
        if self._registered and self._directory is not None:
            try:
                self._directory.unregister(self.name)
            except Exception:
                log.warning("server %r: could not unregister", self.name, exc_info=True)
            self._registered = False
        close_directory = getattr(self._directory, "close", None)
        if self._owns_directory and callable(close_directory):
            self._owns_directory = False  # once: stop is idempotent
            try:
                close_directory()
            except Exception:
                log.warning("server %r: could not close its directory", self.name, exc_info=True)
        if self._runner is not None:
            self._runner.stopping = True
        if self._transport is not None:
            self._transport.close(_left(deadline))
        if self._scheduler is not None:
            self._scheduler.close(_left(deadline))
        if self._unhook_clock is not None:
            self._unhook_clock()
        if self._deadlines is not None:
            self._deadlines.close(_left(deadline))
        if self._registry is not None:
            for source in self._registry.close():
                try:
                    self._subs.source_removed(source)
                except Exception:
                    log.exception("server %r: source_removed raised at stop", self.name)
        for device in self._device_objects.values():
            device.unbind()
        with self._state_lock:
            self._state = "stopped"

    def __enter__(self) -> Server:
        if self._state == "built":
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- introspection -----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The bound endpoint (the real port once started)."""
        return self._endpoint

    @property
    def server_key(self) -> str | None:
        """The CURVE public key clients need (``ServerBuilder.security``); None: plain."""
        return None if self._curve is None else self._curve.public

    def directory_state(self) -> str:
        """Where this server is registered and how that stands (etcd: the lease's state)."""
        directory = self._directory
        if directory is None:
            return "none"
        state = getattr(directory, "state", None)
        if callable(state):
            return str(state().summary())
        return f"{directory!r}: {'registered' if self._registered else 'not registered'}"

    def _keys_overwritten(self) -> int:
        """How many of this server's directory keys another wrote over (etcd's registration
        state says; other directories: 0)."""
        state = getattr(self._directory, "state", None)
        if not callable(state):
            return 0
        registration = state().registrations.get(self.name)
        return 0 if registration is None else int(registration.overwritten)

    @property
    def running(self) -> bool:
        return self._state == "running"

    def subscriptions(self) -> list[SubscriptionSource]:
        """One source per (device, property, selector, filters) with subscribers."""
        return [] if self._registry is None else self._registry.sources()

    def settings(self) -> dict[str, object]:
        c = self.config
        return {
            "name": self.name,
            "endpoint": self._endpoint,
            "workers": c.workers,
            "queue_limit": c.queue_limit,
            "overflow_policy": c.overflow_policy,
            "heartbeat_interval": c.heartbeat_interval,
            "heartbeat_timeout": c.heartbeat_timeout,
            "request_timeout": c.request_timeout,
            "immediate_updates": self._immediate,
            "inline_handlers": self._inline.describe(),
            "blocking_properties": self._inline.describe_blocking(),
            "metrics_port": self.metrics_port,
            "devices": list(self._devices),
        }

    def devices(self) -> list[str]:
        return list(self._devices)

    def properties(self) -> dict[str, list[dict[str, object]]]:
        """Per device served as a ``Device`` or declared with ``ServerBuilder.describe``: its
        properties' names, whether each is writable, its description and declared fields
        (rows of ``Field.summary``) and, for one with alarm limits, its last alarm severity (the admin
        ``devices`` command; undeclared properties of raw callbacks are not listed)."""
        states = self._properties.alarm_states()
        out: dict[str, list[dict[str, object]]] = {}
        for d in self._properties.descriptions():
            entry: dict[str, object] = {"name": d.property, "writable": d.settable}
            if d.description:
                entry["description"] = d.description
            if d.fields:
                entry["fields"] = [{"field": name, **f.summary()} for name, f in d.fields.items()]
            state = states.get((d.device, d.property))
            if state is not None:
                entry["alarm"] = state.name
            out.setdefault(d.device, []).append(entry)
        return out

    def describe(self, device: str, prop: str) -> PropertyDescription:
        """What a client's ``describe()`` of ``device/prop`` gets (NoSuchDeviceError for a
        property a Device lacks)."""
        return self._properties.describe(device, prop)

    def alarm_counts(self) -> dict[Severity, int]:
        """How many properties with alarm limits are at each severity, from the last value
        each sent (the exporter's ``rda_server_properties_in_alarm``)."""
        return self._properties.alarm_counts()

    # -- authorization -----------------------------------------------------------------------

    @property
    def policy(self) -> Policy | None:
        """The authorization policy in force (None: everything is allowed)."""
        return self._gate.policy

    @property
    def policy_file(self) -> Path | None:
        return self._policy_file

    def set_policy(self, policy: Policy | None) -> None:
        """Put ``policy`` in force at once (None: stop authorizing)."""
        self._gate.set_policy(policy)
        if self._dispatch is not None:
            self._dispatch.refresh_roles()

    def reload_policy(self, allow_empty: bool = False) -> Policy:
        """Re-read the builder's policy file and put it in force. Atomic: a broken file raises
        ``PolicyError`` (naming the file and the line at fault) and the old policy stays; so
        does a file that would lock everyone out (no rules, or nobody left who may
        ``admin:reload-policy``) unless ``allow_empty``."""
        with self._reload_lock:
            policy = reload_file(self._policy_file, self.name, self.policy, allow_empty)
            self.set_policy(policy)
        log.info("server %r: policy reloaded from %s", self.name, policy.source)
        return policy

    def uptime(self) -> float:
        """Seconds since :meth:`start` on the monotonic clock (0 before): a step of the wall
        clock (NTP, a hand-set date) does not change it, as it changes ``started_at``."""
        return max(0.0, self._clock() - self._started) if self.started_at else 0.0

    def clients(self) -> list[ClientSnapshot]:
        if self._dispatch is None or self._registry is None:
            return []
        registry = self._registry
        lost = self._peer_statistics()
        none = PeerStatistics()
        now = self._clock()
        return [
            ClientSnapshot(
                peer=peer.hex(),
                info=dict(state.client.info),
                connected_since=state.connected_since,
                last_heard=state.last_heard,
                connected_for=max(0.0, now - state.connected_at),
                subscriptions=registry.subscriptions_of(peer),
                queue_depth=lost.get(peer, none).queue_depth,
                conflated=lost.get(peer, none).conflated,
                dropped=lost.get(peer, none).dropped,
                principal=state.client.principal,
                roles=state.client.roles,
            )
            for peer, state in self._dispatch.peers()
        ]

    def _peer_statistics(self) -> dict[bytes, PeerStatistics]:
        transport = self._transport
        return {} if transport is None else transport.peer_statistics()

    def connected(self, peer: bytes) -> bool:
        """Whether the client connection (or lane) ``peer`` (``request.client.peer``) is still
        connected: a handler whose requests wait in a queue can skip those of a client that
        has gone (the history server does)."""
        return self._dispatch is not None and self._dispatch.connected(peer)

    def client_info(self, peer_hex: str) -> ClientInfo | None:
        if self._dispatch is None:
            return None
        for peer, state in self._dispatch.peers():
            if peer.hex() == peer_hex:
                return state.client
        return None

    def sources(self) -> list[SourceSnapshot]:
        lost = self._peer_statistics()
        return [source.snapshot(lost) for source in self.subscriptions()]

    def statistics(self) -> ServerStatistics:
        requests, durations, handler_errors, late = self._counters.snapshot()
        transport = (
            self._transport.statistics()
            if self._transport is not None
            else ServerTransportStatistics()
        )
        scheduler = self._scheduler.statistics() if self._scheduler is not None else _NO_SCHEDULER
        subscriptions, sources, sent = (
            self._registry.counts() if self._registry is not None else (0, 0, 0)
        )
        clients = 0 if self._dispatch is None else len(self._dispatch.peers())
        accepted, closed = self._counters.connections()
        zero_copy, copied = self._counters.array_replies()
        return ServerStatistics(
            transport=transport,
            scheduler=scheduler,
            requests=requests,
            durations=durations,
            subscriptions=subscriptions,
            sources=sources,
            notifications_sent=sent,
            handler_errors=handler_errors,
            late_completions=late,
            clients=clients,
            denied=self._counters.denials(),
            devices=self._counters.devices(),
            device_limit=self._counters.device_limit,
            connections_accepted=accepted,
            connections_closed=closed,
            directory=self.directory_state(),
            directory_keys_overwritten=self._keys_overwritten(),
            zero_copy_replies=zero_copy,
            copied_replies=copied,
            properties_in_alarm={
                severity.name.lower(): count
                for severity, count in self._properties.alarm_counts().items()
                if severity is not Severity.NONE
            },
        )

    def metric_pairs(self) -> set[tuple[str, str]]:
        """The (device, property) pairs with metrics of their own (``Config.metrics_devices``)."""
        return self._counters.tracked()

    def disconnect_client(self, peer_hex: str) -> bool:
        """Drop one client connection; False when no such client is connected."""
        if self._dispatch is None or self._transport is None:
            return False
        for peer, _ in self._dispatch.peers():
            if peer.hex() == peer_hex:
                self._transport.disconnect(peer)
                return True
        return False

    def check_deadlines(self) -> int:
        """Answer every request whose deadline has passed now; returns how many (for tests
        driving a fake clock; the watcher thread does this by itself)."""
        return 0 if self._deadlines is None else self._deadlines.run_due()


def _connectable(endpoint: str) -> str:
    """A wildcard bind ("tcp://*:5555", "tcp://0.0.0.0:5555") is not an address to dial; on
    this machine's directory, loopback is."""
    for wildcard in ("://*:", "://0.0.0.0:"):
        if wildcard in endpoint:
            return endpoint.replace(wildcard, "://127.0.0.1:")
    return endpoint


def _left(deadline: float) -> float:
    return max(0.05, deadline - time.monotonic())


def _call(hook: Hook, server: Server, what: str) -> None:
    try:
        hook(server)
    except Exception:
        log.exception("server %r: %s raised", server.name, what)
