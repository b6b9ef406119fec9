"""Compaction of the Parquet store (small files -> one per signal and hour) and its retention.

The converter writes one small file per (key, day) every few seconds; readers pay per file
(Spark plans a task per file, DuckDB and pyarrow open each footer). Compaction rewrites the
files of one (recorder, schema version) whose rows start in one closed time bucket (an hour by
default, a day for :func:`compact`) into one file ``part-<recorder>-<min seq>-<max seq>.parquet``
in the same ``date=`` partition, so the store's layout and every reader stay as they are.

**Each row once, for every reader.** A partition is compacted in three steps, each durable
before the next:

1. the plan (groups of ``inputs`` -> ``output``) is written to ``_compaction.json``;
2. each output is streamed to a hidden temporary name, fsynced and renamed into place, and the
   plan notes when (``written``);
3. ``linger`` seconds later (the next round), the inputs are deleted, then the plan.

A reader lists a partition's files: an input whose output is listed beside it and named by the
plan is skipped (``StoreIndex.files``; the history server's ``HistoryReader`` drops the
duplicate ``(recorder_id, seq)`` rows too), so before step 2 it reads the inputs, after it the
output, never both. ``linger`` is how long a reader that listed the inputs just before step 2
may take to read them (a Spark query plans first and reads later). A glob that ignores the plan
(DuckDB's ``read_parquet('STORE/**/*.parquet')``) sees both during ``linger`` only: run such
queries on partitions without ``_compaction.json``, or de-duplicate on ``(recorder_id, seq)``.

A crash anywhere leaves a plan that the next round finishes: outputs exist whole or not at all
(they derive only from the inputs, so a redo writes the same rows under the same name), inputs
are deleted only once their output is durable.

**Retention** (:func:`delete_older`): a ``date=`` partition whose day ended more than ``keep``
seconds ago is renamed to a hidden name (readers ignore names starting with ``.``; the rename is
atomic, so a reader sees the whole day or none of it), then deleted.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from rda.pipeline.recorder.converter import (
    column_or_null,
    group_rows,
    parquet_options,
    partition_path,
)
from rda.pipeline.recorder.journal import fsync_directory, write_durably
from rda.pipeline.recorder.schema import merge_types
from rda.pipeline.recorder.store import Store

__all__ = [
    "CompactionResult",
    "compact",
    "compact_store",
    "delete_older",
]

_DAY_NS = 86_400 * 10**9
_PART = re.compile(r"^part-(.+)-(\d+)-(\d+)\.parquet$")
_PLAN = "_compaction.json"
_DELETING = re.compile(r"^\.date=.*\.deleting$")


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One round of :func:`compact_store`: outputs written, input files deleted."""

    outputs: list[Path]
    removed: int


def _local_root(root: Path | str | Store) -> Path:
    store = Store.open(root)
    if not store.local:  # the plan, fsyncs and the check of planned conversions need a local disk
        raise ValueError(f"{store.uri}: compaction and retention run on a local store only")
    return Path(store.base)


def _planned_conversions(root: Path) -> set[str]:
    """The partition directories (relative to ``root``) some recorder is converting into."""
    busy = set()
    for progress in (root / "_journal").glob("*/progress.json"):
        try:
            planned = json.loads(progress.read_text()).get("planned")
        except (OSError, ValueError):  # being replaced: the rename makes it whole again
            continue
        for name in planned["files"] if planned else []:
            busy.add(name.rpartition("/")[0])
    return busy


def compact(
    root: Path | str,
    device: str,
    prop: str,
    date: str,
    *,
    grace: float = 3_600.0,
    clock: Callable[[], float] = time.time,
) -> list[Path]:
    """Rewrite a closed day into one file per (recorder, schema version); return the outputs.

    The inputs are deleted in the same call (no ``linger``): run it on days no reader is
    reading. A day is closed once it ended ``grace`` seconds ago and no recorder has a planned
    conversion into it; otherwise ``ValueError``.
    """
    base = _local_root(root)
    partition = partition_path(base, device, prop, date)
    day_end = datetime.datetime.fromisoformat(date).replace(
        tzinfo=datetime.UTC
    ) + datetime.timedelta(days=1)
    if clock() < day_end.timestamp() + grace:
        raise ValueError(f"{device}/{prop} {date}: the day is not closed yet")
    if str(partition.relative_to(base)) in _planned_conversions(base):
        raise ValueError(f"{device}/{prop} {date}: a conversion into this day is in progress")
    outputs, _ = _compact_partition(
        partition, bucket_ns=_DAY_NS, closed_ns=None, linger=0.0, now=clock(), on_step=None
    )
    return outputs


