""":class:`EtcdDirectory`: the facility-wide directory, on etcd.

For a client, a cache of every ``devices/`` key, loaded once and then kept current by one watch
(a named thread), so that resolving is a dictionary lookup and a device that moves (its server
restarted on another host or port) is reported to :meth:`EtcdDirectory.watch` callbacks at once
(the client then moves its access points and subscriptions: ``rda.business.client``). For a
server, :meth:`register` makes a :class:`~rda.business.etcd.registration.Registration`.

etcd down: the watch breaks and the cache is marked stale. Devices in it keep resolving (their
servers are probably still up); a device it does not know asks etcd once, bounded by
``timeout``, and fails with :class:`DirectoryUnavailableError` naming the directory and the
cause, never ``NoSuchDeviceError``. The watch thread tries again on a capped back-off and, once
etcd answers, reloads the keys and reports every difference.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import translate
from types import TracebackType
from typing import NamedTuple

from rda.business.config import Config, etcd_endpoints
from rda.business.directory import DirectoryUnavailableError
from rda.business.entries import ServerEntry
from rda.business.etcd.gateway import EtcdGateway, Event, KeyValue, WatchStream
from rda.business.etcd.registration import Registration, RegistrationState, decode_server
from rda.serialization.errors import NoSuchDeviceError, RdaError

__all__ = ["DeviceChange", "EtcdDirectory", "EtcdDirectoryState"]

log = logging.getLogger("rda.directory.etcd")

# A device's new endpoint, or None when it left the directory.
DeviceChange = Callable[[str, str | None], None]

_GLOB_CHARS = frozenset("*?[")
_RETRY_MIN, _RETRY_MAX = 0.1, 2.0


class _Device(NamedTuple):
    server: str
    endpoint: str
    server_key: str | None


@dataclass(frozen=True, slots=True)
class EtcdDirectoryState:
    """What ``statistics()`` and the admin ``info`` show of an etcd directory."""

    url: str
    watching: str  # "idle" (never resolved), "synced", "stale" (etcd lost), "closed"
    devices: int
    revision: int
    last_error: str
    registrations: dict[str, RegistrationState]

    def summary(self) -> str:
        parts = [f"etcd {self.url}", f"watch {self.watching}"]
        for name, reg in self.registrations.items():
            # What is wrong with it, when something is (the keys written over, the outage).
            said = f" ({reg.last_error})" if reg.last_error and reg.state != "registered" else ""
            parts.append(f"{name} {reg.state}{said}")
        if self.last_error:
            parts.append(f"last error: {self.last_error}")
        return "; ".join(parts)


class EtcdDirectory:
    """Devices of servers on every host, registered in etcd (v3 API over its HTTP gateway).

    ``url``: ``"http://host:2379"``, several comma-separated or as a list (a cluster), or
    ``"etcd://h1:2379,h2:2379"``. ``prefix`` separates facilities sharing one etcd; ``ttl`` is
    how long a killed server's entries outlive it; ``timeout`` bounds every call to etcd.
    """

    def __init__(
        self,
        url: str | Sequence[str] = "http://127.0.0.1:2379",
        prefix: str = "/rda/",
        ttl: float = 10.0,
        *,
        timeout: float = 2.0,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        endpoints = [e for u in urls for e in etcd_endpoints(u)]
        if ttl < 2:
            raise ValueError(
                f"ttl must be at least 2 s (the lease is refreshed every ttl/3), got {ttl}"
            )
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.ttl = ttl
        self._gateway = EtcdGateway(endpoints, timeout)
        self._lock = threading.Lock()
        self._exact: dict[str, _Device] = {}
        self._patterns: dict[str, _Device] = {}
        self._compiled: list[tuple[re.Pattern[str], _Device]] = []
        self._revision = 0
        self._synced = False
        self._last_error = ""
        self._listeners: list[DeviceChange] = []
        self._registrations: dict[str, Registration] = {}
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None
        self._stop = threading.Event()
        self._closed = False

    @classmethod
    def from_config(cls, config: Config) -> EtcdDirectory:
        assert config.directory_url is not None
        return cls(config.directory_url, config.directory_prefix, config.directory_ttl)

    @property
    def url(self) -> str:
        return ",".join(self._gateway.endpoints)

    def __repr__(self) -> str:
        return f"EtcdDirectory('{self.url}', prefix='{self.prefix}')"

    def __enter__(self) -> EtcdDirectory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- Directory ---------------------------------------------------------------------------

    def resolve(self, device: str) -> str:
        self._ensure_watching()
        self._catch_up_with_own_writes()
        found = self._lookup(device)
        if found is None and not self._synced:
            # Stale cache and an unknown device: ask etcd now, bounded by the timeout.
            try:
                self._load()
            except RdaError as exc:
                raise DirectoryUnavailableError(f"{device}: cannot resolve: {exc}") from exc
            found = self._lookup(device)
        if found is None:
            raise NoSuchDeviceError(f"{device}: no such device registered in {self!r}")
        return found.endpoint

    def devices(self) -> dict[str, str]:
        self._ensure_watching()
        if not self._synced or self._behind_own_writes():
            self._load()
        with self._lock:
            return {name: d.endpoint for name, d in {**self._exact, **self._patterns}.items()}

    def server_key(self, endpoint: str) -> str | None:
        """The CURVE public key registered with the server at ``endpoint``, if any."""
        with self._lock:
            for device in (*self._exact.values(), *self._patterns.values()):
                if device.endpoint == endpoint and device.server_key is not None:
                    return device.server_key
        return None

    def servers(self) -> list[ServerEntry]:
        """Every registered server, oldest registration first (asks etcd each time)."""
        _, kvs = self._gateway.range(f"{self.prefix}servers/", prefix=True)
        names = (kv.key[len(self.prefix) + len("servers/") :] for kv in kvs)
        entries = [decode_server(kv, name) for kv, name in zip(kvs, names, strict=True)]
        return sorted((e for e in entries if e is not None), key=lambda e: e.registered_at)

    def watch(self, callback: DeviceChange) -> Callable[[], None]:
        """Call ``callback(device_or_pattern, endpoint_or_None)`` on the watch thread for
        every change (keep it short); returns the function that stops the calls."""
        # Loaded first: the entries already there are not news to the new listener.
        self._ensure_watching(required=False)
        with self._lock:
            self._listeners.append(callback)

        def unwatch() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return unwatch

    # -- Registry ----------------------------------------------------------------------------

    def register(
        self,
        server: str,
        endpoint: str,
        devices: Iterable[str],
        server_key: str | None = None,
        *,
        replace: bool = False,
    ) -> None:
        if isinstance(devices, str):
            raise ValueError(f"server {server!r}: devices must be a collection of names, not a str")
        names = list(dict.fromkeys(devices))
        entry = ServerEntry(
            server,
            endpoint,
            tuple(names),
            os.getpid(),
            socket.gethostname(),
            time.time(),
            server_key,
        )
        registration = Registration(self._gateway, self.prefix, self.ttl, entry, replace)
        registration.claim()
        registration.start()
        with self._lock:
            old = self._registrations.pop(server, None)
            self._registrations[server] = registration
        if old is not None:
            old.close()

    def unregister(self, server: str) -> None:
        with self._lock:
            registration = self._registrations.pop(server, None)
        if registration is not None:
            registration.close()

    def state(self) -> EtcdDirectoryState:
        with self._lock:
            if self._closed:
                watching = "closed"
            elif self._thread is None:
                watching = "idle"
            else:
                watching = "synced" if self._synced else "stale"
            return EtcdDirectoryState(
                url=self.url,
                watching=watching,
                devices=len(self._exact) + len(self._patterns),
                revision=self._revision,
                last_error=self._last_error,
                registrations={n: r.state() for n, r in self._registrations.items()},
            )

    def close(self, timeout: float = 2.0) -> None:
        """Stop the watch and revoke this process's registrations; idempotent."""
        with self._lock:
            self._closed = True
            registrations = list(self._registrations.values())
            self._registrations.clear()
            stream, thread = self._stream, self._thread
        self._stop.set()
        if stream is not None:
            stream.stop()
        for registration in registrations:
            registration.close(timeout)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._gateway.close()

    # -- the cache ---------------------------------------------------------------------------

    def _lookup(self, device: str) -> _Device | None:
        with self._lock:
            found = self._exact.get(device)
            if found is not None:
                return found
            for pattern, candidate in self._compiled:
                if pattern.match(device):
                    return candidate
        return None

    def _behind_own_writes(self) -> bool:
        with self._lock:
            return self._revision < self._gateway.written_revision

    def _catch_up_with_own_writes(self) -> None:
        """Read your own writes: a device this process has just registered (or unregistered)
        resolves so at once, though the watch delivers the change a moment later."""
        if not self._behind_own_writes():
            return
        try:
            self._load()
        except RdaError as exc:
            log.warning("%r: cannot read back this process's own registration: %s", self, exc)

    def _ensure_watching(self, required: bool = True) -> None:
        """Load the keys and start the watch on first use. ``required``: a failed first load
        raises (a resolve); otherwise the thread keeps trying (a watch callback)."""
        with self._lock:
            if self._closed:
                raise RdaError(f"{self!r} is closed")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="rda-etcd-watch", daemon=True)
        try:
            self._load()
        except RdaError:
            if required:
                self._thread.start()
                raise
        self._thread.start()

    def _load(self) -> None:
        """Read every device key, replace the cache, report the differences."""
        revision, kvs = self._gateway.range(f"{self.prefix}devices/", prefix=True)
        fresh = {self._name(kv): d for kv in kvs if (d := _device(kv)) is not None}
        with self._lock:
            watching, self._synced = self._synced, True
            self._last_error = ""
            if watching and revision <= self._revision:
                # The watch applied newer changes meanwhile, in order: this older snapshot
                # would undo them (and they will not come again). After a lost watch the
                # snapshot replaces all (etcd may even have been recreated, revisions anew).
                return
            old = {**self._exact, **self._patterns}
            self._exact = {n: d for n, d in fresh.items() if _GLOB_CHARS.isdisjoint(n)}
            self._patterns = {n: d for n, d in fresh.items() if not _GLOB_CHARS.isdisjoint(n)}
            self._compile()
            self._revision = revision
        changes: list[tuple[str, str | None]] = [
            (n, d.endpoint) for n, d in fresh.items() if old.get(n, d_none) != d
        ]
        changes += [(n, None) for n in old if n not in fresh]
        self._notify(changes)

    def _compile(self) -> None:
        # Caller holds the lock. Patterns in name order: deterministic across clients.
        self._compiled = [
            (re.compile(translate(n)), self._patterns[n]) for n in sorted(self._patterns)
        ]

    def _name(self, kv: KeyValue) -> str:
        return kv.key[len(self.prefix) + len("devices/") :]

    def _apply(self, events: list[Event]) -> None:
        changes: list[tuple[str, str | None]] = []
        with self._lock:
            patterns_changed = False
            for event in events:
                if 0 < event.kv.mod_revision <= self._revision:
                    continue  # a load read it already (the load may overtake the watch)
                name = self._name(event.kv)
                table = self._exact if _GLOB_CHARS.isdisjoint(name) else self._patterns
                patterns_changed |= table is self._patterns
                device = None if event.deleted else _device(event.kv)
                if device is None:
                    if table.pop(name, None) is not None:
                        changes.append((name, None))
                elif table.get(name) != device:
                    table[name] = device
                    changes.append((name, device.endpoint))
            if patterns_changed:
                self._compile()
            # The events' own revisions, not the message's header: a watch opened from an
            # older revision first says "created" with the store's current revision, then
            # replays what happened since, which must not count as seen already.
            seen = max((e.kv.mod_revision for e in events), default=0)
            self._revision = max(self._revision, seen)
        self._notify(changes)

    def _notify(self, changes: list[tuple[str, str | None]]) -> None:
        if not changes:
            return
        with self._lock:
            listeners = list(self._listeners)
        for name, endpoint in changes:
            for listener in listeners:
                try:
                    listener(name, endpoint)
                except Exception:
                    log.exception("%r: a watch callback raised for %s", self, name)

    # -- the watch thread --------------------------------------------------------------------

    def _run(self) -> None:
        delay = _RETRY_MIN
        need_load = not self._synced
        while not self._stop.is_set():
            try:
                if need_load:
                    self._load()
                need_load = True  # unless the stream ends cleanly below
                with self._lock:
                    if self._closed:
                        return
                    start = self._revision + 1
                    stream = self._gateway.watch(f"{self.prefix}devices/", start, _idle(self.ttl))
                    self._stream = stream
                try:
                    for _, events in stream.events():
                        delay = _RETRY_MIN
                        self._apply(events)
                finally:
                    stream.close()
                # Silent for the idle time (or stopped): watch again from where we are.
                need_load = False
            except RdaError as exc:
                with self._lock:
                    was_synced, self._synced = self._synced, False
                    self._last_error = str(exc)
                if was_synced:
                    log.warning("%r: watch lost; resolved devices keep working: %s", self, exc)
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, _RETRY_MAX)


# A sentinel that compares unequal to every device.
d_none = _Device("", "", None)


def _idle(ttl: float) -> float:
    """How long a silent watch stream is trusted before it is opened again: etcd sends nothing
    while nothing changes, and a partition does not close the TCP connection."""
    return max(30.0, 3 * ttl)


def _device(kv: KeyValue) -> _Device | None:
    try:
        raw = json.loads(kv.value)
        key = raw.get("server_key")
        return _Device(str(raw["server"]), str(raw["endpoint"]), None if key is None else str(key))
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("etcd key %s does not hold a device entry; ignored", kv.key)
        return None
