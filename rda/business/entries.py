"""Who holds a name in a directory: the :class:`ServerEntry` of a registered server, and the
one-live-server-per-name rule the file and etcd directories share (:func:`conflict`,
:class:`NameTakenError`): a name or glob pattern is taken when it *overlaps* one a live server
holds (:func:`overlap`: some device name matches both), so ``D1`` or ``*`` cannot be claimed
beside a live ``D*``. With the record parsing and process checks of the file directory, and
the liveness probe both directories use when a pid alone cannot tell (:func:`endpoint_answers`:
a process in another PID namespace is invisible here, yet alive).

Kept apart from ``directory.py`` so that the etcd directory (``rda.business.etcd``) shares them
without importing the file directory's machinery, and each file stays one job.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import translate
from pathlib import Path
from typing import Any, NamedTuple

from rda.serialization.errors import RdaError

__all__ = [
    "NameTakenError",
    "Record",
    "ServerEntry",
    "conflict",
    "endpoint_answers",
    "globs_intersect",
    "overlap",
    "parse_record",
    "process_start",
]

_GLOB_CHARS = frozenset("*?[")


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
    """The first clash of ``server``/``devices`` with another live server's entry: the same
    server name, or a device name or pattern that overlaps one of its own."""
    wanted = sorted(set(devices))
    for other in others:
        if other.name == server:
            return f"server name {server!r}", other
        found = overlap(wanted, other.devices)
        if found is not None:
            return clash_text(server, *found), other
    return None


def clash_text(server: str, mine: str, theirs: str) -> str:
    """How a clash of ``server``'s ``mine`` with another's ``theirs`` is named in an error."""
    if mine == theirs:
        return f"device {mine!r} (of server {server!r})"
    return f"device {mine!r} (of server {server!r}) overlaps {theirs!r}, which"


def is_pattern(name: str) -> bool:
    return not _GLOB_CHARS.isdisjoint(name)


def overlap(mine: Iterable[str], theirs: Iterable[str]) -> tuple[str, str] | None:
    """The first ``(mine, theirs)`` pair of device names or glob patterns that some device name
    matches both (``D1``/``D*``, ``D*``/``*``, ``D[12]``/``?2``), or None. Exact names are a
    set lookup and a pattern is compiled once, so thousands of names on each side stay cheap."""
    exact: set[str] = set()
    patterns: list[tuple[str, re.Pattern[str]]] = []
    for name in theirs:
        if is_pattern(name):
            patterns.append((name, re.compile(translate(name))))
        else:
            exact.add(name)
    for name in mine:
        if not is_pattern(name):
            if name in exact:
                return name, name
            for other, compiled in patterns:
                if compiled.match(name):
                    return name, other
            continue
        mine_compiled = re.compile(translate(name))
        for other in sorted(exact):
            if mine_compiled.match(other):
                return name, other
        for other, _ in patterns:
            if globs_intersect(name, other):
                return name, other
    return None


# A glob as tokens: None for "*", else a character class (negated, inclusive code-point ranges).
_Class = tuple[bool, tuple[tuple[int, int], ...]]


def _tokens(pattern: str) -> list[_Class | None]:
    """``pattern`` read as ``fnmatch`` reads it: ``*``, ``?``, ``[...]``/``[!...]`` (a ``[``
    without its ``]`` is a plain character), everything else literal."""
    tokens: list[_Class | None] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not tokens or tokens[-1] is not None:
                tokens.append(None)
        elif c == "?":
            tokens.append((True, ()))
        elif c == "[":
            j = i + 1 if i < n and pattern[i] == "!" else i
            j = j + 1 if j < n and pattern[j] == "]" else j
            close = pattern.find("]", j)
            if close < 0:
                tokens.append((False, ((ord("["), ord("[")),)))
                continue
            body = pattern[i:close]
            negated = body.startswith("!")
            body = body[1:] if negated else body
            ranges: list[tuple[int, int]] = []
            k = 0
            while k < len(body):
                if k + 2 < len(body) and body[k + 1] == "-":
                    ranges.append((ord(body[k]), ord(body[k + 2])))
                    k += 3
                else:
                    ranges.append((ord(body[k]), ord(body[k])))
                    k += 1
            tokens.append((negated, tuple(ranges)))
            i = close + 1
        else:
            tokens.append((False, ((ord(c), ord(c)),)))
    return tokens


def _accepts(token: _Class, char: int) -> bool:
    negated, ranges = token
    return negated != any(lo <= char <= hi for lo, hi in ranges)


def _share_a_character(a: _Class, b: _Class) -> bool:
    # Which classes a character belongs to changes only at a range's ends: trying each end,
    # its neighbours, and the extremes tries every distinct case.
    candidates = {0, 0x10FFFF}
    for _, ranges in (a, b):
        for lo, hi in ranges:
            candidates.update((lo - 1, lo, hi, hi + 1))
    return any(_accepts(a, c) and _accepts(b, c) for c in candidates if 0 <= c <= 0x10FFFF)


def globs_intersect(a: str, b: str) -> bool:
    """Whether some string matches both ``fnmatch`` patterns ``a`` and ``b`` (exact: a search
    over pairs of positions in the two patterns)."""
    ta, tb = _tokens(a), _tokens(b)
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(ta) and j == len(tb):
            return True
        x = ta[i] if i < len(ta) else _END
        y = tb[j] if j < len(tb) else _END
        if x is None:
            todo.append((i + 1, j))  # "*" matches nothing more
            if y is not None and y is not _END:
                todo.append((i, j + 1))  # "*" takes the character b's class takes
        if y is None:
            todo.append((i, j + 1))
            if x is not None and x is not _END:
                todo.append((i + 1, j))
        if x is not None and y is not None and _END not in (x, y) and _share_a_character(x, y):
            todo.append((i + 1, j + 1))
    return False


# Past a pattern's last token (a class no character is in, compared by identity only).
_END: _Class = (False, ())


def endpoint_answers(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether something accepts a connection at ``endpoint`` (``tcp://`` or ``ipc://``): the
    liveness proof of a directory entry whose pid cannot be checked here (another PID
    namespace, a container with the host's network). A wildcard host is tried on loopback."""
    scheme, _, rest = endpoint.partition("://")
    try:
        if scheme == "tcp":
            host, _, port = rest.rpartition(":")
            host = host.strip("[]")
            if host in ("*", "0.0.0.0", "::", ""):
                host = "127.0.0.1"
            with socket.create_connection((host, int(port)), timeout=timeout):
                return True
        if scheme == "ipc":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(rest)
                return True
    except (OSError, ValueError):
        return False
    return False  # inproc://: only within one process


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