def compact_store(
    root: Path | str | Store,
    *,
    bucket: float = 3_600.0,
    grace: float = 600.0,
    linger: float = 60.0,
    clock: Callable[[], float] = time.time,
    on_step: Callable[[str, Path], None] | None = None,
    footers: dict[Path, _Facts] | None = None,
) -> CompactionResult:
    """One compaction round over every partition of the store (see the module docstring).

    Files whose rows start in one ``bucket`` (seconds, UTC-aligned) become one file once the
    bucket ended ``grace`` seconds ago; inputs are deleted ``linger`` seconds after their output
    was written (by a later round). Partitions some recorder is converting into are left for
    the next round. ``on_step(step, partition)`` is called after each durable step
    (``planned``, ``written``, ``removed``): a test reads the store there. ``footers`` is a
    cache of what each file's footer says, kept by the caller between rounds (files never
    change under one name): a round then reads only the footers of new files.
    """
    base = _local_root(root)
    now = clock()
    closed_ns = int((now - grace) * 1e9)
    busy = _planned_conversions(base)
    outputs: list[Path] = []
    removed = 0
    seen: dict[Path, _Facts] = {}
    for partition in sorted(base.glob("device=*/property=*/date=*")):
        if not partition.is_dir() or str(partition.relative_to(base)) in busy:
            continue
        written, deleted = _compact_partition(
            partition,
            bucket_ns=int(bucket * 1e9),
            closed_ns=closed_ns,
            linger=linger,
            now=now,
            on_step=on_step,
            facts=_FactCache(footers or {}, seen),
        )
        outputs.extend(written)
        removed += deleted
    if footers is not None:  # only the files that still exist: the cache stays bounded
        footers.clear()
        footers.update(seen)
    return CompactionResult(outputs, removed)


def _compact_partition(
    partition: Path,
    *,
    bucket_ns: int,
    closed_ns: int | None,
    linger: float,
    now: float,
    on_step: Callable[[str, Path], None] | None,
    facts: _FactCache | None = None,
) -> tuple[list[Path], int]:
    record = partition / _PLAN
    if record.exists():
        plan: list[dict[str, Any]] = json.loads(record.read_text())
    else:
        plan = _plan(partition, bucket_ns, closed_ns, facts or _FactCache({}, {}))
        if not plan:
            return [], 0
        write_durably(record, json.dumps(plan).encode())
        if on_step is not None:
            on_step("planned", partition)
    outputs = []
    for group in plan:
        if "written" in group:
            continue
        output = partition / group["output"]
        if not output.exists():  # renamed into place whole: if it exists, it is complete
            _merge_files(output, [partition / name for name in group["inputs"]])
        group["written"] = now
        outputs.append(output)
    if outputs:
        write_durably(record, json.dumps(plan).encode())
        if on_step is not None:
            on_step("written", partition)
    if any(now < group["written"] + linger for group in plan):
        return outputs, 0  # readers that listed the inputs may still be reading them
    removed = 0
    for group in plan:
        for name in group["inputs"]:
            (partition / name).unlink(missing_ok=True)
            removed += 1
    fsync_directory(partition)
    record.unlink()
    fsync_directory(partition)
    if on_step is not None:
        on_step("removed", partition)
    return outputs, removed


def _stamp_range(path: Path) -> tuple[int, int]:
    """The file's smallest and largest ``acq_stamp``, from the footer's statistics."""
    metadata = pq.ParquetFile(path).metadata
    index = metadata.schema.to_arrow_schema().get_field_index("acq_stamp")
    low, high = None, None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            column = pq.read_table(path, columns=["acq_stamp"]).column("acq_stamp")
            bounds = pa.compute.min_max(column)
            return int(bounds["min"].as_py()), int(bounds["max"].as_py())
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return int(low or 0), int(high or 0)


class _Facts(NamedTuple):
    """What compaction needs of a file's footer: its schema version and stamp range."""

    version: str
    low: int
    high: int


