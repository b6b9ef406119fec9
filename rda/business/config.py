"""Settings for servers and clients: defaults < TOML file < ``RDA_*`` environment < arguments.

pydantic validates what comes from outside (files, the environment, arguments); its errors are
turned into one :class:`ConfigError` whose message names each bad setting, where it came from
(the environment variable to fix) and why it is wrong. The reference table is ``docs/config.md``.
"""

from __future__ import annotations

import getpass
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from rda.business.scheduler import OverflowPolicy
from rda.serialization.errors import RdaError
from rda.transport.api import TransportSettings
from rda.transport.protocol import DEFAULT_MAX_MESSAGE_SIZE

__all__ = ["ENV_PREFIX", "Config", "ConfigError", "default_directory_file", "etcd_endpoints"]

ENV_PREFIX = "RDA_"

_ENDPOINT = re.compile(r"^(tcp|ipc|inproc)://\S+$")


class ConfigError(RdaError, ValueError):
    """A setting is missing, malformed or out of range; the message lists every problem."""


def default_directory_file() -> Path:
    """Where servers on this machine register: per user, so two users never collide.

    ``$XDG_RUNTIME_DIR`` is per-user, private and cleared at logout, the right home for a
    registry of running processes; without it, a per-user folder under /tmp.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "rda" / "directory.json"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        # No login name (containers with an anonymous uid): the uid is unique enough.
        user = str(os.getuid())
    return Path("/tmp") / f"rda-{user}" / "directory.json"


class Config(BaseSettings):
    """Every rda setting, each overridable by an environment variable ``RDA_<NAME>``.

    ``Config()`` reads the environment; ``Config(workers=8)`` overrides it;
    ``Config.from_file("rda.toml")`` adds a TOML file below the environment. Immutable: derive
    variants with ``config.model_copy(update={...})``.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        validate_default=True,
        # ``RDA_METRICS_PORT=`` means "not set", not "the empty string".
        env_ignore_empty=True,
    )

    heartbeat_interval: float = Field(
        1.0, gt=0, description="Seconds of silence after which a peer sends a heartbeat."
    )
    heartbeat_timeout: float = Field(
        10.0, gt=0, description="Seconds of silence after which a peer is declared gone."
    )
    # 10 s, not 3 s: slow equipment operations outlive short defaults (pytango#304).
    request_timeout: float = Field(
        10.0, gt=0, description="Default client deadline for get/set, seconds."
    )
    directory_file: Path = Field(
        default_factory=default_directory_file,
        description="JSON file servers on this machine register their devices into.",
    )
    directory: dict[str, str] = Field(
        default_factory=dict,
        description="Static device name or glob pattern -> endpoint; consulted first.",
    )
    directory_url: str | None = Field(
        None,
        description="Facility directory: etcd://host1:2379,host2:2379 (etcds:// for TLS); "
        "servers register there, clients resolve there after the static mapping. None: off.",
    )
    directory_prefix: str = Field(
        "/rda/", min_length=1, description="Key prefix of this facility's entries in etcd."
    )
    directory_ttl: float = Field(
        10.0,
        ge=2.0,
        description="Seconds a killed server's entries outlive it in etcd (its lease's TTL).",
    )
    directory_fallback: bool = Field(
        False,
        description="With directory_url set: when etcd cannot be reached, resolve from the "
        "directory file instead of failing, and say so. False: etcd's outage is the answer.",
    )
    workers: int = Field(4, ge=1, le=1024, description="Scheduler worker threads.")
    queue_limit: int = Field(1000, ge=1, description="Waiting tasks per scheduler group.")
    overflow_policy: OverflowPolicy = Field(
        "reject", description="What a full group queue does with a new task."
    )
    reconnect_initial: float = Field(
        0.02, gt=0, description="First client reconnection back-off, seconds."
    )
    reconnect_max: float = Field(2.0, gt=0, description="Cap of the reconnection back-off.")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint; None: off."
    )
    metrics_devices: int = Field(
        200,
        ge=0,
        le=100_000,
        description="Server: (device, property) pairs with metrics of their own; past it "
        "requests count in the pair (other, other) (docs/metrics.md, cardinality).",
    )
    direct_calls: bool = Field(
        True,
        description="Blocking get/set go out on the calling thread's own connection (a "
        "lane), not through the client's dispatcher thread.",
    )
    lane_spin: float = Field(
        0.0,
        ge=0,
        le=0.01,
        description="Client: seconds a blocking get/set on its lane (direct_calls) polls for "
        "its reply before sleeping: lower latency for that much CPU per call; 0: no polling.",
    )
    max_message_size: int = Field(
        DEFAULT_MAX_MESSAGE_SIZE, ge=1024, description="Largest accepted message, bytes."
    )
    # A server's trade-off for slow or bursty clients (docs/server.md, "Subscriptions").
    peer_hwm: int = Field(
        1000,
        ge=1,
        description="Server: messages ZeroMQ buffers for one client before the server's own "
        "queue for it takes over and its notifications are conflated (latest wins, counted).",
    )
    handover_after: float = Field(
        0.002,
        ge=0,
        description="Server: a get/set handler still running on the dispatcher after this "
        "many seconds hands the dispatching to a standby thread; 0: no standby.",
    )
    # Read by the rda CLI's client commands (get/set/subscribe/admin), like --key/--server-key.
    key_file: Path | None = Field(
        None, description="CURVE key pair file of the rda CLI as a client; None: no CURVE."
    )
    server_key: str | None = Field(
        None, description="CURVE public key (Z85 text or a key file) of the server to reach."
    )
    principal: str | None = Field(
        None,
        description="Principal a client declares in CONNECT (believed only by servers that "
        "trust declared names: test stands without CURVE).",
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_readable(exc)) from exc
        except SettingsError as exc:
            # Raised for environment values that are not valid JSON for a structured field
            # (``RDA_DIRECTORY``); the JSON parser's complaint is the useful part.
            reason = f": {exc.__cause__}" if exc.__cause__ is not None else ""
            raise ConfigError(f"invalid rda configuration: {exc}{reason}") from exc

    @field_validator("directory_file")
    @classmethod
    def _expand_home(cls, path: Path) -> Path:
        # ``RDA_DIRECTORY_FILE=~/rda.json`` is not expanded by every shell (e.g. inside quotes).
        return path.expanduser()

    @field_validator("key_file")
    @classmethod
    def _expand_key_home(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()

    @field_validator("directory_url")
    @classmethod
    def _check_directory_url(cls, url: str | None) -> str | None:
        if url is not None:
            etcd_endpoints(url)  # raises ValueError naming what is wrong
        return url

    @field_validator("directory")
    @classmethod
    def _check_directory(cls, mapping: dict[str, str]) -> dict[str, str]:
        for pattern, endpoint in mapping.items():
            if not pattern.strip():
                raise ValueError("device names and patterns must not be empty")
            if not _ENDPOINT.match(endpoint):
                raise ValueError(
                    f"endpoint {endpoint!r} for {pattern!r} is not tcp://, ipc:// or inproc://"
                )
        return mapping

    @model_validator(mode="after")
    def _check_relations(self) -> Self:
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_timeout ({self.heartbeat_timeout}) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}), or every idle peer would be dropped"
            )
        if self.reconnect_max < self.reconnect_initial:
            raise ValueError(
                f"reconnect_max ({self.reconnect_max}) must be at least reconnect_initial "
                f"({self.reconnect_initial})"
            )
        return self

    @classmethod
    def from_file(cls, path: Path | str, **overrides: Any) -> Config:
        """Settings from a TOML file of top-level ``name = value`` pairs.

        The environment still wins over the file (so one variable can adjust a deployed file)
        and ``overrides`` win over both. A relative ``directory_file`` is taken relative to the
        TOML file's folder.
        """
        path = Path(path)
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read rda configuration file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"rda configuration file {path} is not valid TOML: {exc}") from exc
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise ConfigError(
                f"rda configuration file {path}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(cls.model_fields)}"
            )
        if isinstance(data.get("directory_file"), str):
            data["directory_file"] = path.parent / data["directory_file"]
        # Init arguments outrank the environment in pydantic-settings, so file values that the
        # environment also sets are left out: the environment source then supplies them.
        env_names = {name.upper() for name in os.environ}
        from_file = {
            name: value
            for name, value in data.items()
            if f"{ENV_PREFIX}{name}".upper() not in env_names
        }
        try:
            return cls(**{**from_file, **overrides})
        except ConfigError as exc:
            raise ConfigError(f"{exc} (file: {path})") from exc.__cause__

    def transport_settings(self) -> TransportSettings:
        """The subset the transport layer takes, with its other knobs at their defaults."""
        return TransportSettings(
            heartbeat_interval=self.heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
            max_message_size=self.max_message_size,
            handover_after=self.handover_after,
            lane_spin=self.lane_spin,
        )


