"""A typed client of etcd's v3 HTTP/JSON gateway (``/v3/kv/*``, ``/v3/lease/*``, ``/v3/watch``).

Why the gateway over httpx rather than a gRPC client: the gateway is part of every etcd >= 3.3
(3.4 serves ``/v3/`` and ``/v3beta/``), so no generated stubs or grpcio wheel; httpx is typed,
maintained and lets us bound every call (connect/read timeouts), which is what "a new
resolution fails fast when etcd is down" needs. The few calls rda makes (range, put, txn,
lease grant/keep-alive/revoke, watch) are each one JSON POST.

Messages are protobuf JSON: keys and values are base64, 64-bit integers are decimal strings,
and fields at their zero value are left out (an event without ``type`` is a PUT, a keep-alive
answer without ``TTL`` means the lease is gone).

A cluster is several endpoints: a call goes to the last one that answered and moves on to the
next when it cannot connect; only when none answers does it raise
:class:`~rda.business.directory.DirectoryUnavailableError`, naming every endpoint and the cause.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from rda.business.directory import DirectoryUnavailableError
from rda.serialization.errors import RdaError

__all__ = ["EtcdGateway", "EtcdRequestError", "Event", "KeyValue", "WatchStream", "prefix_end"]

# gRPC status code etcd answers with for an unknown (expired or revoked) lease.
_NOT_FOUND = 5


class EtcdRequestError(RdaError):
    """etcd answered, with an error (bad request, too many operations, lease not found...)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    @property
    def not_found(self) -> bool:
        return self.code == _NOT_FOUND


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    lease: int
    create_revision: int
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Event:
    """One change seen by a watch: ``kv.value`` is empty for a DELETE."""

    deleted: bool
    kv: KeyValue


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return "\0"  # every key
    raw[-1] += 1
    return raw.decode("latin-1")


def _key_value(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")).decode(),
        value=base64.b64decode(raw.get("value", "")),
        lease=int(raw.get("lease", 0)),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
    )


def _range_end_b64(end: str) -> str:
    return _b64(end.encode("latin-1"))


