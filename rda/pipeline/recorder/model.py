"""The recorder's plain data: the network-free ``Sample``, its statistics, pattern parsing."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from rda.serialization.header import DataContext, UpdateType

__all__ = [
    "DEFAULT_ENDPOINT",
    "Closable",
    "RecorderStatistics",
    "Sample",
    "default_id",
    "parse_pattern",
]

_GLOB = re.compile(r"[*?\[]")
# Where a history server listens unless told: loopback only, as every server (``rda record
# --serve``, ``rda history serve``): the one place this default is written.
DEFAULT_ENDPOINT = "tcp://127.0.0.1:0"


@dataclass(frozen=True, slots=True)
class Sample:
    """A notification-shaped value for feeding the recorder without a network."""

    data: Any
    context: DataContext = field(default_factory=DataContext)
    error: BaseException | None = None
    update_type: UpdateType = UpdateType.NORMAL


@dataclass(frozen=True, slots=True)
class RecorderStatistics:
    """A snapshot of the recorder's counters (what the CLI and metrics show)."""

    state: str  # "created", "running", "error", "stopped"
    recorder_id: str
    received: int  # rows taken from the queue (each got a seq)
    overflow: int  # notifications refused because the queue was full
    gaps: int  # updates the server-side subscription reported as missed
    queue_depth: int
    queue_limit: int
    pending_rows: int  # rows in the writer waiting for their segment
    acked_seq: int
    acked_rows: int
    segments_written: int
    bytes_written: int
    write_errors: int
    last_error: str | None
    lag_seconds: float  # age of the oldest row not yet acknowledged
    schema_changes: int
    converted_segments: int
    parquet_files: int
    conversion_errors: int
    subscriptions: int
    # Value rows the server sent without an acquisition stamp (acq_stamp 0): stored at their
    # receive time (acq_stamp == recv_stamp, docs/history.md), logged once per signal.
    missing_acq_stamps: int = 0
    # FIRST updates not stored because the row they repeat (same acquisition stamp and value)
    # was: what a resubscription resends is not a new acquisition.
    repeated_first: int = 0
    # Compaction and partition retention (--compact-every, --keep; compaction.py).
    compacted_files: int = 0  # output files written
    compaction_inputs_removed: int = 0  # small files deleted once their output was durable
    partitions_deleted: int = 0  # date= partitions older than --keep
    compaction_errors: int = 0


class Closable(Protocol):
    """A subscription as the recorder holds it."""

    def close(self) -> None: ...


def parse_pattern(pattern: str) -> tuple[str, str, str | None]:
    """Split ``"DEV/Prop"`` or ``"DEV/Prop@SELECTOR"`` into (device glob, property, selector)."""
    target, _, selector = pattern.partition("@")
    device, sep, prop = target.partition("/")
    if not sep or not device or not prop:
        raise ValueError(f"pattern {pattern!r} is not DEVICE/PROPERTY[@SELECTOR]")
    if _GLOB.search(prop):
        raise ValueError(f"pattern {pattern!r}: only the device part may be a glob")
    return device, prop, selector or None


def default_id() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "recorder"
