"""Compaction: a recorder of many properties at a steady rate, its store before and after
compaction, and a Spark ``History`` query over each (same rows, same run). Prints JSON.

The recorder is the real one (``Recorder.offer`` from a paced fire-hose, journal segments,
conversion every ``--convert-every`` seconds as ``rda record`` does) without the network, so
the figure is the store's and not the transport's. Acquisition stamps are spread over
``--hours`` past hours (the run is compressed in time), so that the hours are closed when the
recorder's own compaction round (``Recorder.maintain_store``, ``compact_store``) runs right
after the recording. What makes a store slow is the number of files per signal-hour
(``3600 / --convert-every`` for a real recorder: 720 at ``rda record``'s 5 s), so the run
converts every ``--convert-every`` (1 s) seconds: 90 s give about 90 files per signal-hour.

Measured:

- ingest: rows acknowledged per second against rows offered (the pace), the largest queue fill
  seen, CPU seconds of this process per second of recording;
- the store: Parquet files and their sizes (count, mean, max) before and after compaction,
  and the compaction's wall and CPU time;
- Spark ``History.get`` of every signal over the whole window (count and sum, collected to the
  driver) on a copy of the uncompacted store (the raw baseline) and on the compacted one, each
  run twice in turns, the faster of each taken; both must count every row;
- DuckDB's ``count(*)`` over each store (a reader without rda), as a second view.

Targets are read from ``benchmarks/compaction_targets.json``.

    .venv/bin/python benchmarks/compaction.py [--properties 20] [--rate 100] [--seconds 90]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from rda.pipeline.history.api import History
from rda.pipeline.recorder.service import Recorder, Sample
from rda.pipeline.spark_session import local_session
from rda.serialization.data import Data
from rda.serialization.header import DataContext

TARGETS = Path(__file__).with_name("compaction_targets.json")
HOUR_NS = 3_600 * 10**9


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _files(root: Path) -> dict[str, Any]:
    sizes = [p.stat().st_size for p in root.glob("device=*/property=*/date=*/*.parquet")]
    return {
        "files": len(sizes),
        "bytes": sum(sizes),
        "mean_bytes": round(statistics.fmean(sizes)) if sizes else 0,
        "max_bytes": max(sizes, default=0),
    }


def record(
    root: Path, properties: int, rate: float, seconds: float, hours: int, convert_every: float
) -> dict[str, Any]:
    """Record ``properties`` x ``rate`` rows/s for ``seconds``; stamps span ``hours`` hours."""
    # Whole hours, ending two hours ago: closed, and past any grace, when compaction runs.
    start_ns = (time.time_ns() // HOUR_NS - hours - 2) * HOUR_NS
    total = int(properties * rate * seconds)
    step = hours * HOUR_NS // total
    recorder = Recorder(
        root, recorder_id="bench", queue_limit=100_000, convert_interval=convert_every
    )
    recorder.start()
    names = [f"DEV{i:04d}" for i in range(properties)]
    values = [Data(current=float(i), voltage=1.5, status=i) for i in range(properties)]
    tick = 0.1
    per_tick = properties * rate * tick
    sent, fill = 0, 0
    cpu0, t0 = _cpu(), time.monotonic()
    while sent < total:
        due = min(total, int(per_tick * (1 + (time.monotonic() - t0) / tick)))
        while sent < due:
            n = sent % properties
            acq = start_ns + sent * step
            sample = Sample(values[n], DataContext("CYC", acq, acq, "SEL"))
            if not recorder.offer(names[n], "Acq", None, sample):
                break
            sent += 1
        fill = max(fill, recorder.statistics().queue_depth)
        time.sleep(max(0.0, t0 + (sent / (properties * rate)) - time.monotonic()))
    recorded_s = time.monotonic() - t0
    assert recorder.flush(timeout=300.0)
    acked_s = time.monotonic() - t0
    cpu = _cpu() - cpu0
    recorder.stop()  # converts what is left
    stats = recorder.statistics()
    assert stats.acked_rows == total and stats.overflow == 0, stats
    return {
        "properties": properties,
        "rate_hz": rate,
        "rows": total,
        "offered_rows_per_s": round(total / recorded_s),
        "acked_rows_per_s": round(total / acked_s),
        "ingest_vs_offered": round(recorded_s / acked_s, 3),
        "max_queue_fill": round(fill / recorder.queue_limit, 4),
        "cpu_s_per_s": round(cpu / acked_s, 3),
        "window": (start_ns, start_ns + hours * HOUR_NS),
    }


def _spark_query(history: History, window: tuple[int, int]) -> tuple[float, int, float]:
    from pyspark.sql import functions as F

    begin = time.perf_counter()
    frame = history.get("DEV*/Acq", window[0], window[1], fields=["current"])
    row = frame.agg(F.count("*").alias("n"), F.sum("current").alias("s")).collect()[0]
    return time.perf_counter() - begin, int(row["n"]), float(row["s"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root, copy = Path(tmp) / "store", Path(tmp) / "uncompacted"
        ingest = record(
            root, args.properties, args.rate, args.seconds, args.hours, args.convert_every
        )
        window = ingest.pop("window")
        out["ingest"] = ingest
        shutil.copytree(root, copy)
        out["before"] = _files(root)
        out["before"]["files_per_signal_hour"] = round(
            out["before"]["files"] / (args.properties * args.hours), 1
        )
        compactor = Recorder(root, recorder_id="bench", compact_interval=600.0, compact_linger=0)
        cpu0, t0 = _cpu(), time.perf_counter()
        compactor.maintain_store()
        out["compaction_s"] = round(time.perf_counter() - t0, 2)
        out["compaction_cpu_s"] = round(_cpu() - cpu0, 2)
        out["after"] = _files(root)
        stats = compactor.statistics()
        assert stats.compaction_errors == 0, stats
        signal_hours = args.properties * args.hours
        out["files_per_signal_hour_after"] = round(out["after"]["files"] / signal_hours, 3)
        con = duckdb.connect()
        duck = {}
        for name, path in (("uncompacted", copy), ("compacted", root)):
            begin = time.perf_counter()
            count = con.execute(f"SELECT count(*) FROM read_parquet('{path}/**/*.parquet')")
            answer = count.fetchone()
            duck[name] = {
                "rows": answer[0] if answer else 0,
                "s": round(time.perf_counter() - begin, 3),
            }
        out["duckdb_count"] = duck
        spark = local_session(master="local[2]", app_name="rda-compaction-bench")
        try:
            times: dict[str, list[float]] = {"uncompacted": [], "compacted": []}
            for _ in range(2):
                for name, path in (("uncompacted", copy), ("compacted", root)):
                    seconds, rows, _ = _spark_query(History(spark, path), window)
                    assert rows == ingest["rows"], (name, rows)
                    times[name].append(seconds)
        finally:
            spark.stop()
        best = {name: min(values) for name, values in times.items()}
        out["spark_get_s"] = {name: [round(v, 2) for v in values] for name, values in times.items()}
        out["spark_speedup"] = round(best["uncompacted"] / best["compacted"], 2)
    targets = json.loads(TARGETS.read_text())
    out["targets"] = targets
    out["targets_met"] = {
        "spark_speedup": out["spark_speedup"] >= targets["spark_speedup_min"],
        "files_per_signal_hour": out["files_per_signal_hour_after"]
        <= targets["compacted_files_per_signal_hour_max"],
        "ingest": ingest["ingest_vs_offered"] >= targets["ingest_vs_offered_min"],
        "queue": ingest["max_queue_fill"] <= targets["max_queue_fill_max"],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--properties", type=int, default=20)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--hours", type=int, default=1)
    parser.add_argument("--convert-every", type=float, default=1.0)
    print(json.dumps(run(parser.parse_args()), indent=1))


if __name__ == "__main__":
    main()
