"""Compaction into one file per signal-hour, with every reader seeing each row once; --keep."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rda.pipeline.history.local import local_get
from rda.pipeline.history.paths import StoreIndex
from rda.pipeline.recorder.cli import record
from rda.pipeline.recorder.compaction import compact_store, delete_older
from rda.pipeline.recorder.converter import Converter, partition_path
from rda.pipeline.recorder.journal import Journal, SegmentBuilder
from rda.pipeline.recorder.query import RELISTS, Cursor, HistoryReader
from rda.pipeline.recorder.schema import arrow_type_of
from rda.pipeline.recorder.service import Recorder
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data
from rda.serialization.errors import HistoryUnavailableError

pytestmark = pytest.mark.timeout(120)

HOUR_NS = 3_600 * 10**9
T0 = int(datetime.datetime(2024, 3, 1, 10, tzinfo=datetime.UTC).timestamp() * 1e9)
AFTER = datetime.datetime(2024, 3, 10, tzinfo=datetime.UTC).timestamp()
DEVICES = ("PS1", "PS2")
ROWS_PER_FILE = 5
FILES_PER_HOUR = 4


def _recorded(root: Path) -> int:
    """Two devices, two hours, each hour in FILES_PER_HOUR small files per device; returns the
    number of rows. x is the row's seq, so a repeated or missing row shows."""
    journal = Journal(root, "r1")
    converter = Converter(root, "r1")
    seq = 0
    step = HOUR_NS // (FILES_PER_HOUR * ROWS_PER_FILE)
    for n in range(2 * FILES_PER_HOUR):
        builder = SegmentBuilder()
        for device in DEVICES:
            for i in range(ROWS_PER_FILE):
                seq += 1
                acq = T0 + (n * ROWS_PER_FILE + i) * step
                data = Data(x=float(seq), n=seq)
                slot = builder.key_slot((device, "Acq", 1), arrow_type_of(data))
                assert slot is not None
                builder.add(slot, data, "SEL", acq, acq - 5, "CYC", acq + 7, seq, None)
        journal.write(builder)
        converter.convert_pending()  # one small file per device and segment
    return seq


def _parquet_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("device=*/property=*/date=*/part-*.parquet"))


def _local_rows(root: Path) -> list[float]:
    table = local_get(root, [f"{d}/Acq" for d in DEVICES], T0, T0 + 2 * HOUR_NS)
    return [float(x) for x in table.column("x").to_pylist()]


def _server_rows(root: Path, reader: HistoryReader | None = None) -> list[float]:
    """Every row the recorder's history server would send, chunk after chunk."""
    if reader is None:
        journal = Journal(root, "r1")
        reader = HistoryReader(
            Store.open(root), journal, lambda: Converter(root, "r1").max_seq, "r1"
        )
    values: list[float] = []
    for device in DEVICES:
        after = None
        while True:
            chunk = reader.chunk(device, "Acq", T0, T0 + 2 * HOUR_NS, after=after, max_rows=7)
            table = chunk.table
            if table.num_rows:
                values.extend(x["x"] for x in table.column("data").to_pylist())
                last = table.num_rows - 1
                after = Cursor(
                    table.column("acq_stamp")[last].as_py(),
                    table.column("recorder_id")[last].as_py(),
                    table.column("seq")[last].as_py(),
                )
            if not chunk.more:
                break
    return values


def _listed(root: Path) -> list[str]:
    index = StoreIndex(root)
    return [p for d in DEVICES for p in index.files(d, "Acq", ["2024-03-01"])]


def _once(values: list[float], total: int) -> None:
    assert sorted(values) == [float(s) for s in range(1, total + 1)]


