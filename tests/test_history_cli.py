"""``rda history search|get|stats`` through the ``rda`` facade group, on a recorded store."""

from __future__ import annotations

import datetime
import json
import math
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rda._cli import build
from rda.admin.cli.common import ExitCode
from rda.pipeline.history.cli import NOT_FOUND, parse_cli_time
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.errors import RemoteError
from rda.serialization.header import DataContext

START = datetime.datetime(2026, 11, 20, 22, 0, tzinfo=datetime.UTC)
T0 = int(START.timestamp()) * 10**9
STEP = 600 * 10**9  # a row every 10 minutes, for 4 hours: crosses midnight
ROWS = 24


def _y(i: int) -> float:
    return math.nan if i == 7 else i * 0.5


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    recorder = Recorder(root, recorder_id="r1", convert=True, convert_interval=3600.0)
    recorder.start()
    try:
        for i in range(ROWS):
            context = DataContext(acq_stamp=T0 + i * STEP, selector="CPS.USER.A" if i % 2 else "")
            data = Data(x=i, y=_y(i), arr=np.arange(3.0) + i)
            assert recorder.offer("PS1", "Acq", None, Sample(data, context))
            assert recorder.offer("PS2", "Acq", None, Sample(Data(s=f"s{i}"), context))
            if i % 5 == 0:
                error = RemoteError("Boom", f"failure {i}")
                assert recorder.offer("PS1", "Acq", None, Sample(None, context, error))
        assert recorder.flush()
    finally:
        recorder.stop()
    return root


def _run(*args: str) -> Any:
    return CliRunner().invoke(build(), ["history", *args], catch_exceptions=False)


def _iso(i: int) -> str:
    return (START + datetime.timedelta(minutes=10 * i)).isoformat()


def test_facade_has_admin_and_pipeline_commands() -> None:
    result = CliRunner().invoke(build(), ["--help"])
    assert result.exit_code == 0
    for name in ("get", "subscribe", "serve", "record", "compact", "history"):
        assert f"  {name}" in result.output


def test_search(store: Path) -> None:
    result = _run("search", str(store), "PS*", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["device"], r["property"]) for r in rows] == [("PS1", "Acq"), ("PS2", "Acq")]
    assert rows[0]["first_day"] == "2026-11-20" and rows[0]["last_day"] == "2026-11-21"
    assert rows[0]["schema_versions"] == [1]
    table = _run("search", str(store), "PS2/*").output
    assert "PS2" in table and "PS1" not in table and "(1 rows)" in table


def test_get_window_is_half_open_and_fields_select(store: Path) -> None:
    result = _run("get", str(store), "PS1/Acq", "--start", _iso(3), "--end", _iso(9), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["acq_stamp"] for r in rows] == [T0 + i * STEP for i in range(3, 9)]
    assert [r["x"] for r in rows] == list(range(3, 9))
    assert [r["y"] for r in rows] == [None if i == 7 else i * 0.5 for i in range(3, 9)]
    assert rows[0]["arr"] == [3.0, 4.0, 5.0]
    assert rows[0]["ts"].startswith("2026-11-20T22:30:00")
    only = json.loads(
        _run("get", str(store), "PS1/Acq#x", "-s", _iso(0), "-e", _iso(2), "--json").output
    )
    assert [sorted(k for k in r if k in ("x", "y", "arr")) for r in only] == [["x"], ["x"]]
    ns = _run(
        "get", str(store), "PS1/Acq", "-s", str(T0), "-e", str(T0 + STEP), "-f", "y", "--json"
    )
    assert [r["y"] for r in json.loads(ns.output)] == [0.0]


def test_get_errors_selector_and_globs(store: Path) -> None:
    window = ["--start", _iso(0), "--end", _iso(ROWS)]
    errors = json.loads(_run("get", str(store), "PS1/Acq", *window, "--errors", "--json").output)
    failed = [r for r in errors if r["error"] is not None]
    assert len(failed) == len(range(0, ROWS, 5))
    for row, i in zip(failed, range(0, ROWS, 5), strict=True):
        assert row["error"].startswith("RemoteError") and f"failure {i}" in row["error"]
        assert row["acq_stamp"] == T0 + i * STEP and row["x"] is None
    assert len(errors) == ROWS + len(failed)
    odd = json.loads(
        _run("get", str(store), "PS*/Acq", *window, "--selector", "CPS.*", "--json").output
    )
    assert len(odd) == ROWS  # half the rows of each of the two devices
    assert {r["device"] for r in odd} == {"PS1", "PS2"}
    assert all(r["selector"] == "CPS.USER.A" for r in odd)


