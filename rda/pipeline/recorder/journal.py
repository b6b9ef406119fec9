"""The recorder's journal: durable Arrow IPC segments, the only thing an acknowledgement trusts.

A segment is one Arrow IPC *file* ``seg-<firstseq>-<lastseq>.arrow`` in ``root/_journal/<id>/``,
written to a hidden temporary name, fsynced, renamed, and the directory fsynced: only after
that rename is durable do its rows count as acknowledged. A crash leaves either the whole
segment or only a ``.tmp`` file, which recovery deletes (its rows were never acknowledged).

One segment holds rows of many (device, property, schema version) keys. Arrow IPC needs one
schema per file, so ``data`` is a dense union with one struct child per key (type code = index
in the ``rda.keys`` metadata list): each row lives in exactly one child, no per-key padding.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from rda.pipeline.recorder.schema import build_array
from rda.pipeline.recorder.store import fsync_directory, write_durably

__all__ = [
    "MAX_KEYS",
    "Journal",
    "Segment",
    "SegmentBuilder",
    "fsync_directory",
    "read_segment",
    "write_durably",
]

log = logging.getLogger("rda.pipeline.recorder.journal")

MAX_KEYS = 127  # dense union type codes are int8
_SEGMENT = re.compile(r"^seg-(\d{20})-(\d{20})\.arrow$")
_META_FIELDS = [
    pa.field("selector", pa.string()),
    pa.field("acq_stamp", pa.int64()),
    pa.field("cycle_stamp", pa.int64()),
    pa.field("cycle_name", pa.string()),
    pa.field("recv_stamp", pa.int64()),
    pa.field("seq", pa.int64()),
    pa.field("error", pa.string()),
    # The update's type by name (FIRST, NORMAL, IMMEDIATE_UPDATE, ...): a FIRST is the value
    # a (re)subscription started with, not necessarily a new acquisition. Absent from segments
    # written before it existed (read back as null).
    pa.field("update_type", pa.string()),
    # The alarm severity the server computed for the value (0 NONE, 1 MINOR, 2 MAJOR,
    # 3 INVALID: rda.Severity, EPICS numbering); null when the notification carried no alarm
    # state (a Sample, rows recorded before the column existed).
    pa.field("alarm_severity", pa.int8()),
]

Key = tuple[str, str, int]  # (device, property, schema version)


class SegmentBuilder:
    """Columnar accumulation of rows for one segment (lists per column, arrays at ``build``)."""

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.key_types: list[pa.StructType] = []
        self._index: dict[Key, int] = {}
        self.values: list[list[Any]] = []
        self.codes: list[int] = []
        self.offsets: list[int] = []
        self.selector: list[str] = []
        self.acq_stamp: list[int] = []
        self.cycle_stamp: list[int] = []
        self.cycle_name: list[str] = []
        self.recv_stamp: list[int] = []
        self.seq: list[int] = []
        self.error: list[str | None] = []
        self.update_type: list[str] = []
        self.alarm_severity: list[int | None] = []

    def __len__(self) -> int:
        return len(self.seq)

    def key_slot(self, key: Key, arrow_type: pa.StructType) -> int | None:
        """The union code for ``key`` (its type widened to ``arrow_type``), None when full."""
        slot = self._index.get(key)
        if slot is None:
            if len(self.keys) >= MAX_KEYS:
                return None
            slot = self._index[key] = len(self.keys)
            self.keys.append(key)
            self.key_types.append(arrow_type)
            self.values.append([])
        else:
            self.key_types[slot] = arrow_type
        return slot

    def add(
        self,
        slot: int,
        value: Any,
        selector: str,
        acq_stamp: int,
        cycle_stamp: int,
        cycle_name: str,
        recv_stamp: int,
        seq: int,
        error: str | None,
        update_type: str = "NORMAL",
        alarm_severity: int | None = None,
    ) -> None:
        values = self.values[slot]
        self.codes.append(slot)
        self.offsets.append(len(values))
        values.append(value)
        self.selector.append(selector)
        self.acq_stamp.append(acq_stamp)
        self.cycle_stamp.append(cycle_stamp)
        self.cycle_name.append(cycle_name)
        self.recv_stamp.append(recv_stamp)
        self.seq.append(seq)
        self.error.append(error)
        self.update_type.append(update_type)
        self.alarm_severity.append(alarm_severity)

    def build(self, recorder_id: str) -> pa.Table:
        """The segment's table: meta columns plus the dense-union ``data`` column."""
        children = [build_array(v, t) for v, t in zip(self.values, self.key_types, strict=True)]
        data = pa.UnionArray.from_dense(
            pa.array(self.codes, pa.int8()),
            pa.array(self.offsets, pa.int32()),
            children,
            [f"k{i}" for i in range(len(children))],
        )
        columns = [
            pa.array(self.selector, pa.string()),
            pa.array(self.acq_stamp, pa.int64()),
            pa.array(self.cycle_stamp, pa.int64()),
            pa.array(self.cycle_name, pa.string()),
            pa.array(self.recv_stamp, pa.int64()),
            pa.array(self.seq, pa.int64()),
            pa.array(self.error, pa.string()),
            pa.array(self.update_type, pa.string()),
            pa.array(self.alarm_severity, pa.int8()),
            data,
        ]
        metadata = {"rda.keys": json.dumps(self.keys), "rda.recorder_id": recorder_id}
        schema = pa.schema([*_META_FIELDS, pa.field("data", data.type)], metadata=metadata)
        return pa.Table.from_arrays(columns, schema=schema)


