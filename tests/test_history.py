"""The History API on PySpark against a store written by the real recorder.

One store per module (``store``): the recorder's storage core is fed ``Sample``s directly, so
journal segments, conversion, partitions, the schema catalog and schema versions are all the
real thing. Expected values are computed here from the inputs with pandas/numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
import pytest

from rda.pipeline.history.api import BASE_COLUMNS, History, to_pandas
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext

# The JVM starts in the first test; the store is built once per module.
pytestmark = pytest.mark.timeout(300)

MIDNIGHT = 1_795_305_600_000_000_000  # 2026-11-22T00:00:00Z: the store spans two days
S = 10**9


@dataclass
class Store:
    root: Path
    rows: pd.DataFrame  # one row per input: device, prop, acq, selector, error, fields...


def _ps_value(i: int) -> Data:
    current = float("nan") if i % 17 == 3 else math.sin(i) * 10
    return Data(
        current=current,
        n=i * 3,
        wave=np.arange(i % 4, dtype=np.float64) * 1.5,
        img=np.full((2, 3), i, np.int16),
        sub=Data(ok=i % 2 == 0, x=i / 4),
    )


def _inputs() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    # Two devices of one shape across midnight, stamps that are not whole µs, two selectors.
    for device, first, step, count in (
        ("PS1", MIDNIGHT - 3_600 * S, 36 * S + 7, 200),
        ("PS2", MIDNIGHT - 3_000 * S, 50 * S + 3, 150),
    ):
        for i in range(count):
            acq = first + i * step
            selector = "CPS.USER.A" if i % 3 else "CPS.USER.B"
            row = {"device": device, "prop": "Acq", "acq": acq, "selector": selector}
            if i in (5, 120):
                row["error"] = f"RuntimeError: boom {i}"
            else:
                value = _ps_value(i)
                row.update(error=None, value=value, current=value["current"], n=i * 3)
                row.update(x=i / 4)
            rows.append(row)
    # A property whose schema widens (version 1 gains "extra") then changes type (version 2).
    for i in range(20):
        acq = MIDNIGHT + 600 * S + i * S
        if i < 10:
            value = Data(pos=i)
        elif i < 15:
            value = Data(pos=i, extra=1.5 * i)
        else:
            value = Data(pos=f"s{i}")
        rows.append(
            {"device": "BPM", "prop": "Orbit", "acq": acq, "selector": "", "error": None}
            | {"value": value}
        )
    return rows


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("history")
    inputs = _inputs()
    recorder = Recorder(root, recorder_id="r1", flush_interval=0.02, convert_interval=3_600)
    recorder.start()
    try:
        for row in sorted(inputs, key=lambda r: r["acq"]):
            context = DataContext("CPS.USER.ALL", row["acq"] - 5, row["acq"], row["selector"])
            if row["error"] is None:
                sample = Sample(row["value"], context)
            else:
                sample = Sample(None, context, RuntimeError(row["error"].split(": ")[1]))
            assert recorder.offer(row["device"], row["prop"], None, sample)
        assert recorder.flush(timeout=30)
    finally:
        recorder.stop()
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "value"} for r in inputs])
    frame["value"] = [r.get("value") for r in inputs]
    return Store(root, frame)


@pytest.fixture(scope="module")
def history(spark: Any, store: Store) -> History:
    return History(spark, store.root)


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def _values(store: Store, device: str, start: int, end: int) -> pd.DataFrame:
    rows = store.rows
    mask = (rows.device == device) & (rows.acq >= start) & (rows.acq < end)
    return rows[mask & rows.error.isna()].sort_values("acq")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b) if not isinstance(a, float) else a == pytest.approx(b, rel=1e-12)


# --- get -------------------------------------------------------------------------------------


def test_get_returns_exactly_the_half_open_window(history: History, store: Store) -> None:
    ps1 = store.rows[store.rows.device == "PS1"].sort_values("acq")
    start, end = int(ps1.acq.iloc[10]), int(ps1.acq.iloc[150])  # spans midnight
    result = history.get("PS1/Acq", start, end)
    expected = _values(store, "PS1", start, end)
    assert result.columns == [*BASE_COLUMNS, "current", "n", "wave", "img", "sub"]
    rows = _rows(result)
    assert [r["acq_stamp"] for r in rows] == expected.acq.tolist()
    assert rows[0]["acq_stamp"] == start and end not in [r["acq_stamp"] for r in rows]
    for row, (_, want) in zip(rows, expected.iterrows(), strict=True):
        value = want["value"]
        assert _same(row["current"], value["current"]) and row["n"] == value["n"]
        assert row["wave"] == value["wave"].tolist()
        assert row["img"] == {"elements": value["img"].ravel().tolist(), "dims": [2, 3]}
        assert row["sub"] == {"ok": value["sub"]["ok"], "x": value["sub"]["x"]}
        assert row["selector"] == want["selector"] and row["cycle_stamp"] == want["acq"] - 5
        assert row["ts"].timestamp() == pytest.approx(want["acq"] / 1e9, abs=1e-6)
    assert history.get("PS1/Acq", start + 1, end).count() == len(expected) - 1


def test_get_fields_selectors_errors_and_globs(history: History, store: Store) -> None:
    start, end = MIDNIGHT - 4_000 * S, MIDNIGHT + 4_000 * S
    picked = history.get(["PS*/Acq#sub.x", "PS1/Acq#n"], start, end, selector="CPS.USER.B")
    assert picked.columns == [*BASE_COLUMNS, "sub.x", "n"]
    rows = _rows(picked)
    expected = store.rows[
        store.rows.device.isin(["PS1", "PS2"])
        & (store.rows.selector == "CPS.USER.B")
        & store.rows.error.isna()
        & (store.rows.acq >= start)
        & (store.rows.acq < end)
    ].sort_values(["device", "acq"])
    assert [(r["device"], r["acq_stamp"]) for r in rows] == list(
        zip(expected.device, expected.acq, strict=True)
    )
    assert [r["sub.x"] for r in rows] == expected.x.tolist()
    glob = history.get("PS2/Acq", start, end, fields=["n"], selector="CPS.USER.[AB]")
    assert glob.columns == [*BASE_COLUMNS, "n"] and glob.count() == len(
        _values(store, "PS2", start, end)
    )
    with_errors = _rows(history.get("PS*/Acq", start, end, fields=["n"], errors=True))
    failed = [(r["device"], r["acq_stamp"], r["error"]) for r in with_errors if r["error"]]
    want = store.rows[store.rows.error.notna()].sort_values(["device", "acq"])
    assert failed == list(zip(want.device, want.acq, want.error, strict=True))
    assert all(r["n"] is None for r in with_errors if r["error"])


def test_get_of_several_signals_is_sorted_by_ranges_of_signals(
    history: History, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """Several signals: each range of them is read and sorted by one task, the ranges in order
    (no range partitioning, whose sampling scans the window twice); the rows come out in
    get's global order all the same."""
    start, end = MIDNIGHT - 4_000 * S, MIDNIGHT + 10_000 * S
    frame = history.get("PS*/Acq", start, end)
    frame.explain()
    assert "rangepartitioning" not in capsys.readouterr().out.lower()
    rows = [(r["device"], r["acq_stamp"]) for r in _rows(frame)]
    expected = pd.concat([_values(store, d, start, end) for d in ("PS1", "PS2")])
    assert rows == list(zip(expected.device, expected.acq, strict=True))
    assert frame.columns == [*BASE_COLUMNS, "current", "n", "wave", "img", "sub"]


