"""Rows of the ``rda-journal`` source: its options, its schema, and reading one segment.

A segment's dense-union ``data`` column (one struct child per value type, each row's key in the
``key`` column, ``rda.keys`` metadata: journal.py) is flattened into rows of :func:`stream_schema`: the key as ``device``/``property``/
``schema_version`` columns and the value as JSON text, or as the struct of one selected schema
version (``data=struct``). Plain pyarrow and numpy: this runs inside Spark's Python workers.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rda.pipeline.recorder.journal import segment_layout
from rda.pipeline.recorder.schema import SchemaCatalog

__all__ = [
    "JournalError",
    "JournalOptions",
    "SegmentRef",
    "read_segment_rows",
    "report_missing",
    "stream_schema",
]

log = logging.getLogger("rda.pipeline.stream.sources")

_GLOB = re.compile(r"[*?\[]")
_META = [
    pa.field("recorder_id", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("device", pa.string()),
    pa.field("property", pa.string()),
    pa.field("schema_version", pa.int32()),
    pa.field("acq_stamp", pa.int64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("cycle_stamp", pa.int64()),
    pa.field("cycle_name", pa.string()),
    pa.field("selector", pa.string()),
    pa.field("recv_stamp", pa.int64()),
    pa.field("error", pa.string()),
]


class JournalError(RuntimeError):
    """The journal cannot deliver a planned batch (segments deleted before they were read)."""


@dataclass(frozen=True, slots=True)
class JournalOptions:
    """The parsed source options (see ``docs/history.md``, "Streaming")."""

    root: str
    recorders: tuple[str, ...] | None  # None: every recorder under root/_journal
    device: str | None  # glob
    property: str | None  # glob
    data: str  # "json" or "struct"
    data_type: pa.StructType | None  # struct mode: the selected schema version's type
    schema_version: int | None  # struct mode: rows of this version only
    max_segments: int | None
    rows_per_partition: int
    starting: str  # "earliest" or "latest"
    fail_on_data_loss: bool
    # Exact key sets pushed down by a batch read's filters (device = 'X', property IN (...)).
    devices: frozenset[str] | None = None
    properties: frozenset[str] | None = None

    @classmethod
    def parse(cls, options: dict[str, str]) -> JournalOptions:
        opts = {k.lower(): v for k, v in options.items()}
        root = opts.get("root") or opts.get("path")
        if not root:
            raise ValueError("rda-journal: option 'root' (the recorder's store) is required")
        recorders = opts.get("recorder")
        data = opts.get("data", "json").lower()
        if data not in ("json", "struct"):
            raise ValueError(f"rda-journal: option 'data' must be json or struct, not {data!r}")
        starting = opts.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ValueError(
                f"rda-journal: 'startingOffsets' must be earliest or latest: {starting!r}"
            )
        fail = opts.get("failondataloss", "true").lower()
        if fail not in ("true", "false"):
            raise ValueError(f"rda-journal: 'failOnDataLoss' must be true or false: {fail!r}")
        max_text = opts.get("maxsegmentspertrigger")
        max_segments = _positive_int("maxSegmentsPerTrigger", max_text) if max_text else None
        per_task = _positive_int("rowsPerPartition", opts.get("rowsperpartition", "100000"))
        device, prop = opts.get("device"), opts.get("property")
        data_type, version = None, None
        if data == "struct":
            data_type, version = _struct_type(root, device, prop, opts.get("schemaversion"))
        return cls(
            root=root,
            recorders=tuple(r.strip() for r in recorders.split(",") if r.strip())
            if recorders
            else None,
            device=device,
            property=prop,
            data=data,
            data_type=data_type,
            schema_version=version,
            max_segments=max_segments,
            rows_per_partition=per_task,
            starting=starting,
            fail_on_data_loss=fail == "true",
        )


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"rda-journal: option {name!r} must be an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"rda-journal: option {name!r} must be >= 1: {value}")
    return value


def _struct_type(
    root: str, device: str | None, prop: str | None, version_text: str | None
) -> tuple[pa.StructType, int]:
    """The Arrow type of ``data`` in struct mode: one literal key, one schema version."""
    if not device or not prop or _GLOB.search(device) or _GLOB.search(prop):
        raise ValueError("rda-journal: data=struct needs a literal 'device' and 'property'")
    catalog = SchemaCatalog(root)
    numbers = [v["number"] for v in catalog.versions(device, prop)]
    if not numbers:
        raise ValueError(f"rda-journal: {device}/{prop} has no recorded schema under {root}")
    number = _positive_int("schemaVersion", version_text) if version_text else numbers[-1]
    arrow_type = catalog.arrow_type(device, prop, number)
    if not isinstance(arrow_type, pa.StructType):
        raise ValueError(f"rda-journal: {device}/{prop} has no schema version {number}")
    return arrow_type, number


def stream_schema(options: JournalOptions) -> pa.Schema:
    """The Arrow schema of the rows the source yields (``data`` last)."""
    data = pa.field("data", options.data_type if options.data_type is not None else pa.string())
    return pa.schema([*_META, data])


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment of one recorder, as planned into a batch."""

    recorder_id: str
    path: str
    first_seq: int
    last_seq: int


