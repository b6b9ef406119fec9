"""Journal segments: durable write, read back per key, recovery of interrupted writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rda.pipeline.recorder.journal import (
    MAX_TYPES,
    Journal,
    SegmentBuilder,
    read_segment,
    write_durably,
)
from rda.pipeline.recorder.schema import arrow_type_of
from rda.serialization.data import Data


def _builder(rows: list[tuple[str, Data | None, int]]) -> SegmentBuilder:
    builder = SegmentBuilder()
    for device, data, seq in rows:
        arrow_type = arrow_type_of(data) if data is not None else pa.struct([])
        slot = builder.key_slot((device, "Acq", 1 if data is not None else 0), arrow_type)
        assert slot is not None
        error = None if data is not None else "RemoteError: boom"
        builder.add(slot, data, "SEL", seq * 10, seq * 100, "CYC", seq * 1000, seq, error)
    return builder


def test_segment_round_trip_per_key(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "r1")
    rows = [("A", Data(x=1), 1), ("B", Data(y="b"), 2), ("A", Data(x=3), 3), ("A", None, 4)]
    segment = journal.write(_builder(rows))
    assert (segment.first_seq, segment.last_seq) == (1, 4)
    assert segment.path.name == f"seg-{1:020d}-{4:020d}.arrow"
    assert journal.segments() == [segment]
    found = {key: (meta, data) for key, meta, data in read_segment(segment.path)}
    assert set(found) == {("A", "Acq", 1), ("B", "Acq", 1), ("A", "Acq", 0)}
    meta, data = found[("A", "Acq", 1)]
    assert meta.column("seq").to_pylist() == [1, 3]
    assert meta.column("acq_stamp").to_pylist() == [10, 30]
    assert meta.column("cycle_name").to_pylist() == ["CYC", "CYC"]
    assert data.to_pylist() == [{"x": 1}, {"x": 3}]
    meta, data = found[("A", "Acq", 0)]
    assert meta.column("error").to_pylist() == ["RemoteError: boom"]
    assert data.to_pylist() == [None]


def test_recover_removes_unfinished_writes_and_reports_last_seq(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "r1")
    assert journal.recover() == 0
    journal.write(_builder([("A", Data(x=1), 1), ("A", Data(x=2), 2)]))
    journal.write(_builder([("A", Data(x=1), 3)]))
    stray = journal.directory / f".seg-{4:020d}-{9:020d}.arrow.tmp"
    stray.write_bytes(b"half a segment")
    reopened = Journal(tmp_path, "r1")
    assert reopened.recover() == 3
    assert not stray.exists()
    assert [(s.first_seq, s.last_seq) for s in reopened.segments()] == [(1, 2), (3, 3)]


def test_write_durably_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "progress.json"
    write_durably(target, b"one")
    write_durably(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["progress.json"]


def test_builder_refuses_a_type_beyond_the_union_limit() -> None:
    builder = SegmentBuilder()
    types = [pa.struct([pa.field(f"f{i}", pa.int64())]) for i in range(MAX_TYPES + 1)]
    for i in range(MAX_TYPES):
        assert builder.key_slot((f"D{i}", "Acq", 1), types[i]) == i
    # Another key of a type the segment has is taken; a new type is refused.
    assert builder.key_slot(("same-type", "Acq", 1), types[0]) == MAX_TYPES
    assert builder.key_slot(("one-too-many", "Acq", 1), types[MAX_TYPES]) is None
    assert builder.key_slot(("D0", "Acq", 1), types[MAX_TYPES]) is None  # widened to a new type
    assert builder.key_slot(("D0", "Acq", 1), types[0]) == 0


def test_a_thousand_keys_of_one_type_share_one_segment(tmp_path: Path) -> None:
    """Keys of one value type share a union child: a segment holds any number of keys (a
    recorder of 1,000 properties no longer closes a segment every 127 keys), interleaved rows
    come back per key in seq order, and keys of other types and error rows beside them too."""
    builder = SegmentBuilder()
    kind = arrow_type_of(Data(x=1))  # one object per type, as the recorder gives it
    seq = 0
    for turn in range(3):
        for i in range(1000):
            seq += 1
            slot = builder.key_slot((f"PS{i}", "Acq", 1), kind)
            assert slot is not None
            builder.add(slot, Data(x=turn * 1000 + i), "", seq, 0, "", seq, seq, None)
        seq += 1
        slot = builder.key_slot(("SCOPE", "Wave", 2), arrow_type_of(Data(name="a")))
        assert slot is not None
        builder.add(slot, Data(name=f"w{turn}"), "", seq, 0, "", seq, seq, None)
        seq += 1
        slot = builder.key_slot(("DOWN", "Acq", 0), pa.struct([]))
        assert slot is not None
        builder.add(slot, None, "", seq, 0, "", seq, seq, "RemoteError: down")
    segment = Journal(tmp_path, "r1").write(builder)
    table = pa.ipc.open_file(pa.memory_map(str(segment.path))).read_all()
    assert table.column("data").type.num_fields == 3  # one child per type, not per key
    found = {key: (meta, data) for key, meta, data in read_segment(segment.path)}
    assert len(found) == 1002
    meta, data = found[("PS7", "Acq", 1)]
    assert data.to_pylist() == [{"x": 7}, {"x": 1007}, {"x": 2007}]
    assert meta.column("seq").to_pylist() == [8, 1010, 2012]
    meta, data = found[("SCOPE", "Wave", 2)]
    assert data.to_pylist() == [{"name": "w0"}, {"name": "w1"}, {"name": "w2"}]
    assert meta.column("seq").to_pylist() == [1001, 2003, 3005]
    meta, data = found[("DOWN", "Acq", 0)]
    assert meta.column("error").to_pylist() == ["RemoteError: down"] * 3
    assert data.to_pylist() == [None] * 3
    total = sum(len(meta) for meta, _ in found.values())
    assert total == seq


def test_equal_types_given_as_distinct_objects_are_stored_right(tmp_path: Path) -> None:
    builder = SegmentBuilder()
    for i in range(3):
        slot = builder.key_slot((f"PS{i}", "Acq", 1), arrow_type_of(Data(x=1)))
        assert slot is not None
        builder.add(slot, Data(x=i), "", i, 0, "", i, i + 1, None)
    segment = Journal(tmp_path, "r1").write(builder)
    found = {key[0]: data.to_pylist() for key, _, data in read_segment(segment.path)}
    assert found == {"PS0": [{"x": 0}], "PS1": [{"x": 1}], "PS2": [{"x": 2}]}


def test_a_segment_written_before_the_key_column_reads_as_before(tmp_path: Path) -> None:
    """The layout before the ``key`` column: one union child per key, the type code being the
    key's index (segments a recorder wrote before an upgrade, still in its journal)."""
    keys = [["A", "Acq", 1], ["B", "Acq", 1]]
    children = [pa.array([{"x": 1}, {"x": 3}]), pa.array([{"x": 2}])]
    data = pa.UnionArray.from_dense(
        pa.array([0, 1, 0], pa.int8()), pa.array([0, 0, 1], pa.int32()), children, ["k0", "k1"]
    )
    table = pa.table(
        {"seq": pa.array([1, 2, 3], pa.int64()), "acq_stamp": pa.array([1, 2, 3]), "data": data}
    ).replace_schema_metadata({"rda.keys": json.dumps(keys), "rda.recorder_id": "r1"})
    path = tmp_path / f"seg-{1:020d}-{3:020d}.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    found = {key: (meta, data) for key, meta, data in read_segment(path)}
    assert found[("A", "Acq", 1)][0].column("seq").to_pylist() == [1, 3]
    assert found[("A", "Acq", 1)][1].to_pylist() == [{"x": 1}, {"x": 3}]
    assert found[("B", "Acq", 1)][1].to_pylist() == [{"x": 2}]


