"""The history store on any pyarrow filesystem: a ``file://`` URI end to end, an in-memory
filesystem (no local disk) for the recorder's Parquet output and the pyarrow History reader,
idempotent redo of an interrupted conversion there, and the URIs Spark is given."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from click.testing import CliRunner

import rda.pipeline.recorder.converter as converter
from rda._cli import build
from rda.pipeline.history.api import History
from rda.pipeline.history.local import local_get, local_search
from rda.pipeline.recorder.converter import Converter
from rda.pipeline.recorder.schema import SchemaCatalog
from rda.pipeline.recorder.service import Recorder, Sample
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data
from rda.serialization.header import DataContext

START = datetime.datetime(2026, 11, 20, 23, 0, tzinfo=datetime.UTC)
T0 = int(START.timestamp()) * 10**9
STEP = 300 * 10**9  # every 5 minutes for 2 hours: two UTC days
ROWS = 24
WINDOW = (T0, T0 + ROWS * STEP)


def _record(root: Any, journal: Path | None = None, *, convert: bool = True) -> None:
    """PS1/Acq: x int then (from row 20) x string -> a second schema version; PS2/Acq: s."""
    recorder = Recorder(
        root, recorder_id="r1", journal=journal, convert=convert, convert_interval=3600.0
    )
    recorder.start()
    try:
        for i in range(ROWS):
            context = DataContext(acq_stamp=T0 + i * STEP)
            x: int | str = i if i < 20 else f"x{i}"
            assert recorder.offer("PS1", "Acq", None, Sample(Data(x=x, y=i * 0.5), context))
            assert recorder.offer("PS2", "Acq", None, Sample(Data(s=f"s{i}"), context))
            assert recorder.flush()  # one segment per row pair: several segments to convert
    finally:
        recorder.stop(convert=convert)


def _memory_store() -> Store:
    # pyarrow's in-memory filesystem: nothing of the store can touch the local disk.
    return Store(pafs._MockFileSystem(), "bucket/history")


def _parquet_names(store: Store) -> list[str]:
    selector = pafs.FileSelector(store.base, recursive=True, allow_not_found=True)
    return sorted(i.path for i in store.fs.get_file_info(selector) if i.path.endswith(".parquet"))


def _ps1_rows(table: pa.Table) -> list[tuple[int, float]]:
    return list(
        zip(table.column("acq_stamp").to_pylist(), table.column("y").to_pylist(), strict=True)
    )


EXPECTED_PS1 = [(T0 + i * STEP, i * 0.5) for i in range(ROWS)]


@pytest.mark.timeout(240)  # the first Spark test of a run also starts the JVM
def test_file_uri_store_end_to_end(tmp_path: Path, spark: Any) -> None:
    root = tmp_path / "store"
    uri = root.absolute().as_uri()
    assert uri.startswith("file:///")
    _record(uri)
    days = sorted(p.name for p in (root / "device=PS1" / "property=Acq").iterdir())
    assert days == ["date=2026-11-20", "date=2026-11-21"]
    assert (root / "_journal" / "r1" / "progress.json").exists()  # a local store keeps its journal

    by_uri = local_get(uri, "PS1/Acq#y", *WINDOW)
    by_path = local_get(root, "PS1/Acq#y", *WINDOW)
    assert _ps1_rows(by_uri) == EXPECTED_PS1
    assert by_uri.equals(by_path)

    result = CliRunner().invoke(
        build(),
        ["history", "get", uri, "PS2/Acq", "-s", str(WINDOW[0]), "-e", str(WINDOW[1]), "--json"],
    )
    assert result.exit_code == 0, result.output
    assert [r["s"] for r in json.loads(result.output)] == [f"s{i}" for i in range(ROWS)]

    history = History(spark, uri)
    assert history.root == str(root.absolute())  # Spark reads a file:// store by its path
    frame = history.get("PS1/Acq#y", *WINDOW).toArrow()
    assert _ps1_rows(frame) == EXPECTED_PS1


def test_recorder_and_reader_on_an_in_memory_filesystem(tmp_path: Path) -> None:
    store = _memory_store()
    journal = tmp_path / "journal"
    _record(store, journal)

    names = _parquet_names(store)
    assert names and all(n.startswith("bucket/history/device=PS") for n in names)
    assert not [n for n in names if "/." in n], "a temporary name was left in the store"
    assert not list(tmp_path.rglob("*.parquet")), "Parquet went to the local disk"
    assert list((journal / "_journal" / "r1").glob("seg-*.arrow"))  # the journal stays local

    versions = SchemaCatalog(store).versions("PS1", "Acq")
    assert [v["number"] for v in versions] == [1, 2]  # x: int64, then string
    assert store.exists("bucket/history/_schemas/device=PS1/property=Acq.json")

    found = local_search(store, "PS*")
    assert found.column("device").to_pylist() == ["PS1", "PS2"]
    assert found.column("schema_versions").to_pylist() == [[1, 2], [1]]
    assert _ps1_rows(local_get(store, "PS1/Acq#y", *WINDOW)) == EXPECTED_PS1
    xs = local_get(store, "PS1/Acq#x", T0, T0 + 20 * STEP).column("x").to_pylist()
    assert xs == list(range(20))
    strings = local_get(store, "PS1/Acq#x", T0 + 20 * STEP, WINDOW[1]).column("x").to_pylist()
    assert strings == [f"x{i}" for i in range(20, ROWS)]


def test_interrupted_conversion_is_redone_under_the_same_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _memory_store()
    journal = tmp_path / "journal"
    _record(store, journal, convert=False)
    assert _parquet_names(store) == []

    real = converter._write_parquet
    written: list[str] = []

    def crash_after_two(target: Any, table: pa.Table) -> None:
        if len(written) == 2:
            raise OSError("simulated crash inside a conversion")
        real(target, table)
        written.append(target.path)

    monkeypatch.setattr(converter, "_write_parquet", crash_after_two)
    with pytest.raises(OSError, match="simulated crash"):
        Converter(store, "r1", journal=journal).convert_pending()
    progress = json.loads((journal / "_journal" / "r1" / "progress.json").read_text())
    assert progress["planned"] is not None
    assert sorted(written) == _parquet_names(store)

    monkeypatch.setattr(converter, "_write_parquet", real)
    redo = Converter(store, "r1", journal=journal)
    assert redo.convert_pending() > 0
    names = _parquet_names(store)
    assert set(written) <= set(names)  # the same names were rewritten, none added beside them
    planned = [store.path(f) for f in progress["planned"]["files"]]
    assert set(planned) <= set(names)
    assert local_get(store, "PS2/Acq", *WINDOW).num_rows == ROWS  # every row exactly once
    assert _ps1_rows(local_get(store, "PS1/Acq#y", *WINDOW)) == EXPECTED_PS1


def test_a_store_off_the_local_disk_needs_a_local_journal() -> None:
    with pytest.raises(ValueError, match="journal"):
        Recorder(_memory_store(), recorder_id="r1")
    with pytest.raises(ValueError, match="journal"):
        Converter(_memory_store(), "r1")


def test_spark_reads_each_store_through_its_hadoop_connector(tmp_path: Path) -> None:
    s3 = Store(pafs._MockFileSystem(), "bucket/history", "s3://bucket/history?region=eu-west-1")
    assert s3.spark_path(s3.path("device=PS1")) == "s3a://bucket/history/device=PS1"
    gcs = Store(pafs._MockFileSystem(), "bucket/h", "gs://bucket/h")
    assert gcs.spark_path(gcs.base) == "gs://bucket/h"
    hdfs = Store(pafs._MockFileSystem(), "/data/h", "hdfs://namenode:8020/data/h")
    assert hdfs.spark_path(hdfs.path("x.parquet")) == "hdfs://namenode:8020/data/h/x.parquet"
    local = Store.open(tmp_path.as_uri())
    assert local.local and local.spark_path(local.base) == str(tmp_path)
    assert Store.open(tmp_path).spark_path(local.base) == str(tmp_path)
    with pytest.raises(ValueError, match="Spark cannot read a mock filesystem"):
        History(None, _memory_store())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pyarrow\.fs can open"):
        Store.open("nosuchscheme://x/y")


def test_an_s3_uri_opens_an_object_store() -> None:
    store = Store.open("s3://bucket/history?region=eu-west-1")  # no request is made here
    assert store.fs.type_name == "s3" and store.base == "bucket/history"
    assert store.object_store and not store.local  # objects are written once, in place


def test_history_cli_rejects_a_missing_local_root(tmp_path: Path) -> None:
    result = CliRunner().invoke(build(), ["history", "search", str(tmp_path / "absent")])
    assert result.exit_code != 0
    assert "is not a directory" in result.output


def test_record_cli_needs_a_journal_for_a_uri_store() -> None:
    # No request reaches S3: the recorder refuses before anything is written.
    uri = "s3://bucket/history?region=eu-west-1"
    result = CliRunner().invoke(build(), ["record", uri, "PS1/Acq", "--duration", "1s"])
    assert result.exit_code == 2, result.output
    assert "--journal" in result.output