def test_every_reader_sees_each_row_once_at_every_step_of_a_compaction(tmp_path: Path) -> None:
    """Readers run between each durable step (plan written, outputs written, inputs deleted);
    and a reader that listed the small files before the outputs appeared reads them after."""
    total = _recorded(tmp_path)
    assert len(_parquet_files(tmp_path)) == 2 * 2 * FILES_PER_HOUR
    listed_early: list[str] = []
    steps: list[str] = []

    def between(step: str, partition: Path) -> None:
        steps.append(f"{partition.parent.parent.name}:{step}")
        _once(_local_rows(tmp_path), total)
        _once(_server_rows(tmp_path), total)
        if step == "planned" and not listed_early:
            listed_early.extend(_listed(tmp_path))  # a Spark query planned now, read later

    first = compact_store(tmp_path, linger=60.0, clock=lambda: AFTER, on_step=between)
    assert first.removed == 0 and len(first.outputs) == 2 * 2  # one per device and hour
    # Inputs linger beside their outputs: the early reader still reads them, once.
    early = [x for path in listed_early for x in pq.read_table(path).column("data").to_pylist()]
    assert len(early) == total // 2 or len(early) == total  # one or both partitions listed
    assert len({row["n"] for row in early}) == len(early)
    assert len(_parquet_files(tmp_path)) == 2 * 2 * FILES_PER_HOUR + 4
    second = compact_store(tmp_path, linger=60.0, clock=lambda: AFTER + 61, on_step=between)
    assert second.outputs == [] and second.removed == 2 * 2 * FILES_PER_HOUR
    assert steps == [
        f"{s}:{step}" for s in ("device=PS1", "device=PS2") for step in ("planned", "written")
    ] + ["device=PS1:removed", "device=PS2:removed"]
    names = _parquet_files(tmp_path)
    assert len(names) == 4  # one file per signal-hour
    _once(_local_rows(tmp_path), total)
    _once(_server_rows(tmp_path), total)
    assert not list(tmp_path.glob("device=*/property=*/date=*/_compaction.json"))
    # A reader without rda (DuckDB over the whole store, hive partitions) counts the same
    # rows and first stamp as local_get, and the field types survive the rewrite.
    con = duckdb.connect()
    answer = con.execute(
        f"SELECT count(*), min(acq_stamp), count(DISTINCT seq) FROM read_parquet("
        f"'{tmp_path}/**/*.parquet', hive_partitioning=true) WHERE date = '2024-03-01'"
    ).fetchone()
    table = local_get(tmp_path, [f"{d}/Acq" for d in DEVICES], T0, T0 + 2 * HOUR_NS)
    assert answer == (table.num_rows, table.column("acq_stamp")[0].as_py(), total)
    kinds = con.execute(
        f"SELECT column_name, column_type FROM (DESCRIBE SELECT data.* "
        f"FROM read_parquet('{tmp_path}/**/*.parquet'))"
    ).fetchall()
    assert dict(kinds) == {"x": "DOUBLE", "n": "BIGINT"}
    # A further round finds nothing to do.
    assert compact_store(tmp_path, clock=lambda: AFTER + 120) == compact_store(
        tmp_path, clock=lambda: AFTER + 180
    )
    assert _parquet_files(tmp_path) == names


def test_a_local_read_that_outlives_the_linger_lists_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction without linger runs between a local read's listing and its reading: the
    listed inputs are gone, and the read lists again instead of failing or losing rows."""
    total = _recorded(tmp_path)
    listing = StoreIndex.files
    compacted: list[int] = []

    def files_then_compact(self: StoreIndex, device: str, prop: str, days: Any) -> list[str]:
        names = listing(self, device, prop, days)
        if not compacted:
            compacted.append(compact_store(tmp_path, linger=0.0, clock=lambda: AFTER).removed)
        return names

    monkeypatch.setattr(StoreIndex, "files", files_then_compact)
    _once(_local_rows(tmp_path), total)
    assert compacted == [2 * 2 * FILES_PER_HOUR]


def test_a_history_read_that_outlives_the_linger_lists_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history server's reader (HistoryReader) listed the small files, then a compaction
    without linger deleted them before the chunk read them (a reader slower than the linger):
    the chunk lists again and reads the output, so every row comes once (before, the missing
    files' rows were skipped for that chunk)."""
    total = _recorded(tmp_path)
    listing = Store.files
    calls: list[int] = []

    def files_then_compact(self: Store, path: str) -> list[Any]:
        found = listing(self, path)
        calls.append(len(found))
        if len(calls) == 2:  # PS1's second chunk: the first one's files are known, not all read
            compact_store(tmp_path, linger=0.0, clock=lambda: AFTER)
        return found

    monkeypatch.setattr(Store, "files", files_then_compact)
    journal = Journal(tmp_path, "r1")
    reader = HistoryReader(
        Store.open(tmp_path), journal, lambda: Converter(tmp_path, "r1").max_seq, "r1"
    )
    _once(_server_rows(tmp_path, reader), total)
    assert reader.relists() == 1
    assert len(_parquet_files(tmp_path)) == 4  # compacted: one file per device-hour