@dataclass(frozen=True, slots=True)
class Segment:
    """A durable segment on disk: its path and the seq range it holds."""

    path: Path
    first_seq: int
    last_seq: int

    @property
    def name(self) -> str:
        return self.path.name


def read_segment(path: Path) -> Iterator[tuple[Key, pa.Table, pa.Array]]:
    """Yield ``(key, meta rows, data)`` per key of a segment, rows in seq order.

    ``meta rows`` has the meta columns of that key's rows; ``data`` is the key's struct child.
    """
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    keys = [tuple(k) for k in json.loads(table.schema.metadata[b"rda.keys"])]
    union = table.column("data").combine_chunks()
    codes = union.type_codes.to_numpy(zero_copy_only=False)
    meta = table.drop_columns(["data"])
    for code, key in enumerate(keys):
        rows = meta.filter(pa.array(codes == code))
        child = union.field(code)
        yield (str(key[0]), str(key[1]), int(key[2])), rows, child


class Journal:
    """The segment directory of one recorder: write segments durably, list and recover them."""

    def __init__(self, root: Path | str, recorder_id: str) -> None:
        self.recorder_id = recorder_id
        self.directory = Path(root) / "_journal" / recorder_id
        self.directory.mkdir(parents=True, exist_ok=True)

    def recover(self) -> int:
        """Delete leftovers of an interrupted write; return the last durable seq (0 if none)."""
        for stray in self.directory.glob(".*.tmp"):
            log.info("journal %s: removing unfinished %s", self.recorder_id, stray.name)
            stray.unlink()
        segments = self.segments()
        return segments[-1].last_seq if segments else 0

    def segments(self) -> list[Segment]:
        """Durable segments, oldest first."""
        found = []
        for entry in os.scandir(self.directory):
            match = _SEGMENT.match(entry.name)
            if match:
                found.append(Segment(Path(entry.path), int(match[1]), int(match[2])))
        found.sort(key=lambda s: s.first_seq)
        return found

    def write(self, builder: SegmentBuilder) -> Segment:
        """Write the rows of ``builder`` as one durable segment (raises OSError on failure)."""
        table = builder.build(self.recorder_id)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        first, last = builder.seq[0], builder.seq[-1]
        path = self.directory / f"seg-{first:020d}-{last:020d}.arrow"
        write_durably(path, sink.getvalue())
        return Segment(path, first, last)
