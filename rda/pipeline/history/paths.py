"""Arguments of the History API (signals, times, durations) and the store files a call reads.

Everything here is plain Python on the store directory (no Spark): a call first resolves the
exact Parquet files of the partitions ``device=D/property=P/date=YYYY-MM-DD`` its window touches,
then groups them by the type of their ``data`` column (read from the Parquet footers, cached),
so ``rda.pipeline.history.api`` can hand Spark an explicit file list and schema: no directory scan
of the store, no schema inference job.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rda.pipeline.recorder.schema import SchemaCatalog, merge_types, partition_escape
from rda.pipeline.recorder.store import Store

__all__ = [
    "DAY_NS",
    "FileGroup",
    "Signal",
    "StoreIndex",
    "days_between",
    "parse_duration",
    "parse_signals",
    "parse_time",
]

DAY_NS = 86_400 * 10**9
_GLOB = re.compile(r"[*?\[]")
_NAME = re.compile(r"^[^\s/#]+$")
_FIELD = re.compile(r"^[^\s/#.]+(\.[^\s/#.]+)*$")
_UNITS = {
    "ns": 1,
    "us": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "min": 60 * 10**9,
    "h": 3_600 * 10**9,
    "d": DAY_NS,
    "w": 7 * DAY_NS,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ns|us|ms|s|min|m|h|d|w)\s*$")


@dataclass(frozen=True, slots=True)
class Signal:
    """One parsed signal: device and property (either may be a glob) and an optional field path."""

    device: str
    prop: str
    field: str | None = None

    @property
    def text(self) -> str:
        base = f"{self.device}/{self.prop}"
        return base if self.field is None else f"{base}#{self.field}"

    def matches(self, device: str, prop: str) -> bool:
        return fnmatch.fnmatchcase(device, self.device) and fnmatch.fnmatchcase(prop, self.prop)


def _check_glob(part: str, argument: str, text: str) -> None:
    if not _NAME.match(part):
        raise ValueError(f"{argument}: {text!r} is not DEVICE/PROPERTY[#field]")
    if part.count("[") != part.count("]"):
        raise ValueError(f"{argument}: {text!r} has an unbalanced '[' in its glob")


def parse_signal(text: str, argument: str = "signals") -> Signal:
    """Parse ``"DEV/Prop"`` or ``"DEV/Prop#field.sub"``; ValueError naming ``argument``."""
    if not isinstance(text, str):
        raise ValueError(f"{argument}: expected a string, got {type(text).__name__}")
    target, hash_, field_path = text.partition("#")
    device, slash, prop = target.partition("/")
    if not slash:
        raise ValueError(f"{argument}: {text!r} is not DEVICE/PROPERTY[#field]")
    _check_glob(device, argument, text)
    _check_glob(prop, argument, text)
    if hash_ and not _FIELD.match(field_path):
        raise ValueError(f"{argument}: {text!r} has a malformed field path {field_path!r}")
    return Signal(device, prop, field_path if hash_ else None)


def parse_signals(signals: str | Sequence[str], argument: str = "signals") -> list[Signal]:
    """One signal or a list of them (each may be a glob)."""
    if isinstance(signals, str):
        return [parse_signal(signals, argument)]
    if not isinstance(signals, Sequence) or not signals:
        raise ValueError(f"{argument}: expected a signal or a non-empty list of signals")
    return [parse_signal(s, argument) for s in signals]


def parse_time(value: Any, argument: str) -> int:
    """ns since the epoch (UTC) from a datetime (naive = UTC), an ISO string or an int of ns."""
    if isinstance(value, bool):
        raise ValueError(f"{argument}: a bool is not a time")
    if isinstance(value, int) or type(value).__name__ in ("int64", "int32"):
        return int(value)  # numpy integers too
    nanos = getattr(value, "value", None)
    if type(value).__name__ == "Timestamp" and isinstance(nanos, int):
        return nanos  # pandas: ns since the epoch, UTC (naive counts as UTC), ns kept
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{argument}: {value!r} is not an ISO 8601 time") from None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        delta: datetime.timedelta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1_000
    if isinstance(value, datetime.date):
        return int((value - datetime.date(1970, 1, 1)).days) * DAY_NS
    raise ValueError(f"{argument}: {value!r} is not a time (datetime, ISO string or ns int)")


def parse_duration(value: Any, argument: str) -> int:
    """ns from ``"10s"``, ``"500ms"``, ``"1h"``, ``"1d"``, a timedelta or an int of ns (> 0)."""
    nanos: int
    if isinstance(value, bool):
        raise ValueError(f"{argument}: a bool is not a duration")
    if isinstance(value, int):
        nanos = value
    elif isinstance(value, datetime.timedelta):
        nanos = (value.days * 86_400 + value.seconds) * 10**9 + value.microseconds * 1_000
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        nanos = round(float(match[1]) * _UNITS[match[2]])
    else:
        raise ValueError(f"{argument}: {value!r} is not a duration like '10s', '5min', '1h', '1d'")
    if nanos <= 0:
        raise ValueError(f"{argument}: {value!r} must be positive")
    return nanos


def days_between(start: int, end: int) -> list[str]:
    """The UTC days (``YYYY-MM-DD``) that ``[start, end)`` touches, in order."""
    if end <= start:
        return []
    first, last = start // DAY_NS, (end - 1) // DAY_NS
    epoch = datetime.date(1970, 1, 1)
    return [(epoch + datetime.timedelta(days=d)).isoformat() for d in range(first, last + 1)]


@dataclass(slots=True)
class FileGroup:
    """Files whose ``data`` types merge into one: Spark reads them in one go with ``data_type``.

    ``keys`` are the (device, property) pairs the files belong to; ``data_type`` is None for
    files whose ``data`` column is null-typed (only error rows, recorded before any value).
    """

    data_type: pa.DataType | None
    files: list[str] = field(default_factory=list)
    keys: set[tuple[str, str]] = field(default_factory=set)


def _mtime(info: pafs.FileInfo) -> int:
    """A file's mtime in ns (0 where the filesystem keeps none: the size still tells a change)."""
    return int(info.mtime_ns or 0)


