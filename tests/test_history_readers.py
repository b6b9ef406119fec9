"""History readers of one device are served side by side (issue 37, item 3): a reader parked at
a backfill seam does not hold the device's other readers, and the queued requests of a client
that went away are dropped, not read.

Real ZeroMQ on 127.0.0.1: a recorder's history server, clients in this process and a client
process killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import ServerBuilder
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data, DataType
from rda.serialization.header import DataContext
from rda.testing import wait_until

T0 = 1_790_000_000_000_000_000
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def recorder(no_thread_leak: None, tmp_path: Path) -> Iterator[Recorder]:
    recorder = Recorder(
        tmp_path,
        recorder_id="readers",
        flush_interval=0.02,
        convert=False,
        serve=ServerBuilder("Readers").directory(None),
    )
    recorder.start()
    try:
        _offer(recorder, 0, 100)
        yield recorder
    finally:
        recorder.stop()


def _offer(recorder: Recorder, first: int, count: int) -> None:
    for i in range(first, first + count):
        context = DataContext("", 0, T0 + i * 1000, "")
        assert recorder.offer("DEV", "Prop", None, Sample(Data(i=i), context))
    assert recorder.flush()


def _client(recorder: Recorder) -> ClientService:
    assert recorder.history_server is not None
    return ClientService(
        StaticDirectory({"history:*": recorder.history_server.endpoint}),
        Config(request_timeout=60.0),
    )


def test_a_reader_waiting_at_the_seam_does_not_hold_the_other_readers(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader A asks for its seam ``until`` (a row the recorder has not acknowledged yet, 10 s
    wait); reader B then asks for plain history of the same device. B must be answered while
    A still waits, and A once the seam's row is durable.

    Before the fix (checked on main at 97b39da by running this test there): B was queued
    behind A's wait on the device's worker, answered only after A's 10 s ran out, so A's
    reply came back incomplete (``complete`` False) before the seam row was even offered."""
    entered = threading.Event()
    real_records = recorder.records

    def records(device: str, prop: str) -> bool:  # the handler asks this first, in any version
        if armed.is_set():
            entered.set()
        return real_records(device, prop)

    armed = threading.Event()
    monkeypatch.setattr(recorder, "records", records)
    a_client, b_client = _client(recorder), _client(recorder)
    a_reply: list[Any] = []
    a_done = threading.Event()

    def reader_a() -> None:
        filters = Data()
        for name, value in (("start", T0), ("end", T0 + 10**9), ("until", T0 + 200 * 1000)):
            filters.append(name, value, DataType.INT64)
        filters.append("wait_ms", 10_000, DataType.INT64)
        filters.append("format", "arrow", DataType.STRING)
        point = a_client.access_point("history:DEV", "Prop")
        armed.set()
        a_reply.append(point.get(filters=filters, timeout=60))
        a_done.set()

    thread = threading.Thread(target=reader_a)
    try:
        thread.start()
        assert entered.wait(30), "reader A's request never reached the history server"
        table = b_client.history_table("DEV", "Prop", T0, T0 + 10**9, timeout=60)
        assert table.column("i").to_pylist() == list(range(100))
        assert not a_done.is_set(), "A's seam wait ended before B was answered"
        assert recorder.history is not None
        assert recorder.history.statistics().seam_waits == 1
        _offer(recorder, 200, 1)  # the seam's row: A is answered now, complete
        thread.join(60)
        assert a_done.is_set()
        reply = a_reply[0].data
        assert reply["complete"] is True
        assert reply["rows"] == 100  # the rows before the seam
    finally:
        thread.join(60)
        a_client.close()
        b_client.close()


_DOOMED = """
import sys, threading
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
client = ClientService(StaticDirectory({"history:*": sys.argv[1]}), Config(request_timeout=120.0))
T0 = int(sys.argv[2])
def read():
    client.history_table("DEV", "Prop", T0, T0 + 10**9)
threads = [threading.Thread(target=read) for _ in range(40)]
for t in threads:
    t.start()
print("started", flush=True)
for t in threads:
    t.join()
"""


def test_the_queued_requests_of_a_killed_client_are_dropped(recorder: Recorder) -> None:
    """A client process sends 40 history requests of one device from 40 threads, which queue
    behind the first (held in the reader by this test), and is killed. Its queued requests
    must not be read once its connections are gone; another reader then gets its answer.

    Before the fix (checked on main at 97b39da by running this test there): all 40 were read
    for nobody, one after the other (``chunk`` called 40 times), ahead of the next reader."""
    assert recorder.history is not None and recorder.history_server is not None
    server = recorder.history_server
    reader = recorder.history.reader
    release = threading.Event()
    calls: list[int] = []
    real_chunk = reader.chunk

    def chunk(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            assert release.wait(60)
        return real_chunk(*args, **kwargs)

    reader.chunk = chunk  # type: ignore[method-assign]
    lanes_before = server.statistics().transport.lanes
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    doomed = subprocess.Popen(
        [sys.executable, "-c", _DOOMED, server.endpoint, str(T0)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert doomed.stdout is not None
        assert doomed.stdout.readline().strip() == "started"
        wait_until(lambda: len(calls) == 1, "the first request reached the reader", timeout=60)
        wait_until(
            lambda: server.statistics().scheduler.queued >= 39, "39 requests queued", timeout=60
        )
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(30)
        wait_until(
            lambda: server.statistics().transport.lanes <= lanes_before,
            "the killed client's lanes are gone",
            timeout=60,
        )
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)
        if doomed.stdout is not None:
            doomed.stdout.close()
        release.set()
    client = _client(recorder)
    try:
        # Answered after everything queued before it (a device's requests run in order).
        table = client.history_table("DEV", "Prop", T0, T0 + 10**9, timeout=60)
        assert table.num_rows == 100
    finally:
        client.close()
    assert len(calls) == 2, f"{len(calls) - 2} requests of the killed client were read"
    assert recorder.history.statistics().departed == 39
