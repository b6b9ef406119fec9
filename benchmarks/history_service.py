"""History as a service: what a client gets from a recorder's history server. Prints JSON.

1. ``client.history_table`` over a window of a 1 kHz scalar (the issue's figure: 1 hour, 3.6M
   rows; ``--scalar-seconds``) and of a 1 MiB float64 array at 1 Hz (10 minutes;
   ``--array-seconds``): rows/s and MiB/s delivered as a ``pyarrow.Table``, the store written
   by the real recorder (mostly converted to Parquet, the last rows still in the journal).
   Baselines in the same run, on the same bytes (the Arrow IPC streams of the same query as
   the server encodes them): raw pyzmq DEALER/ROUTER shipping them chunk after chunk
   (request, reply), and the same with each received frame opened by pyarrow's IPC reader
   (raw pyarrow IPC over raw pyzmq). ``client.history`` (a Notification per row) is timed on
   the first rows too. Each pull and baseline runs ``RUNS`` times; the best counts.
2. The recorder's own ingest rate (a local fire-hose, rows acknowledged per second) with and
   without a client (another process) pulling history from it meanwhile; the goal is >= 90 %.
   Twice: as fast as the fire-hose goes (the recorder's maximum, which shares the GIL with the
   history server) and paced at ``--ingest-rate`` rows/s (a recorder's usual load).
3. ``subscribe(backfill=60)`` to a 1 kHz counter whose last 60 s are recorded: time from the
   call to the first live (non-HISTORY) update, and how many HISTORY rows came first.

Short by default (a minute or two on a shared 2-core machine):

    .venv/bin/python benchmarks/history_service.py [--scalar-seconds 60] [--array-seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import zmq

from rda.business.client.history import TABLE_CHUNK_ROWS
from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest
from rda.pipeline.recorder.query import Cursor, HistoryReader
from rda.pipeline.recorder.serve import MAX_BYTES, encode_chunk
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext, UpdateType

RUNS = 3  # each pull and each baseline: the best of these (the machine is shared)
# The targets (issue 35, "Performance"), reported beside each figure.
TARGETS = {
    "history_table_scalar_rows_per_s": 5_000_000,
    "history_table_scalar_ratio_vs_raw_pyarrow_ipc": 0.5,
    "history_table_array_ratio_vs_raw_pyzmq": 0.8,
    "backfill_first_live_update_s": 2.0,
    "ingest_ratio_while_serving": 0.95,
}


def _fill(recorder: Recorder, count: int, start: int, step: int, value: Any) -> None:
    """``count`` rows of DEV/Prop stamped ``start + i*step``; all but the last ~10 % converted."""
    converted_at = int(count * 0.9)
    for i in range(count):
        context = DataContext("", 0, start + i * step, "")
        while not recorder.offer("DEV", "Prop", None, Sample(value(i), context)):
            time.sleep(0.001)  # queue full: let the writer catch up
        if i + 1 == converted_at:
            recorder.flush(300)
            recorder.convert_now()
    recorder.flush(300)


def _raw_pyzmq(chunks: list[Any], decode: bool) -> float:
    """Seconds for raw pyzmq to ship ``chunks`` (the same bytes rda sent) one request/reply at
    a time; ``decode``: the receiver opens each as an Arrow IPC stream over the frame."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")

    def serve() -> None:
        for chunk in chunks:
            peer, _ = router.recv_multipart()
            router.send_multipart([peer, chunk], copy=False)

    server = threading.Thread(target=serve)
    server.start()
    rows = 0
    start = time.perf_counter()
    for _ in chunks:
        dealer.send(b"next")
        frame = dealer.recv(copy=False)
        if decode:
            rows += pa.ipc.open_stream(pa.py_buffer(frame.buffer)).read_all().num_rows
    elapsed = time.perf_counter() - start
    server.join()
    dealer.close(0)
    router.close(0)
    context.term()
    return elapsed