def test_get_to_files(store: Path, tmp_path: Path) -> None:
    window = ["--start", _iso(0), "--end", _iso(4)]
    parquet, csv = tmp_path / "out.parquet", tmp_path / "out.csv"
    assert _run("get", str(store), "PS1/Acq", *window, "--parquet", str(parquet)).exit_code == 0
    table = pq.read_table(parquet)
    assert table.column("x").to_pylist() == [0, 1, 2, 3]
    assert table.column("arr").to_pylist()[1] == [1.0, 2.0, 3.0]
    assert _run("get", str(store), "PS1/Acq", *window, "--csv", str(csv)).exit_code == 0
    read = pacsv.read_csv(csv)
    assert read.column("x").to_pylist() == [0, 1, 2, 3]
    assert json.loads(read.column("arr").to_pylist()[2]) == [2.0, 3.0, 4.0]


def test_get_table_output_and_empty_results(store: Path) -> None:
    table = _run("get", str(store), "PS2/Acq", "-s", _iso(0), "-e", _iso(2)).output
    assert "s0" in table and "s1" in table and "(2 rows)" in table
    empty = _run("get", str(store), "PS2/Acq", "-s", _iso(ROWS + 6), "-e", _iso(ROWS + 8))
    assert empty.exit_code == 0 and "(0 rows)" in empty.output
    assert (
        json.loads(
            _run("get", str(store), "PS1/Acq", "-s", _iso(2), "-e", _iso(2), "--json").output
        )
        == []
    )