def report_missing(options: JournalOptions, recorder_id: str, first: int, last: int) -> None:
    """Seq ``first..last`` of a recorder is gone: raise JournalError, or warn if told to skip."""
    message = (
        f"rda-journal: segments of recorder {recorder_id!r} holding seq {first}..{last} are gone "
        f"from {options.root}/_journal (deleted by retention before the stream read them); "
        "their rows are in the Parquet store (History.get)"
    )
    if options.fail_on_data_loss:
        raise JournalError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


# --- reading one segment -----------------------------------------------------------------------


def _json_values(child: pa.Array) -> np.ndarray[Any, Any]:
    # NaN and infinities are written as NaN/Infinity, which Spark's from_json accepts.
    return np.array(
        [None if v is None else json.dumps(v, separators=(",", ":")) for v in child.to_pylist()],
        dtype=object,
    )


def _fit(child: pa.Array, target: pa.StructType) -> pa.Array:
    """``child`` (a segment's struct, possibly narrower or wider) as ``target``: by field name."""
    if child.type.equals(target):
        return child
    fields = []
    for field in target:
        index = child.type.get_field_index(field.name) if pa.types.is_struct(child.type) else -1
        if index < 0:
            fields.append(pa.nulls(len(child), field.type))
        else:
            column = child.field(index)
            fields.append(column if column.type.equals(field.type) else column.cast(field.type))
    mask = child.is_null() if len(child) else None
    return pa.StructArray.from_arrays(fields, fields=list(target), mask=mask)


def read_segment_rows(options: JournalOptions, partition: SegmentRef) -> pa.RecordBatch:
    """The rows of one segment, flattened to :func:`stream_schema`, in seq order."""
    schema = stream_schema(options)
    try:
        with pa.memory_map(partition.path) as source:
            table = pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        report_missing(options, partition.recorder_id, partition.first_seq, partition.last_seq)
        return pa.RecordBatch.from_pylist([], schema=schema)
    keys = [tuple(k) for k in json.loads(table.schema.metadata[b"rda.keys"])]
    union, row_keys, codes, offsets = segment_layout(table)
    wanted = np.zeros(len(keys), dtype=bool)
    for index, (device, prop, version) in enumerate(keys):
        wanted[index] = (
            (options.device is None or fnmatch.fnmatchcase(device, options.device))
            and (options.property is None or fnmatch.fnmatchcase(prop, options.property))
            and (options.schema_version is None or version in (options.schema_version, 0))
            and (options.devices is None or device in options.devices)
            and (options.properties is None or prop in options.properties)
        )
    mask = wanted[row_keys]
    rows = np.flatnonzero(mask)
    row_keys, codes, offsets = row_keys[rows], codes[rows], offsets[rows]
    take = pa.array(rows)
    acq = table.column("acq_stamp").take(take)
    columns: dict[str, Any] = {
        "recorder_id": pa.array([partition.recorder_id] * len(rows), pa.string()),
        "seq": table.column("seq").take(take),
        "device": pa.array([k[0] for k in keys], pa.string()).take(pa.array(row_keys)),
        "property": pa.array([k[1] for k in keys], pa.string()).take(pa.array(row_keys)),
        "schema_version": pa.array([k[2] for k in keys], pa.int32()).take(pa.array(row_keys)),
        "acq_stamp": acq,
        "ts": pc.divide(acq, 1000).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }
    for name in ("cycle_stamp", "cycle_name", "selector", "recv_stamp", "error"):
        columns[name] = table.column(name).take(take)
    columns["data"] = _data_column(options, union, codes, offsets)
    out = pa.table(columns, schema=schema).combine_chunks()
    batches = out.to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema)


def _data_column(
    options: JournalOptions,
    union: pa.UnionArray,
    codes: np.ndarray[Any, Any],
    offsets: np.ndarray[Any, Any],
) -> pa.Array:
    if options.data_type is None:
        values = np.empty(len(codes), dtype=object)
        for code in np.unique(codes):
            selected = codes == code
            values[selected] = _json_values(union.field(int(code)))[offsets[selected]]
        return pa.array(values, pa.string())
    target = options.data_type
    pieces = np.empty(len(codes), dtype=np.int64)
    arrays: list[pa.Array] = []
    base = 0
    for code in np.unique(codes):
        selected = codes == code
        # The rows kept are of the selected version or error rows stored before any value
        # (version 0, an empty struct type: every field missing, so all null after _fit).
        child = _fit(union.field(int(code)), target)
        arrays.append(child)
        pieces[selected] = offsets[selected] + base
        base += len(child)
    if not arrays:
        return pa.nulls(0, target)
    return pa.concat_arrays(arrays).take(pa.array(pieces))