def etcd_endpoints(url: str) -> list[str]:
    """``etcd://h1:2379,h2:2379`` -> ``["http://h1:2379", "http://h2:2379"]`` (``etcds://``:
    https). Plain ``http(s)://`` endpoints, comma-separated, are taken as they are."""
    scheme, sep, rest = url.partition("://")
    schemes = {"etcd": "http", "etcds": "https", "http": "http", "https": "https"}
    if not sep or scheme not in schemes:
        raise ValueError(
            f"directory URL {url!r} must start with etcd:// (or etcds://, http://, https://)"
        )
    hosts = [h.strip().rstrip("/") for h in rest.split(",")]
    for host in hosts:
        if not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[\w.-]+):\d{1,5}", host):
            raise ValueError(f"directory URL {url!r}: {host!r} is not host:port")
    return [f"{schemes[scheme]}://{h}" for h in hosts]


def _readable(exc: ValidationError) -> str:
    """One line per problem: the setting, its environment variable, the reason, the value."""
    lines = ["invalid rda configuration:"]
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        field = loc[0] if loc else ""
        where = ".".join(loc) if loc else "(settings as a whole)"
        if field in Config.model_fields:
            where += f" (env {ENV_PREFIX}{field.upper()})"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown setting; known: {', '.join(Config.model_fields)}"
        line = f"  {where}: {message}"
        if error["type"] not in ("missing", "value_error") and "input" in error:
            line += f" [got {error['input']!r}]"
        lines.append(line)
    return "\n".join(lines)