def _unescape(entry: str, prefix: str) -> str | None:
    return unquote(entry[len(prefix) :]) if entry.startswith(prefix) else None


class StoreIndex:
    """Reads the store's directory tree and Parquet footers (cached by path, mtime and size).

    ``root`` is a local path, a store URI or a ``Store``: every listing and read goes through
    its ``pyarrow.fs`` filesystem, and the file paths handed out are that filesystem's.
    """

    def __init__(self, root: Store | Path | str) -> None:
        self.store = Store.open(root)
        self.root = self.store.base
        self._footers: dict[str, tuple[int, int, pa.DataType | None]] = {}
        self._seen: dict[str, tuple[int, int]] = {}  # (mtime, size) from the last listing

    # --- keys -----------------------------------------------------------------------------------

    def keys(self, signals: Iterable[Signal]) -> list[tuple[str, str]]:
        """The (device, property) pairs of the store that the signals name, sorted."""
        found: set[tuple[str, str]] = set()
        for signal in signals:
            for device in self._names(self.root, "device=", signal.device):
                directory = self.store.path(f"device={partition_escape(device)}")
                for prop in self._names(directory, "property=", signal.prop):
                    found.add((device, prop))
        return sorted(found)

    def _names(self, directory: str, prefix: str, pattern: str) -> list[str]:
        if not _GLOB.search(pattern):  # a literal name: one stat, no listing
            path = f"{directory.rstrip('/')}/{prefix}{partition_escape(pattern)}"
            return [pattern] if self.store.is_dir(path) else []
        names = (_unescape(entry, prefix) for entry in self.store.listdir(directory))
        return [n for n in names if n is not None and fnmatch.fnmatchcase(n, pattern)]

    def key_dir(self, device: str, prop: str) -> str:
        return self.store.path(
            f"device={partition_escape(device)}", f"property={partition_escape(prop)}"
        )

    def days(self, device: str, prop: str) -> list[str]:
        """Every day a property has a partition for, sorted."""
        names = (_unescape(e, "date=") for e in self.store.listdir(self.key_dir(device, prop)))
        return [n for n in names if n is not None]

    # --- files ----------------------------------------------------------------------------------

    def files(self, device: str, prop: str, days: Iterable[str]) -> list[str]:
        """The Parquet files of the given days of one property (those that exist)."""
        out: list[str] = []
        for day in self._present(device, prop, list(days)):
            directory = f"{self.key_dir(device, prop)}/date={day}"
            entries = self.store.files(directory)
            names = [
                str(e.base_name)
                for e in entries
                if e.base_name.endswith(".parquet") and not e.base_name.startswith(("_", "."))
            ]
            if any(e.base_name == "_compaction.json" for e in entries):
                names = self._skip_compacted(directory, names)
            for entry in entries:  # the listing gave size and mtime: no stat per footer
                self._seen[entry.path] = (_mtime(entry), int(entry.size))
            out.extend(f"{directory}/{n}" for n in names)
        return out

    def _present(self, device: str, prop: str, days: list[str]) -> list[str]:
        """The days asked for that the property has a partition for, in the order asked.

        A window of many days (a query "since ever" spans 20,000) would otherwise cost a
        listing per day, nearly all of directories that do not exist, for every signal: list
        the property's days once instead when they are fewer."""
        if len(days) <= 2:
            return days
        present = self.days(device, prop)
        if len(present) >= len(days):
            return days
        first, last = days[0], days[-1]
        span = datetime.date.fromisoformat(last) - datetime.date.fromisoformat(first)
        if first <= last and span.days + 1 == len(days):  # a run of days (days_between's)
            return [day for day in present if first <= day <= last]
        have = set(present)
        return [day for day in days if day in have]

    def _skip_compacted(self, directory: str, names: list[str]) -> list[str]:
        """During a compaction, an output already written replaces its inputs (no duplicates)."""
        try:
            plan = json.loads(self.store.read_bytes(f"{directory}/_compaction.json"))
        except (OSError, ValueError):
            return names
        replaced = {
            name
            for group in plan
            if group["output"] in names
            for name in group["inputs"]
            if name != group["output"]
        }
        return [n for n in names if n not in replaced]

    def data_type(self, path: str) -> pa.DataType | None:
        """The ``data`` column's Arrow type of one file (None: null-typed or absent)."""
        seen = self._seen.pop(path, None)
        if seen is None:
            info = self.store.info(path)
            seen = (_mtime(info), int(info.size or 0))
        cached = self._footers.get(path)
        if cached is not None and cached[:2] == seen:
            return cached[2]
        schema = pq.read_schema(path, filesystem=self.store.fs)
        index = schema.get_field_index("data")
        kind = schema.field(index).type if index >= 0 else None
        if kind is not None and (pa.types.is_null(kind) or kind == pa.struct([])):
            kind = None
        self._footers[path] = (*seen, kind)
        return kind

    def size(self, path: str) -> int:
        """A file's size in bytes, as its last listing or footer read saw it."""
        cached = self._footers.get(path)
        if cached is not None:
            return cached[1]
        seen = self._seen.get(path)
        return seen[1] if seen is not None else int(self.store.info(path).size or 0)

    def group(self, files: Sequence[tuple[tuple[str, str], str]]) -> list[FileGroup]:
        """Group files so that each group's ``data`` types merge (schema versions kept apart).

        Files of one property usually share a type (a version only widens), and properties with
        compatible types share a group too: 80 signals of one shape are one Spark read.
        """
        groups: list[FileGroup] = []
        for key, path in files:
            kind = self.data_type(path)
            for group in groups:
                if kind is None or group.data_type is None:
                    if kind is None and group.data_type is None:
                        break
                    continue
                merged = merge_types(group.data_type, kind)
                if merged is not None:
                    group.data_type = merged
                    break
            else:
                group = FileGroup(kind)
                groups.append(group)
            group.files.append(path)
            group.keys.add(key)
        return groups

    def any_type(self, device: str, prop: str) -> pa.DataType | None:
        """A property's newest known data type (for empty results): catalog, else any footer."""
        versions = self.versions(device, prop)
        if versions:
            kind = SchemaCatalog(self.store).arrow_type(device, prop, versions[-1])
            if kind is not None:
                return kind
        for day in reversed(self.days(device, prop)):
            for path in self.files(device, prop, [day]):
                kind = self.data_type(path)
                if kind is not None:
                    return kind
        return None

    def versions(self, device: str, prop: str) -> list[int]:
        """Schema version numbers recorded in the catalog for a property."""
        try:
            return [int(v["number"]) for v in SchemaCatalog(self.store).versions(device, prop)]
        except (OSError, ValueError, KeyError):
            return []
