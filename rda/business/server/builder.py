"""``ServerBuilder``: the fluent set-up of a server (RDA3's ``ServerBuilder``), and ``Server``.

The builder collects endpoint, callbacks or devices, threads, security and policy, validates
the configuration and builds a :class:`~rda.business.server.runtime.Server` (re-exported here:
``rda.business.server.builder`` is where users and the ``rda`` facade import both from).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from rda.business.config import Config
from rda.business.directory import Registry, default_registry
from rda.business.metadata import Field, PropertyDescription
from rda.business.policy import Policy, check_lockout
from rda.business.scheduler import InlineRule, OverflowPolicy
from rda.business.server.devices import Device, DeviceRouter
from rda.business.server.requests import RequestReplyCallback
from rda.business.server.runtime import AdminHandler, Hook, Server, TransportFactory
from rda.business.server.subscriptions import SubscriptionCallback
from rda.serialization.errors import RdaError

if TYPE_CHECKING:  # zmq stays unloaded for servers on the in-memory transport
    from rda.business.security import ServerSecurity

__all__ = ["Server", "ServerBuilder", "TransportFactory"]

_UNSET: Any = object()


class ServerBuilder:
    """Configure a :class:`Server`; every method returns the builder.

    Values not set here come from ``config`` (``Config()``, i.e. ``RDA_*`` variables, unless
    :meth:`config` gives one).
    """

    def __init__(self, name: str) -> None:
        if not name or not name.strip():
            raise ValueError("a server needs a non-empty name")
        self.name = name
        self._endpoint = "tcp://127.0.0.1:0"
        self._rr: RequestReplyCallback | None = None
        self._subs: SubscriptionCallback | None = None
        self._devices: dict[str, Device] = {}
        self._device_names: list[str] = []
        self._described: dict[tuple[str, str], PropertyDescription] = {}
        self._config: Config | None = None
        self._overrides: dict[str, Any] = {}
        self._immediate = True
        self._inline = True
        self._inline_patterns: list[str] = []
        self._blocking_patterns: list[str] = []
        self._directory: Registry | None = _UNSET
        self._replace = False
        self._transport: TransportFactory | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._admin: AdminHandler | None = None
        self._admin_commands: Callable[[str], bool] | None = None
        self.metrics_port_value: int | None = None
        self._policy: Policy | None = None
        self._policy_file: Path | None = None
        self._trust_declared = False
        self._on_start: list[Hook] = []
        self._on_stop: list[Hook] = []
        self._security: ServerSecurity | None = None

    def endpoint(self, endpoint: str) -> Self:
        """Where to bind, e.g. "tcp://127.0.0.1:0" (port 0: any free port) or "tcp://*:5555"."""
        self._endpoint = endpoint
        return self

    def request_reply(self, callback: RequestReplyCallback) -> Self:
        self._rr = callback
        return self

    def subscription(self, callback: SubscriptionCallback) -> Self:
        self._subs = callback
        return self

    def device(self, name: str, device: Device) -> Self:
        """Serve a declarative :class:`~rda.business.server.devices.Device` under ``name``."""
        if name in self._devices:
            raise ValueError(f"device {name!r} is already served by this builder")
        if any(d == name for d, _ in self._described):
            raise ValueError(f"{name} has describe() calls: a Device declares its own fields")
        self._devices[name] = device
        for p in type(device).properties().values():
            pattern = f"{_glob_escape(name)}/{_glob_escape(p.name)}"
            if p.blocking is False:
                self._inline_patterns.append(pattern)
            elif p.blocking is True:
                self._blocking_patterns.append(pattern)
        return self

    def devices(self, *names: str) -> Self:
        """Device names or glob patterns served by the raw callbacks (for the directory)."""
        self._device_names.extend(names)
        return self

    def describe(
        self,
        device: str,
        prop: str,
        fields: Mapping[str, Field] | None = None,
        description: str = "",
        settable: bool = True,
    ) -> Self:
        """Declare the metadata of a property the raw callbacks serve (a ``Device`` declares
        its own with ``@rda.prop(..., fields=...)``): what ``describe`` answers; the server
        refuses sets outside the fields' ``limits`` before the callback sees them and sends
        the alarm of each value (docs/server.md, "Property metadata")."""
        if not device or not prop:
            raise ValueError("describe needs a device and a property name")
        if device in self._devices:
            raise ValueError(
                f"{device} is a Device: declare its fields with @rda.prop(..., fields=...)"
            )
        checked = dict(fields or {})
        for name, field in checked.items():
            if not isinstance(field, Field):
                raise TypeError(f"{device}/{prop}: fields[{name!r}] must be an rda.Field")
        self._described[(device, prop)] = PropertyDescription(
            device, prop, checked, description, settable
        )
        return self

    def heartbeat(self, interval: float, timeout: float) -> Self:
        self._overrides["heartbeat_interval"] = interval
        self._overrides["heartbeat_timeout"] = timeout
        return self

    def workers(self, n: int) -> Self:
        self._overrides["workers"] = n
        return self

    def queue_limit(self, n: int) -> Self:
        self._overrides["queue_limit"] = n
        return self

    def overflow_policy(self, policy: OverflowPolicy) -> Self:
        self._overrides["overflow_policy"] = policy
        return self

    def peer_hwm(self, messages: int) -> Self:
        """Messages ZeroMQ buffers for one client before notifications to it are conflated:
        larger lets longer bursts through whole, and lets a slow client fall further behind
        before it is brought up to date (``Config.peer_hwm``, default 1000)."""
        self._overrides["peer_hwm"] = messages
        return self

    def request_timeout(self, seconds: float) -> Self:
        """Deadline for requests whose client sent none (and for FIRST/IMMEDIATE gets)."""
        self._overrides["request_timeout"] = seconds
        return self

    def inline_handlers(self, enabled: bool = True) -> Self:
        """On (the default): a get or set whose device has nothing queued or running starts on
        the thread that received it (no worker hop); if it runs past ``handover_after``
        (2 ms) a standby thread takes over the dispatching, so the server never stops
        receiving (docs/server.md, "Threads and order"). Off: every get and set runs on a
        worker, except :meth:`inline_properties` and properties declared ``blocking=False``."""
        self._inline = enabled
        return self

    def inline_properties(self, *patterns: str) -> Self:
        """With ``inline_handlers(False)``: still start these properties on the dispatcher,
        those whose ``DEVICE/PROPERTY`` matches one of ``patterns`` (globs, e.g.
        ``"PS*/Acquisition"``). A :class:`~rda.business.server.devices.Device` property
        declared ``blocking=False`` is added by :meth:`device` itself."""
        InlineRule(patterns=patterns)  # a malformed pattern fails here, at the call
        self._inline_patterns.extend(patterns)
        return self

    def handover_after(self, seconds: float) -> Self:
        """How long a handler may run on the dispatcher before a standby thread takes over
        the dispatching (``Config.handover_after``, default 2 ms; 0: never)."""
        self._overrides["handover_after"] = seconds
        return self

    def blocking_properties(self, *patterns: str) -> Self:
        """Always run these properties on a worker (handlers that wait on hardware): those
        whose ``DEVICE/PROPERTY`` matches one of ``patterns`` (globs). A ``Device`` property
        declared ``blocking=True`` is added by :meth:`device` itself."""
        InlineRule(blocking=patterns)  # a malformed pattern fails here, at the call
        self._blocking_patterns.extend(patterns)
        return self

    def immediate_updates(self, enabled: bool = True) -> Self:
        """After a successful set, send subscribers of the property an IMMEDIATE update."""
        self._immediate = enabled
        return self

    def config(self, config: Config) -> Self:
        self._config = config
        return self

    def directory(self, directory: Registry | None) -> Self:
        """Register into ``directory`` on start (None: register nowhere). Default: etcd when
        ``RDA_DIRECTORY_URL`` names one (``rda.EtcdDirectory``), else this machine's file."""
        self._directory = directory
        return self

    def replace(self, enabled: bool = True) -> Self:
        """Take over the directory entries of a live server holding this server's name or one
        of its devices (logged, and the old owner is told); without it, ``start()`` fails with
        ``NameTakenError`` naming the owner. ``rda serve --replace``."""
        self._replace = enabled
        return self

    def transport(self, factory: TransportFactory) -> Self:
        """Build the transport with ``factory(handler, settings, server_info)`` (tests use
        ``rda.testing.MemoryNetwork``); default: a ZeroMQ ROUTER on the endpoint."""
        self._transport = factory
        return self

    def clock(self, clock: Callable[[], float]) -> Self:
        """Monotonic clock for deadlines and durations (a ``FakeClock`` in tests)."""
        self._clock = clock
        return self

    def admin_handler(
        self, handler: AdminHandler, commands: Callable[[str], bool] | None = None
    ) -> Self:
        """The admin commands' handler; ``commands(name)`` says whether a command exists (only
        those get an ``operation`` label of their own in the denial metrics)."""
        self._admin = handler
        self._admin_commands = commands
        return self

    def metrics_port(self, port: int | None) -> Self:
        self.metrics_port_value = port
        return self

    def security(self, security: ServerSecurity | None) -> Self:
        """CURVE encryption and client authentication (docs/security.md): only the clients
        listed in ``security.clients`` can connect. Needs the default ZeroMQ transport."""
        self._security = security
        return self

    def policy(self, policy: Policy | str | Path | None, allow_empty: bool = False) -> Self:
        """Authorize every get, set, subscribe and admin request by ``policy`` (a
        :class:`~rda.business.policy.Policy` or a TOML file; default deny for what its rules do
        not allow). A file is loaded here (a broken one raises ``PolicyError`` now, and so does
        one without rules unless ``allow_empty``: docs/security.md) and is what
        :meth:`Server.reload_policy` re-reads. None: no authorization (everything allowed)."""
        if policy is None or isinstance(policy, Policy):
            self._policy, self._policy_file = policy, None
        else:
            self._policy_file = Path(policy)
            loaded = Policy.from_toml(self._policy_file)
            self._policy = check_lockout(loaded, self.name, None, allow_empty)
        return self

    def trust_declared_principals(self, trust: bool = True) -> Self:
        """Take the principal a client declares (``ClientService(principal=...)``) at its word
        when the transport authenticated none. For test stands only: without CURVE anyone can
        claim any name."""
        self._trust_declared = trust
        return self

    def on_start(self, hook: Hook) -> Self:
        self._on_start.append(hook)
        return self

    def on_stop(self, hook: Hook) -> Self:
        self._on_stop.append(hook)
        return self

    def build(self) -> Server:
        base = self._config if self._config is not None else Config()
        config = base.model_copy(update=self._overrides) if self._overrides else base
        if self._overrides:
            # model_copy skips validation; re-validate so a bad value fails here, clearly.
            config = Config(**config.model_dump())
        if self.metrics_port_value is None:
            self.metrics_port_value = config.metrics_port
        directory = self._directory
        owns_directory = directory is _UNSET
        if owns_directory:
            directory = default_registry(config)
        rr: RequestReplyCallback
        subs: SubscriptionCallback
        if self._devices:
            router = DeviceRouter(self._devices, self._rr, self._subs)
            rr, subs = router, router
        else:
            rr = self._rr if self._rr is not None else RequestReplyCallback()
            subs = self._subs if self._subs is not None else SubscriptionCallback()
        curve = None
        if self._security is not None:
            if self._transport is not None:
                raise RdaError("security (CURVE) needs the ZeroMQ transport, not a custom one")
            # Key files are read here: a bad one stops the server before it binds.
            curve = self._security.curve()
        return Server(
            name=self.name,
            endpoint=self._endpoint,
            config=config,
            request_reply=rr,
            subscription=subs,
            devices=list(dict.fromkeys([*self._devices, *self._device_names])),
            device_objects=dict(self._devices),
            described=dict(self._described),
            raw_devices=self._rr is not None or self._subs is not None,
            immediate_updates=self._immediate,
            inline_handlers=InlineRule(
                self._inline, self._inline_patterns, self._blocking_patterns
            ),
            directory=directory,
            owns_directory=owns_directory,
            replace=self._replace,
            transport_factory=self._transport,
            clock=self._clock,
            admin_handler=self._admin,
            admin_commands=self._admin_commands,
            metrics_port=self.metrics_port_value,
            policy=self._policy,
            policy_file=self._policy_file,
            trust_declared=self._trust_declared,
            on_start=list(self._on_start),
            on_stop=list(self._on_stop),
            curve=curve,
        )


def _glob_escape(name: str) -> str:
    """``name`` as a glob that matches only itself (``[*]`` for ``*``, as glob.escape)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
