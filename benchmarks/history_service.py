"""History as a service: what a client gets from a recorder's history server. Prints JSON.

1. ``client.history_table`` over a window of a 1 kHz scalar (the issue's figure: 1 hour, 3.6M
   rows; ``--scalar-seconds 3600``) and of a 1 MiB float64 array at 1 Hz (10 minutes;
   ``--array-seconds 600``), from ``rda history serve`` in a process of its own over a store
   the real recorder wrote (``Recorder.offer`` fed directly, not over the network: journal
   segments, 90 % converted to Parquet, the rest left in the journal). Two figures each: the
   first pull of a freshly started server (each Parquet file decoded for the first time) and
   the best of ``--runs`` pulls after it (the server keeps decoded files, bounded by bytes:
   query.py), with the CPU seconds of the server and of the client per pull. Baselines in
   the same run, on the same bytes (the Arrow IPC streams of the same query as the server
   encodes them): raw pyzmq DEALER/ROUTER shipping them chunk after chunk (request, reply),
   and the same with each received frame opened by pyarrow's IPC reader (raw pyarrow IPC
   over raw pyzmq), with sender and receiver as threads of one process; and both again with
   the sender in a process of its own (``*_processes``: rda's server and client are two
   processes). The targets are checked against the one-process baselines. ``client.history`` (a Notification per row) is timed on the first rows.
2. The recorder's own ingest rate (a local fire-hose, rows acknowledged per second) with and
   without a client (another process) pulling history from it meanwhile; the goal is >= 95 %.
   At the fire-hose's maximum with the history server beside the recorder, then as
   ``rda history serve`` in its own process (also at niceness 10), then paced at
   ``--ingest-rate`` rows/s. CPU seconds per 1,000 rows of each process (recorder with its
   fire-hose, server, puller) say whether the three fit the machine's cores.
   ``--parts ingest-alternating``: alone, with a puller of a niced server (``rda record
   --serve``'s default) and of an un-niced one, ``--turns`` rounds in an order that turns round
   every round; medians and spreads of the rates and of each round's ratios.
3. ``subscribe(backfill=60)`` to a 1 kHz counter whose last 60 s are recorded (``--backfill
   3600``: the issue's hour): time from the call to the first live (non-HISTORY) update, and
   how many HISTORY rows came first, with the past a notification per row and as
   ``HistoryChunk`` tables (``backfill_columnar=True``; ``--backfill-forms``).

The load average is recorded before and after each part (the machine may be shared).

    .venv/bin/python benchmarks/history_service.py [--scalar-seconds 60] [--array-seconds 60]
        [--runs 3] [--parts pull,ingest,backfill] [--backfill 3600] [--backfill-forms columnar]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
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
from rda.business.client.subscriptions import HistoryChunk
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest
from rda.pipeline.recorder.converter import journal_root
from rda.pipeline.recorder.journal import Journal
from rda.pipeline.recorder.query import Cursor, HistoryReader
from rda.pipeline.recorder.serve import MAX_BYTES, encode_chunk
from rda.pipeline.recorder.service import Recorder, Sample
from rda.pipeline.recorder.standalone import DiskRecorder
from rda.pipeline.recorder.store import Store
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


_RAW_SERVER = """
import sys, zmq
paths, rounds = sys.argv[2:], int(sys.argv[1])
frames = [zmq.Frame(open(path, 'rb').read()) for path in paths]
context = zmq.Context()
router = context.socket(zmq.ROUTER)
print(router.bind_to_random_port('tcp://127.0.0.1'), flush=True)
for _ in range(rounds):
    for frame in frames:
        peer, _ = router.recv_multipart()
        router.send_multipart([peer, frame], copy=False)
