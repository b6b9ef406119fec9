"""History API timings on local[2] over a 10M-row store. Prints JSON.

The store (80 signals over 2 days, 125,000 rows per signal, one file per signal and day) is
generated with pyarrow directly in the recorder's layout and schema (``STORE_COLUMNS``, zstd,
the schema catalog), in a temporary directory. Timed, each as the wall time to materialise the
result in the driver:

- ``get`` of one hour of one signal, cold (first query of the session) and warm (median of 5);
  the other queries are timed twice: the first run pays the JVM's code generation and JIT,
  ``*_warm_s`` is the second;
- hourly ``stats`` of every signal over one day (5M rows);
- ``last_before`` for all 80 signals;
- ``aligned`` of two 125k-row signals (both whole days);
- baseline: the same one-hour ``get`` with pyarrow alone (no JVM), so that ratios survive a
  noisy machine.

    .venv/bin/python benchmarks/history.py [--signals 80] [--rows-per-signal 125000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from rda.pipeline.history.api import History, col
from rda.pipeline.recorder.converter import STORE_COLUMNS, partition_path
from rda.pipeline.recorder.schema import SchemaCatalog
from rda.pipeline.spark_session import local_session

DAY0 = 1_795_219_200_000_000_000  # 2026-11-21T00:00:00Z
DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
PROP = "Acquisition"
DATA = pa.struct([("current", pa.float64()), ("voltage", pa.float64()), ("status", pa.int32())])


def _device(i: int) -> str:
    return f"DEV{i:02d}"


def generate(root: Path, signals: int, per_signal: int) -> int:
    """Write the store; return its size in bytes."""
    rng = np.random.default_rng(7)
    catalog = SchemaCatalog(root, "bench")
    per_day = per_signal // 2
    step = DAY_NS // per_day
    size = 0
    seq = 1
    for s in range(signals):
        catalog.resolve(_device(s), PROP, DATA)
        for day in range(2):
            # Evenly spaced with jitter, ns stamps, sorted (as the recorder writes them).
            base = DAY0 + day * DAY_NS + np.arange(per_day, dtype=np.int64) * step
            acq = np.sort(base + rng.integers(0, step // 2, per_day))
            current = np.sin(acq / 1e12 + s) * 100 + rng.normal(0, 1, per_day)
            data = pa.StructArray.from_arrays(
                [
                    pa.array(current),
                    pa.array(rng.normal(230, 2, per_day)),
                    pa.array(rng.integers(0, 4, per_day, dtype=np.int32)),
                ],
                fields=list(DATA),
            )
            seqs = np.arange(seq, seq + per_day, dtype=np.int64)
            seq += per_day
            columns: dict[str, Any] = {
                "acq_stamp": pa.array(acq),
                "ts": pa.array(acq // 1000).cast(pa.timestamp("us", tz="UTC")),
                "cycle_stamp": pa.array(acq - 5),
                "cycle_name": pa.array(["CPS.USER.SFTPRO"] * per_day),
                "selector": pa.array(["CPS.USER.SFTPRO"] * per_day),
                "recv_stamp": pa.array(acq + 1_000_000),
                "recorder_id": pa.array(["bench"] * per_day),
                "seq": pa.array(seqs),
                "error": pa.nulls(per_day, pa.string()),
                "data": data,
            }
            assert tuple(columns) == STORE_COLUMNS
            table = pa.table(columns).replace_schema_metadata(
                {"rda.device": _device(s), "rda.property": PROP, "rda.schema_version": "1"}
            )
            date = time.strftime("%Y-%m-%d", time.gmtime((DAY0 + day * DAY_NS) // 10**9))
            path = partition_path(root, _device(s), PROP, date)
            path.mkdir(parents=True, exist_ok=True)
            name = path / f"part-bench-{seqs[0]}-{seqs[-1]}.parquet"
            # Row groups of 8,192 rows (~1.5 h of one signal): the recorder's files are small
            # and compaction keeps their row groups, so a store it wrote looks like this too;
            # row-group statistics then let a narrow window skip most of a day's file.
            pq.write_table(table, name, compression="zstd", row_group_size=8_192)
            size += name.stat().st_size
    return size


def _timed(action: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def _pyarrow_get(root: Path, start: int, end: int) -> int:
    directory = partition_path(root, _device(0), PROP, "2026-11-22")
    table = ds.dataset(directory, format="parquet").to_table(
        filter=(pc.field("acq_stamp") >= start) & (pc.field("acq_stamp") < end)
    )
    return int(table.num_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--signals", type=int, default=80)
    parser.add_argument("--rows-per-signal", type=int, default=125_000)
    args = parser.parse_args()
    report: dict[str, Any] = {"signals": args.signals, "rows": args.signals * args.rows_per_signal}
    with tempfile.TemporaryDirectory(prefix="rda-history-bench-") as tmp:
        root = Path(tmp)
        report["generate_s"], report["store_bytes"] = _timed(
            lambda: generate(root, args.signals, args.rows_per_signal)
        )
        report["spark_start_s"], spark = _timed(lambda: local_session("local[2]", "rda-bench"))
        history = History(spark, root)
        one = f"{_device(0)}/{PROP}"
        hour = DAY0 + DAY_NS + 10 * HOUR_NS

        def get_hour() -> int:
            return len(history.get(one, hour, hour + HOUR_NS).collect())

        report["get_1h_cold_s"], report["get_1h_rows"] = _timed(get_hour)
        warm = [_timed(get_hour)[0] for _ in range(5)]
        report["get_1h_warm_s"] = statistics.median(warm)
        baseline = [_timed(lambda: _pyarrow_get(root, hour, hour + HOUR_NS)) for _ in range(5)]
        report["pyarrow_get_1h_s"] = statistics.median(t for t, _ in baseline)
        assert baseline[0][1] == report["get_1h_rows"]

        every = f"*/{PROP}"

        def hourly() -> list[Any]:
            return history.stats(every, DAY0, DAY0 + DAY_NS, every="1h").collect()

        report["stats_hourly_5M_s"], stats_rows = _timed(hourly)
        report["stats_hourly_5M_warm_s"] = _timed(hourly)[0]
        report["stats_rows"] = len(stats_rows)
        report["stats_input_rows"] = sum(r["count"] for r in stats_rows if r["field"] == "current")

        def last_values() -> list[Any]:
            return history.last_before(every, DAY0 + DAY_NS + 12 * HOUR_NS).collect()

        report["last_before_80_s"], last = _timed(last_values)
        report["last_before_80_warm_s"] = _timed(last_values)[0]
        report["last_before_rows"] = len(last)
        other = f"{_device(1)}/{PROP}#current"

        def align() -> Any:
            frame = history.aligned(f"{one}#current", [other], DAY0, DAY0 + 2 * DAY_NS)
            return frame.agg(F.count("*"), F.count(col(other)), F.sum(col(other))).collect()

        report["aligned_125k_s"], aligned_rows = _timed(align)
        report["aligned_125k_warm_s"] = _timed(align)[0]
        report["aligned_rows"] = aligned_rows[0][0]
        report["get_warm_vs_pyarrow"] = report["get_1h_warm_s"] / report["pyarrow_get_1h_s"]
        spark.stop()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}))


if __name__ == "__main__":
    main()
