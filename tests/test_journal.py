"""Journal segments: durable write, read back per key, recovery of interrupted writes."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from rda.pipeline.recorder.journal import (
    MAX_KEYS,
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


def test_builder_refuses_a_key_beyond_the_union_limit() -> None:
    builder = SegmentBuilder()
    for i in range(MAX_KEYS):
        assert builder.key_slot((f"D{i}", "Acq", 1), pa.struct([])) == i
    assert builder.key_slot(("one-too-many", "Acq", 1), pa.struct([])) is None
    assert builder.key_slot(("D0", "Acq", 1), pa.struct([])) == 0


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