def test_write_failure_leaves_no_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal(tmp_path, "r1")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        journal.write(_builder([("A", Data(x=1), 1)]))
    monkeypatch.undo()
    assert journal.segments() == []
    assert journal.recover() == 0
    assert os.listdir(journal.directory) == []


def _twin_builders(exact: list[bool]) -> tuple[SegmentBuilder, SegmentBuilder]:
    """The same rows into two builders: one promised exact values where ``exact`` says
    (transposed at build), one read field by field by name."""
    wide = arrow_type_of(Data(a=1, b=0.5, wave=np.arange(3.0), sub=Data(ok=True)))
    rows: list[tuple[str, Data | None]] = []
    for i in range(40):
        rows.append(
            (
                f"PS{i % 4}",
                Data(a=i, b=i / 2, wave=np.arange(float(i % 3)), sub=Data(ok=i % 2 == 0)),
            )
        )
    rows.insert(7, ("PS1", None))  # an error row of a key of that type
    rows.insert(11, ("PS2", Data(a=-1, b=0.0)))  # a narrower value
    transposed, by_name = SegmentBuilder(), SegmentBuilder()
    for seq, (device, data) in enumerate(rows, start=1):
        for builder, promised in ((transposed, exact[int(device[-1])]), (by_name, False)):
            promise = promised and data is not None and len(data) == 4
            slot = builder.key_slot((device, "Acq", 1), wide, promise)
            assert slot is not None
            error = None if data is not None else "RemoteError: down"
            builder.add(slot, data, "", seq, 0, "", seq, seq, error)
    return transposed, by_name