def _chunks(recorder: Recorder, start: int, end: int, chunk_rows: int) -> list[Any]:
    """The Arrow IPC streams of the query, as the history server encodes them."""
    reader = HistoryReader(
        recorder.store, recorder.journal, lambda: recorder.converter.max_seq, "bench"
    )
    out = []
    after = None
    while True:
        chunk = reader.chunk(
            "DEV", "Prop", start, end, after=after, max_rows=chunk_rows, max_bytes=MAX_BYTES
        )
        out.append(encode_chunk(chunk, True).get_array("arrow"))
        if not chunk.more:
            return out
        last = chunk.table.slice(len(chunk) - 1).to_pylist()[0]
        after = Cursor(last["acq_stamp"], last["recorder_id"], last["seq"])


def history_pull(seconds: int, rate: float, array: bool, notifications: int) -> dict[str, Any]:
    count = int(seconds * rate)
    step = int(1e9 / rate)
    wave = np.linspace(0.0, 1.0, 131072)  # 1 MiB of float64

    def value(i: int) -> Data:
        return Data(index=i, wave=wave) if array else Data(current=i * 0.5, index=i)

    with tempfile.TemporaryDirectory() as root:
        recorder = Recorder(
            root,
            recorder_id="bench",
            convert=False,
            queue_limit=200_000,
            serve=ServerBuilder("bench").directory(None),
        )
        t0 = time.perf_counter()
        recorder.start()
        start = time.time_ns() - count * step
        end = start + count * step
        _fill(recorder, count, start, step, value)
        filled = time.perf_counter() - t0
        assert recorder.history_server is not None
        client = ClientService(
            StaticDirectory({"history:*": recorder.history_server.endpoint}),
            Config(request_timeout=120.0),
        )
        try:
            client.history_table("DEV", "Prop", start, start + step)  # connect first
            runs = []
            for _ in range(RUNS):
                begin = time.perf_counter()
                table = client.history_table("DEV", "Prop", start, end)
                runs.append(time.perf_counter() - begin)
                rows = table.num_rows
                nbytes = table.nbytes
                del table
            elapsed = min(runs)
            # client.history (a Notification per row), on the first rows only: it is slow.
            few = min(count, notifications)
            begin = time.perf_counter()
            listed = 0
            for notification in client.history_iter("DEV", "Prop", start, end, limit=few):
                notification.data  # noqa: B018 - delivered means readable
                listed += 1
            per_row = time.perf_counter() - begin
            # The raw baselines ship the same bytes: the Arrow streams of the same query.
            payloads = _chunks(recorder, start, end, TABLE_CHUNK_ROWS)
            raw = min(_raw_pyzmq(payloads, decode=False) for _ in range(RUNS))
            raw_ipc = min(_raw_pyzmq(payloads, decode=True) for _ in range(RUNS))
            wire = sum(p.nbytes for p in payloads)
        finally:
            client.close()
            recorder.stop(convert=False)
    mib = (count * wave.nbytes if array else nbytes) / 2**20
    return {
        "window_s": seconds,
        "rows": rows,
        "expected_rows": count,
        "chunks": len(payloads),
        "wire_mib": round(wire / 2**20, 1),
        "fill_s": round(filled, 2),
        "history_table_s": round(elapsed, 3),
        "history_table_runs_s": [round(r, 3) for r in runs],
        "history_table_rows_per_s": round(rows / elapsed),
        "history_table_mib_per_s": round(mib / elapsed, 1),
        "raw_pyzmq_rows_per_s": round(count / raw),
        "raw_pyzmq_mib_per_s": round(mib / raw, 1),
        "raw_pyarrow_ipc_rows_per_s": round(count / raw_ipc),
        "ratio_vs_raw_pyzmq": round(raw / elapsed, 3),
        "ratio_vs_raw_pyarrow_ipc": round(raw_ipc / elapsed, 3),
        "history_notifications_rows": listed,
        "history_notifications_rows_per_s": round(listed / per_row),
    }


_QUERIER = """
import sys, time
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
client = ClientService(StaticDirectory({"history:*": sys.argv[1]}), Config(request_timeout=60.0))
rows = 0
while True:
    now = time.time_ns()
    rows += client.history_table("DEV", "Prop", now - 60 * 10**9, now).num_rows
    print(rows, flush=True)
"""


