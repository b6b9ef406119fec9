"""A recorder of many properties at a steady rate for minutes: sustained or not, its backlog
over time, CPU per thread; then the same store compacted, and queried by Spark and DuckDB
before and after compaction (same rows, same run). Prints JSON.

The issue's run is ``--properties 1000 --rate 100 --seconds 600``: 100,000 rows/s for ten
minutes. The recorder is the real one (``Recorder.offer`` from a paced fire-hose in this
process, journal segments, conversion every ``--convert-every`` seconds, as ``rda record``
runs it) without the network: a thousand publishing properties and their subscriptions at
100 kHz in total would need more cores than the recorder itself, so the figure is the
recorder's write path, not the transport's. Each row is a fresh ``Sample`` (3 scalar fields);
the rows of one 10 ms tick share the tick's ``DataContext`` (acquisition stamp = the tick's
scheduled time). The feeder's CPU is measured apart from the recorder's threads.

Measured, every ``--sample-every`` seconds: rows offered, acknowledged (durable in the
journal) and converted (in Parquet); the journal lag (offered, not yet acknowledged: the queue
plus the rows of the segment being written) and the conversion lag (acknowledged, not yet
converted); the recorder's ``lag_seconds`` (age of the oldest unacknowledged row); CPU seconds
of the writer thread, the converter thread and the feeder (``/proc/self/task``). "Sustained"
means: every row offered on time (the pace kept), none refused, and no backlog growth: the
lags of the run's second half do not trend up (least-squares slope of the samples).

Then (``--compact``): the store is copied, compacted (``Recorder.maintain_store`` with a
clock past the recorded hours, what ``rda record --compact-every`` does an hour later), and
the copy and the compacted store are each queried by Spark's ``History.get`` (every signal,
count and sum collected to the driver; after one untimed warm-up query,
``--spark-turns`` in turns whose order turns round, the fastest taken; each timed as its
``build``, the DataFrame made, and its ``run``, the jobs, with each job's tasks;
``--spark-queries get,frame,stats`` adds ``History.frame``, the same rows without ``get``'s
sort, and ``History.stats``, each signal's statistics) and DuckDB
(``count(*)``, ``sum``). Both must count every row. Targets in
``benchmarks/recorder_scale_targets.json``.

    .venv/bin/python benchmarks/recorder_scale.py [--properties 1000] [--rate 100]
        [--seconds 60] [--convert-every 30] [--compact] [--spark-turns 2] [--spark-queries get]
        [--store DIR] [--query-only]

(the issue's run: ``--seconds 600 --compact``; the default is a one-minute look.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext

TARGETS = Path(__file__).with_name("recorder_scale_targets.json")
HOUR = 3600.0
_TICK = os.sysconf("SC_CLK_TCK")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _thread_cpu(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process, from /proc."""
    if native_id is None:
        return 0.0
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # the thread ended
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _threads(recorder: Recorder) -> dict[str, int | None]:
    named = {t.name: t.native_id for t in threading.enumerate()}
    rid = recorder.recorder_id
    return {
        "writer": named.get(f"rda-recorder-{rid}"),
        "converter": named.get(f"rda-converter-{rid}"),
    }


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (units per second) of (t, value) points; 0 for fewer than 2."""
    if len(points) < 2:
        return 0.0
    ts = [t for t, _ in points]
    vs = [v for _, v in points]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    var = sum((t - mt) ** 2 for t in ts)
    return 0.0 if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var


class _Feeder(threading.Thread):
    """Offers one row of every property per tick of ``1 / rate`` seconds (10 ms at 100 Hz),
    stamped with the tick's scheduled time: the rows of one tick share their ``DataContext``
    as the acquisitions of one timing cycle would. Behind its schedule it catches up without
    sleeping (and reports how far behind it got); a refused row is counted."""

    def __init__(self, recorder: Recorder, properties: int, rate: float, seconds: float) -> None:
        super().__init__(name="feeder")
        self.recorder = recorder
        self.names = [f"DEV{i:04d}" for i in range(properties)]
        self.values = [Data(current=float(i), voltage=1.5, status=i) for i in range(properties)]
        self.ticks = int(rate * seconds)
        self.period = 1.0 / rate
        self.total = self.ticks * properties
        self.sent = 0
        self.refused = 0
        self.late_s = 0.0  # the most the feeder ran behind its schedule
        self.started = 0.0
        self.finished = 0.0
        self.cpu_s = 0.0  # this thread's CPU time, once it ended

    def run(self) -> None:
        cpu = time.thread_time()
        offer = self.recorder.offer
        rows = list(zip(self.names, self.values, strict=True))
        period_ns = int(self.period * 1e9)
        base_ns = time.time_ns()
        self.started = t0 = time.monotonic()
        for tick in range(self.ticks):
            stamp = base_ns + tick * period_ns
            context = DataContext("CYC", stamp, stamp, "SEL")
            refused = 0
            for name, value in rows:
                if not offer(name, "Acq", None, Sample(value, context)):
                    refused += 1
            self.refused += refused
            self.sent += len(rows)
            ahead = t0 + (tick + 1) * self.period - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            else:
                self.late_s = max(self.late_s, -ahead)
        self.finished = time.monotonic()
        self.cpu_s = time.thread_time() - cpu


def record(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    recorder = Recorder(
        root,
        recorder_id="scale",
        queue_limit=args.queue_limit,
        convert_interval=args.convert_every,
    )
    recorder.start()
    threads = _threads(recorder)
    feeder = _Feeder(recorder, args.properties, args.rate, args.seconds)
    samples: list[dict[str, Any]] = []
    process0 = time.process_time()
    feeder.start()
    threads["feeder"] = None
    t0 = time.monotonic()
    cpu0: dict[str, float] = {}
    while feeder.is_alive() or not samples:
        if threads["feeder"] is None:
            threads["feeder"] = feeder.native_id
            cpu0 = {name: _thread_cpu(tid) for name, tid in threads.items()}
        feeder.join(args.sample_every)
        stats = recorder.statistics()
        converted = recorder.converter.max_seq
        offered = feeder.sent
        samples.append(
            {
                "t": round(time.monotonic() - t0, 1),
                "offered": offered,
                "acked": stats.acked_rows,
                "converted_seq": converted,
                "journal_lag_rows": offered - feeder.refused - stats.acked_rows,
                "queue_depth": stats.queue_depth,
                "conversion_lag_rows": stats.acked_seq - converted,
                "lag_seconds": round(stats.lag_seconds, 3),
                "segments": stats.segments_written,
                "parquet_files": stats.parquet_files,
                "cpu_s": {
                    n: round(_thread_cpu(t) - cpu0.get(n, 0.0), 2) for n, t in threads.items()
                },
                "load": _load(),
            }
        )
    fed_s = feeder.finished - feeder.started
    flush0 = time.monotonic()
    assert recorder.flush(timeout=600.0)
    flush_s = time.monotonic() - flush0
    cpu = {n: _thread_cpu(t) - cpu0.get(n, 0.0) for n, t in threads.items()}
    cpu["feeder"] = feeder.cpu_s
    process_cpu = time.process_time() - process0
    stats = recorder.statistics()
    stop0 = time.monotonic()
    recorder.stop()  # converts what is left
    stop_s = time.monotonic() - stop0
    final = recorder.statistics()
    assert final.acked_rows == feeder.total - feeder.refused, final
    half = [s for s in samples if s["t"] >= args.seconds / 2]
    rows = feeder.total
    return {
        "properties": args.properties,
        "rate_hz": args.rate,
        "seconds": args.seconds,
        "convert_every_s": args.convert_every,
        "rows": rows,
        "refused": feeder.refused,
        "fed_s": round(fed_s, 2),
        "offered_rows_per_s": round(rows / fed_s),
        "feeder_max_late_s": round(feeder.late_s, 3),
        "acked_rows_per_s": round(stats.acked_rows / (fed_s + flush_s)),
        "flush_at_end_s": round(flush_s, 3),
        "stop_with_last_conversion_s": round(stop_s, 2),
        "segments": final.segments_written,
        "rows_per_segment": round(final.acked_rows / max(1, final.segments_written)),
        "journal_bytes": final.bytes_written,
        "parquet_files_written": final.parquet_files,
        "max_journal_lag_rows": max(s["journal_lag_rows"] for s in samples),
        "max_conversion_lag_rows": max(s["conversion_lag_rows"] for s in samples),
        "max_lag_seconds": max(s["lag_seconds"] for s in samples),
        "second_half_slope_rows_per_s": {
            "journal_lag": round(_slope([(s["t"], s["journal_lag_rows"]) for s in half]), 1),
            "conversion_lag": round(_slope([(s["t"], s["conversion_lag_rows"]) for s in half]), 1),
        },
        "cpu_s": {n: round(v, 1) for n, v in cpu.items()} | {"process": round(process_cpu, 1)},
        "cores_busy": {n: round(v / fed_s, 3) for n, v in cpu.items()}
        | {"process": round(process_cpu / fed_s, 3)},
        "cpu_ms_per_1000_rows": {n: round(v * 1e6 / rows, 3) for n, v in cpu.items()},
        "samples": samples,
    }


def _files(root: Path) -> dict[str, Any]:
    sizes = [p.stat().st_size for p in root.glob("device=*/property=*/date=*/*.parquet")]
    return {
        "files": len(sizes),
        "bytes": sum(sizes),
        "mean_bytes": round(statistics.fmean(sizes)) if sizes else 0,
        "min_bytes": min(sizes, default=0),
        "max_bytes": max(sizes, default=0),
    }


def _hours(root: Path) -> int:
    """Signal-hours in the store: distinct (device, UTC hour of acq_stamp) pairs."""
    import duckdb

    answer = (
        duckdb.connect()
        .execute(
            f"SELECT count(DISTINCT (device, acq_stamp // {int(HOUR * 1e9)})) "
            f"FROM read_parquet('{root}/**/*.parquet', hive_partitioning = true)"
        )
        .fetchone()
    )
    return int(answer[0]) if answer else 0


def duckdb_rows(root: Path) -> int:
    import duckdb

    answer = (
        duckdb.connect()
        .execute(f"SELECT count(*) FROM read_parquet('{root}/**/*.parquet')")
        .fetchone()
    )
    return int(answer[0]) if answer else 0


def compact_and_query(
    root: Path, copy: Path, rows: int, args: argparse.Namespace
) -> dict[str, Any]:

    out: dict[str, Any] = {}
    begin = time.perf_counter()
    shutil.copytree(root, copy)
    out["copy_s"] = round(time.perf_counter() - begin, 1)
    out["before"] = _files(root)
    signal_hours = _hours(root)
    out["signal_hours"] = signal_hours
    compactor = Recorder(root, recorder_id="scale", compact_interval=600.0, compact_linger=0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    # An hour after the recording, past every hour's grace: what the recorder's own round does.
    compactor.maintain_store(now=time.time() + 2 * HOUR)
    out["compaction_s"] = round(time.perf_counter() - t0, 1)
    out["compaction_cpu_s"] = round(time.process_time() - cpu0, 1)
    stats = compactor.statistics()
    assert stats.compaction_errors == 0, stats
    out["after"] = _files(root)
    out["files_per_signal_hour_after"] = round(out["after"]["files"] / signal_hours, 3)
    return out | query(root, copy, rows, args)


def query(root: Path, copy: Path, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    """DuckDB and Spark over the uncompacted copy and the compacted store, in turns, over the
    recorded window (the stamps' first to last: a wider window would make ``History`` list
    a partition per day of it, for every signal)."""
    import duckdb

    out: dict[str, Any] = {}
    con = duckdb.connect()
    bounds = con.execute(
        f"SELECT min(acq_stamp), max(acq_stamp) FROM read_parquet('{root}/**/*.parquet')"
    ).fetchone()
    assert bounds is not None
    window = (int(bounds[0]), int(bounds[1]) + 1)
    out["window_ns"] = window
    duck: dict[str, Any] = {}
    for _ in range(2):
        for name, path in (("uncompacted", copy), ("compacted", root)):
            begin = time.perf_counter()
            answer = con.execute(
                f"SELECT count(*), sum(data.current) FROM read_parquet('{path}/**/*.parquet')"
            ).fetchone()
            assert answer is not None and answer[0] == rows, (name, answer)
            duck.setdefault(name, []).append(round(time.perf_counter() - begin, 3))
    out["duckdb_count_sum_s"] = duck
    out["duckdb_speedup"] = round(min(duck["uncompacted"]) / min(duck["compacted"]), 2)
    if args.spark:
        out |= spark_query(root, copy, rows, window, args)
    return out


def _jobs(spark: Any, group: str) -> list[list[int]]:
    """The tasks of each stage of each job of a job group (status tracker), in job order."""
    tracker = spark.sparkContext.statusTracker()
    jobs = []
    for job in sorted(tracker.getJobIdsForGroup(group)):
        info = tracker.getJobInfo(job)
        stages = [tracker.getStageInfo(s) for s in info.stageIds] if info else []
        jobs.append([s.numTasks for s in stages if s is not None])
    return jobs


def spark_query(
    root: Path, copy: Path, rows: int, window: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Spark ``History.get`` of every signal (count and sum collected) on both stores, in turns
    whose order turns round each time (``--spark-queries``: also ``History.frame``, the same
    rows unsorted, and ``History.stats`` per signal). Each query is timed in two phases:
    ``build`` (a new ``History``: the planning, the footers, Spark's listing of the files,
    which happens when the DataFrame is made) and ``run`` (the jobs), with the tasks of each
    job's stages."""
    from pyspark.sql import functions as F

    from rda.pipeline.history.api import History
    from rda.pipeline.spark_session import local_session

    out: dict[str, Any] = {}
    spark = local_session(master="local[2]", app_name="rda-recorder-scale")
    kinds = args.spark_queries.split(",")
    times: dict[str, dict[str, list[Any]]] = {}
    try:
        # A first query, not timed: the JVM's warm-up would otherwise count for the first.
        History(spark, root).get("DEV0000/Acq", *window, fields=["current"]).count()
        turn = 0
        stores = [("uncompacted", copy), ("compacted", root)]
        for round_ in range(args.spark_turns):  # A B, then B A: the load hits both alike
            for name, path in stores if round_ % 2 == 0 else stores[::-1]:
                for kind in kinds:
                    turn += 1
                    group = f"rda-scale-{turn}"
                    spark.sparkContext.setJobGroup(group, f"{kind} {name}")
                    begin = time.perf_counter()
                    history = History(spark, path)
                    if kind == "stats":  # per signal: count, min, max, mean, std, first, last
                        frame = history.stats("DEV*/Acq", *window)
                    else:
                        read = history.get if kind == "get" else history.frame
                        frame = read("DEV*/Acq", *window, fields=["current"])
                    built = time.perf_counter()
                    if kind == "stats":
                        got = frame.where(F.col("field") == "current").collect()
                        counted = sum(int(r["count"]) for r in got)
                    else:
                        got = frame.agg(F.count("*").alias("n"), F.sum("current")).collect()
                        counted = int(got[0]["n"])
                    end = time.perf_counter()
                    assert counted == rows, (name, kind, counted)
                    label = {"get": name, "frame": f"{name}_unsorted"}.get(kind, f"{name}_{kind}")
                    entry = times.setdefault(label, {"total": [], "build": [], "run": []})
                    entry["total"].append(round(end - begin, 2))
                    entry["build"].append(round(built - begin, 2))
                    entry["run"].append(round(end - built, 2))
                    entry.setdefault("jobs_tasks", []).append(_jobs(spark, group))
                    entry.setdefault("load", []).append(_load()[0])
    finally:
        spark.stop()
    out["spark_get_s"] = times
    out["spark_speedup"] = round(
        min(times["uncompacted"]["total"]) / min(times["compacted"]["total"]), 2
    )
    for kind, label in (("frame", "unsorted"), ("stats", "stats")):
        if kind in kinds:
            out[f"spark_{label}_speedup"] = round(
                min(times[f"uncompacted_{label}"]["total"])
                / min(times[f"compacted_{label}"]["total"]),
                2,
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--properties", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="the issue: 600")
    parser.add_argument("--convert-every", type=float, default=30.0)
    parser.add_argument("--queue-limit", type=int, default=200_000)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--compact", action="store_true", help="then compact and query")
    parser.add_argument("--no-spark", dest="spark", action="store_false")
    parser.add_argument("--spark-turns", type=int, default=2, help="Spark queries per store")
    parser.add_argument(
        "--spark-queries",
        default="get",
        help="History queries per turn, of get (count + sum), frame (get unsorted), stats",
    )
    parser.add_argument("--store", help="keep the store here (default: a temporary directory)")
    parser.add_argument(
        "--query-only", action="store_true", help="only query the stores --store DIR holds"
    )
    args = parser.parse_args()
    result: dict[str, Any] = {"load_before": _load()}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.store) if args.store else Path(tmp)
        root, copy = base / "store", base / "uncompacted"
        if args.query_only:  # the stores a run with --store left: query them again
            count = duckdb_rows(root)
            result["query"] = query(root, copy, count, args) | {"rows": count}
            result["load_after_query"] = _load()
            print(json.dumps(result, indent=1))
            return
        result["ingest"] = record(root, args)
        result["load_after_ingest"] = _load()
        if args.compact:
            rows = result["ingest"]["rows"] - result["ingest"]["refused"]
            result["compaction"] = compact_and_query(root, copy, rows, args)
            result["load_after_compaction"] = _load()
    targets = json.loads(TARGETS.read_text())
    ingest = result["ingest"]
    met = {
        "pace_kept": ingest["offered_rows_per_s"]
        >= targets["offered_vs_asked_min"] * args.properties * args.rate,
        "nothing_refused": ingest["refused"] == 0,
        "no_journal_backlog_growth": ingest["second_half_slope_rows_per_s"]["journal_lag"]
        <= targets["lag_slope_rows_per_s_max"],
        "no_conversion_backlog_growth": ingest["second_half_slope_rows_per_s"]["conversion_lag"]
        <= targets["lag_slope_rows_per_s_max"],
    }
    if "compaction" in result:
        comp = result["compaction"]
        met["files_per_signal_hour"] = (
            comp["files_per_signal_hour_after"] <= targets["compacted_files_per_signal_hour_max"]
            or comp["after"]["mean_bytes"] >= targets["compacted_file_bytes_min"]
        )
        if "spark_speedup" in comp:
            met["spark_speedup"] = comp["spark_speedup"] >= targets["spark_speedup_min"]
    result["targets"] = targets
    result["targets_met"] = met
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
