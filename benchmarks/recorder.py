"""Recorder throughput: a local fire-hose through the storage core to acknowledged journal
segments, then to Parquet. Prints JSON.

Two workloads: scalar rows (5 scalar fields) and rows with a 1,000-element float64 array.
Rates are rows/s of wall time; CPU time is the process's (user + system) over the same span,
so ``rows_per_cpu_s`` says what one core sustains. Peak RSS is the process maximum so far.

    .venv/bin/python benchmarks/recorder.py [--rows N] [--array-rows N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _samples(count: int, array: bool) -> list[Sample]:
    # Built before the clock starts: the benchmark measures the recorder, not Data creation.
    base = time.time_ns()
    wave = np.linspace(0.0, 1.0, 1000)
    out = []
    for i in range(count):
        if array:
            data = Data(index=i, wave=wave)
        else:
            data = Data(current=float(i), voltage=1.5, index=i, status="ON", ok=True)
        out.append(Sample(data, DataContext("CPS.USER.ALL", base + i, base + i, "CPS.USER.ALL")))
    return out


def _baseline(samples: list[Sample], root: str) -> float:
    """Rows/s of the bare minimum: the same values as columns -> one Arrow IPC file, fsynced.

    The ratio recorder/baseline survives a noisy machine better than the absolute rate.
    """
    start = time.perf_counter()
    fields = list(samples[0].data.types())
    columns = {name: [s.data[name] for s in samples] for name in fields}
    columns["acq_stamp"] = [s.context.acq_stamp for s in samples]
    table = pa.table({name: pa.array(values) for name, values in columns.items()})
    path = Path(root) / "baseline.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    return len(samples) / (time.perf_counter() - start)


def run(rows: int, array: bool) -> dict[str, Any]:
    samples = _samples(rows, array)
    with tempfile.TemporaryDirectory() as root:
        recorder = Recorder(root, recorder_id="bench", queue_limit=rows + 1, convert=False)
        recorder.start()
        cpu0, t0 = _cpu(), time.perf_counter()
        offer = recorder.offer
        for sample in samples:
            offer("BENCH1", "Acquisition", None, sample)
        recorder.flush(timeout=300.0)
        t1, cpu1 = time.perf_counter(), _cpu()
        stats = recorder.statistics()
        recorder.stop(convert=False)
        cpu2, t2 = _cpu(), time.perf_counter()
        converted = recorder.converter.convert_pending()
        t3, cpu3 = time.perf_counter(), _cpu()
        files = recorder.converter.statistics().files_written
        baseline = _baseline(samples, root)
    assert stats.acked_seq == rows and stats.overflow == 0, stats
    acked_rate = rows / (t1 - t0)
    return {
        "rows": rows,
        "acked_rows_per_s": round(acked_rate),
        "acked_rows_per_cpu_s": round(rows / (cpu1 - cpu0)),
        "segments": stats.segments_written,
        "journal_bytes": stats.bytes_written,
        "parquet_rows_per_s": round(rows / (t3 - t2)),
        "parquet_rows_per_cpu_s": round(rows / max(1e-9, cpu3 - cpu2)),
        "converted_segments": converted,
        "parquet_files": files,
        "baseline_raw_arrow_rows_per_s": round(baseline),
        "acked_vs_baseline": round(acked_rate / baseline, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--array-rows", type=int, default=30_000)
    args = parser.parse_args()
    result = {
        "scalar": run(args.rows, array=False),
        "array_1000": run(args.array_rows, array=True),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