def ingest(
    seconds: float, with_queries: bool, rate: float = 0.0, separate: bool = False
) -> dict[str, Any]:
    """Rows/s the recorder acknowledges from a fire-hose, optionally while a client in another
    process pulls the last minute of a 1 kHz signal with ``history_table``, again and again:
    from the history server beside the recorder, or (``separate``) from ``rda history serve``
    in a process of its own reading the same store from disk."""
    with tempfile.TemporaryDirectory() as root:
        recorder = Recorder(
            root,
            recorder_id="ingest",
            queue_limit=50_000,
            serve=False if separate else ServerBuilder("ingest").directory(None),
        )
        recorder.start()
        _fill(recorder, 60_000, time.time_ns() - 60_000 * 10**6, 10**6, lambda i: Data(x=i))
        server = None
        if separate:
            env = dict(os.environ, RDA_DIRECTORY_FILE=str(Path(root) / "directory.json"))
            server = subprocess.Popen(
                [sys.executable, "-m", "rda._cli", "history", "serve", root],
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            assert server.stderr is not None
            endpoint = server.stderr.readline().split()[-1]
        else:
            assert recorder.history_server is not None
            endpoint = recorder.history_server.endpoint
        querier = None
        if with_queries:
            querier = subprocess.Popen(
                [sys.executable, "-c", _QUERIER, endpoint], stdout=subprocess.PIPE, text=True
            )
            assert querier.stdout is not None
            querier.stdout.readline()  # it has pulled one minute: it is running
        before = recorder.statistics().acked_rows
        begin = time.perf_counter()
        sample = Sample(Data(current=1.0, index=0), DataContext(acq_stamp=1))
        offered = 0
        while time.perf_counter() - begin < seconds:
            for _ in range(1000):
                if not recorder.offer("HOSE", "Prop", None, sample):
                    time.sleep(0.0005)
            offered += 1000
            if rate:  # paced: a recorder's usual load, not its maximum
                ahead = offered / rate - (time.perf_counter() - begin)
                if ahead > 0:
                    time.sleep(ahead)
        recorder.flush(120)
        elapsed = time.perf_counter() - begin
        acked = recorder.statistics().acked_rows - before
        pulls = 0
        if querier is not None:
            querier.kill()
            querier.wait(10)
            assert querier.stdout is not None
            lines = querier.stdout.read().split()
            pulls = int(lines[-1]) if lines else 0
            querier.stdout.close()
        if server is not None:
            server.terminate()
            server.wait(60)
            assert server.stderr is not None
            server.stderr.close()
        recorder.stop(convert=False)
    return {"rows_per_s": round(acked / elapsed), "history_rows_pulled": pulls}


class _Counter(Device):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.n = 0
        self.last = AcquiredData(Data(n=0), DataContext(acq_stamp=time.time_ns()))

    @Device.property("Count")
    def count(self, request: GetRequest) -> AcquiredData:
        with self.lock:
            return self.last

    def tick(self) -> None:
        with self.lock:
            self.n += 1
            self.last = AcquiredData(Data(n=self.n), DataContext(acq_stamp=time.time_ns()))
            self.publish("Count", self.last)


def backfill(seconds: int, rate: float) -> dict[str, Any]:
    device = _Counter()
    server = ServerBuilder("Counter").device("CNT", device).directory(None).build().start()
    static = {"CNT": server.endpoint}
    with tempfile.TemporaryDirectory() as root:
        rec_client = ClientService(StaticDirectory(static), Config(request_timeout=10.0))
        builder = ServerBuilder("History").directory(None)
        recorder = Recorder(Path(root), ["CNT/Count"], rec_client, recorder_id="bf", serve=builder)
        recorder.start()
        # The last `seconds` of the counter, as if recorded: synthetic rows before the live ones.
        step = int(1e9 / rate)
        count = int(seconds * rate)
        past = time.time_ns() - count * step
        for i in range(count):
            context = DataContext("", 0, past + i * step, "")
            while not recorder.offer("CNT", "Count", None, Sample(Data(n=i - count), context)):
                time.sleep(0.001)
        recorder.flush(120)
        recorder.convert_now()
        stop = threading.Event()

        def publish() -> None:
            while not stop.wait(1 / rate):
                device.tick()

        ticker = threading.Thread(target=publish)
        ticker.start()
        assert recorder.history_server is not None
        static["history:*"] = recorder.history_server.endpoint
        client = ClientService(StaticDirectory(static), Config(request_timeout=60.0))
        try:
            begin = time.perf_counter()
            sub = client.access_point("CNT", "Count").subscribe(backfill=seconds, queue_size=5000)
            history = 0
            first_row = None
            while True:
                n = sub.poll(60)
                assert n is not None and n.error is None, n
                if first_row is None:
                    first_row = time.perf_counter() - begin
                if n.update_type is not UpdateType.HISTORY:
                    break
                history += 1
            live_after = time.perf_counter() - begin
            sub.close()
        finally:
            client.close()
            stop.set()
            ticker.join()
            recorder.stop(convert=False)
            rec_client.close()
            server.stop()
    return {
        "backfill_s": seconds,
        "history_rows": history,
        "time_to_first_row_s": round(first_row or 0.0, 4),
        "time_to_first_live_update_s": round(live_after, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scalar-seconds", type=int, default=60, help="issue: 3600")
    parser.add_argument("--array-seconds", type=int, default=60, help="issue: 600")
    parser.add_argument("--ingest-seconds", type=float, default=5.0)
    parser.add_argument("--ingest-rate", type=float, default=20_000.0, help="paced rows/s")
    parser.add_argument("--backfill", type=int, default=60)
    args = parser.parse_args()
    quiet = ingest(args.ingest_seconds, False)
    loaded = ingest(args.ingest_seconds, True)
    apart_quiet = ingest(args.ingest_seconds, False, separate=True)
    apart_loaded = ingest(args.ingest_seconds, True, separate=True)
    apart_ratio = round(apart_loaded["rows_per_s"] / max(1, apart_quiet["rows_per_s"]), 3)
    paced_quiet = ingest(args.ingest_seconds, False, args.ingest_rate)
    paced_loaded = ingest(args.ingest_seconds, True, args.ingest_rate)
    scalar = history_pull(args.scalar_seconds, 1000.0, False, 50_000)
    array = history_pull(args.array_seconds, 1.0, True, 10)
    backfilled = backfill(args.backfill, 1000.0)
    ingest_ratio = round(loaded["rows_per_s"] / max(1, quiet["rows_per_s"]), 3)
    result = {
        "targets": TARGETS,
        "met": {
            "history_table_scalar_rows_per_s": scalar["history_table_rows_per_s"]
            >= TARGETS["history_table_scalar_rows_per_s"],
            "history_table_scalar_ratio_vs_raw_pyarrow_ipc": scalar["ratio_vs_raw_pyarrow_ipc"]
            >= TARGETS["history_table_scalar_ratio_vs_raw_pyarrow_ipc"],
            "history_table_array_ratio_vs_raw_pyzmq": array["ratio_vs_raw_pyzmq"]
            >= TARGETS["history_table_array_ratio_vs_raw_pyzmq"],
            "backfill_first_live_update_s": backfilled["time_to_first_live_update_s"]
            <= TARGETS["backfill_first_live_update_s"],
            "ingest_ratio_while_serving": ingest_ratio >= TARGETS["ingest_ratio_while_serving"],
            "ingest_ratio_while_serving_separate_process": apart_ratio
            >= TARGETS["ingest_ratio_while_serving"],
        },
        "scalar_1kHz": scalar,
        "array_1MiB_1Hz": array,
        "ingest": {
            "alone": quiet,
            "while_serving": loaded,
            "ratio": ingest_ratio,
            "separate_alone": apart_quiet,
            "separate_while_serving": apart_loaded,
            "separate_ratio": apart_ratio,
            "paced_rate": args.ingest_rate,
            "paced_alone": paced_quiet,
            "paced_while_serving": paced_loaded,
            "paced_ratio": round(paced_loaded["rows_per_s"] / max(1, paced_quiet["rows_per_s"]), 3),
        },
        "backfill_1kHz": backfilled,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