def test_stats_hourly_against_numpy(store: Path) -> None:
    result = _run(
        "stats", str(store), "PS1/Acq#y", "-s", _iso(0), "-e", _iso(ROWS), "--every", "1h", "--json"
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 4
    for hour, row in enumerate(rows):
        indexes = range(hour * 6, hour * 6 + 6)
        values = np.array([_y(i) for i in indexes])
        finite = values[~np.isnan(values)]
        assert row["field"] == "y"
        assert row["ts"].startswith((START + datetime.timedelta(hours=hour)).isoformat()[:19])
        assert row["acq_stamp"] == T0 + hour * 6 * STEP
        assert row["count"] == 6
        assert row["nan_count"] == int(np.isnan(values).sum())
        assert row["min"] == finite.min() and row["max"] == finite.max()
        assert row["mean"] == pytest.approx(finite.mean())
        assert row["std"] == pytest.approx(finite.std(ddof=1))
        assert row["first"] == values[0] and row["last"] == values[-1]
        assert row["errors"] == sum(1 for i in indexes if i % 5 == 0)
    whole = json.loads(
        _run("stats", str(store), "PS1/Acq", "-s", _iso(0), "-e", _iso(ROWS), "--json").output
    )
    assert [r["field"] for r in whole] == ["x", "y"]  # arr is not a scalar: no statistics
    assert whole[0]["count"] == ROWS and whole[0]["mean"] == pytest.approx((ROWS - 1) / 2)
    assert "ts" not in whole[0] and whole[0]["errors"] == len(range(0, ROWS, 5))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "{root}", "PS1/Acq", "--start", "yesterday-ish"], "start"),
        (["get", "{root}", "PS1", "--start", "-1h"], "not DEVICE/PROPERTY"),
        (["stats", "{root}", "PS1/Acq", "--every", "often"], "every"),
        (["get", "{root}", "PS1/Acq", "--json", "--csv", "x.csv"], "at most one"),
        (["search", "{root}", "PS1/Acq#x"], "names no field"),
    ],
)
def test_bad_input_is_a_usage_error(store: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(build(), ["history", *[a.format(root=store) for a in args]])
    assert result.exit_code == 2  # usage error, as for every rda command (docs/cli.md)
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and message in last


def test_relative_times() -> None:
    now = 10**18
    assert parse_cli_time("now", "end", now) == now
    assert parse_cli_time("-90s", "start", now) == now - 90 * 10**9
    assert parse_cli_time("12345", "start", now) == 12345
    assert parse_cli_time("2026-11-20T22:00:00Z", "start", now) == T0
    with pytest.raises(ValueError, match="start"):
        parse_cli_time("-soon", "start", now)


@pytest.mark.timeout(240)  # the first Spark test also starts the JVM
def test_spark_gives_the_same_rows(store: Path, spark: Any) -> None:
    window = ["--start", _iso(0), "--end", _iso(5)]
    local = json.loads(_run("get", str(store), "PS1/Acq", *window, "--json").output)
    remote = json.loads(_run("get", str(store), "PS1/Acq", *window, "--json", "--spark").output)
    assert [(r["acq_stamp"], r["x"], r["arr"]) for r in remote] == [
        (r["acq_stamp"], r["x"], r["arr"]) for r in local
    ]
    hourly = ["stats", str(store), "PS1/Acq", *window, "--every", "20min", "--json"]
    local_stats = json.loads(_run(*hourly).output)
    spark_stats = json.loads(_run(*hourly, "--spark").output)
    keys = ("acq_stamp", "field", "count", "nan_count", "errors", "first", "min", "max", "mean")
    assert [[r[k] for k in keys] for r in spark_stats] == [
        [r[k] for k in keys] for r in local_stats
    ]
    found = json.loads(_run("search", str(store), "PS*/*", "--json", "--spark").output)
    assert [(r["device"], r["first_day"]) for r in found] == [
        ("PS1", "2026-11-20"),
        ("PS2", "2026-11-20"),
    ]


# Issue 26: a typo in a signal or field is named (exit 4, as "not found" elsewhere), never an
# answer without the value column; usage errors exit 2 in every subcommand.


def _not_found(result: Any) -> str:
    assert result.exit_code == NOT_FOUND == ExitCode.NO_SUCH_DEVICE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert result.stdout == ""
    return str(lines[0])


def test_an_unknown_field_is_named_with_the_recorded_ones(store: Path) -> None:
    window = ("-s", _iso(0), "-e", _iso(ROWS))
    line = _not_found(_run("get", str(store), "PS1/Acq#nope", *window))
    assert line == "rda: not found: PS1/Acq has no field 'nope' (fields: arr, x, y)"
    line = _not_found(_run("get", str(store), "PS1/Acq", "-f", "x", "-f", "why", *window))
    assert line == "rda: not found: PS1/Acq has no field 'why' (fields: arr, x, y)"
    line = _not_found(_run("stats", str(store), "PS2/Acq#t", *window))
    assert line == "rda: not found: PS2/Acq has no field 't' (fields: s)"
    # Outside the window's days the last recorded day's fields count.
    later = ("-s", "2026-12-01T00:00:00Z", "-e", "2026-12-02T00:00:00Z")
    assert "(fields: arr, x, y)" in _not_found(_run("get", str(store), "PS1/Acq#z", *later))
    assert _run("get", str(store), "PS1/Acq#y", *later).exit_code == 0


def test_a_signal_with_no_recorded_data_is_named_with_the_recorded_ones(store: Path) -> None:
    line = _not_found(_run("get", str(store), "PS1/Acq", "NOPE/Acq"))
    assert line == "rda: not found: no recorded data for 'NOPE/Acq' (recorded: PS1/Acq, PS2/Acq)"
    line = _not_found(_run("stats", str(store), "PS*/Acquisition"))
    assert line.startswith("rda: not found: no recorded data for 'PS*/Acquisition'")


def test_compact_and_record_usage_errors_exit_2(store: Path, no_thread_leak: None) -> None:
    bad_date = CliRunner().invoke(build(), ["compact", str(store), "PS1/Acq", "20-11-2026"])
    assert bad_date.exit_code == 2 and "not a date like 2026-11-20" in bad_date.output
    bad = CliRunner().invoke(build(), ["record", str(store), "PS1/Acq", "--duration", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output


def test_a_recording_refused_at_start_leaves_the_callers_sigterm_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It once installed its handler before starting and kept it when the start was refused:
    # a later forked worker of the same process then ignored SIGTERM.
    monkeypatch.setenv("RDA_DIRECTORY_FILE", str(tmp_path / "directory.json"))
    before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(build(), ["record", str(tmp_path / "store"), "NONE/Acq"])
    assert result.exit_code == ExitCode.NO_SUCH_DEVICE, result.output
    assert "NONE: no such device" in result.output
    assert signal.getsignal(signal.SIGTERM) is before
