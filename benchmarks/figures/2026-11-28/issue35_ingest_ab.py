"""The recorder's write path at its maximum rate, before and after, alternated in one run.

Each turn runs one fire-hose in a fresh process, once with the ``--base`` tree of rda first
on ``PYTHONPATH`` (the code before the change) and once with ``--new``, in an order that
turns round every round (base, new; then new, base; ...), so that a load swinging over the
minutes weighs on both alike. A fire-hose: ``Recorder.offer`` from this process's main thread,
as fast as the queue (50,000 rows) takes rows (a refused row waits 0.5 ms and is offered
again), for ``--seconds``, rows of 5 scalar fields (a pool of 10,000 distinct ``Sample``s)
spread over ``--signals`` properties; then ``flush``. Measured: rows acknowledged per second
(durable in the journal), the process's CPU and the writer thread's CPU per 1,000 rows
acknowledged. Prints JSON; each round's ratio new/base is taken against that round's base.

    python issue35_ingest_ab.py --base DIR --new DIR [--seconds 10] [--rounds 4]
        [--signals 1] [--signals 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

_CHILD = r"""
import json, os, sys, tempfile, threading, time
from pathlib import Path
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext
import rda

seconds, signals = float(sys.argv[1]), int(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")

def thread_cpu(native_id):
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick

base = time.time_ns()
names = [f"DEV{i:04d}" for i in range(signals)]
samples = [
    Sample(
        Data(current=float(i), voltage=1.5, index=i, status="ON", ok=True),
        DataContext("CPS.USER.ALL", base + i, base + i, "CPS.USER.ALL"),
    )
    for i in range(10_000)
]
with tempfile.TemporaryDirectory() as root:
    recorder = Recorder(root, recorder_id="ab", queue_limit=50_000, convert=False)
    recorder.start()
    # Every signal once before the clock starts: its schema is resolved (a catalog write
    # each, once in a recorder's life), not timed.
    for i, name in enumerate(names):
        recorder.offer(name, "Acq", None, samples[i % 10_000])
    assert recorder.flush(600)
    writer = next(t.native_id for t in threading.enumerate() if t.name == "rda-recorder-ab")
    before = recorder.statistics().acked_rows
    cpu0, writer0, begin = time.process_time(), thread_cpu(writer), time.perf_counter()
    offer, i = recorder.offer, 0
    while time.perf_counter() - begin < seconds:
        for _ in range(1000):
            while not offer(names[i % signals], "Acq", None, samples[i % 10_000]):
                time.sleep(0.0005)
            i += 1
    assert recorder.flush(600)
    elapsed = time.perf_counter() - begin
    writer_cpu, cpu = thread_cpu(writer) - writer0, time.process_time() - cpu0
    acked = recorder.statistics().acked_rows - before
    recorder.stop(convert=False)
print(json.dumps({
    "rda": rda.__file__,
    "rows_per_s": round(acked / elapsed),
    "process_cpu_ms_per_1000_rows": round(cpu * 1e6 / acked, 3),
    "writer_cpu_ms_per_1000_rows": round(writer_cpu * 1e6 / acked, 3),
    "cores_busy": round(cpu / elapsed, 2),
}))
"""


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _turn(tree: str, seconds: float, signals: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(seconds), str(signals)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=seconds * 20 + 300,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    assert result["rda"].startswith(tree), (result["rda"], tree)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="rda tree before the change")
    parser.add_argument("--new", required=True, help="rda tree after the change")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--signals", type=int, action="append")
    args = parser.parse_args()
    trees = {"base": os.path.abspath(args.base), "new": os.path.abspath(args.new)}
    out: dict[str, Any] = {"load_before": _load(), "seconds_per_turn": args.seconds, "runs": {}}
    for signals in args.signals or [1, 1000]:
        rounds = []
        for turn in range(args.rounds):
            order = ["base", "new"] if turn % 2 == 0 else ["new", "base"]
            one: dict[str, Any] = {"order": order, "load": _load()}
            for side in order:
                one[side] = _turn(trees[side], args.seconds, signals)
            one["ratio_rows_per_s"] = round(one["new"]["rows_per_s"] / one["base"]["rows_per_s"], 3)
            one["ratio_writer_cpu"] = round(
                one["new"]["writer_cpu_ms_per_1000_rows"]
                / one["base"]["writer_cpu_ms_per_1000_rows"],
                3,
            )
            rounds.append(one)
            print(json.dumps(one), file=sys.stderr, flush=True)

        def median(side: str, name: str, rounds: list[dict[str, Any]] = rounds) -> float:
            return round(float(statistics.median(r[side][name] for r in rounds)), 3)

        names = ("rows_per_s", "process_cpu_ms_per_1000_rows", "writer_cpu_ms_per_1000_rows")
        out["runs"][str(signals)] = {
            "rounds": rounds,
            "median": {side: {n: median(side, n) for n in names} for side in ("base", "new")},
            "ratio_rows_per_s": {
                "median": round(statistics.median(r["ratio_rows_per_s"] for r in rounds), 3),
                "min": min(r["ratio_rows_per_s"] for r in rounds),
                "max": max(r["ratio_rows_per_s"] for r in rounds),
            },
            "ratio_writer_cpu_median": round(
                statistics.median(r["ratio_writer_cpu"] for r in rounds), 3
            ),
        }
    out["load_after"] = _load()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