def test_exact_values_build_the_same_segment_as_values_read_by_name() -> None:
    """``key_slot(..., exact=True)``: the keys' values are transposed into the child's columns
    in one pass; a key that also got an error row or a narrower value is read by name. Either
    way the segment equals the one built by name throughout."""
    transposed, by_name = _twin_builders([True, True, True, True])
    assert transposed.build("r1").equals(by_name.build("r1"))
    transposed, by_name = _twin_builders([True, False, True, False])
    assert transposed.build("r1").equals(by_name.build("r1"))


def test_a_broken_exact_promise_is_still_read_by_name() -> None:
    """Values of another width given as exact (a caller's bug) are not misplaced: the
    transposed columns would not add up, so the child is read by name."""
    kind = arrow_type_of(Data(a=1, b=2))
    builder = SegmentBuilder()
    slot = builder.key_slot(("PS1", "Acq", 1), kind, True)
    assert slot is not None
    builder.add(slot, Data(a=1, b=2), "", 1, 0, "", 1, 1, None)
    builder.add(slot, Data(a=3), "", 2, 0, "", 2, 2, None)
    data = builder.build("r1").column("data").combine_chunks().field(0)
    assert data.to_pylist() == [{"a": 1, "b": 2}, {"a": 3, "b": None}]


def test_widening_a_key_in_a_segment_reads_its_earlier_values_by_name(tmp_path: Path) -> None:
    narrow, wide = arrow_type_of(Data(a=1)), arrow_type_of(Data(a=1, b=2))
    builder = SegmentBuilder()
    assert builder.key_slot(("PS1", "Acq", 1), narrow, True) == 0
    builder.add(0, Data(a=1), "", 1, 0, "", 1, 1, None)
    assert builder.key_slot(("PS1", "Acq", 1), wide, True) == 0  # widened: no longer exact
    builder.add(0, Data(a=2, b=3), "", 2, 0, "", 2, 2, None)
    segment = Journal(tmp_path, "r1").write(builder)
    found = [data.to_pylist() for _, _, data in read_segment(segment.path)]
    assert found == [[{"a": 1, "b": None}, {"a": 2, "b": 3}]]
