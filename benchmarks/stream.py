"""Rows/s through the ``rda-journal`` streaming source (prints JSON; not part of the tests).

A journal of ``--rows`` scalar rows (5 fields, 4 devices) is written by the recorder's storage
core, then read by a streaming query with ``trigger(availableNow=True)`` into Spark's ``noop``
sink and into a Parquet sink, each on a fresh checkpoint, on ``local[2]``. Also reported: the
source's per-segment read (``read_segment_rows``) alone, without Spark.

    .venv/bin/python benchmarks/stream.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rda.pipeline.recorder.service import Recorder, Sample
from rda.pipeline.spark_session import local_session
from rda.pipeline.stream.sources import (
    JournalDataSource,
    JournalOptions,
    JournalStreamReader,
    plan_segments,
    read_segment_rows,
)
from rda.serialization.data import Data
from rda.serialization.header import DataContext

T0 = 1_795_300_000_000_000_000


def write_journal(root: Path, rows: int) -> float:
    recorder = Recorder(root, recorder_id="bench", convert=False, queue_limit=rows + 1)
    recorder.start()
    started = time.perf_counter()
    for i in range(rows):
        data = Data(i=i, x=i * 0.5, y=-i * 0.25, ok=bool(i % 2), name="n")
        while not recorder.offer(
            f"PS{i % 4}", "Acq", None, Sample(data, DataContext(acq_stamp=T0 + i))
        ):
            time.sleep(0.001)
    recorder.flush(timeout=600)
    elapsed = time.perf_counter() - started
    recorder.stop(convert=False)
    return elapsed


def direct_read(root: Path) -> tuple[int, float]:
    options = JournalOptions.parse({"root": str(root)})
    reader = JournalStreamReader(options)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    started = time.perf_counter()
    rows = sum(read_segment_rows(options, p).num_rows for p in plan_segments(options, start, end))
    return rows, time.perf_counter() - started


def stream(spark: Any, root: Path, sink: str, work: Path, **options: str) -> tuple[int, float]:
    frame = (
        spark.readStream.format("rda-journal").option("root", str(root)).options(**options).load()
    )
    writer = frame.writeStream.option("checkpointLocation", str(work / f"checkpoint-{sink}"))
    writer = (
        writer.format("noop")
        if sink == "noop"
        else writer.format("parquet").option("path", str(work / "out"))
    )
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return rows, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rda-stream-bench-") as tmp:
        work = Path(tmp)
        root = work / "store"
        write_s = write_journal(root, args.rows)
        segments = len(list((root / "_journal" / "bench").glob("seg-*.arrow")))
        read_rows, read_s = direct_read(root)
        spark = local_session("local[2]", "rda-stream-bench")
        spark.dataSource.register(JournalDataSource)
        stream(spark, root, "noop", work / "warmup", maxSegmentsPerTrigger="1")  # JVM, workers
        noop_rows, noop_s = stream(spark, root, "noop", work)
        parquet_rows, parquet_s = stream(spark, root, "parquet", work)
        spark.stop()
    result = {
        "rows": args.rows,
        "segments": segments,
        "master": "local[2]",
        "journal_write_rows_per_s": round(args.rows / write_s),
        "source_read_without_spark_rows_per_s": round(read_rows / read_s),
        "stream_noop": {
            "rows": noop_rows,
            "seconds": round(noop_s, 2),
            "rows_per_s": round(noop_rows / noop_s),
        },
        "stream_parquet": {
            "rows": parquet_rows,
            "seconds": round(parquet_s, 2),
            "rows_per_s": round(parquet_rows / parquet_s),
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
