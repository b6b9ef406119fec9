"""Where a recorded row's time goes: the recorder's write path fed at its maximum rate.

Feeds ``Recorder.offer`` from this thread (the fire-hose) with the queue kept full, then times
each step of the writer thread with wrappers: the per-row append (signature, routing, nine list
appends), the segment's Arrow build, its IPC serialisation, and the durable write split into
``os.write``, the file's fsync, the rename and the directory's fsync. Wall time and the thread's
own CPU time (``time.thread_time``) are both kept: their difference is time the thread waited
(the GIL, the scheduler of a shared machine, the disk). Prints JSON.

    python issue35_ingest_profile.py [--rows 300000] [--signals 1] [--signals 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import rda.pipeline.recorder.journal as journal_module
import rda.pipeline.recorder.service as service_module
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext

WALL: dict[str, float] = defaultdict(float)
CPU: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _timed(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return func(*args, **kwargs)
        finally:
            WALL[name] += time.perf_counter() - w
            CPU[name] += time.thread_time() - c
            CALLS[name] += 1

    return wrapper


def _install() -> None:
    os.fsync = _timed("fsync (file and directory)", os.fsync)
    os.replace = _timed("rename", os.replace)
    os.write = _timed("os.write", os.write)
    builder = journal_module.SegmentBuilder
    builder.build = _timed("segment build (Arrow arrays)", builder.build)  # type: ignore[method-assign]
    journal = journal_module.Journal
    journal.write = _timed("journal.write (build+IPC+durable write)", journal.write)  # type: ignore[method-assign]
    recorder = service_module.Recorder
    recorder._append = _timed("append per row", recorder._append)  # type: ignore[method-assign]
    loop = recorder._write_loop

    def write_loop(self: Recorder) -> None:
        c = time.thread_time()
        try:
            loop(self)
        finally:
            CPU["writer thread total"] += time.thread_time() - c

    recorder._write_loop = write_loop  # type: ignore[method-assign]


def run(rows: int, signals: int) -> dict[str, Any]:
    for table in (WALL, CPU, CALLS):
        table.clear()
    base = time.time_ns()
    names = [f"DEV{i:04d}" for i in range(signals)]
    samples = [
        Sample(
            Data(current=float(i), voltage=1.5, index=i, status="ON", ok=True),
            DataContext("CPS.USER.ALL", base + i, base + i, "CPS.USER.ALL"),
        )
        for i in range(min(rows, 10_000))
    ]
    with tempfile.TemporaryDirectory() as root:
        recorder = Recorder(root, recorder_id="prof", queue_limit=rows + 1, convert=False)
        recorder.start()
        w0, c0 = time.perf_counter(), time.process_time()
        feed_cpu = time.thread_time()
        offer = recorder.offer
        n = len(samples)
        for i in range(rows):
            offer(names[i % signals], "Acq", None, samples[i % n])
        feed_cpu = time.thread_time() - feed_cpu
        assert recorder.flush(timeout=600.0)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        stats = recorder.statistics()
        recorder.stop(convert=False)
    assert stats.acked_rows == rows, stats
    per_k = 1000 / rows
    steps = {
        name: {
            "calls": CALLS[name],
            "wall_ms_per_1000_rows": round(WALL[name] * 1e3 * per_k, 3),
            "cpu_ms_per_1000_rows": round(CPU[name] * 1e3 * per_k, 3),
        }
        for name in WALL
    }
    return {
        "rows": rows,
        "signals": signals,
        "segments": stats.segments_written,
        "rows_per_segment": round(rows / max(1, stats.segments_written)),
        "wall_s": round(wall, 3),
        "acked_rows_per_s": round(rows / wall),
        "process_cpu_ms_per_1000_rows": round(cpu * 1e3 * per_k, 3),
        "feeder_offer_cpu_ms_per_1000_rows": round(feed_cpu * 1e3 * per_k, 3),
        "writer_thread_cpu_ms_per_1000_rows": round(CPU["writer thread total"] * 1e3 * per_k, 3),
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--signals", type=int, action="append")
    args = parser.parse_args()
    _install()
    result = {
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "runs": [run(args.rows, s) for s in args.signals or [1, 1000]],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
