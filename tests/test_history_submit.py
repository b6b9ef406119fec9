"""The example job through ``spark-submit --master local[2]``: the History API as a batch job.

A separate JVM and driver, configured only by spark-submit's arguments: what runs here runs on a
cluster with ``--master spark://...`` (docs/history.md, "Running on a cluster").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext

pytestmark = pytest.mark.timeout(400)

REPO = Path(__file__).resolve().parent.parent
DAY = 1_795_305_600_000_000_000  # 2026-11-22T00:00:00Z
S = 10**9


def _record(root: Path) -> dict[int, list[float]]:
    """Values every 7 minutes over 26 hours (the day and an hour either side); per-hour truth."""
    by_hour: dict[int, list[float]] = {}
    recorder = Recorder(root, recorder_id="job", flush_interval=0.02, convert_interval=3_600)
    recorder.start()
    try:
        for i in range(26 * 60 // 7):
            acq = DAY - 3_600 * S + i * 420 * S + 11
            value = float(np.cos(i) * 100)
            context = DataContext("CPS.USER.ALL", acq, acq, "CPS.USER.ALL")
            assert recorder.offer("PS1", "Acq", None, Sample(Data(current=value, n=i), context))
            if DAY <= acq < DAY + 86_400 * S:
                by_hour.setdefault((acq - DAY) // (3_600 * S), []).append(value)
        assert recorder.flush(timeout=30)
    finally:
        recorder.stop()
    return by_hour


def test_spark_submit_hourly_stats_job(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    by_hour = _record(root)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    submit = Path(sys.executable).parent / "spark-submit"
    command = [
        str(submit),
        "--master",
        "local[2]",
        "--driver-memory",
        "512m",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        str(REPO / "examples" / "history_job.py"),
        str(root),
        str(out),
        "2026-11-22",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"written to {out}" in done.stdout
    table = pq.read_table(out).to_pandas()
    current = table[table.field == "current"].sort_values("acq_stamp")
    assert [(s - DAY) // (3_600 * S) for s in current.acq_stamp] == list(range(24))
    for (_, row), hour in zip(current.iterrows(), range(24), strict=True):
        values = np.array(by_hour[hour])
        assert row["count"] == len(values)
        assert row["mean"] == pytest.approx(values.mean())
        assert row["min"] == values.min() and row["max"] == values.max()
        assert row["first"] == values[0] and row["last"] == values[-1]
    assert set(table.field) == {"current", "n"} and set(table.device) == {"PS1"}