def test_schema_versions_read_back_merged(history: History, store: Store) -> None:
    rows = _rows(history.get("BPM/Orbit", MIDNIGHT, MIDNIGHT + 2 * 86_400 * S))
    # pos is int64 in version 1 and string in version 2: the common type is string.
    assert [r["pos"] for r in rows] == [str(i) for i in range(15)] + [
        f"s{i}" for i in range(15, 20)
    ]
    assert [r["extra"] for r in rows] == [None] * 10 + [1.5 * i for i in range(10, 15)] + [None] * 5
    found = _rows(history.search("BPM"))
    assert found == [
        {
            "device": "BPM",
            "property": "Orbit",
            "first_day": pd.Timestamp("2026-11-22").date(),
            "last_day": pd.Timestamp("2026-11-22").date(),
            "schema_versions": [1, 2],
        }
    ]
    assert [(r["device"], str(r["first_day"])) for r in _rows(history.search("PS*/Acq"))] == [
        ("PS1", "2026-11-21"),
        ("PS2", "2026-11-21"),
    ]


def test_empty_results_keep_their_schema(history: History) -> None:
    unknown = history.get("NOPE/Acq", MIDNIGHT, MIDNIGHT + S)
    assert unknown.columns == list(BASE_COLUMNS) and unknown.count() == 0
    empty = history.get("PS1/Acq", MIDNIGHT + 50 * 86_400 * S, MIDNIGHT + 51 * 86_400 * S)
    assert empty.columns == [*BASE_COLUMNS, "current", "n", "wave", "img", "sub"]
    assert empty.count() == 0
    assert history.get("PS1/Acq#nope", MIDNIGHT, MIDNIGHT + S).count() == 0
    assert history.get("PS1/Acq", MIDNIGHT, MIDNIGHT).count() == 0
    assert history.search("NOPE*/*").count() == 0
    stats = history.stats("NOPE/Acq", MIDNIGHT, MIDNIGHT + S, every="1h")
    assert stats.columns[:5] == ["device", "property", "ts", "acq_stamp", "field"]