class _FactCache:
    """Footer facts by path: those of earlier rounds (``known``), those seen now (``seen``)."""

    def __init__(self, known: dict[Path, _Facts], seen: dict[Path, _Facts]) -> None:
        self.known = known
        self.seen = seen

    def get(self, path: Path) -> _Facts:
        facts = self.known.get(path)
        if facts is None:
            metadata = pq.read_schema(path).metadata or {}
            version = metadata.get(b"rda.schema_version", b"0").decode()
            facts = _Facts(version, *_stamp_range(path))
        self.seen[path] = facts
        return facts


def _plan(
    partition: Path, bucket_ns: int, closed_ns: int | None, facts: _FactCache
) -> list[dict[str, Any]]:
    """Groups of >= 2 files of one (recorder, schema version, bucket), each in a closed bucket."""
    groups: dict[tuple[str, str, int], list[tuple[int, int, str]]] = defaultdict(list)
    for path in sorted(partition.glob("part-*.parquet")):
        match = _PART.match(path.name)
        if not match:
            continue
        version, low, high = facts.get(path)
        slot = low // bucket_ns
        if closed_ns is not None and (high >= closed_ns or (slot + 1) * bucket_ns > closed_ns):
            continue  # its bucket may still receive rows: leave it for a later round
        groups[(match[1], version, slot)].append((int(match[2]), int(match[3]), path.name))
    plan = []
    for (recorder_id, _, _), files in sorted(groups.items()):
        if len(files) < 2:
            continue
        first = min(f[0] for f in files)
        last = max(f[1] for f in files)
        plan.append(
            {
                "output": f"part-{recorder_id}-{first}-{last}.parquet",
                "inputs": [f[2] for f in sorted(files)],
            }
        )
    return plan


def _merge_files(output: Path, inputs: list[Path]) -> None:
    """Stream ``inputs`` into ``output`` one file at a time (a day may not fit in memory).

    The inputs of one (recorder, schema version) hold disjoint seq ranges, each sorted, and the
    plan lists them by first seq: appending them in that order keeps the output sorted by seq.
    """
    schemas = [pq.read_schema(path) for path in inputs]
    target: pa.DataType = schemas[0].field("data").type
    for schema in schemas[1:]:
        merged = merge_types(target, schema.field("data").type)
        target = merged if merged is not None else target
    # Files written before a meta column existed (update_type) get it as nulls: the output
    # has the widest schema, which is the newest one.
    widest = max(schemas, key=len)
    index = widest.get_field_index("data")
    schema = widest.set(index, pa.field("data", target))
    tmp = output.with_name(f".{output.name}.tmp")
    with pq.ParquetWriter(str(tmp), schema, **parquet_options(schema)) as writer:
        for path in inputs:
            table = pq.read_table(path)
            if not table.schema.field("data").type.equals(target):
                data_at = table.schema.get_field_index("data")
                table = table.set_column(data_at, "data", table.column("data").cast(target))
            if table.column_names != schema.names:
                table = pa.table(
                    {f.name: column_or_null(table, f.name, f.type) for f in schema},
                    schema=schema,
                )
            writer.write_table(
                table.replace_schema_metadata(schema.metadata), row_group_size=group_rows(table)
            )
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, output)
    fsync_directory(output.parent)


def delete_older(
    root: Path | str | Store, keep: float, *, clock: Callable[[], float] = time.time
) -> list[Path]:
    """Delete the ``date=`` partitions whose day ended more than ``keep`` seconds ago.

    Returns the partitions deleted. Each is first renamed to a hidden ``.date=...deleting``
    (atomic: a reader sees the whole day or nothing), then removed; a crash in between leaves
    the hidden directory, which the next call removes.
    """
    base = _local_root(root)
    limit = clock() - keep
    deleted = []
    for prop_dir in sorted(base.glob("device=*/property=*")):
        for leftover in prop_dir.iterdir():
            if _DELETING.match(leftover.name):
                shutil.rmtree(leftover, ignore_errors=True)
        for partition in sorted(prop_dir.glob("date=*")):
            try:
                day = datetime.date.fromisoformat(partition.name[len("date=") :])
            except ValueError:
                continue
            end = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
            if (end + datetime.timedelta(days=1)).timestamp() > limit:
                continue
            hidden = partition.with_name(f".{partition.name}.deleting")
            os.replace(partition, hidden)
            fsync_directory(prop_dir)
            shutil.rmtree(hidden)
            deleted.append(partition)
    return deleted
