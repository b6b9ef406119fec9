"""A server's claim on its name and devices in etcd, held by a lease a named thread keeps alive.

Keys (under the directory's prefix):

- ``servers/<name>``: the :class:`~rda.business.entries.ServerEntry` as JSON (endpoint,
  devices, host, pid, registered_at, server_key);
- ``devices/<device or pattern>``: ``{"server", "endpoint", "server_key"}``, what a client
  needs to reach the device (one key per device, so a client watches exactly the changes).

Every key is attached to one lease of ``ttl`` seconds. The keeper thread refreshes it every
``ttl / 3``; ``kill -9`` stops the refreshes and etcd deletes the keys within ``ttl``; a clean
stop revokes the lease, which deletes them at once.

One live server per name: each key is created by a transaction that succeeds only if the key is
absent, so of two servers starting together exactly one wins; the loser learns the owner from
the failure branch and gets :class:`NameTakenError`. A device name or pattern that overlaps
another server's (``D1`` beside ``D*``) is refused the same way: checked on a read of every
device key before ours are written, and again after, when only keys written before ours count,
so that of two overlapping claims made together the later one backs off. A name held by a dead
process of this same host (a ``kill -9`` seconds ago: its pid gone and its endpoint silent) is
taken over at once rather than waiting for the lease; a live lease is otherwise proof enough.
Transactions are cut in batches (etcd refuses more than 128 operations per transaction by
default). If a device batch fails, the lease is revoked: nothing half-registered remains.

The keeper also checks, at each refresh, that every key is still attached to its lease (etcd
lists a lease's keys): a key written over by hand (``etcdctl put``, which detaches it from the
lease) would otherwise send the server's clients elsewhere while it says "registered", and
outlive its stop. A key that still names this server (same server and endpoint) is written
again under the lease (re-asserted: it goes with the lease again); one that names something
else is reported, not fought over: the state becomes ``overwritten`` with the keys and where
they point now (admin ``info``, ``statistics().directory``), with a warning in the log, until
the keys are ours again. At stop, a key that still names this server but is off the lease is
deleted with it.

When etcd is unreachable the keeper keeps trying; if the lease expired meanwhile, it claims
everything again with a new lease when etcd is back (and logs it when someone else has taken
the name in between). If the server's entry is taken over on purpose (``replace``), the keeper
notices within ``ttl / 3``, logs who took it, revokes its lease and stops.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rda.business.directory import DirectoryUnavailableError, covers
from rda.business.entries import (
    NameTakenError,
    ServerEntry,
    clash_text,
    endpoint_answers,
    overlap,
)
from rda.business.etcd.gateway import (
    EtcdGateway,
    KeyValue,
    compare_absent,
    compare_mod,
    delete_op,
    put_op,
    range_op,
)
from rda.serialization.errors import RdaError

__all__ = ["Registration", "decode_server", "device_value"]

log = logging.getLogger("rda.directory.etcd")

# etcd's default --max-txn-ops is 128; stay under it.
_BATCH = 100


def device_value(entry: ServerEntry) -> bytes:
    return json.dumps(
        {"server": entry.name, "endpoint": entry.endpoint, "server_key": entry.server_key}
    ).encode()


def decode_server(kv: KeyValue, name: str) -> ServerEntry | None:
    """The entry stored at ``servers/<name>``, or None if it is malformed."""
    try:
        raw = json.loads(kv.value)
        return ServerEntry(
            name=name,
            endpoint=str(raw["endpoint"]),
            devices=tuple(str(d) for d in raw["devices"]),
            pid=int(raw["pid"]),
            host=str(raw["host"]),
            registered_at=float(raw["registered_at"]),
            server_key=None if raw.get("server_key") is None else str(raw["server_key"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _batches(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _BATCH):
        yield items[start : start + _BATCH]


def _dead_here(entry: ServerEntry, own_endpoint: str) -> bool:
    """True when ``entry``'s process ran on this host and is gone (a stale entry): its pid is
    not alive here *and* nothing answers at its endpoint. The pid alone does not prove it: a
    server in another PID namespace (a container with the host's network and name) has a pid
    this host cannot see. At ``own_endpoint`` (the registering server's, bound by it) the old
    server cannot be listening."""
    if entry.host != socket.gethostname() or entry.pid == os.getpid():
        return False
    if not _pid_gone(entry):
        return False
    return entry.endpoint == own_endpoint or not endpoint_answers(entry.endpoint)


def _pid_gone(entry: ServerEntry) -> bool:
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    # A killed process its parent has not reaped yet (a zombie) serves nobody either.
    try:
        stat = Path(f"/proc/{entry.pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


@dataclass(frozen=True, slots=True)
class RegistrationState:
    # "registered", "overwritten" (keys written over by another: ``last_error`` says which and
    # where they point), "unreachable", "re-registering", "replaced", "stopped"
    state: str
    lease: int
    since: float
    last_error: str
    overwritten: int = 0  # keys written over by another that point elsewhere (the metric)


class Registration:
    """One server's entries in etcd and the thread that keeps their lease alive."""

    def __init__(
        self,
        gateway: EtcdGateway,
        prefix: str,
        ttl: float,
        entry: ServerEntry,
        replace: bool,
    ) -> None:
        self._gateway = gateway
        self._prefix = prefix
        self._ttl = ttl
        self.entry = entry
        self._replace = replace
        self._lease = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = RegistrationState("unregistered", 0, time.time(), "")

    @property
    def server_key(self) -> str:
        return f"{self._prefix}servers/{self.entry.name}"

    def device_key(self, device: str) -> str:
        return f"{self._prefix}devices/{device}"

    def state(self) -> RegistrationState:
        return self._state

    def _set_state(self, state: str, error: str = "", overwritten: int = 0) -> None:
        if state != self._state.state or error != self._state.last_error:
            self._state = RegistrationState(state, self._lease, time.time(), error, overwritten)

    # -- claiming ----------------------------------------------------------------------------

    def claim(self) -> None:
        """Grant a lease and create every key under it; ``NameTakenError`` when a live server
        of another process holds one (nothing of ours is left behind then)."""
        lease = self._gateway.grant(self._ttl)
        self._lease = lease
        try:
            self._claim_server(lease)
            self._check_overlaps(written=False)
            self._claim_devices(lease)
            self._check_overlaps(written=True)
        except BaseException:
            self._revoke_quietly(lease)
            self._lease = 0
            raise
        self._set_state("registered")

    def _claim_server(self, lease: int) -> None:
        value = json.dumps(asdict(self.entry)).encode()
        key = self.server_key
        ok, responses = self._gateway.txn(
            [compare_absent(key)], [put_op(key, value, lease)], [range_op(key)]
        )
        if ok:
            return
        owner = self._owner_from(responses, self.entry.name)
        self._take_over_or_refuse(f"server name {self.entry.name!r}", owner)
        self._gateway.put(key, value, lease)

    def _claim_devices(self, lease: int) -> None:
        value = device_value(self.entry)
        for batch in _batches(list(self.entry.devices)):
            keys = [self.device_key(d) for d in batch]
            ok, responses = self._gateway.txn(
                [compare_absent(k) for k in keys],
                [put_op(k, value, lease) for k in keys],
                [range_op(k) for k in keys],
            )
            if ok:
                continue
            for device, response in zip(batch, responses, strict=True):
                kvs = response.get("response_range", {}).get("kvs", [])
                if not kvs:
                    continue
                holder = json.loads(_decode(kvs[0]["value"])).get("server", "?")
                if holder == self.entry.name:
                    continue  # the server name was ours to take over: so are its devices
                owner = self._server_entry(str(holder))
                self._take_over_or_refuse(
                    f"device {device!r} (of server {self.entry.name!r})", owner
                )
            # Every clash was taken over (or was ours): write the batch unconditionally.
            self._gateway.txn([], [put_op(k, value, lease) for k in keys], [])

    def _check_overlaps(self, written: bool) -> None:
        """Refuse (or take over) device names and patterns of other servers that overlap ours
        (``D1`` beside a live ``D*``); an exact clash is the device transactions' job.

        Before writing, every overlap counts. After writing (``written``), only those written
        before ours: of two servers registering overlapping patterns at once, both see each
        other then, and the later one backs off (its lease revoked by ``claim``), so a race
        leaves one owner. With ``replace``, another's key that ours covers is deleted (its
        server reports the lost key); one that only partly overlaps stays, and exact names
        win over patterns when clients resolve."""
        prefix = f"{self._prefix}devices/"
        # Names only (a server of 10,000 devices reads no values): a key named as one of our
        # devices is ours, or an exact clash the transactions settle; the others are read
        # one by one, only those that overlap ours.
        _, kvs = self._gateway.range(prefix, prefix=True, keys_only=True)
        revisions = {kv.key[len(prefix) :]: kv.mod_revision for kv in kvs}
        names = set(self.entry.devices)
        theirs = {name for name in revisions if name not in names}
        mine = sorted(names)
        while (found := overlap(mine, theirs)) is not None:
            device, other = found
            theirs.discard(other)
            if written and revisions[other] > revisions.get(device, 0):
                continue
            _, current = self._gateway.range(f"{prefix}{other}")
            if not current:
                continue  # gone meanwhile
            holder = _holder(current[0])
            if holder == self.entry.name:
                continue  # left by an earlier registration of this same server name
            owner = self._server_entry(holder)
            self._take_over_or_refuse(clash_text(self.entry.name, device, other), owner)
            if covers(device, other):
                self._gateway.delete(f"{prefix}{other}")

    def _owner_from(self, responses: list[dict[str, Any]], name: str) -> ServerEntry | None:
        for response in responses:
            for raw in response.get("response_range", {}).get("kvs", []):
                kv = KeyValue(self.server_key, _decode(raw.get("value", "")), 0, 0, 0)
                return decode_server(kv, name)
        return None

    def _server_entry(self, name: str) -> ServerEntry | None:
        _, kvs = self._gateway.range(f"{self._prefix}servers/{name}")
        return decode_server(kvs[0], name) if kvs else None

    def _take_over_or_refuse(self, what: str, owner: ServerEntry | None) -> None:
        if owner is None:
            owner = ServerEntry("(unknown)", "?", (), 0, "?", 0.0)
        if _dead_here(owner, self.entry.endpoint):
            log.info("%s: the entry of dead %s is stale; taking it over", what, owner.describe())
            return
        if not self._replace:
            # A server killed on another host keeps its entry until its lease runs out.
            hint = f"a killed server's entry expires within {self._ttl:g} s"
            raise NameTakenError(what, owner, f"etcd directory {self._where()}", hint)
        log.warning("%s: taken over from %s (replace)", what, owner.describe())

    def _where(self) -> str:
        return f"{','.join(self._gateway.endpoints)} (prefix {self._prefix})"

    # -- keeping alive -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._keep, name=f"rda-etcd-lease-{self.entry.name}", daemon=True
        )
        self._thread.start()

    def _keep(self) -> None:
        period = self._ttl / 3
        while not self._stop.wait(
            period if self._state.state in ("registered", "overwritten") else min(period, 0.5)
        ):
            try:
                self._refresh()
            except NameTakenError as exc:
                self._set_state("conflict", str(exc))
                log.error("server %r: cannot register again: %s", self.entry.name, exc)
            except DirectoryUnavailableError as exc:
                if self._state.state != "unreachable":
                    log.warning(
                        "server %r: etcd unreachable; still serving: %s", self.entry.name, exc
                    )
                self._set_state("unreachable", str(exc))
            except RdaError as exc:
                self._set_state("error", str(exc))
                log.warning("server %r: etcd: %s", self.entry.name, exc)
            if self._state.state == "replaced":
                return

    def _refresh(self) -> None:
        if self._lease and self._gateway.keepalive(self._lease) > 0:
            if self._taken_over():
                return
            lost = self._check_keys()
            if lost:
                said = "; ".join(lost)
                if said != self._state.last_error:
                    log.warning("server %r: directory keys written over: %s", self.entry.name, said)
                self._set_state("overwritten", said, len(lost))
                return
            if self._state.state == "overwritten":
                log.info("server %r: every directory key is its own again", self.entry.name)
            elif self._state.state != "registered":
                log.info("server %r: etcd reachable again; entry kept", self.entry.name)
            self._set_state("registered")
            return
        # The lease expired (an outage longer than ttl) or was never granted: claim again.
        self._set_state("re-registering", self._state.last_error)
        self.claim()
        log.info("server %r: registered again in etcd (lease %d)", self.entry.name, self._lease)

    def _keys(self) -> dict[str, bytes]:
        """Every key of this registration and the value it should hold."""
        device = device_value(self.entry)
        keys = {self.device_key(d): device for d in self.entry.devices}
        keys[self.server_key] = json.dumps(asdict(self.entry)).encode()
        return keys

    def _check_keys(self) -> list[str]:
        """Re-assert our keys that were written over with our own entry; describe those that
        now point elsewhere (none when every key is on our lease)."""
        attached = self._gateway.lease_keys(self._lease)
        if attached is None:
            return []  # expired meanwhile: the next refresh claims everything again
        expected = self._keys()
        lost: list[str] = []
        for key in sorted(set(expected) - attached):
            _, kvs = self._gateway.range(key)
            current = kvs[0] if kvs else None
            if current is not None and _same_entry(current.value, expected[key]):
                # Our own entry, off the lease (written again by hand): put it back on the
                # lease, unless it changed meanwhile.
                ok, _ = self._gateway.txn(
                    [compare_mod(key, current.mod_revision)],
                    [put_op(key, expected[key], self._lease)],
                    [],
                )
                if ok:
                    log.info("server %r: %s put back on its lease", self.entry.name, key)
                    continue
            name = key[len(self._prefix) :]
            lost.append(f"{name} -> {_points_to(current)}")
        return lost

    def _release_orphans(self) -> None:
        """At stop: delete our keys that still name us but are off the lease (the revoke does
        not reach them), each only if unchanged since read."""
        attached = self._gateway.lease_keys(self._lease) or set()
        expected = self._keys()
        for key in sorted(set(expected) - attached):
            _, kvs = self._gateway.range(key)
            if kvs and _same_entry(kvs[0].value, expected[key]):
                self._gateway.txn([compare_mod(key, kvs[0].mod_revision)], [delete_op(key)], [])

    def _taken_over(self) -> bool:
        """True (and the lease revoked) when another process has replaced our entry."""
        _, kvs = self._gateway.range(self.server_key)
        current = decode_server(kvs[0], self.entry.name) if kvs else None
        if current is None or current == self.entry:
            return False
        log.warning(
            "server %r: its directory entry was taken over by %s; no longer registered",
            self.entry.name,
            current.describe(),
        )
        self._revoke_quietly(self._lease)
        self._set_state("replaced", f"taken over by {current.describe()}")
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Stop the keeper and revoke the lease (which deletes every key at once)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self._lease and self._state.state != "replaced":
            try:
                self._release_orphans()
            except RdaError as exc:
                log.warning("server %r: could not clean its keys: %s", self.entry.name, exc)
            self._revoke_quietly(self._lease)
        self._lease = 0
        self._set_state("stopped")

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self._gateway.revoke(lease)
        except RdaError as exc:
            # etcd down: the lease expires by itself within ttl.
            log.warning("server %r: could not revoke lease %d: %s", self.entry.name, lease, exc)


def _same_entry(value: bytes, expected: bytes) -> bool:
    """Whether a key's value is our entry (as JSON: key order and spacing do not matter)."""
    try:
        return bool(json.loads(value) == json.loads(expected))
    except ValueError:
        return False


def _points_to(kv: KeyValue | None) -> str:
    """Where a written-over key sends clients now, for the report."""
    if kv is None:
        return "deleted"
    try:
        raw = json.loads(kv.value)
        return f"server {raw.get('server', raw.get('name'))!r} at {raw.get('endpoint')}"
    except (ValueError, AttributeError):
        return f"{len(kv.value)} bytes that are no entry"


def _holder(kv: KeyValue) -> str:
    """The server a ``devices/`` key names ("?" when it holds no device entry)."""
    try:
        return str(json.loads(kv.value).get("server", "?"))
    except (ValueError, AttributeError):
        return "?"


def _decode(b64: object) -> bytes:
    return base64.b64decode(str(b64))
