"""The built-in admin commands: ping, info, clients, subscriptions, stats, devices, log-level,
disconnect, reload-policy, commands.

Each reads the server introspection API (``AdminServer``: snapshots from
``rda.business.server.statistics``) and answers plain data, so a script can use ``--json`` and a
human gets a table. Snapshots are converted generically (frozen dataclasses -> dicts) so a
counter the server adds later shows up here without a change.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.metadata
import logging
import os
import platform
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pydantic

from rda.admin.metrics import metrics_endpoint
from rda.admin.registry import AdminArgumentsError, AdminContext, command
from rda.business import driver
from rda.business.server.statistics import DeviceSnapshot, HistogramSnapshot
from rda.serialization.data import Data, DataType

__all__ = ["histogram_quantile", "plain"]

_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")


class PingArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    echo: str = ""


@command("ping", PingArgs)
def ping(ctx: AdminContext, args: PingArgs) -> dict[str, Any]:
    """Answer at once: proves the admin group is alive; ``echo`` is sent back."""
    return {"pong": True, "server": ctx.server.name, "time": driver.wall_time(), "echo": args.echo}


@command("info")
def info(ctx: AdminContext, args: pydantic.BaseModel) -> dict[str, Any]:
    """Name, version, uptime, endpoint, process and settings of the server."""
    server = ctx.server
    result: dict[str, Any] = {
        "name": server.name,
        "version": _version(),
        "endpoint": server.endpoint,
        "started_at": server.started_at,
        "uptime": server.uptime(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "devices": len(server.devices()),
        "commands": [c.name for c in ctx.registry.commands()],
        "directory": server.statistics().directory,
        "settings": plain(server.settings()),
    }
    endpoint = metrics_endpoint(server)
    if endpoint is not None:
        result["metrics_url"] = endpoint.url
    if ctx.registry.load_errors:
        result["plugin_errors"] = list(ctx.registry.load_errors)
    return result


@command("clients")
def clients(ctx: AdminContext, args: pydantic.BaseModel) -> Data:
    """Who is connected: peer id, client info, since when, last heard, subscriptions."""
    return _records("clients", [plain(snap) for snap in ctx.server.clients()])


class SubscriptionsArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    device: str = pydantic.Field("*", description="device glob")
    property: str = pydantic.Field("*", description="property glob")


@command("subscriptions", SubscriptionsArgs)
def subscriptions(ctx: AdminContext, args: SubscriptionsArgs) -> Data:
    """Per source: subscribers, notifications sent, last update, drops ("why is it blind?")."""
    rows = [
        plain(snap)
        for snap in ctx.server.sources()
        if fnmatch.fnmatchcase(snap.device, args.device)
        and fnmatch.fnmatchcase(snap.property, args.property)
    ]
    return _records("sources", rows)


@command("stats")
def stats(ctx: AdminContext, args: pydantic.BaseModel) -> dict[str, Any]:
    """Every component's statistics(): transport, scheduler, requests, latencies, totals."""
    snapshot = ctx.server.statistics()
    result: dict[str, Any] = {}
    for field in dataclasses.fields(snapshot):
        value = getattr(snapshot, field.name)
        if field.name == "requests":
            result["requests"] = _requests_table(value)
        elif field.name == "denied":
            # Principal names are free text: rows, not nested keys.
            rows = [
                {"principal": principal, "operation": operation, "count": int(count)}
                for (principal, operation), count in sorted(value.items())
            ]
            denied = Data(count=sum(r["count"] for r in rows))
            denied.append("rows", rows, type=DataType.DATA_ARRAY)
            result["denied"] = denied
        elif field.name == "durations":
            result["durations"] = {t: _histogram(h) for t, h in sorted(value.items())}
        elif field.name == "devices":
            result["devices"] = _device_rows(value)
        elif field.name == "scheduler":
            scheduler = plain(dataclasses.replace(value, busiest=()))
            busiest = [{"group": group, "waiting": int(n)} for group, n in value.busiest]
            scheduler["busiest"] = Data(count=len(busiest))
            scheduler["busiest"].append("rows", busiest, type=DataType.DATA_ARRAY)
            result["scheduler"] = scheduler
        else:
            result[field.name] = plain(value)
    return result


@command("devices")
def devices(ctx: AdminContext, args: pydantic.BaseModel) -> dict[str, Any]:
    """The devices this server serves and, for ``Device`` objects, their properties."""
    names = sorted(ctx.server.devices())
    result: dict[str, Any] = {"count": len(names), "devices": names}
    # Optional in the AdminServer protocol: a server without it lists names only.
    properties = getattr(ctx.server, "properties", None)
    if callable(properties):
        result["properties"] = {
            device: _records("properties", rows) for device, rows in properties().items()
        }
    return result


class LogLevelArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    logger: str = pydantic.Field("rda", description="logger name ('' or 'root' for root)")
    level: str | None = pydantic.Field(None, description="new level; omit to read")

    @pydantic.field_validator("level")
    @classmethod
    def _known_level(cls, value: str | None) -> str | None:
        if value is None:
            return None
        upper = value.upper()
        if upper not in _LEVELS:
            raise ValueError(f"unknown level {value!r}; expected one of {', '.join(_LEVELS)}")
        return upper


@command("log-level", LogLevelArgs)
def log_level(ctx: AdminContext, args: LogLevelArgs) -> dict[str, Any]:
    """Read or change a logger's level at run time (``level=DEBUG logger=rda.business``)."""
    name = "" if args.logger in ("", "root") else args.logger
    logger = logging.getLogger(name)
    previous = logging.getLevelName(logger.getEffectiveLevel())
    if args.level is not None:
        logger.setLevel(args.level)
    return {
        "logger": args.logger or "root",
        "level": logging.getLevelName(logger.getEffectiveLevel()),
        "previous": previous,
    }


class DisconnectArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    peer: str = pydantic.Field(description="the client's peer id (hex), from `clients`")


@command("disconnect", DisconnectArgs)
def disconnect(ctx: AdminContext, args: DisconnectArgs) -> dict[str, Any]:
    """Drop one client connection; it may reconnect (its subscriptions restart with FIRST)."""
    if not ctx.server.disconnect_client(args.peer):
        raise AdminArgumentsError(f"disconnect: no connected client with peer id {args.peer!r}")
    return {"disconnected": args.peer}


class ReloadPolicyArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    allow_empty: bool = pydantic.Field(
        False, description="put in force a policy that would lock everyone out (docs/security.md)"
    )


@command("reload-policy", ReloadPolicyArgs)
def reload_policy(ctx: AdminContext, args: ReloadPolicyArgs) -> dict[str, Any]:
    """Re-read the server's policy file; a broken file, or one that would lock everyone out
    (no rules, nobody left who may reload), is refused and the old policy stays."""
    # No path argument on purpose: a remote caller must not make the server read any file.
    reload = getattr(ctx.server, "reload_policy", None)
    if reload is None:
        raise AdminArgumentsError("reload-policy: this server has no authorization policy")
    policy = reload(allow_empty=args.allow_empty)
    return {
        "source": policy.source,
        "roles": len(policy.roles),
        "principals": len(policy.principals),
        "rules": len(policy.rules),
    }


@command("commands")
def commands(ctx: AdminContext, args: pydantic.BaseModel) -> dict[str, Any]:
    """List the admin commands with their arguments."""
    rows = []
    for spec in ctx.registry.commands():
        fields = spec.args_model.model_fields
        rows.append(
            {
                "name": spec.name,
                "arguments": " ".join(
                    f"{n}={'...' if f.is_required() else repr(f.default)}"
                    for n, f in fields.items()
                ),
                "help": spec.help,
            }
        )
    return {"commands": rows}


def plain(value: Any) -> Any:
    """A snapshot (frozen dataclass, dict, tuple) as Data-friendly plain values.

    None fields are left out (Data has no null); tuples of numbers become numpy arrays so they
    keep their type; dict keys become strings.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, Mapping):
        return {_key(k): plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            kinds = {type(v) for v in value}
            return np.asarray(value, dtype=np.int64 if kinds == {int} else np.float64)
        if value and all(isinstance(v, str) for v in value):
            return list(value)
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, bool | int | float | str | np.ndarray | np.generic):
        return value
    return str(value)


def histogram_quantile(q: float, buckets: tuple[float, ...], counts: tuple[int, ...]) -> float:
    """Estimate a quantile from per-bucket counts (upper bound of the bucket reaching q).

    ``counts`` has one more entry than ``buckets`` (+Inf); a quantile falling there answers
    the last finite bound, as PromQL's histogram_quantile does. NaN when there is no sample.
    """
    total = sum(counts)
    if total == 0:
        return float("nan")
    rank = q * total
    running = 0
    for bound, count in zip(buckets, counts, strict=False):
        running += count
        if running >= rank:
            return bound
    return buckets[-1] if buckets else float("nan")


def _records(name: str, rows: list[dict[str, Any]]) -> Data:
    """``{count, name: rows}`` with ``rows`` pinned as a Data array even when empty (an empty
    list would otherwise infer as an empty float64 array)."""
    result = Data(count=len(rows))
    result.append(name, rows, type=DataType.DATA_ARRAY)
    return result


def _requests_table(requests: Mapping[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    # Every (type, outcome) exists from the start for the metrics; a person reads what moved.
    table: dict[str, dict[str, int]] = {}
    for (kind, outcome), count in sorted(requests.items()):
        if count:
            table.setdefault(kind, {})[outcome] = int(count)
    return table


def _device_rows(pairs: Sequence[DeviceSnapshot]) -> Data:
    """Per (device, property): requests, errors and latency quantiles, as rows (names are free
    text, so not keys); pairs without a request left out."""
    rows = []
    for pair in pairs:
        if not pair.requests:
            continue
        hist = _histogram(pair.durations)
        rows.append(
            {
                "device": pair.device,
                "property": pair.property,
                "requests": int(pair.requests),
                "errors": int(pair.errors),
                "p50": float(hist.get("p50", 0.0)),
                "p99": float(hist.get("p99", 0.0)),
            }
        )
    table = Data(count=len(rows))
    table.append("rows", rows, type=DataType.DATA_ARRAY)
    return table


def _histogram(snapshot: HistogramSnapshot) -> dict[str, Any]:
    buckets = tuple(float(b) for b in snapshot.buckets)
    counts = tuple(int(c) for c in snapshot.counts)
    count = int(snapshot.count)
    result: dict[str, Any] = {
        "count": count,
        "sum": float(snapshot.sum),
        "buckets": np.asarray(buckets, dtype=np.float64),
        "counts": np.asarray(counts, dtype=np.int64),
    }
    if count:
        result["mean"] = float(snapshot.sum) / count
        result["p50"] = histogram_quantile(0.5, buckets, counts)
        result["p99"] = histogram_quantile(0.99, buckets, counts)
    return result


def _key(key: object) -> str:
    if isinstance(key, tuple):
        return "/".join(str(k) for k in key)
    return str(key)


def _version() -> str:
    try:
        return importlib.metadata.version("rda")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
