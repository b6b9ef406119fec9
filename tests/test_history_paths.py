"""The History API's argument parsing and store file resolution (plain Python, no Spark)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from rda.pipeline.history.paths import (
    DAY_NS,
    StoreIndex,
    days_between,
    parse_duration,
    parse_signal,
    parse_signals,
    parse_time,
)
from rda.pipeline.recorder.converter import partition_path
from rda.pipeline.recorder.store import Store

T = 1_795_305_600_000_000_000  # 2026-11-22T00:00:00Z


def test_times_in_every_accepted_form() -> None:
    assert parse_time(T + 7, "start") == T + 7
    assert parse_time(np.int64(T), "start") == T
    assert parse_time(datetime.datetime(2026, 11, 22), "start") == T  # naive = UTC
    aware = datetime.datetime(
        2026, 11, 22, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    assert parse_time(aware, "start") == T
    assert parse_time("2026-11-22T00:00:00.000001Z", "end") == T + 1_000
    assert parse_time("2026-11-22", "end") == T
    assert parse_time(datetime.date(2026, 11, 22), "end") == T


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01", 1.5, None, True, [1]])
def test_malformed_times_name_the_argument(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^start: "):
        parse_time(bad, "start")


def test_durations() -> None:
    assert parse_duration("10s", "every") == 10 * 10**9
    assert parse_duration("500ms", "every") == 500 * 10**6
    assert parse_duration("5min", "every") == parse_duration("5m", "every") == 300 * 10**9
    assert parse_duration("1.5h", "every") == 5_400 * 10**9
    assert parse_duration("1d", "lookback") == DAY_NS
    assert parse_duration(datetime.timedelta(seconds=2), "every") == 2 * 10**9
    assert parse_duration(42, "every") == 42
    for bad in ("10", "s", "-1s", "0s", 0, "1 fortnight", None):
        with pytest.raises(ValueError, match=r"^every: "):
            parse_duration(bad, "every")


def test_signals() -> None:
    assert parse_signal("PS1/Acq") == parse_signal("PS1/Acq", "master")
    signal = parse_signal("PS*/Acq#sub.x")
    assert (signal.device, signal.prop, signal.field) == ("PS*", "Acq", "sub.x")
    assert signal.matches("PS7", "Acq") and not signal.matches("BPM", "Acq")
    assert [s.text for s in parse_signals(["A/B", "C/D#e"])] == ["A/B", "C/D#e"]
    for bad in ("PS1", "/Acq", "PS1/", "PS1/Acq#", "PS1/Acq#a..b", "P[S/Acq", "a b/c", "A/B/C"):
        with pytest.raises(ValueError, match=r"^signals: "):
            parse_signals(bad)
    with pytest.raises(ValueError, match=r"^signals: "):
        parse_signals([])
    with pytest.raises(ValueError, match=r"^master: "):
        parse_signal("nope", "master")


def test_days_of_a_window_are_half_open() -> None:
    assert days_between(T, T) == []
    assert days_between(T, T + DAY_NS) == ["2026-11-22"]
    assert days_between(T - 1, T + DAY_NS + 1) == ["2026-11-21", "2026-11-22", "2026-11-23"]


def _file(root: Path, device: str, prop: str, day: str, name: str, kind: pa.DataType) -> None:
    path = partition_path(root, device, prop, day) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"acq_stamp": pa.array([1], pa.int64()), "data": pa.nulls(1, kind)}), path
    )


def test_store_index_resolves_keys_days_files_and_types(tmp_path: Path) -> None:
    a = pa.struct([("x", pa.float64())])
    wider = pa.struct([("x", pa.float64()), ("y", pa.int64())])
    other = pa.struct([("x", pa.string())])
    _file(tmp_path, "PS1", "Acq", "2026-11-21", "part-r-1-5.parquet", a)
    _file(tmp_path, "PS1", "Acq", "2026-11-22", "part-r-6-9.parquet", wider)
    _file(tmp_path, "PS1", "Acq", "2026-11-22", "part-r-10-12.parquet", other)
    _file(tmp_path, "odd/name", "Acq", "2026-11-22", "part-r-13-13.parquet", a)
    (partition_path(tmp_path, "PS1", "Acq", "2026-11-22") / ".part-r-14-15.parquet.tmp").touch()
    index = StoreIndex(tmp_path)
    assert index.keys(parse_signals("*/Acq")) == [("PS1", "Acq"), ("odd/name", "Acq")]
    assert index.keys(parse_signals(["PS?/A*", "NOPE/Acq"])) == [("PS1", "Acq")]
    assert index.days("PS1", "Acq") == ["2026-11-21", "2026-11-22"]
    files = index.files("PS1", "Acq", days_between(T - 1, T + 1))
    assert [Path(f).name for f in files] == [
        "part-r-1-5.parquet",
        "part-r-10-12.parquet",
        "part-r-6-9.parquet",
    ]
    groups = index.group([(("PS1", "Acq"), f) for f in files])
    assert [g.data_type for g in groups] == [wider, other]  # versions that conflict stay apart
    assert [len(g.files) for g in groups] == [2, 1]
    assert index.any_type("PS1", "Acq") is not None


def test_files_of_a_compaction_in_progress_are_not_read_twice(tmp_path: Path) -> None:
    kind = pa.struct([("x", pa.float64())])
    for name in ("part-r-1-5.parquet", "part-r-6-9.parquet", "part-r-1-9.parquet"):
        _file(tmp_path, "PS1", "Acq", "2026-11-22", name, kind)
    plan = [
        {"output": "part-r-1-9.parquet", "inputs": ["part-r-1-5.parquet", "part-r-6-9.parquet"]}
    ]
    directory = partition_path(tmp_path, "PS1", "Acq", "2026-11-22")
    (directory / "_compaction.json").write_text(json.dumps(plan))
    files = StoreIndex(tmp_path).files("PS1", "Acq", ["2026-11-22"])
    assert [Path(f).name for f in files] == ["part-r-1-9.parquet"]


class _CountingStore(Store):
    """A local store that counts the directories whose files are listed."""

    listed = 0

    def files(self, path: str) -> list[Any]:
        self.listed += 1
        return super().files(path)


def test_a_window_of_many_days_lists_only_the_days_the_property_has(tmp_path: Path) -> None:
    # A query "since ever" spans 20,000 days: it listed each day's directory, for every
    # signal, nearly all absent (20.8M listings for 1,000 signals in the scale benchmark).
    kind = pa.struct([("x", pa.float64())])
    _file(tmp_path, "PS1", "Acq", "2026-11-21", "part-r-1-5.parquet", kind)
    _file(tmp_path, "PS1", "Acq", "2026-11-22", "part-r-6-9.parquet", kind)
    _file(tmp_path, "PS1", "Acq", "2026-11-24", "part-r-10-12.parquet", kind)
    store = _CountingStore(pafs.LocalFileSystem(), str(tmp_path))
    index = StoreIndex(store)
    ever = days_between(0, T + 2 * DAY_NS)
    assert len(ever) > 20_000
    names = [Path(f).name for f in index.files("PS1", "Acq", ever)]
    assert names == ["part-r-1-5.parquet", "part-r-6-9.parquet"]  # 2026-11-24 is past the end
    assert store.listed == 2
    # Days not in a run, in the order asked; a short list is read as before.
    picked = index.files("PS1", "Acq", ["2026-11-24", "2026-11-20", "2026-11-21"])
    assert [Path(f).name for f in picked] == ["part-r-10-12.parquet", "part-r-1-5.parquet"]
    assert [Path(f).name for f in index.files("PS1", "Acq", ["2026-11-22"])] == [
        "part-r-6-9.parquet"
    ]