def test_bad_arguments_raise_value_errors_naming_them(history: History) -> None:
    with pytest.raises(ValueError, match=r"^start: "):
        history.get("PS1/Acq", "not a time", MIDNIGHT)
    with pytest.raises(ValueError, match=r"^end: "):
        history.get("PS1/Acq", MIDNIGHT, 1.5)
    with pytest.raises(ValueError, match=r"^signals: "):
        history.get("PS1", MIDNIGHT, MIDNIGHT + S)
    with pytest.raises(ValueError, match=r"^pattern: "):
        history.search("PS[1/Acq")
    with pytest.raises(ValueError, match=r"^fields: "):
        history.get("PS1/Acq", MIDNIGHT, MIDNIGHT + S, fields="n")
    with pytest.raises(ValueError, match=r"^every: "):
        history.resample("PS1/Acq", MIDNIGHT, MIDNIGHT + S, every="often")
    with pytest.raises(ValueError, match=r"^how: "):
        history.resample("PS1/Acq", MIDNIGHT, MIDNIGHT + S, how="median")
    with pytest.raises(ValueError, match=r"^master: "):
        history.aligned("PS*/Acq", ["BPM/Orbit"], MIDNIGHT, MIDNIGHT + S)
    with pytest.raises(ValueError, match=r"^signal: "):
        history.decimate("PS1/Acq", MIDNIGHT, MIDNIGHT + S)  # several numeric fields
    with pytest.raises(ValueError, match=r"^lookback: "):
        history.last_before("PS1/Acq", MIDNIGHT, lookback="-1h")


