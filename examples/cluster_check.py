"""The History job on a real Spark standalone cluster on this machine, checked against History.local.

    python examples/cluster_check.py [--workdir DIR] [--keep] [--timeout SECONDS]
    make cluster-check

1. Records a store with the recorder (three signals, a value every 7 minutes over 26 hours
   around 2026-11-22; PS1's schema widens, BPM1's ``y`` changes type: two schema versions),
   written through a ``file://`` store URI.
2. Starts a Spark standalone **master** and one **worker** from the installed pyspark's own
   launcher (``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``:
   the pip package has no ``sbin/start-master.sh``), as child processes of this script, bound to
   127.0.0.1 on free ports, logs in ``WORKDIR/logs``; waits (bounded) until the master reports
   the worker ALIVE (its JSON status page).
3. Runs ``spark-submit --master spark://127.0.0.1:PORT examples/history_job.py`` on the store and
   checks that the application ran there and finished (the master's status page) and that the
   worker's executors ran its tasks (their logs).
4. Computes the same hourly ``stats`` with ``History.local`` and compares: every row equal
   (counts, first/last/min/max exactly; mean and std to 1e-12 relative: the cluster sums in
   another order).
5. Stops the worker, then the master, by pid (SIGTERM, then SIGKILL after a bounded wait).

Prints one JSON document (timings, rows, the application id) and exits 0 when the results are
equal, 1 otherwise. ``SPARK_HOME`` defaults to the pyspark package directory; Java 17 must be on
the PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow.parquet as pq
import pyspark

from rda.pipeline.history.api import History
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "examples" / "history_job.py"
DAY = "2026-11-22"
DAY_NS = int(datetime.datetime.fromisoformat(DAY).replace(tzinfo=datetime.UTC).timestamp()) * 10**9
S = 10**9
KEYS = ("device", "property", "acq_stamp", "field")
EXACT = ("count", "nan_count", "errors", "first", "last", "min", "max")
CLOSE = ("mean", "std")


def record(root: str) -> int:
    """A store like a demo's: PS1/PS2 currents, BPM1 positions; returns the rows offered."""
    recorder = Recorder(root, recorder_id="check", flush_interval=0.02, convert_interval=3_600)
    recorder.start()
    rows = 0
    try:
        for i in range(26 * 60 // 7):
            acq = DAY_NS - 3_600 * S + i * 420 * S + 11
            context = DataContext("CPS.USER.ALL", acq, acq, "CPS.USER.ALL")
            ps = {"current": float(np.cos(i) * 100), "n": i}
            if i >= 100:  # a field appears: the schema widens, older files lack the column
                ps["voltage"] = float(i % 13)
            offers = [
                ("PS1", "Acquisition", Data(**ps)),
                ("PS2", "Acquisition", Data(current=float(np.sin(i) * 50), n=-i)),
                ("BPM1", "Orbit", Data(x=float(i % 17) - 8.0, y=math.nan if i % 29 == 0 else i)),
            ]
            for device, prop, data in offers:
                if not recorder.offer(device, prop, None, Sample(data, context)):
                    raise RuntimeError("the recorder refused a row (queue full)")
                rows += 1
        if not recorder.flush(timeout=60):
            raise RuntimeError("the recorder did not acknowledge every row within 60 s")
    finally:
        recorder.stop()
    return rows


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Cluster:
    """A standalone master and one worker, as child processes owned (and stopped) by this object."""

    def __init__(self, workdir: Path, spark_home: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.spark_home = spark_home
        self.env = env
        self.port, self.ui_port = free_port(), free_port()
        self.worker_port, self.worker_ui_port = free_port(), free_port()
        self.processes: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _launch(self, name: str, *args: str) -> None:
        log = open(self.workdir / "logs" / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop)
        command = [str(self.spark_home / "bin" / "spark-class"), *args]
        # A session of its own: a Ctrl-C at the terminal reaches this script, which stops the
        # daemons in order, rather than killing them mid-way.
        process = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes.append((name, process, log))

    def start(self, timeout: float) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        (self.workdir / "worker").mkdir(parents=True, exist_ok=True)
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        self._launch(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.worker_port),
            "--webui-port",
            str(self.worker_ui_port),
            "--cores",
            "2",
            "--memory",
            "1g",
            "--work-dir",
            str(self.workdir / "worker"),
            self.url,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process, _ in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"the {name} exited ({process.returncode}): see its log")
            status = self.status()
            if status and any(w.get("state") == "ALIVE" for w in status.get("workers", [])):
                return
            time.sleep(0.5)  # polling a child's readiness, bounded by the deadline
        raise RuntimeError(f"no worker registered with {self.url} within {timeout:.0f} s")

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status page (workers, applications), or None while it starts."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                document: dict[str, Any] = json.load(r)
                return document
        except (OSError, ValueError):
            return None

    def finished_apps(self, timeout: float) -> list[dict[str, Any]]:
        """The applications the master lists as completed (waits, bounded, for the first)."""
        deadline = time.monotonic() + timeout
        while True:
            apps: list[dict[str, Any]] = (self.status() or {}).get("completedapps", [])
            if apps or time.monotonic() >= deadline:
                return apps
            time.sleep(0.5)  # the master moves an app to "completed" once its driver is gone

    def executor_tasks(self) -> int:
        """Tasks the worker's executors finished (their logs): the job ran on the cluster."""
        logs = (self.workdir / "worker").glob("app-*/*/stderr")
        return sum(log.read_text(errors="replace").count("Finished task") for log in logs)

    def stop(self, timeout: float = 30.0) -> None:
        """The worker first (it stops its executors), then the master; by pid, bounded."""
        for name, process, log in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # the group this object created
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    print(f"the {name} ignored SIGTERM: killing it", file=sys.stderr)
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout)
            log.close()
        self.processes.clear()


