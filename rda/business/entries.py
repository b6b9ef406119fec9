"""Who holds a name in a directory: the :class:`ServerEntry` of a registered server, and the
one-live-server-per-name rule the file and etcd directories share (:func:`conflict`,
:class:`NameTakenError`), with the record parsing and process checks of the file directory.

Kept apart from ``directory.py`` so that the etcd directory (``rda.business.etcd``) shares them
without importing the file directory's machinery, and each file stays one job.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rda.serialization.errors import RdaError

__all__ = ["NameTakenError", "Record", "ServerEntry", "conflict", "parse_record", "process_start"]


@dataclass(frozen=True, slots=True)
class ServerEntry:
    """One server registered in a :class:`FileDirectory`."""

    name: str
    endpoint: str
    devices: tuple[str, ...]
    pid: int
    host: str
    registered_at: float  # seconds since the epoch
    server_key: str | None = None  # CURVE public key of a server with security

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.registered_at))
        return (
            f"server {self.name!r} on host {self.host}, pid {self.pid}, at {self.endpoint}, "
            f"since {since}"
        )


class NameTakenError(RdaError):
    """A live server (``owner``) already holds the server name or a device being registered."""

    def __init__(self, what: str, owner: ServerEntry, where: str, hint: str = "") -> None:
        super().__init__(
            f"{what} is already registered in {where} by {owner.describe()}; stop that server, "
            "or take the entry over on purpose (rda serve --replace, ServerBuilder.replace())"
            + (f"; {hint}" if hint else "")
        )
        self.owner = owner


def conflict(
    server: str, devices: Iterable[str], others: Iterable[ServerEntry]
) -> tuple[str, ServerEntry] | None:
    """The first clash of ``server``/``devices`` with another live server's entry."""
    wanted = set(devices)
    for other in others:
        if other.name == server:
            return f"server name {server!r}", other
        taken = sorted(wanted.intersection(other.devices))
        if taken:
            return f"device {taken[0]!r} (of server {server!r})", other
    return None


class Record(NamedTuple):
    entry: ServerEntry
    start: int | None  # process start time, to tell a live process from a recycled pid


def parse_record(name: str, raw: dict[str, Any]) -> Record | None:
    """A record from the file, or None if it is malformed (hand-edited)."""
    endpoint, devices = raw.get("endpoint"), raw.get("devices")
    pid, host, at = raw.get("pid"), raw.get("host"), raw.get("registered_at")
    if (
        not isinstance(endpoint, str)
        or not isinstance(devices, list)
        or not all(isinstance(d, str) for d in devices)
        or not isinstance(pid, int)
        or isinstance(pid, bool)
        or pid <= 0
        or not isinstance(host, str)
        or not isinstance(at, int | float)
    ):
        return None
    start = raw.get("start")
    if not isinstance(start, int) or isinstance(start, bool):
        start = None
    key = raw.get("server_key")
    entry = ServerEntry(
        name, endpoint, tuple(devices), pid, host, float(at), key if isinstance(key, str) else None
    )
    return Record(entry, start)


def process_start(pid: int) -> int | None:
    """The process start time in clock ticks since boot (Linux ``/proc``), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None