def test_many_files_are_listed_in_a_task_per_core(spark: Any, tmp_path: Path) -> None:
    """Spark stats an explicit list of more than 32 files in a job: one task per core, not one
    per file (its default: up to 10,000 tasks), and the session's setting is left as it was."""
    recorder = Recorder(tmp_path, recorder_id="r1", flush_interval=0.02, convert_interval=3_600)
    recorder.start()
    try:
        for i in range(40):  # 40 properties: 40 files
            context = DataContext("CPS.USER.ALL", MIDNIGHT + i * S, MIDNIGHT + i * S, "")
            assert recorder.offer(f"M{i:02d}", "Acq", None, Sample(Data(v=float(i)), context))
        assert recorder.flush(timeout=30)
    finally:
        recorder.stop()
    assert len(list(tmp_path.glob("device=*/property=*/date=*/*.parquet"))) == 40
    key = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    before = spark.conf.get(key)
    context = spark.sparkContext
    context.setJobGroup("rda-listing-test", "listing")
    try:
        frame = History(spark, tmp_path).frame("M*/Acq", MIDNIGHT, MIDNIGHT + 60 * S)
    finally:
        context.setJobGroup("rda-other", "other")
    tracker = context.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("rda-listing-test")]
    tasks = [tracker.getStageInfo(s).numTasks for job in jobs for s in job.stageIds]
    assert tasks and max(tasks) <= context.defaultParallelism, tasks
    assert spark.conf.get(key) == before
    assert sorted(r["v"] for r in _rows(frame)) == [float(i) for i in range(40)]
    ordered = History(spark, tmp_path).get("M*/Acq", MIDNIGHT, MIDNIGHT + 60 * S)
    assert [r["v"] for r in _rows(ordered)] == [float(i) for i in range(40)]


# --- last_before, aligned --------------------------------------------------------------------


def test_last_before(history: History, store: Store) -> None:
    ps2 = _values(store, "PS2", 0, 2**62)
    at = int(ps2.acq.iloc[40])  # a value exactly at t counts
    rows = _rows(history.last_before(["PS*/Acq"], at))
    got = {r["device"]: (r["acq_stamp"], r["n"]) for r in rows}
    for device in ("PS1", "PS2"):
        want = _values(store, device, at - 86_400 * S + 1, at + 1).iloc[-1]
        assert got[device] == (want.acq, want.n)
    assert rows[0]["device"] == "PS1" and set(rows[0]) >= set(BASE_COLUMNS)
    # A lookback that ends before PS2's previous value leaves PS2 out.
    short = _rows(history.last_before("PS2/Acq", at - 1, lookback="10s"))
    assert short == []


def test_aligned_matches_pandas_merge_asof(history: History, store: Store) -> None:
    start, end = MIDNIGHT - 3_000 * S, MIDNIGHT + 1_000 * S
    master = _values(store, "PS2", start, end)[["acq", "n"]]
    other = _values(store, "PS1", start - 86_400 * S, end)[["acq", "x", "n"]]
    result = to_pandas(
        history.aligned("PS2/Acq#n", ["PS1/Acq#sub.x", "PS1/Acq"], start, end, tolerance="30s")
    )
    want = pd.merge_asof(
        master,
        other.rename(columns={"n": "other_n"}),
        on="acq",
        direction="backward",
        tolerance=30 * S,
        allow_exact_matches=True,
    )
    assert result["acq_stamp"].tolist() == want.acq.tolist()
    assert result["n"].tolist() == want.n.tolist()
    got_x = result["PS1/Acq#sub.x"].tolist()
    assert [None if pd.isna(v) else v for v in got_x] == [None if pd.isna(v) else v for v in want.x]
    whole = [None if v is None else v["n"] for v in result["PS1/Acq"]]
    assert whole == [None if pd.isna(v) else int(v) for v in want.other_n]
    assert any(v is None for v in whole) and any(v is not None for v in whole)


# --- resample, stats, decimate ---------------------------------------------------------------