def test_a_store_that_keeps_changing_is_an_error_the_client_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each listing names a file that is gone when read: after RELISTS listings the chunk
    fails with HistoryUnavailableError (a history server sends it to the client), never a
    chunk without those rows."""
    _recorded(tmp_path)
    listing = Store.files

    def files_and_a_ghost(self: Store, path: str) -> list[Any]:
        ghost = pafs.FileInfo(f"{path}/part-r1-999-999.parquet", pafs.FileType.File, size=10)
        return [*listing(self, path), ghost]

    monkeypatch.setattr(Store, "files", files_and_a_ghost)
    journal = Journal(tmp_path, "r1")
    reader = HistoryReader(Store.open(tmp_path), journal, lambda: 0, "r1")
    with pytest.raises(HistoryUnavailableError, match="changed under the read 3 times"):
        reader.chunk("PS1", "Acq", T0, T0 + 2 * HOUR_NS, max_rows=7)
    assert reader.relists() == RELISTS


def test_an_open_hour_waits_for_its_grace(tmp_path: Path) -> None:
    _recorded(tmp_path)
    # 30 minutes after the second hour ended, with a grace of one hour: only the first hour.
    now = (T0 + 2 * HOUR_NS) / 1e9 + 1_800
    done = compact_store(tmp_path, grace=3_600.0, linger=0.0, clock=lambda: now)
    assert len(done.outputs) == 2 and done.removed == 2 * FILES_PER_HOUR
    assert len(_parquet_files(tmp_path)) == 2 * (1 + FILES_PER_HOUR)


def test_an_interrupted_compaction_is_finished_by_the_next_round(tmp_path: Path) -> None:
    total = _recorded(tmp_path)

    def crash(step: str, partition: Path) -> None:
        if step == "planned":
            raise KeyboardInterrupt  # killed after the plan, before any output

    with pytest.raises(KeyboardInterrupt):
        compact_store(tmp_path, linger=0.0, clock=lambda: AFTER, on_step=crash)
    plan = partition_path(tmp_path, "PS1", "Acq", "2024-03-01") / "_compaction.json"
    assert json.loads(plan.read_text())[0]["inputs"]
    _once(_local_rows(tmp_path), total)
    compact_store(tmp_path, linger=0.0, clock=lambda: AFTER)
    assert len(_parquet_files(tmp_path)) == 4
    _once(_local_rows(tmp_path), total)


def test_keep_deletes_old_day_partitions_whole(tmp_path: Path) -> None:
    _recorded(tmp_path)
    day = partition_path(tmp_path, "PS1", "Acq", "2024-03-01")
    leftover = day.with_name(".date=2024-02-01.deleting")  # a crash mid-delete
    leftover.mkdir()
    (leftover / "part-r1-1-1.parquet").write_bytes(b"x")
    end_of_day = datetime.datetime(2024, 3, 2, tzinfo=datetime.UTC).timestamp()
    assert delete_older(tmp_path, 86_400.0, clock=lambda: end_of_day + 86_000) == []
    assert not leftover.exists() and day.exists()
    deleted = delete_older(tmp_path, 86_400.0, clock=lambda: end_of_day + 86_401)
    assert sorted(p.parent.parent.name for p in deleted) == ["device=PS1", "device=PS2"]
    assert _parquet_files(tmp_path) == []
    assert (tmp_path / "_journal" / "r1" / "progress.json").exists()  # the journal is kept


def test_the_recorder_compacts_and_applies_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = _recorded(tmp_path)
    recorder = Recorder(
        tmp_path, recorder_id="r1", compact_interval=600.0, compact_linger=0.0, keep=30 * 86_400
    )
    recorder.maintain_store(now=AFTER)
    assert len(_parquet_files(tmp_path)) == 4
    recorder.maintain_store(now=AFTER + 1)  # not due yet: nothing runs
    stats = recorder.statistics()
    assert (stats.compacted_files, stats.compaction_inputs_removed) == (4, 4 * FILES_PER_HOUR)
    _once(_local_rows(tmp_path), total)

    from rda.pipeline.recorder import compaction

    read: list[str] = []
    stamp_range = compaction._stamp_range

    def counted(path: Path) -> tuple[int, int]:
        read.append(path.name)
        return stamp_range(path)

    # Each file's footer is read once: the outputs in the next round, then none.
    monkeypatch.setattr(compaction, "_stamp_range", counted)
    recorder.maintain_store(now=AFTER + 601)
    assert sorted(read) == _parquet_files(tmp_path)
    recorder.maintain_store(now=AFTER + 1202)
    assert len(read) == 4 and recorder.statistics().compaction_errors == 0
    monkeypatch.undo()
    recorder.maintain_store(now=AFTER + 40 * 86_400)
    assert recorder.statistics().partitions_deleted == 2
    assert _parquet_files(tmp_path) == []


def test_record_rejects_a_bad_keep_and_keep_on_a_remote_store(tmp_path: Path) -> None:
    bad = CliRunner().invoke(record, [str(tmp_path), "PS1/Acq", "--keep", "a month"])
    assert bad.exit_code == 2 and "duration" in bad.output
    with pytest.raises(ValueError, match="local store"):
        Recorder("mock://bucket/x", recorder_id="r1", journal=tmp_path, keep=86_400.0)
