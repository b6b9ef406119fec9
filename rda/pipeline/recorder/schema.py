"""Mapping of the Data container onto Arrow types, and the per-(device, property) schema catalog.

The mapping (docs/history.md has the table): scalars become Arrow scalars of the same width,
1-D arrays ``list<T>``, N-D arrays ``struct<elements: list<T>, dims: list<int32>>`` (row-major
elements), string arrays ``list<string>``, nested Data a ``struct``, arrays of Data
``list<struct>``. Rows are turned into Arrow columns in batches (one ``pa.array`` per field per
batch), never one Python dict per row through pyarrow: that is what keeps the recorder above
100,000 rows/s.

A property's schema may only gain fields. A value whose types do not fit the current schema
(a field changed type) opens a new schema *version*; the catalog records every version per
(device, property) in ``root/_schemas`` so the History API knows which types a file carries.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from rda.business.client.arrow_rows import ND_NAMES
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data

__all__ = [
    "DataLike",
    "SchemaCatalog",
    "SchemaVersion",
    "arrow_type_of",
    "build_array",
    "merge_types",
    "partition_escape",
    "signature",
]

log = logging.getLogger("rda.pipeline.recorder.schema")

_SCALARS: dict[str, pa.DataType] = {
    "BOOL": pa.bool_(),
    "INT8": pa.int8(),
    "INT16": pa.int16(),
    "INT32": pa.int32(),
    "INT64": pa.int64(),
    "FLOAT32": pa.float32(),
    "FLOAT64": pa.float64(),
    "STRING": pa.string(),
}
_NUMPY: dict[str, pa.DataType] = {
    "b": pa.bool_(),
    "i1": pa.int8(),
    "i2": pa.int16(),
    "i4": pa.int32(),
    "i8": pa.int64(),
    "f4": pa.float32(),
    "f8": pa.float64(),
}


class DataLike(Protocol):
    """What the recorder needs from ``rda.serialization.data.Data``."""

    def items(self) -> Iterable[tuple[str, Any]]: ...

    def type_of(self, name: str) -> Any: ...


def _type_name(data: DataLike, name: str) -> str:
    kind = data.type_of(name)
    return str(getattr(kind, "name", kind)).upper()


def _element_type(array: np.ndarray[Any, Any]) -> pa.DataType:
    if array.dtype.kind in "US" or array.dtype == object:
        return pa.string()
    key = "b" if array.dtype.kind == "b" else array.dtype.str[1:]
    if key not in _NUMPY:
        raise TypeError(
            f"array dtype {array.dtype} has no Arrow mapping (RDA has no unsigned types)"
        )
    return _NUMPY[key]


def _nd_type(element: pa.DataType) -> pa.DataType:
    return pa.struct(
        [pa.field("elements", pa.list_(element)), pa.field("dims", pa.list_(pa.int32()))]
    )


def _value_type(kind: str, value: Any) -> pa.DataType:
    if kind in _SCALARS and not isinstance(value, np.ndarray):
        return _SCALARS[kind]
    if kind == "DATA":
        return arrow_type_of(value)
    if kind == "DATA_ARRAY":
        element: pa.DataType | None = None
        for item in value:
            merged = (
                arrow_type_of(item)
                if element is None
                else merge_types(element, arrow_type_of(item))
            )
            if merged is None:
                raise TypeError("the elements of a Data array have conflicting field types")
            element = merged
        return pa.list_(element if element is not None else pa.struct([]))
    if isinstance(value, np.ndarray):
        element_type = _element_type(value)
        return pa.list_(element_type) if value.ndim == 1 else _nd_type(element_type)
    if kind == "STRING_ARRAY" or isinstance(value, list | tuple):
        return pa.list_(pa.string())
    raise TypeError(f"value of type {kind} ({type(value).__name__}) has no Arrow mapping")


def arrow_type_of(data: DataLike) -> pa.StructType:
    """The Arrow struct type that stores ``data`` (field order kept)."""
    fields = [
        pa.field(name, _value_type(_type_name(data, name), value)) for name, value in data.items()
    ]
    return pa.struct(fields)


_PLAIN = frozenset({int, float, bool, str})


def signature(data: DataLike) -> tuple[Any, ...]:
    """A cheap hashable summary of ``data``'s types: equal signatures give equal Arrow types.

    Called once per recorded row, so scalars (the common case) take the shortest path: the
    type tag itself, no name lookup.
    """
    if data.__class__ is Data and _PLAIN.issuperset(map(type, data.values())):
        # Only bools, ints, floats and strings: the (name, type) pairs the loop below makes,
        # taken from the type table in one step.
        return tuple(data.types().items())
    type_of = data.type_of
    parts: list[Any] = []
    append = parts.append
    for name, value in data.items():
        kind = type_of(name)
        cls = value.__class__
        if cls in _PLAIN:
            append((name, kind))
        elif cls is np.ndarray:
            append((name, kind, value.dtype.str, value.ndim == 1))
        else:
            label = _type_name(data, name)
            if label == "DATA":
                append((name, kind, signature(value)))
            elif label == "DATA_ARRAY":
                append((name, kind, frozenset(signature(item) for item in value)))
            else:
                append((name, kind))
    return tuple(parts)


def merge_types(old: pa.DataType, new: pa.DataType) -> pa.DataType | None:
    """``old`` widened by the fields ``new`` adds, or None if a field changed type."""
    if old.equals(new):
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = list(old)
        index = {field.name: i for i, field in enumerate(fields)}
        for field in new:
            if field.name not in index:
                fields.append(field)
                continue
            merged = merge_types(fields[index[field.name]].type, field.type)
            if merged is None:
                return None
            fields[index[field.name]] = pa.field(field.name, merged)
        return pa.struct(fields)
    if pa.types.is_list(old) and pa.types.is_list(new):
        merged = merge_types(old.value_type, new.value_type)
        return None if merged is None else pa.list_(merged)
    return None


# --- column building: one Arrow array per field per batch -----------------------------------


def _mask(values: Sequence[Any]) -> pa.Array | None:
    nulls = [value is None for value in values]
    return pa.array(nulls, pa.bool_()) if any(nulls) else None


def _list_array(values: Sequence[Any], value_type: pa.DataType) -> pa.Array:
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int32, len(values))
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [v for v in values if v is not None and len(v)]
    if pa.types.is_struct(value_type):
        children = build_array([item for v in present for item in v], value_type)
    elif pa.types.is_string(value_type):
        children = pa.array([str(item) for v in present for item in v], pa.string())
    elif present:
        flat = np.concatenate([np.asarray(v).ravel() for v in present])
        children = pa.array(flat.astype(value_type.to_pandas_dtype(), copy=False), value_type)
    else:
        children = pa.array([], value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), children, mask=_mask(values))


def _nd_array(values: Sequence[Any], nd_type: pa.StructType) -> pa.Array:
    elements = [None if v is None else np.asarray(v).ravel() for v in values]
    dims = [None if v is None else np.asarray(np.shape(v), np.int32) for v in values]
    children = [_list_array(elements, nd_type[0].type.value_type), _list_array(dims, pa.int32())]
    return pa.StructArray.from_arrays(children, fields=list(nd_type), mask=_mask(values))


def build_array(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """One Arrow array of ``arrow_type`` from a batch of values (Data, arrays, scalars, None)."""
    if pa.types.is_struct(arrow_type):
        if arrow_type.num_fields == 0:
            return pa.array([None] * len(values), arrow_type)
        sample = next((v for v in values if v is not None), None)
        if isinstance(sample, np.ndarray) or (
            sample is not None
            and not hasattr(sample, "items")
            and [f.name for f in arrow_type] == list(ND_NAMES)
        ):
            return _nd_array(values, arrow_type)
        children = [build_array(_column(values, field.name), field.type) for field in arrow_type]
        return pa.StructArray.from_arrays(children, fields=list(arrow_type), mask=_mask(values))
    if pa.types.is_list(arrow_type):
        return _list_array(values, arrow_type.value_type)
    return pa.array(values, arrow_type)


def _column(values: Sequence[Any], name: str) -> list[Any]:
    try:  # the common case: every row is a value that has the field
        return [v[name] for v in values]
    except (KeyError, TypeError):  # a null row, or a row of a narrower (older) type
        return [None if v is None or name not in v else v[name] for v in values]


# --- catalog ---------------------------------------------------------------------------------

_RESERVED = set("\"#%'*/:=?\\{}[]^<>| ")


def partition_escape(value: str) -> str:
    """Escape a partition value the way Spark and Hive do (``%XX`` for path-hostile chars)."""
    return "".join(f"%{ord(ch):02X}" if ch in _RESERVED or ord(ch) < 32 else ch for ch in value)


class SchemaVersion:
    """One schema version of a property: its number and its (possibly widened) data type."""

    __slots__ = ("arrow_type", "number")

    def __init__(self, number: int, arrow_type: pa.StructType) -> None:
        self.number = number
        self.arrow_type = arrow_type


def _encode_type(arrow_type: pa.DataType) -> str:
    schema = pa.schema([pa.field("data", arrow_type)])
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _decode_type(text: str) -> pa.DataType:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))).field("data").type


class SchemaCatalog:
    """Schema versions per (device, property), persisted under ``root/_schemas``.

    ``root`` is a local path, a store URI or a ``Store`` (``rda.pipeline.recorder.store``). On the local
    disk, files are replaced atomically under an ``flock`` so recorders sharing a root agree on
    version numbers. Other filesystems have no lock: there, a property's versions must be owned
    by one recorder (recorders sharing a remote store record disjoint properties).
    ``resolve`` is called by the single writer thread; readers may call ``versions``.
    """

    def __init__(self, root: Store | Path | str, recorder_id: str = "") -> None:
        self.store = Store.open(root)
        self.directory = self.store.path("_schemas")
        self.recorder_id = recorder_id
        self._current: dict[tuple[str, str], SchemaVersion] = {}
        self._lock = threading.Lock()
        self.changes = 0  # type changes that opened a new version (reported in statistics)

    def _path(self, device: str, prop: str) -> str:
        return (
            f"{self.directory}/device={partition_escape(device)}"
            f"/property={partition_escape(prop)}.json"
        )

    def _entries(self, path: str) -> list[dict[str, Any]] | None:
        """The versions recorded in one catalog file, or None when it does not exist."""
        try:
            payload = self.store.read_bytes(path)
        except FileNotFoundError:
            return None
        entries: list[dict[str, Any]] = json.loads(payload)["versions"]
        return entries

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[list[dict[str, Any]]]:
        if not self.store.local:
            versions = self._entries(path) or []
            before = json.dumps(versions)
            yield versions
            if json.dumps(versions) != before:
                self.store.write(path, json.dumps({"versions": versions}, indent=1).encode())
            return
        local = Path(path)
        local.parent.mkdir(parents=True, exist_ok=True)
        with open(local.with_suffix(".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            versions = json.loads(local.read_text())["versions"] if local.exists() else []
            before = json.dumps(versions)
            yield versions
            if json.dumps(versions) != before:
                tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"versions": versions}, indent=1))
                with open(tmp, "rb") as handle:
                    os.fsync(handle.fileno())
                os.replace(tmp, local)

    def versions(self, device: str, prop: str) -> list[dict[str, Any]]:
        """Every version of a property: ``number``, ``type`` (readable), ``since`` and ``recorder``."""
        entries = self._entries(self._path(device, prop)) or []
        return [{k: v for k, v in entry.items() if k != "arrow"} for entry in entries]

    def arrow_type(self, device: str, prop: str, number: int) -> pa.DataType | None:
        """The latest (widest) Arrow type of one version, or None if unknown."""
        for entry in self._entries(self._path(device, prop)) or []:
            if entry["number"] == number:
                return _decode_type(entry["arrow"])
        return None

    def current(self, device: str, prop: str) -> SchemaVersion | None:
        """The version new values of a property go to, or None before any value was seen."""
        key = (device, prop)
        with self._lock:
            if key not in self._current:
                entries = self._entries(self._path(device, prop))
                if not entries:
                    return None
                last = entries[-1]
                self._current[key] = SchemaVersion(last["number"], _decode_type(last["arrow"]))
            return self._current[key]

    def resolve(self, device: str, prop: str, arrow_type: pa.StructType) -> SchemaVersion:
        """The version that stores values of ``arrow_type``: widened, kept or newly opened."""
        current = self.current(device, prop)
        if current is not None and current.arrow_type.equals(arrow_type):
            return current
        if current is not None:
            merged = merge_types(current.arrow_type, arrow_type)
            if merged is not None and merged.equals(current.arrow_type):
                return current
        with self._locked(self._path(device, prop)) as entries:
            # Re-read under the lock: another recorder may have widened or opened a version.
            version = self._apply(device, prop, entries, arrow_type)
        with self._lock:
            self._current[(device, prop)] = version
        return version

    def _apply(
        self, device: str, prop: str, entries: list[dict[str, Any]], arrow_type: pa.StructType
    ) -> SchemaVersion:
        if entries:
            last = entries[-1]
            merged = merge_types(_decode_type(last["arrow"]), arrow_type)
            if merged is not None:
                last["arrow"] = _encode_type(merged)
                last["type"] = str(merged)
                return SchemaVersion(last["number"], merged)
            self.changes += 1
            log.warning(
                "%s/%s: schema changed (%s -> %s): opening schema version %d",
                device,
                prop,
                last["type"],
                arrow_type,
                last["number"] + 1,
            )
        number = entries[-1]["number"] + 1 if entries else 1
        entries.append(
            {
                "number": number,
                "type": str(arrow_type),
                "arrow": _encode_type(arrow_type),
                "since": time.time_ns(),
                "recorder": self.recorder_id,
            }
        )
        return SchemaVersion(number, arrow_type)