def compare_absent(key: str) -> dict[str, Any]:
    """A txn comparison true when ``key`` does not exist (created at revision 0)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def compare_mod(key: str, revision: int) -> dict[str, Any]:
    """A txn comparison true when ``key`` was last modified at ``revision`` (unchanged since)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def range_op(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


class EtcdGateway:
    """Blocking calls to one etcd cluster; thread-safe (httpx's client is)."""

    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("an etcd directory needs at least one endpoint")
        self.endpoints = tuple(e.rstrip("/") for e in endpoints)
        self.timeout = timeout
        # Plain http:// endpoints need no TLS: skipping the CA bundle saves ~30 ms per client.
        self.tls = any(e.startswith("https://") for e in self.endpoints)
        self._client = self.http_client(httpx.Timeout(timeout))
        self._current = 0
        self._lock = threading.Lock()
        # The store's revision after this process's latest write: a cache behind it has not
        # seen our own registration yet (the watch delivers it a moment later).
        self.written_revision = 0

    def __repr__(self) -> str:
        return f"EtcdGateway({','.join(self.endpoints)})"

    def http_client(self, timeout: httpx.Timeout) -> httpx.Client:
        return httpx.Client(timeout=timeout, trust_env=False, verify=self.tls)

    def close(self) -> None:
        self._client.close()

    # -- plumbing ----------------------------------------------------------------------------

    def endpoints_in_order(self) -> list[str]:
        """The gateway's endpoints, the one that answered last first (a watch and a call try
        them in this order)."""
        first = self._current
        return [
            self.endpoints[(first + i) % len(self.endpoints)] for i in range(len(self.endpoints))
        ]

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` on the first endpoint that answers."""
        causes: list[str] = []
        for base in self.endpoints_in_order():
            try:
                response = self._client.post(f"{base}/v3/{path}", json=body)
            except httpx.TransportError as exc:
                causes.append(f"{base}: {exc or type(exc).__name__}")
                continue
            with self._lock:
                self._current = self.endpoints.index(base)
            return _answer(response, path)
        raise DirectoryUnavailableError(
            f"etcd directory {','.join(self.endpoints)} is unreachable ({'; '.join(causes)})"
        )

    # -- key-value ---------------------------------------------------------------------------

    def range(
        self, key: str, *, prefix: bool = False, keys_only: bool = False
    ) -> tuple[int, list[KeyValue]]:
        """``(revision, kvs)`` for ``key`` (or every key under it with ``prefix``);
        ``keys_only``: without the values (empty), revisions and leases still given."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _range_end_b64(prefix_end(key))
        if keys_only:
            body["keys_only"] = True
        answer = self.call("kv/range", body)
        revision = int(answer.get("header", {}).get("revision", 0))
        return revision, [_key_value(kv) for kv in answer.get("kvs", [])]

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self._wrote(self.call("kv/put", put_op(key, value, lease)["request_put"]))

    def delete(self, key: str) -> None:
        self._wrote(self.call("kv/deleterange", {"key": _b64(key)}))

    def _wrote(self, answer: dict[str, Any]) -> None:
        revision = int(answer.get("header", {}).get("revision", 0))
        with self._lock:
            self.written_revision = max(self.written_revision, revision)

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]],
    ) -> tuple[bool, list[dict[str, Any]]]:
        """``(succeeded, responses)``; each response is the gateway's JSON of one operation."""
        answer = self.call("kv/txn", {"compare": compare, "success": success, "failure": failure})
        self._wrote(answer)
        return bool(answer.get("succeeded", False)), list(answer.get("responses", []))

    # -- leases ------------------------------------------------------------------------------

    def grant(self, ttl: float) -> int:
        answer = self.call("lease/grant", {"TTL": str(max(1, round(ttl)))})
        return int(answer["ID"])

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; its remaining TTL in seconds, 0 when it has expired."""
        answer = self.call("lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    def lease_keys(self, lease: int) -> set[str] | None:
        """The keys attached to ``lease`` now; None when it has expired (or never was)."""
        answer = self.call("lease/timetolive", {"ID": str(lease), "keys": True})
        if int(answer.get("TTL", -1)) < 0:
            return None
        return {base64.b64decode(k).decode() for k in answer.get("keys", [])}

    def revoke(self, lease: int) -> None:
        """Drop ``lease`` and every key attached to it; an unknown lease is no error."""
        try:
            self._wrote(self.call("lease/revoke", {"ID": str(lease)}))
        except EtcdRequestError as exc:
            if not exc.not_found:
                raise

    # -- watch -------------------------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int, idle_timeout: float) -> WatchStream:
        """A stream of the changes under ``prefix`` from ``start_revision`` on."""
        return WatchStream(self, prefix, start_revision, idle_timeout)


class WatchStream:
    """One ``/v3/watch`` HTTP stream. Iterate it on one thread; :meth:`stop` from another
    shuts its socket down so the blocked read returns at once (closing alone would not wake
    it). ``idle_timeout`` bounds a silent stream: a partitioned etcd is found out then."""

    def __init__(
        self, gateway: EtcdGateway, prefix: str, start_revision: int, idle_timeout: float
    ) -> None:
        self._gateway = gateway
        self._prefix = prefix
        self._start = start_revision
        self._timeout = httpx.Timeout(gateway.timeout, read=idle_timeout)
        self._client = gateway.http_client(self._timeout)
        self._sock: socket.socket | None = None
        self._stopped = threading.Event()

    def events(self) -> Iterator[tuple[int, list[Event]]]:
        """``(revision, events)`` per message; returns when stopped; raises
        ``DirectoryUnavailableError`` when the stream cannot be opened or breaks."""
        body = {
            "create_request": {
                "key": _b64(self._prefix),
                "range_end": _range_end_b64(prefix_end(self._prefix)),
                "start_revision": str(self._start),
            }
        }
        causes: list[str] = []
        for base in self._gateway.endpoints_in_order():
            if self._stopped.is_set():
                return
            try:
                with self._client.stream("POST", f"{base}/v3/watch", json=body) as response:
                    if response.status_code != 200:
                        response.read()
                        _answer(response, "watch")
                    stream = response.extensions.get("network_stream")
                    if stream is not None:
                        self._sock = stream.get_extra_info("socket")
                    if self._stopped.is_set():
                        return
                    yield from self._messages(response)
                    return
            except httpx.ReadTimeout:
                return  # silent for the idle time: the caller watches again
            except (httpx.TransportError, httpx.StreamError) as exc:
                if self._stopped.is_set():
                    return
                causes.append(f"{base}: {exc or type(exc).__name__}")
        raise DirectoryUnavailableError(
            f"etcd directory {','.join(self._gateway.endpoints)}: watch lost ({'; '.join(causes)})"
        )

    def _messages(self, response: httpx.Response) -> Iterator[tuple[int, list[Event]]]:
        for line in response.iter_lines():
            if not line.strip():
                continue
            message = json.loads(line)
            if "error" in message:
                error = message["error"]
                raise EtcdRequestError(f"etcd watch: {error}", int(error.get("grpc_code", 0)))
            result = message.get("result", {})
            if result.get("canceled"):
                # Compacted past our revision, or the server cancelled: start over.
                raise EtcdRequestError(
                    f"etcd watch cancelled: {result.get('cancel_reason', 'no reason given')}", 0
                )
            revision = int(result.get("header", {}).get("revision", 0))
            events = [
                Event(deleted=e.get("type") == "DELETE", kv=_key_value(e.get("kv", {})))
                for e in result.get("events", [])
            ]
            yield revision, events
        if not self._stopped.is_set():
            raise httpx.RemoteProtocolError("the watch stream ended")

    def stop(self) -> None:
        self._stopped.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.stop()
        self._client.close()


def _answer(response: httpx.Response, path: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise EtcdRequestError(
            f"etcd {path}: HTTP {response.status_code}, not JSON: {response.text[:200]!r}", 0
        ) from exc
    if response.status_code != 200 or "error" in body:
        message = body.get("message") or body.get("error") or f"HTTP {response.status_code}"
        raise EtcdRequestError(f"etcd {path}: {message}", int(body.get("code", 0)))
    return dict(body)
