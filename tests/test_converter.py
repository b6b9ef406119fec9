"""Segments -> Parquet: store layout and schema, idempotent redo, retention, compaction."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rda.pipeline.recorder.compaction import compact
from rda.pipeline.recorder.converter import Converter, partition_path
from rda.pipeline.recorder.journal import Journal, SegmentBuilder
from rda.pipeline.recorder.schema import arrow_type_of
from rda.serialization.data import Data

DAY1 = int(datetime.datetime(2024, 3, 1, 23, 59, tzinfo=datetime.UTC).timestamp() * 1e9)
DAY2 = DAY1 + 120 * 10**9  # two minutes later: 2024-03-02
AFTER = datetime.datetime(2024, 3, 10, tzinfo=datetime.UTC).timestamp()


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _segment(journal: Journal, rows: list[tuple[int, int, Data]], device: str = "PS1") -> None:
    builder = SegmentBuilder()
    for seq, acq, data in rows:
        slot = builder.key_slot((device, "Acq", 1), arrow_type_of(data))
        assert slot is not None
        builder.add(slot, data, "SEL", acq, acq - 5, "CYC", acq + 7, seq, None)
    journal.write(builder)


def _store(root: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(root.glob("device=*/property=*/date=*/part-*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return sorted(rows, key=lambda r: (r["recorder_id"], r["seq"]))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob("device=*/property=*/date=*/*"))


def test_store_layout_and_schema_contract(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "r1")
    _segment(journal, [(1, DAY1, Data(x=1.0)), (2, DAY2, Data(x=2.0)), (3, DAY2 + 1, Data(x=3.0))])
    converter = Converter(tmp_path, "r1")
    assert converter.convert_pending() == 1
    assert _files(tmp_path) == [
        "device=PS1/property=Acq/date=2024-03-01/part-r1-1-1.parquet",
        "device=PS1/property=Acq/date=2024-03-02/part-r1-2-3.parquet",
    ]
    table = pq.read_table(
        partition_path(tmp_path, "PS1", "Acq", "2024-03-02") / "part-r1-2-3.parquet"
    )
    assert table.schema.remove_metadata() == pa.schema(
        [
            ("acq_stamp", pa.int64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("cycle_stamp", pa.int64()),
            ("cycle_name", pa.string()),
            ("selector", pa.string()),
            ("recv_stamp", pa.int64()),
            ("recorder_id", pa.string()),
            ("seq", pa.int64()),
            ("error", pa.string()),
            ("update_type", pa.string()),
            ("alarm_severity", pa.int8()),
            ("data", pa.struct([("x", pa.float64())])),
        ]
    )
    assert table.schema.metadata[b"rda.schema_version"] == b"1"
    row = table.to_pylist()[0]
    assert (
        row["acq_stamp"] == DAY2
        and row["cycle_stamp"] == DAY2 - 5
        and row["recv_stamp"] == DAY2 + 7
    )
    assert row["ts"] == datetime.datetime.fromtimestamp(DAY2 // 1000 / 1e6, datetime.UTC)
    assert (row["selector"], row["cycle_name"], row["recorder_id"]) == ("SEL", "CYC", "r1")
    assert row["update_type"] == "NORMAL"
    assert row["alarm_severity"] is None  # offered without an alarm state
    metadata = pq.ParquetFile(
        partition_path(tmp_path, "PS1", "Acq", "2024-03-02") / "part-r1-2-3.parquet"
    ).metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    assert converter.convert_pending() == 0


def test_interrupted_conversion_is_redone_under_the_same_names(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "r1")
    _segment(journal, [(1, DAY1, Data(x=1.0)), (2, DAY2, Data(x=2.0))])
    _segment(journal, [(3, DAY2, Data(x=3.0, extra="widened"))])
    converter = Converter(tmp_path, "r1")
    assert converter.convert_pending() == 2
    files, rows = _files(tmp_path), _store(tmp_path)
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[1]["data"] == {"x": 2.0, "extra": None}  # older segment cast to the wider type
    # Rewind the progress record to "planned, not done", as after a kill mid-conversion, and
    # leave the tmp file an unfinished write would have left.
    progress_path = journal.directory / "progress.json"
    progress = json.loads(progress_path.read_text())
    progress["planned"] = {
        "segments": sorted(progress["done"]),
        "files": [f for f in files],
    }
    progress["done"] = {}
    progress["max_seq"] = 0
    progress_path.write_text(json.dumps(progress))
    stray = tmp_path / files[0]
    stray = stray.with_name(f".{stray.name}.tmp")
    stray.write_bytes(b"partial")
    redo = Converter(tmp_path, "r1")
    assert not stray.exists()
    assert redo.convert_pending() == 2
    assert _files(tmp_path) == files
    assert _store(tmp_path) == rows
    assert redo.max_seq == 3
    assert redo.convert_pending() == 0


def test_retention_deletes_converted_segments_only_after_the_delay(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "r1")
    clock = FakeClock(1_000.0)
    _segment(journal, [(1, DAY1, Data(x=1.0))])
    converter = Converter(tmp_path, "r1", retention=3_600.0, clock=clock)
    converter.convert_pending()
    _segment(journal, [(2, DAY1, Data(x=2.0))])  # closed but not yet converted
    clock.now += 3_599.0
    assert converter.apply_retention() == 0
    clock.now += 1.0
    assert converter.apply_retention() == 1
    assert [s.first_seq for s in journal.segments()] == [2]
    assert Converter(tmp_path, "r1").max_seq == 1  # survives the segment's deletion
    assert converter.convert_pending() == 1
    clock.now += 3_600.0
    assert converter.apply_retention() == 1
    assert journal.segments() == []
    assert [r["seq"] for r in _store(tmp_path)] == [1, 2]


def _three_files(tmp_path: Path) -> Path:
    journal = Journal(tmp_path, "r1")
    converter = Converter(tmp_path, "r1")
    for seq in (1, 3, 5):
        data = Data(x=float(seq)) if seq != 5 else Data(x=5.0, y=1)
        _segment(journal, [(seq, DAY1 - seq, data), (seq + 1, DAY1 - seq + 1, data)])
        converter.convert_pending()
    _segment(Journal(tmp_path, "r2"), [(1, DAY1, Data(x=9.0))])
    Converter(tmp_path, "r2").convert_pending()
    return partition_path(tmp_path, "PS1", "Acq", "2024-03-01")


def test_compaction_rewrites_a_day_into_one_file_per_recorder(tmp_path: Path) -> None:
    partition = _three_files(tmp_path)
    before = _store(tmp_path)
    assert len(list(partition.glob("part-r1-*"))) == 3
    outputs = compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: AFTER)
    assert [p.name for p in outputs] == ["part-r1-1-6.parquet"]
    assert sorted(p.name for p in partition.iterdir()) == [
        "part-r1-1-6.parquet",
        "part-r2-1-1.parquet",
    ]
    assert _store(tmp_path) == [
        {**r, "data": {"x": r["data"]["x"], "y": r["data"].get("y")}}
        if r["recorder_id"] == "r1"
        else r
        for r in before
    ]
    assert pq.read_table(outputs[0]).column("seq").to_pylist() == [1, 2, 3, 4, 5, 6]
    assert compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: AFTER) == []


def test_compaction_keeps_files_from_before_the_update_type_column(tmp_path: Path) -> None:
    """A store written before ``update_type`` existed (issue 37, item 17) compacts with newer
    files: the old rows read back with a null update type, none is lost."""
    partition = _three_files(tmp_path)
    oldest = sorted(partition.glob("part-r1-*"))[0]
    table = pq.read_table(oldest)
    pq.write_table(table.drop_columns(["update_type"]), oldest)
    before = len(_store(tmp_path))
    outputs = compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: AFTER)
    merged = pq.read_table(outputs[0])
    assert (
        merged.column("update_type").to_pylist()
        == [None, None, "NORMAL", "NORMAL"] + ["NORMAL"] * 2
    )
    assert len(_store(tmp_path)) == before


def test_interrupted_compaction_finishes_without_duplicates(tmp_path: Path) -> None:
    partition = _three_files(tmp_path)
    before = len(_store(tmp_path))
    inputs = sorted(p.name for p in partition.glob("part-r1-*"))
    # A kill after the output was renamed into place, before the inputs were deleted.
    plan = [{"output": "part-r1-1-6.parquet", "inputs": inputs}]
    (partition / "_compaction.json").write_text(json.dumps(plan))
    tables = [pq.read_table(partition / name) for name in inputs]
    merged = pa.concat_tables(
        [
            t.set_column(
                t.schema.get_field_index("data"),
                "data",
                t.column("data").cast(tables[-1].schema.field("data").type),
            )
            for t in tables
        ]
    )
    pq.write_table(merged, partition / "part-r1-1-6.parquet")
    assert len(_store(tmp_path)) == 2 * before - 1  # duplicates visible until finished
    compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: AFTER)
    assert len(_store(tmp_path)) == before
    assert not (partition / "_compaction.json").exists()


def test_compaction_refuses_an_open_day_or_a_conversion_in_progress(tmp_path: Path) -> None:
    _three_files(tmp_path)
    open_day = datetime.datetime(2024, 3, 2, 0, 30, tzinfo=datetime.UTC).timestamp()
    with pytest.raises(ValueError, match="not closed"):
        compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: open_day)
    progress = tmp_path / "_journal" / "r2" / "progress.json"
    record = json.loads(progress.read_text())
    record["planned"] = {
        "segments": [],
        "files": ["device=PS1/property=Acq/date=2024-03-01/x.parquet"],
    }
    progress.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="in progress"):
        compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: AFTER)


def test_groups_are_bounded_in_bytes(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "r1")
    for seq in (1, 2, 3):
        _segment(journal, [(seq, DAY1 - 10 + seq, Data(x=float(seq)))])
    converter = Converter(tmp_path, "r1", max_group_bytes=1)  # every segment is a group
    assert converter.convert_pending() == 3
    assert [
        p.name for p in sorted(partition_path(tmp_path, "PS1", "Acq", "2024-03-01").iterdir())
    ] == [
        "part-r1-1-1.parquet",
        "part-r1-2-2.parquet",
        "part-r1-3-3.parquet",
    ]
    together = tmp_path / "together"
    journal = Journal(together, "r1")
    for seq in (1, 2, 3):
        _segment(journal, [(seq, DAY1 - 10 + seq, Data(x=float(seq)))])
    assert Converter(together, "r1").convert_pending() == 3
    assert [p.name for p in partition_path(together, "PS1", "Acq", "2024-03-01").iterdir()] == [
        "part-r1-1-3.parquet"
    ]


def _encodings(path: Path) -> dict[str, tuple[str, bool]]:
    """Per Parquet column: its compression, and whether any page is dictionary-encoded."""
    group = pq.read_metadata(path).row_group(0)
    columns = (group.column(i) for i in range(group.num_columns))
    return {c.path_in_schema: (c.compression, "RLE_DICTIONARY" in c.encodings) for c in columns}


def test_float_arrays_are_stored_plain_and_the_rest_compressed(tmp_path: Path) -> None:
    """Floating-point array values are written uncompressed without a dictionary (they hardly
    compress and decode several times slower), by the converter and by compaction alike; every
    other column, integer arrays included, stays zstd with dictionaries."""
    journal = Journal(tmp_path, "r1")
    for seq in (1, 2, 3):
        value = Data(x=float(seq), wave=[0.5 * seq] * 300, counts=[seq] * 300)
        _segment(journal, [(seq, DAY1 - 10 + seq, value)])
    assert Converter(tmp_path, "r1", max_group_bytes=1).convert_pending() == 3
    converted = sorted(partition_path(tmp_path, "PS1", "Acq", "2024-03-01").iterdir())
    assert len(converted) == 3
    written = [_encodings(converted[0])]
    outputs = compact(tmp_path, "PS1", "Acq", "2024-03-01", clock=lambda: AFTER)
    assert len(outputs) == 1
    written.append(_encodings(outputs[0]))
    for columns in written:
        assert columns.pop("data.wave.list.element") == ("UNCOMPRESSED", False)
        assert columns.pop("data.counts.list.element")[0] == "ZSTD"
        assert columns.pop("data.x") == ("ZSTD", True)
        assert {kind for kind, _ in columns.values()} == {"ZSTD"}
    assert pq.read_table(outputs[0]).column("data").to_pylist()[2]["wave"] == [1.5] * 300


def test_a_group_of_many_keys_over_segments_and_days_converts_each_row_once(
    tmp_path: Path,
) -> None:
    """Keys interleaved in every segment (a recorder of many properties), rows on both sides
    of midnight, a key whose type widens between segments (its rows come from two value
    types), error rows before any value: one file per (key, day), its rows that key's, in seq
    order, every row once, values and stamps as written."""
    journal = Journal(tmp_path, "r1")
    narrow, wide, empty = arrow_type_of(Data(x=1)), arrow_type_of(Data(x=1, y=0.5)), pa.struct([])
    expected: dict[int, tuple[str, int, Any]] = {}
    seq = 0
    for part in range(3):
        builder = SegmentBuilder()
        for _ in range(4):
            for i in range(40):
                seq += 1
                acq = (DAY1 if part == 0 else DAY2) + seq
                device = f"PS{i}"
                if device == "PS0" and part == 2:  # widened (a field added) within day 2
                    data: Data | None = Data(x=seq, y=0.5)
                    slot = builder.key_slot((device, "Acq", 1), wide)
                elif device == "PS1":  # errors only, before any value: version 0
                    data = None
                    slot = builder.key_slot((device, "Acq", 0), empty)
                else:
                    data = Data(x=seq)
                    slot = builder.key_slot((device, "Acq", 1), narrow)
                assert slot is not None
                error = None if data is not None else "RemoteError: down"
                builder.add(slot, data, "SEL", acq, acq - 5, "CYC", acq + 7, seq, error)
                expected[seq] = (device, acq, None if data is None else dict(data.items()))
        journal.write(builder)
    converter = Converter(tmp_path, "r1")
    assert converter.convert_pending() == 3
    seen: list[int] = []
    files = sorted(tmp_path.glob("device=*/property=*/date=*/part-*.parquet"))
    assert len(files) == 2 * 40  # every key on both days
    for path in files:
        table = pq.read_table(path)
        device = path.parts[-4].removeprefix("device=")
        seqs = table.column("seq").to_pylist()
        assert seqs == sorted(seqs), path
        assert path.name == f"part-r1-{seqs[0]}-{seqs[-1]}.parquet"
        for row in table.to_pylist():
            want_device, want_acq, want_data = expected[row["seq"]]
            assert device == want_device and row["acq_stamp"] == want_acq
            if want_data is None:
                assert row["data"] is None and row["error"] == "RemoteError: down"
            else:
                assert {k: row["data"][k] for k in want_data} == want_data
            seen.append(row["seq"])
    assert sorted(seen) == list(range(1, seq + 1))