def test_resample_last_with_previous_fill(history: History, store: Store) -> None:
    start, every = MIDNIGHT - 1_000 * S, 20 * S  # 20 s buckets: PS2 (50 s) leaves gaps
    end = start + 30 * every
    result = _rows(history.resample("PS2/Acq#n", start, end, every="20s"))
    assert [r["acq_stamp"] for r in result] == [start + b * every for b in range(30)]
    values = _values(store, "PS2", start - 86_400 * S, end)
    expected = []
    for b in range(30):
        before = values[values.acq < start + (b + 1) * every]
        expected.append(int(before.n.iloc[-1]) if len(before) else None)
    assert [r["n"] for r in result] == expected
    means = _rows(history.resample("PS2/Acq#n", start, end, every="100s", how="mean", fill="drop"))
    inside = _values(store, "PS2", start, end)
    grouped = inside.groupby((inside.acq - start) // (100 * S)).n.mean()
    assert [r["acq_stamp"] for r in means] == [start + int(b) * 100 * S for b in grouped.index]
    assert [r["n"] for r in means] == pytest.approx(grouped.tolist())


def test_hourly_stats_match_numpy(history: History, store: Store) -> None:
    start, end = MIDNIGHT - 3_600 * S, MIDNIGHT + 3_600 * S
    result = to_pandas(history.stats("PS1/Acq", start, end, every="1h"))
    assert sorted(set(result.field)) == ["current", "n"]
    rows = store.rows
    ps1 = rows[(rows.device == "PS1") & (rows.acq >= start) & (rows.acq < end)]
    for hour in range(2):
        bucket = ps1[(ps1.acq - start) // (3_600 * S) == hour].sort_values("acq")
        values = bucket[bucket.error.isna()]
        got = result[(result.acq_stamp == start + hour * 3_600 * S) & (result.field == "current")]
        assert len(got) == 1
        stat = got.iloc[0]
        current = values.current.to_numpy(dtype=float)
        finite = current[~np.isnan(current)]
        assert stat["count"] == len(current) and stat["nan_count"] == np.isnan(current).sum()
        assert stat["errors"] == bucket.error.notna().sum()
        assert _same(stat["first"], current[0]) and _same(stat["last"], current[-1])
        assert stat["min"] == finite.min() and stat["max"] == finite.max()
        assert stat["mean"] == pytest.approx(finite.mean())
        assert stat["std"] == pytest.approx(finite.std(ddof=1))
    assert sum(result.nan_count) > 0 and sum(result.errors) > 0  # the data exercise both
    whole = _rows(history.stats("PS1/Acq#n", start, end))
    assert [(r["field"], r["count"]) for r in whole] == [
        ("n", len(_values(store, "PS1", start, end)))
    ]


def test_decimate_gives_min_and_max_per_bin(history: History, store: Store) -> None:
    start, end = MIDNIGHT - 3_600 * S, MIDNIGHT + 3_600 * S
    result = _rows(history.decimate("PS1/Acq#current", start, end, points=20))
    values = _values(store, "PS1", start, end)
    values = values[~values.current.isna()]
    width = (end - start) // 10
    groups = values.groupby((values.acq - start) // width).current
    assert [r["acq_stamp"] for r in result] == [start + int(b) * width for b in groups.groups]
    assert [r["min"] for r in result] == groups.min().tolist()
    assert [r["max"] for r in result] == groups.max().tolist()
    assert [r["count"] for r in result] == groups.count().tolist()


def test_to_pandas_time_index_and_numpy_arrays(history: History, store: Store) -> None:
    ps1 = _values(store, "PS1", 0, 2**62)
    start = int(ps1.acq.iloc[0])
    frame = to_pandas(history.get("PS1/Acq", start, start + 200 * S))
    assert str(frame.index.dtype) == "datetime64[ns, UTC]"
    assert frame.index[1].value == ps1.acq.iloc[1]  # ns kept, not rounded to µs
    image = frame["img"].iloc[1]
    assert isinstance(image, np.ndarray) and image.shape == (2, 3) and image.dtype == np.int16
    assert isinstance(frame["wave"].iloc[2], np.ndarray)
    assert str(frame["ts"].dt.tz) == "UTC"


def test_history_local_reuses_the_active_session(spark: Any, store: Store) -> None:
    local = History.local(store.root, master="local[2]")
    assert local.spark is spark  # getOrCreate: the tests' one session, not a second JVM
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert local.search("*").count() == 3