router.close()  # lingers until the last reply is out (close(0) would drop it)
context.term()
"""


def _raw_pyzmq_processes(chunks: list[Any], runs: int) -> tuple[float, float]:
    """Best seconds of ``runs`` for raw pyzmq to ship ``chunks`` from a ROUTER in a process
    of its own to a DEALER in this one (as rda's server and client are), one request/reply
    at a time: the bytes alone, then each frame opened as an Arrow IPC stream."""
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for number, chunk in enumerate(chunks):
            path = Path(folder) / f"{number}.arrow"
            path.write_bytes(memoryview(chunk).cast("B"))
            paths.append(str(path))
        server = subprocess.Popen(
            [sys.executable, "-c", _RAW_SERVER, str(2 * runs), *paths],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        best = {False: math.inf, True: math.inf}
        try:
            port = int(server.stdout.readline())
            dealer.connect(f"tcp://127.0.0.1:{port}")
            for decode in (False, True):
                for _ in range(runs):
                    start = time.perf_counter()
                    for _ in chunks:
                        dealer.send(b"next")
                        frame = dealer.recv(copy=False)
                        if decode:
                            pa.ipc.open_stream(pa.py_buffer(frame.buffer)).read_all()
                    best[decode] = min(best[decode], time.perf_counter() - start)
            server.wait(60)
        finally:
            # A failed run leaves the child waiting for a request that will not come.
            if server.poll() is None:
                server.kill()
                server.wait(10)
            dealer.close(0)
            context.term()
            server.stdout.close()
    return best[False], best[True]


def _chunks(reader: HistoryReader, start: int, end: int, chunk_rows: int) -> list[Any]:
    """The Arrow IPC streams of the query, as the history server encodes them."""
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


def _cpu() -> float:
    """CPU seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float:
    """CPU seconds of another process so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(root: str, nice: int = 0) -> tuple[subprocess.Popen[str], str]:
    """``rda history serve ROOT`` in a process of its own (``nice``: its niceness); its
    endpoint."""
    env = dict(os.environ, RDA_DIRECTORY_FILE=str(Path(root) / "directory.json"))
    command = [sys.executable, "-m", "rda._cli", "history", "serve", root]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert server.stderr is not None
    return server, server.stderr.readline().split()[-1]


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(60)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _disk_reader(root: str) -> HistoryReader:
    """The reader ``rda history serve`` builds over ``root`` (for the baselines' payloads)."""
    store = Store.open(root)
    journal = Journal(journal_root(store, None), "bench")
    disk = DiskRecorder(store, journal, ["DEV"])
    return HistoryReader(store, journal, disk.converted_seq, "bench")


def history_pull(
    seconds: int, rate: float, array: bool, notifications: int, runs: int = RUNS
) -> dict[str, Any]:
    """``history_table`` of the whole window from ``rda history serve`` (its own process) over
    a store the real recorder wrote (fed directly, not over the network): the first pull of a
    freshly started server (every Parquet file decoded for the first time; the files are in
    the OS page cache, as just written) and the best of ``runs`` pulls after it (the server
    keeps decoded files, bounded: query.py). CPU seconds of server and client per pull."""
    count = int(seconds * rate)
    step = int(1e9 / rate)
    wave = np.linspace(0.0, 1.0, 131072)  # 1 MiB of float64

    def value(i: int) -> Data:
        return Data(index=i, wave=wave) if array else Data(current=i * 0.5, index=i)

    with tempfile.TemporaryDirectory() as root:
        recorder = Recorder(
            root, recorder_id="bench", convert=False, queue_limit=200_000, serve=False
        )
        t0 = time.perf_counter()
        recorder.start()
        start = time.time_ns() - count * step
        end = start + count * step
        _fill(recorder, count, start, step, value)
        recorder.stop(convert=False)
        filled = time.perf_counter() - t0
        server, endpoint = _serve(root)
        client = ClientService(
            StaticDirectory({"history:*": endpoint}), Config(request_timeout=600.0)
        )
        try:
            # Connected first, on a window before the first row: lists, decodes nothing.
            client.history_table("DEV", "Prop", start - 2 * step, start - step)
            pulls = []
            for _ in range(1 + runs):
                server_cpu, client_cpu = _process_cpu(server.pid), _cpu()
                begin = time.perf_counter()
                table = client.history_table("DEV", "Prop", start, end)
                elapsed = time.perf_counter() - begin
                pulls.append((elapsed, _process_cpu(server.pid) - server_cpu, _cpu() - client_cpu))
                rows = table.num_rows
                nbytes = table.nbytes
                del table
            first, warm = pulls[0], min(pulls[1:])
            # client.history (a Notification per row), on the first rows only: it is slow.
            few = min(count, notifications)
            begin = time.perf_counter()
            listed = 0
            for notification in client.history_iter("DEV", "Prop", start, end, limit=few):
                notification.data  # noqa: B018 - delivered means readable
                listed += 1
            per_row = time.perf_counter() - begin
        finally:
            client.close()
            _stop(server)
        # The raw baselines ship the same bytes: the Arrow streams of the same query.
        payloads = _chunks(_disk_reader(root), start, end, TABLE_CHUNK_ROWS)
        raw = min(_raw_pyzmq(payloads, decode=False) for _ in range(runs))
        raw_ipc = min(_raw_pyzmq(payloads, decode=True) for _ in range(runs))
        apart, apart_ipc = _raw_pyzmq_processes(payloads, runs)
        wire = sum(p.nbytes for p in payloads)
        chunks = len(payloads)
        del payloads
    mib = (count * wave.nbytes if array else nbytes) / 2**20
    per_million = 1e6 / max(1, rows)

    def figures(pull: tuple[float, float, float]) -> dict[str, Any]:
        elapsed, server_cpu, client_cpu = pull
        return {
            "s": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed),
            "mib_per_s": round(mib / elapsed, 1),
            "ratio_vs_raw_pyzmq": round(raw / elapsed, 3),
            "ratio_vs_raw_pyarrow_ipc": round(raw_ipc / elapsed, 3),
            "ratio_vs_raw_pyzmq_processes": round(apart / elapsed, 3),
            "ratio_vs_raw_pyarrow_ipc_processes": round(apart_ipc / elapsed, 3),
            "server_cpu_s": round(server_cpu, 3),
            "client_cpu_s": round(client_cpu, 3),
            "server_cpu_s_per_million_rows": round(server_cpu * per_million, 3),
            "client_cpu_s_per_million_rows": round(client_cpu * per_million, 3),
        }

    return {
        "window_s": seconds,
        "rows": rows,
        "expected_rows": count,
        "chunks": chunks,
        "wire_mib": round(wire / 2**20, 1),
        "fill_s": round(filled, 2),
        "first_pull": figures(first),
        "warm_pull": figures(warm),
        "warm_pulls_s": [round(p[0], 3) for p in pulls[1:]],
        "raw_pyzmq_s": round(raw, 4),
        "raw_pyzmq_rows_per_s": round(count / raw),
        "raw_pyzmq_mib_per_s": round(mib / raw, 1),
        "raw_pyarrow_ipc_s": round(raw_ipc, 4),
        "raw_pyarrow_ipc_rows_per_s": round(count / raw_ipc),
        # The same, the sender in a process of its own (rda's server and client are two).
        "raw_pyzmq_processes_s": round(apart, 4),
        "raw_pyzmq_processes_mib_per_s": round(mib / apart, 1),
        "raw_pyarrow_ipc_processes_s": round(apart_ipc, 4),
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
    seconds: float, with_queries: bool, rate: float = 0.0, separate: bool = False, nice: int = 0
) -> dict[str, Any]:
    """Rows/s the recorder acknowledges from a fire-hose, optionally while a client in another
    process pulls the last minute of a 1 kHz signal with ``history_table``, again and again:
    from the history server beside the recorder, or (``separate``) from ``rda history serve``
    in a process of its own (``nice``: its niceness) reading the same store from disk. CPU
    seconds per 1,000 rows acknowledged of each process: this one (the recorder and the
    fire-hose that feeds it), the separate server, the puller."""
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
            server, endpoint = _serve(root, nice)
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
        cpu = {"recorder": _cpu()}
        if server is not None:
            cpu["server"] = _process_cpu(server.pid)
        if querier is not None:
            cpu["puller"] = _process_cpu(querier.pid)
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
        spent = {"recorder": _cpu() - cpu["recorder"]}
        if server is not None:
            spent["server"] = _process_cpu(server.pid) - cpu["server"]
        pulls = 0
        if querier is not None:
            spent["puller"] = _process_cpu(querier.pid) - cpu["puller"]
            querier.kill()
            querier.wait(10)
            assert querier.stdout is not None
            lines = querier.stdout.read().split()
            pulls = int(lines[-1]) if lines else 0
            querier.stdout.close()
        if server is not None:
            _stop(server)
        recorder.stop(convert=False)
    return {
        "rows_per_s": round(acked / elapsed),
        "history_rows_pulled": pulls,
        "cpu_s_per_1000_rows": {k: round(v * 1000 / max(1, acked), 4) for k, v in spent.items()},
        "cores_busy": {k: round(v / elapsed, 2) for k, v in spent.items()},
    }


def ingest_alternating(seconds: float, rounds: int) -> dict[str, Any]:
    """The ingest cases with ``rda history serve`` in its own process, in an order that turns
    round every round (alone, niced puller, puller; then puller, niced puller, alone; ...), so
    that a load swinging over the minutes weighs on every case alike. Each round's ratios are
    taken against that round's own ``alone``; medians, spreads and CPU per process reported."""
    cases = {  # name: (a puller pulls, the server's niceness)
        "alone": (False, 0),
        "niced_while_serving": (True, 10),
        "while_serving": (True, 0),
    }
    order = list(cases)
    runs: list[dict[str, Any]] = []
    for turn in range(rounds):
        names = order if turn % 2 == 0 else order[::-1]
        one: dict[str, Any] = {"order": names, "load": _load()}
        for name in names:
            pulling, nice = cases[name]
            one[name] = ingest(seconds, pulling, separate=True, nice=nice)
        runs.append(one)

    def spread(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
        }

    rates = {name: [r[name]["rows_per_s"] for r in runs] for name in cases}
    ratios = {
        name: [r[name]["rows_per_s"] / max(1, r["alone"]["rows_per_s"]) for r in runs]
        for name in cases
        if name != "alone"
    }
    return {
        "seconds_per_run": seconds,
        "rounds": runs,
        "rows_per_s": {name: spread([float(v) for v in values]) for name, values in rates.items()},
        "ratio_to_the_rounds_alone": {name: spread(values) for name, values in ratios.items()},
        "median_ratios": {name: round(statistics.median(v), 3) for name, v in ratios.items()},
        "ratio_of_medians": {
            name: round(
                statistics.median(rates[name]) / max(1, statistics.median(rates["alone"])), 3
            )
            for name in ratios
        },
    }


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


def _first_live(client: ClientService, seconds: int, columnar: bool) -> dict[str, Any]:
    """Subscribe with backfill; the time to the first row and to the first live update, and
    how many HISTORY rows (in how many notifications) came first."""
    begin = time.perf_counter()
    sub = client.access_point("CNT", "Count").subscribe(
        backfill=seconds, queue_size=5000, backfill_columnar=columnar
    )
    history = 0
    notifications = 0
    first_row = None
    try:
        while True:
            n = sub.poll(120)
            assert n is not None and n.error is None, n
            if first_row is None:
                first_row = time.perf_counter() - begin
            if n.update_type is not UpdateType.HISTORY:
                break
            history += n.rows if isinstance(n, HistoryChunk) else 1
            notifications += 1
        live_after = time.perf_counter() - begin
    finally:
        sub.close()
    return {
        "history_rows": history,
        "history_notifications": notifications,
        "time_to_first_row_s": round(first_row or 0.0, 4),
        "time_to_first_live_update_s": round(live_after, 3),
    }


def backfill(seconds: int, rate: float, columnar: bool) -> dict[str, Any]:
    """``subscribe(backfill=seconds)`` to a 1 kHz counter whose last ``seconds`` are recorded
    (synthetic rows offered to the recorder, 90 % converted, then the live ones), from the
    recorder's own history server (this process: device server, recorder, history server and
    client share it). ``columnar``: the past as HistoryChunk tables. Twice: the first on a
    freshly started history server (every file decoded), then again (decoded files kept)."""
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
        converted_at = int(count * 0.9)
        t0 = time.perf_counter()
        for i in range(count):
            context = DataContext("", 0, past + i * step, "")
            while not recorder.offer("CNT", "Count", None, Sample(Data(n=i - count), context)):
                time.sleep(0.001)
            if i + 1 == converted_at:
                recorder.flush(300)
                recorder.convert_now()
        recorder.flush(300)
        filled = time.perf_counter() - t0
        stop = threading.Event()

        def publish() -> None:
            while not stop.wait(1 / rate):
                device.tick()

        ticker = threading.Thread(target=publish)
        ticker.start()
        assert recorder.history_server is not None
        static["history:*"] = recorder.history_server.endpoint
        client = ClientService(StaticDirectory(static), Config(request_timeout=120.0))
        try:
            first = _first_live(client, seconds, columnar)
            again = _first_live(client, seconds, columnar)
            # The floor of the columnar form: the same window pulled with history_table from
            # the same (warm) server, without a subscription or a seam.
            now = time.time_ns()
            begin = time.perf_counter()
            pulled = client.history_table("CNT", "Count", now - seconds * 10**9, now).num_rows
            pull_s = time.perf_counter() - begin
        finally:
            client.close()
            stop.set()
            ticker.join()
            recorder.stop(convert=False)
            rec_client.close()
            server.stop()
    return {
        "backfill_s": seconds,
        "form": "columnar (HistoryChunk)" if columnar else "rows (a Notification per row)",
        "fill_s": round(filled, 1),
        "first_subscribe": first,
        "second_subscribe": again,
        "history_table_same_window_s": round(pull_s, 3),
        "history_table_same_window_rows": pulled,
        "second_subscribe_ratio_to_history_table": round(
            pull_s / again["time_to_first_live_update_s"], 3
        ),
        **first,
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scalar-seconds", type=int, default=60, help="issue: 3600")
    parser.add_argument("--array-seconds", type=int, default=60, help="issue: 600")
    parser.add_argument("--ingest-seconds", type=float, default=5.0)
    parser.add_argument("--ingest-rate", type=float, default=20_000.0, help="paced rows/s")
    parser.add_argument("--backfill", type=int, default=60, help="issue: 3600")
    parser.add_argument(
        "--backfill-forms", default="rows,columnar", help="rows, columnar or both (comma)"
    )
    parser.add_argument("--runs", type=int, default=RUNS, help="warm pulls and baselines")
    parser.add_argument("--turns", type=int, default=3, help="rounds of the ingest-turns part")
    parser.add_argument(
        "--parts",
        default="pull,ingest,backfill",
        help="which parts to run (comma-separated; also ingest-turns, ingest-alternating)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"targets": TARGETS, "load_before": _load()}
    met: dict[str, bool] = {}
    if "pull" in parts:
        scalar = history_pull(args.scalar_seconds, 1000.0, False, 50_000, args.runs)
        result["load_after_scalar"] = _load()
        array = history_pull(args.array_seconds, 1.0, True, 10, args.runs)
        result["load_after_array"] = _load()
        for kind in ("first_pull", "warm_pull"):
            met[f"history_table_scalar_rows_per_s ({kind})"] = (
                scalar[kind]["rows_per_s"] >= TARGETS["history_table_scalar_rows_per_s"]
            )
            met[f"history_table_scalar_ratio_vs_raw_pyarrow_ipc ({kind})"] = (
                scalar[kind]["ratio_vs_raw_pyarrow_ipc"]
                >= TARGETS["history_table_scalar_ratio_vs_raw_pyarrow_ipc"]
            )
            met[f"history_table_array_ratio_vs_raw_pyzmq ({kind})"] = (
                array[kind]["ratio_vs_raw_pyzmq"]
                >= TARGETS["history_table_array_ratio_vs_raw_pyzmq"]
            )
        result["scalar_1kHz"] = scalar
        result["array_1MiB_1Hz"] = array
    if "ingest" in parts:
        seconds = args.ingest_seconds
        runs = {
            "alone": ingest(seconds, False),
            "while_serving": ingest(seconds, True),
            "separate_alone": ingest(seconds, False, separate=True),
            "separate_while_serving": ingest(seconds, True, separate=True),
            "separate_niced_while_serving": ingest(seconds, True, separate=True, nice=10),
            "paced_alone": ingest(seconds, False, args.ingest_rate),
            "paced_while_serving": ingest(seconds, True, args.ingest_rate, separate=True),
        }
        alone = max(1, runs["alone"]["rows_per_s"])
        ratios = {
            "while_serving": round(runs["while_serving"]["rows_per_s"] / alone, 3),
            "separate": round(
                runs["separate_while_serving"]["rows_per_s"]
                / max(1, runs["separate_alone"]["rows_per_s"]),
                3,
            ),
            "separate_niced": round(
                runs["separate_niced_while_serving"]["rows_per_s"]
                / max(1, runs["separate_alone"]["rows_per_s"]),
                3,
            ),
            "paced": round(
                runs["paced_while_serving"]["rows_per_s"]
                / max(1, runs["paced_alone"]["rows_per_s"]),
                3,
            ),
        }
        met["ingest_ratio_while_serving"] = (
            ratios["while_serving"] >= TARGETS["ingest_ratio_while_serving"]
        )
        met["ingest_ratio_while_serving_separate_process"] = (
            ratios["separate"] >= TARGETS["ingest_ratio_while_serving"]
        )
        result["ingest"] = {**runs, "ratios": ratios, "paced_rate": args.ingest_rate}
        result["load_after_ingest"] = _load()
    if "ingest-turns" in parts:
        # The separate server's three cases in turns, --turns times: one run of each is too
        # noisy on a shared machine (the recorder's maximum is bound by its fsyncs).
        turns = [
            {
                "alone": ingest(args.ingest_seconds, False, separate=True),
                "while_serving": ingest(args.ingest_seconds, True, separate=True),
                "niced_while_serving": ingest(args.ingest_seconds, True, separate=True, nice=10),
            }
            for _ in range(args.turns)
        ]

        def median_ratio(case: str) -> float:
            return round(
                float(
                    statistics.median(
                        t[case]["rows_per_s"] / max(1, t["alone"]["rows_per_s"]) for t in turns
                    )
                ),
                3,
            )

        ratios = {case: median_ratio(case) for case in ("while_serving", "niced_while_serving")}
        met["ingest_ratio_separate_process_median_of_turns"] = (
            ratios["while_serving"] >= TARGETS["ingest_ratio_while_serving"]
        )
        result["ingest_turns"] = {"turns": turns, "median_ratios": ratios}
        result["load_after_ingest_turns"] = _load()
    if "ingest-alternating" in parts:
        result["ingest_alternating"] = ingest_alternating(args.ingest_seconds, args.turns)
        met["ingest_ratio_separate_niced_median_alternating"] = (
            result["ingest_alternating"]["median_ratios"]["niced_while_serving"]
            >= TARGETS["ingest_ratio_while_serving"]
        )
        result["load_after_ingest_alternating"] = _load()
    if "backfill" in parts:
        for form in args.backfill_forms.split(","):
            backfilled = backfill(args.backfill, 1000.0, form == "columnar")
            met[f"backfill_first_live_update_s ({form})"] = (
                backfilled["time_to_first_live_update_s"] <= TARGETS["backfill_first_live_update_s"]
            )
            result[f"backfill_1kHz_{form}"] = backfilled
            result[f"load_after_backfill_{form}"] = _load()
    result["met"] = met
    result["load_after"] = _load()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
