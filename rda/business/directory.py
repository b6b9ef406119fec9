"""Where is device X served? Directories map device names (or glob patterns) to endpoints.

- :class:`StaticDirectory`: a mapping from configuration (``RDA_DIRECTORY``).
- :class:`FileDirectory`: a JSON file that servers on this machine register into on start and
  leave on stop, so ``rda serve`` and ``rda get`` on one machine need no configuration.
- :class:`ChainDirectory`: asks several in order; :func:`default_directory` chains the static
  mapping first, then etcd when ``RDA_DIRECTORY_URL`` names one (``rda.business.etcd``), else
  the file. A directory that cannot answer is never silently replaced by a later one: the
  file stands in for an unreachable etcd only when configured (``RDA_DIRECTORY_FALLBACK``), and
  says so each time.

One live server per name: a directory that servers register into (a :class:`Registry`) refuses
a server whose name, or one of whose devices, a live server of another process holds, with
:class:`NameTakenError` naming the owner; ``replace=True`` takes the entries over on purpose.

Device names match exactly first, then glob patterns (``fnmatch``, case-sensitive: device names
are case-sensitive in RDA3).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from fnmatch import fnmatchcase, translate
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rda.business.config import Config
from rda.business.entries import (
    NameTakenError,
    Record,
    ServerEntry,
    conflict,
    endpoint_answers,
    parse_record,
    process_start,
)
from rda.serialization.errors import NoSuchDeviceError, RdaError, TimeoutError

__all__ = [
    "ChainDirectory",
    "Directory",
    "DirectoryUnavailableError",
    "FileDirectory",
    "NameTakenError",
    "Registry",
    "ServerEntry",
    "StaticDirectory",
    "covers",
    "default_directory",
    "default_registry",
    "server_key_of",
    "split_server_key",
    "watch_of",
]

log = logging.getLogger(__name__)

_GLOB_CHARS = frozenset("*?[")
_ENDPOINT = re.compile(r"^(tcp|ipc|inproc)://\S+$")
# A server bound to every interface is reached on this machine through loopback.
_WILDCARD_HOST = re.compile(r"^tcp://(\*|0\.0\.0\.0|\[::\]|::):")
_FILE_VERSION = 1
# A static mapping value may carry the server's CURVE key: "tcp://host:5555;server_key=KEY"
# (";" is not a Z85 character, so the key itself never contains it).
_KEY_MARK = ";server_key="
_LOCK_TIMEOUT = 10.0


@runtime_checkable
class Directory(Protocol):
    """Resolves a device name to the endpoint of the server that serves it."""

    def resolve(self, device: str) -> str:
        """The endpoint for ``device``; raises ``NoSuchDeviceError`` naming the device."""
        ...

    def devices(self) -> dict[str, str]:
        """Every known device name or pattern -> endpoint."""
        ...


@runtime_checkable
class Registry(Protocol):
    """A directory servers register into (the file, etcd)."""

    def register(
        self,
        server: str,
        endpoint: str,
        devices: Iterable[str],
        server_key: str | None = None,
        *,
        replace: bool = False,
    ) -> None:
        """Claim ``server`` and its ``devices``; ``NameTakenError`` if a live server of
        another process holds one of them (unless ``replace``)."""
        ...

    def unregister(self, server: str) -> None: ...


class DirectoryUnavailableError(RdaError):
    """The directory itself cannot be reached or read (etcd down or unreachable): the device
    may well exist. The message names the directory and the cause."""


def _is_pattern(name: str) -> bool:
    return not _GLOB_CHARS.isdisjoint(name)


def _check_endpoint(endpoint: str, what: str) -> None:
    if not isinstance(endpoint, str) or not _ENDPOINT.match(endpoint):
        raise ValueError(f"endpoint {endpoint!r} for {what} is not tcp://, ipc:// or inproc://")


class _Matcher:
    """Exact names in a dict, patterns compiled once, tried in order."""

    __slots__ = ("exact", "patterns")

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.exact: dict[str, str] = {}
        self.patterns: list[tuple[re.Pattern[str], str]] = []
        for name, endpoint in pairs:
            if _is_pattern(name):
                self.patterns.append((re.compile(translate(name)), endpoint))
            else:
                self.exact.setdefault(name, endpoint)

    def match(self, device: str) -> str | None:
        endpoint = self.exact.get(device)
        if endpoint is not None:
            return endpoint
        for pattern, endpoint in self.patterns:
            if pattern.match(device):
                return endpoint
        return None


def split_server_key(value: str) -> tuple[str, str | None]:
    """``"tcp://h:p;server_key=KEY"`` -> ``("tcp://h:p", "KEY")``; no key: ``(value, None)``."""
    endpoint, mark, key = value.partition(_KEY_MARK)
    return endpoint, (key if mark else None)


class StaticDirectory:
    """A fixed mapping of device names and glob patterns to endpoints.

    An exact name wins over any pattern; patterns are tried in the mapping's order. A value
    may end in ``;server_key=KEY``: the server's CURVE public key (docs/security.md).
    """

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self._keys: dict[str, str] = {}
        plain: dict[str, str] = {}
        for name, value in mapping.items():
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"device names and patterns must be non-empty, got {name!r}")
            endpoint, key = split_server_key(value) if isinstance(value, str) else (value, None)
            _check_endpoint(endpoint, repr(name))
            if key is not None:
                self._keys[endpoint] = key
            plain[name] = endpoint
        self._mapping = plain
        self._matcher = _Matcher(self._mapping.items())

    def server_key(self, endpoint: str) -> str | None:
        """The CURVE public key given for the server at ``endpoint``, if any."""
        return self._keys.get(endpoint)

    def __repr__(self) -> str:
        return f"StaticDirectory({len(self._mapping)} entries)"

    def resolve(self, device: str) -> str:
        endpoint = self._matcher.match(device)
        if endpoint is None:
            raise NoSuchDeviceError(f"{device}: no such device in {self!r}")
        return endpoint

    def devices(self) -> dict[str, str]:
        return dict(self._mapping)


class ChainDirectory:
    """Asks each directory in turn; the first that knows the device answers.

    A directory that cannot answer (``DirectoryUnavailableError``: etcd down) ends the lookup
    with that error: a later directory, which may hold an old entry for the device, is not
    asked in its place. Only ``fallback``, when given, stands in for an unavailable directory;
    each answer it gives so is logged as a warning naming both, and counted
    (:attr:`fallbacks`).
    """

    def __init__(self, *directories: Directory, fallback: Directory | None = None) -> None:
        if not directories:
            raise ValueError("ChainDirectory needs at least one directory")
        self.directories = directories
        self.fallback = fallback
        self.fallbacks = 0  # devices resolved by the fallback because a directory failed

    def __repr__(self) -> str:
        tail = "" if self.fallback is None else f", fallback={self.fallback!r}"
        return f"ChainDirectory({', '.join(map(repr, self.directories))}{tail})"

    def resolve(self, device: str) -> str:
        for directory in self.directories:
            try:
                return directory.resolve(device)
            except NoSuchDeviceError:
                continue
            except DirectoryUnavailableError as exc:
                # The device may exist there: the outage is the answer, unless a fallback
                # was configured, and then its use is reported.
                if self.fallback is None:
                    raise
                return self._fall_back(device, directory, exc)
        tried = ", ".join(map(repr, self.directories))
        raise NoSuchDeviceError(f"{device}: no such device (looked in {tried})")

    def _fall_back(self, device: str, failed: Directory, exc: DirectoryUnavailableError) -> str:
        assert self.fallback is not None
        try:
            endpoint = self.fallback.resolve(device)
        except NoSuchDeviceError:
            raise exc from None
        self.fallbacks += 1
        log.warning(
            "%s: %r unavailable (%s); resolved from the fallback %r to %s",
            device, failed, exc, self.fallback, endpoint,
        )  # fmt: skip
        return endpoint

    def watch(self, callback: Callable[[str, str | None], None]) -> Callable[[], None]:
        """Report changes of every directory in the chain that reports them."""
        stops = [w(callback) for d in self.directories if (w := watch_of(d)) is not None]

        def unwatch() -> None:
            for stop in stops:
                stop()

        return unwatch

    def close(self) -> None:
        for directory in self._every():
            close = getattr(directory, "close", None)
            if callable(close):
                close()

    def server_key(self, endpoint: str) -> str | None:
        for directory in self._every():
            key = server_key_of(directory, endpoint)
            if key is not None:
                return key
        return None

    def _every(self) -> tuple[Directory, ...]:
        return self.directories + (() if self.fallback is None else (self.fallback,))

    def devices(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        # Earlier directories win, so they are applied last.
        for directory in reversed(self.directories):
            merged.update(directory.devices())
        return merged


class FileDirectory:
    """A JSON registry of the servers running on this machine.

    Layout: ``{"version": 1, "servers": {name: {endpoint, devices, pid, host, registered_at,
    start}}}``. Writers take an exclusive ``flock`` on ``<file>.lock``, read, modify, write a
    temporary file, fsync it and rename it over the old one, so a reader never sees a torn
    file and two concurrent registrations never lose each other. Entries of processes no
    longer alive on this host are ignored by readers and removed by the next writer, so a
    killed server leaves no trap. ``start`` (the process start time from ``/proc``) guards
    against a recycled pid making a dead entry look alive; a pid not alive here is confirmed
    by the entry's endpoint (another PID namespace's server answers there).

    A second live process registering a name, or a device name or pattern overlapping one
    already held, is refused (:class:`NameTakenError`), unless it registers with
    ``replace=True``. Should two claims
    exist anyway (an entry from another host on a shared file), the latest wins.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._host = socket.gethostname()
        self._cache: _Snapshot | None = None

    def __repr__(self) -> str:
        return f"FileDirectory('{self.path}')"

    # -- writers -----------------------------------------------------------------------------

    def register(
        self,
        server: str,
        endpoint: str,
        devices: Iterable[str],
        server_key: str | None = None,
        *,
        replace: bool = False,
    ) -> None:
        """Add the entry of ``server`` (or update this process's own); ``server_key`` is its
        CURVE public key, which clients read with the endpoint. A live server of another
        process holding the name or a device: ``NameTakenError``, unless ``replace``, which
        removes its entry (the name) or its claim (a device) and logs whose it was."""
        if not isinstance(server, str) or not server.strip():
            raise ValueError(f"server name must be a non-empty string, got {server!r}")
        _check_endpoint(endpoint, f"server {server!r}")
        if isinstance(devices, str):
            # list("PS1") would register devices "P", "S" and "1".
            raise ValueError(f"server {server!r}: devices must be a collection of names, not a str")
        names = list(devices)
        for name in names:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"server {server!r}: device names must be non-empty strings")
        entry = {
            "endpoint": _WILDCARD_HOST.sub("tcp://127.0.0.1:", endpoint),
            "devices": names,
            "pid": os.getpid(),
            "host": self._host,
            "registered_at": time.time(),
            "start": process_start(os.getpid()),
        }
        if server_key is not None:
            entry["server_key"] = server_key
        with self._locked():
            servers = self._live(self._read(), own_endpoint=str(entry["endpoint"]))
            self._claim(servers, server, names, replace)
            # Re-inserting moves the name to the end: file order is registration order.
            servers.pop(server, None)
            servers[server] = entry
            self._write(servers)

    def _claim(
        self, servers: dict[str, dict[str, Any]], server: str, names: list[str], replace: bool
    ) -> None:
        """Refuse (or, with ``replace``, take over) what other live processes hold."""
        # This process re-registering its own server is an update, not a clash.
        others = [
            record.entry
            for name, raw in servers.items()
            if not (name == server and self._owned(raw))
            and (record := parse_record(name, raw)) is not None
        ]
        while (clash := conflict(server, names, others)) is not None:
            what, owner = clash
            if not replace:
                raise NameTakenError(what, owner, repr(self))
            log.warning("%s: taken over from %s (replace)", what, owner.describe())
            others.remove(owner)
            if owner.name == server:
                del servers[server]
            else:
                # Its names that ours cover go; one that only partly overlaps ours stays (an
                # exact name wins over a pattern, then the newest registration: ours).
                raw = servers[owner.name]
                raw["devices"] = [d for d in raw["devices"] if not any(covers(n, d) for n in names)]

    def unregister(self, server: str) -> None:
        """Remove the entry of ``server`` if this process registered it.

        An entry written by another live process (a newer instance of the same server) is
        left alone, so a slow shutdown cannot erase its successor.
        """
        with self._locked():
            servers = self._live(self._read())
            entry = servers.get(server)
            if entry is not None and self._owned(entry):
                del servers[server]
            elif entry is not None and (record := parse_record(server, entry)) is not None:
                log.warning(
                    "server %r: its entry in %r had been taken over by %s",
                    server,
                    self,
                    record.entry.describe(),
                )
            self._write(servers)

    # -- readers -----------------------------------------------------------------------------

    def resolve(self, device: str) -> str:
        snapshot = self._snapshot()
        # Exact names first, then patterns; newest registration first in each; a dead
        # server's claim falls through to the next candidate.
        for record in snapshot.exact.get(device, ()):
            if self._alive(record):
                return record.entry.endpoint
        for pattern, record in snapshot.patterns:
            if pattern.match(device) and self._alive(record):
                return record.entry.endpoint
        raise NoSuchDeviceError(f"{device}: no such device registered in {self!r}")

    def devices(self) -> dict[str, str]:
        mapping: dict[str, str] = {}
        for entry in self.servers():
            for name in entry.devices:
                mapping[name] = entry.endpoint
        return mapping

    def server_key(self, endpoint: str) -> str | None:
        """The CURVE public key the live server at ``endpoint`` registered, if any."""
        for entry in reversed(self.servers()):
            if entry.endpoint == endpoint and entry.server_key is not None:
                return entry.server_key
        return None

    def servers(self) -> list[ServerEntry]:
        """Live servers in registration order."""
        return [r.entry for r in self._snapshot().records if self._alive(r)]

    def _snapshot(self) -> _Snapshot:
        # The file is read on every call (it is small, and the only way to be sure of seeing
        # the latest version: an mtime can stay the same across two writes within one clock
        # tick); parsing and pattern compilation are skipped when the text is unchanged.
        text = self._read_text()
        cached = self._cache
        if cached is not None and cached.text == text:
            return cached
        records = [
            record
            for name, raw in self._parse(text).items()
            if (record := parse_record(name, raw)) is not None
        ]
        snapshot = _Snapshot(text, records)
        self._cache = snapshot
        return snapshot

    # -- file handling -----------------------------------------------------------------------

    def _read_text(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise RdaError(f"cannot read directory file {self.path}: {exc}") from exc

    def _parse(self, text: str) -> dict[str, dict[str, Any]]:
        if not text:
            return {}
        try:
            content = json.loads(text)
        except ValueError:
            log.warning("directory file %s is not valid JSON; treating it as empty", self.path)
            return {}
        servers = content.get("servers") if isinstance(content, dict) else None
        if not isinstance(servers, dict):
            log.warning("directory file %s has no 'servers' table; treating it as empty", self.path)
            return {}
        return {k: v for k, v in servers.items() if isinstance(v, dict)}

    def _read(self) -> dict[str, dict[str, Any]]:
        return self._parse(self._read_text())

    def _live(
        self, servers: dict[str, dict[str, Any]], own_endpoint: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """The well-formed records of live processes, as raw dicts (what writers keep)."""
        return {
            name: raw
            for name, raw in servers.items()
            if (record := parse_record(name, raw)) is not None and self._alive(record, own_endpoint)
        }

    def _alive(self, record: Record, own_endpoint: str | None = None) -> bool:
        """Whether the entry's server may still run. Its pid says so when it is visible here;
        a pid that is gone, or now another process's, is confirmed by its endpoint: a server
        in another PID namespace (a container with the host's network and name) has a pid
        this host cannot see, and still answers. ``own_endpoint``: the endpoint a
        registering server holds itself, where the old entry's server cannot be listening."""
        entry = record.entry
        if entry.host != self._host:
            # Another machine's process (a shared home directory): cannot check, keep it.
            return True
        if self._pid_alive(record):
            return True
        return entry.endpoint != own_endpoint and endpoint_answers(entry.endpoint)

    @staticmethod
    def _pid_alive(record: Record) -> bool:
        entry = record.entry
        try:
            os.kill(entry.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        except OSError:
            return False
        if record.start is None:
            return True
        # Unknown now (e.g. /proc mounted with hidepid): trust the pid rather than drop it.
        current = process_start(entry.pid)
        return current is None or current == record.start

    def _owned(self, raw: dict[str, Any]) -> bool:
        return bool(raw.get("pid") == os.getpid() and raw.get("host") == self._host)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # Non-blocking attempts in a bounded loop: a stuck holder must not hang a server's
            # start forever.
            deadline = time.monotonic() + _LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"could not lock {self._lock_path} within {_LOCK_TIMEOUT:.0f} s"
                        ) from exc
                    time.sleep(0.002)
            yield
        finally:
            # Closing the descriptor releases the lock.
            os.close(fd)

    def _write(self, servers: dict[str, dict[str, Any]]) -> None:
        text = json.dumps({"version": _FILE_VERSION, "servers": servers}, indent=1)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        # Make the rename itself durable.
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class _Snapshot:
    """One version of the file, parsed: records in file (registration) order, and the
    lookup structures with the newest registration first."""

    __slots__ = ("exact", "patterns", "records", "text")

    def __init__(self, text: str, records: list[Record]) -> None:
        self.text = text
        self.records = records
        self.exact: dict[str, list[Record]] = {}
        self.patterns: list[tuple[re.Pattern[str], Record]] = []
        for record in reversed(records):
            for name in record.entry.devices:
                if _is_pattern(name):
                    self.patterns.append((re.compile(translate(name)), record))
                else:
                    self.exact.setdefault(name, []).append(record)


def server_key_of(directory: Directory, endpoint: str) -> str | None:
    """The server key ``directory`` knows for ``endpoint`` (a directory without keys: None)."""
    lookup = getattr(directory, "server_key", None)
    return lookup(endpoint) if callable(lookup) else None


def covers(name: str, device: str) -> bool:
    """Whether the directory entry ``name`` (a device name or a glob pattern) covers ``device``."""
    return name == device or (_is_pattern(name) and fnmatchcase(device, name))


def watch_of(directory: Directory) -> Any:
    """``directory``'s ``watch(callback)`` (devices that move are reported), or None."""
    lookup = getattr(directory, "watch", None)
    return lookup if callable(lookup) else None


def etcd_of(directory: Directory) -> list[Directory]:
    """Every directory in ``directory`` (a chain is opened up) that has a ``state()``."""
    if isinstance(directory, ChainDirectory):
        return [inner for d in directory.directories for inner in etcd_of(d)]
    return [directory] if callable(getattr(directory, "state", None)) else []


def default_directory(config: Config | None = None) -> Directory:
    """The static mapping from configuration first, then etcd when ``RDA_DIRECTORY_URL`` names
    one (where servers then register), else this machine's directory file. With etcd, the
    file is asked only as the configured fallback (``RDA_DIRECTORY_FALLBACK``) of an etcd
    that cannot be reached."""
    config = config if config is not None else Config()
    static = StaticDirectory(config.directory)
    if config.directory_url is None:
        return ChainDirectory(static, FileDirectory(config.directory_file))
    # Loaded late: the etcd directory builds on this module (and on httpx).
    from rda.business.etcd.directory import EtcdDirectory

    fallback = FileDirectory(config.directory_file) if config.directory_fallback else None
    return ChainDirectory(static, EtcdDirectory.from_config(config), fallback=fallback)


def default_registry(config: Config) -> Registry:
    """Where a server registers by default: etcd when ``RDA_DIRECTORY_URL`` names one, else
    this machine's directory file."""
    if config.directory_url is not None:
        from rda.business.etcd.directory import EtcdDirectory

        return EtcdDirectory.from_config(config)
    return FileDirectory(config.directory_file)