@contextlib.contextmanager
def running(cluster: Cluster, timeout: float) -> Iterator[Cluster]:
    try:
        cluster.start(timeout)
        yield cluster
    finally:
        cluster.stop()


def submit(cluster: Cluster, env: dict[str, str], root: str, out: Path, timeout: float) -> str:
    command = [
        str(cluster.spark_home / "bin" / "spark-submit"),
        "--master",
        cluster.url,
        "--deploy-mode",
        "client",
        "--driver-memory",
        "512m",
        "--executor-memory",
        "512m",
        "--total-executor-cores",
        "2",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        str(JOB),
        root,
        str(out),
        DAY,
    ]
    with open(cluster.workdir / "logs" / "submit.log", "wb") as log:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=log, timeout=timeout)
    stdout = done.stdout.decode()
    if done.returncode != 0:
        raise RuntimeError(f"spark-submit failed ({done.returncode}): see {log.name}")
    return stdout


def _rows(frame: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = frame.to_pylist()
    return {tuple(r[k] for k in KEYS): r for r in rows}


def compare(cluster_table: Any, local_table: Any) -> list[str]:
    """The differences between two stats tables (empty: equal)."""
    ours, theirs = _rows(cluster_table), _rows(local_table)
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"row keys differ: {sorted(set(ours) ^ set(theirs))[:5]}")
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        for name in EXACT:
            if a[name] != b[name] and not (_nan(a[name]) and _nan(b[name])):
                problems.append(f"{key} {name}: cluster {a[name]!r} != local {b[name]!r}")
        for name in CLOSE:
            x, y = a[name], b[name]
            if (x is None) != (y is None) or (
                x is not None and not math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)
            ):
                problems.append(f"{key} {name}: cluster {x!r} != local {y!r}")
    return problems


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a new temp dir.")
    parser.add_argument("--keep", action="store_true", help="Keep the work dir (logs, store).")
    parser.add_argument("--timeout", type=float, default=300.0, help="Bound of each wait (s).")
    options = parser.parse_args(argv)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="rda-cluster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    env = dict(
        os.environ,
        SPARK_HOME=str(spark_home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(workdir / "logs"),
        SPARK_WORKER_DIR=str(workdir / "worker"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = (workdir / "store").absolute().as_uri()  # the store through a file:// URI
    out = workdir / "out"
    report: dict[str, Any] = {"workdir": str(workdir), "store": root, "day": DAY}
    try:
        began = time.monotonic()
        report["rows_recorded"] = record(root)
        report["record_s"] = round(time.monotonic() - began, 2)
        cluster = Cluster(workdir, spark_home, env)
        with running(cluster, options.timeout):
            report["master"] = cluster.url
            report["cluster_start_s"] = round(time.monotonic() - began - report["record_s"], 2)
            submitted = time.monotonic()
            report["job_output"] = submit(cluster, env, root, out, options.timeout).strip()
            report["submit_s"] = round(time.monotonic() - submitted, 2)
            apps = cluster.finished_apps(options.timeout)
            report["application"] = apps[0]["id"] if apps else None
            report["application_state"] = apps[0]["state"] if apps else None
            report["workers"] = len((cluster.status() or {}).get("workers", []))
            report["executor_tasks"] = cluster.executor_tasks()
        stopped = time.monotonic()
        local = History.local(root, master="local[2]")
        start = datetime.datetime.fromisoformat(DAY).replace(tzinfo=datetime.UTC)
        expected = local.stats("*/*", start, start + datetime.timedelta(days=1), every="1h")
        local_table = expected.toArrow()
        local.spark.stop()
        report["local_s"] = round(time.monotonic() - stopped, 2)
        cluster_table = pq.read_table(out)
        problems = compare(cluster_table, local_table)
        if report["application_state"] != "FINISHED":
            problems.append(f"the job did not finish on {report.get('master')}: {apps}")
        if not report["executor_tasks"]:
            problems.append("no task ran on the worker's executors")
        report["rows_compared"] = local_table.num_rows
        report["equal"] = not problems
        report["differences"] = problems[:20]
        report["total_s"] = round(time.monotonic() - began, 2)
    except BaseException:
        print(f"cluster check failed: logs and store kept in {workdir}", file=sys.stderr)
        raise
    if options.workdir is None and not options.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0 if report.get("equal") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
