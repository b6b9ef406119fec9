"""The history server in a process of its own (``rda history serve STORE``,
``rda.pipeline.recorder.standalone``): it reads the recorder's journal and Parquet files from
disk and still answers every acknowledged row (no recent hole), a seam wait included. Real
ZeroMQ on 127.0.0.1; the CLI test runs the server as a separate process.
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
from rda.pipeline.recorder.standalone import StoreHistoryServer, serve_store
from rda.serialization.data import Data, DataType
from rda.serialization.header import DataContext

T0 = 1_790_000_000_000_000_000
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def recorder(no_thread_leak: None, tmp_path: Path) -> Iterator[Recorder]:
    recorder = Recorder(tmp_path, recorder_id="solo", flush_interval=0.02, convert=False)
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()


def _offer(recorder: Recorder, first: int, count: int) -> None:
    for i in range(first, first + count):
        context = DataContext("", 0, T0 + i * 1000, "")
        assert recorder.offer("DEV", "Prop", None, Sample(Data(i=i), context))
    assert recorder.flush()


def _client(endpoint: str) -> ClientService:
    return ClientService(StaticDirectory({"history:*": endpoint}), Config(request_timeout=60.0))


@pytest.fixture
def served(
    recorder: Recorder, tmp_path: Path
) -> Iterator[tuple[StoreHistoryServer, ClientService]]:
    _offer(recorder, 0, 500)
    recorder.convert_now()  # 0..499 in Parquet
    server = serve_store(tmp_path, builder=ServerBuilder("Solo").directory(None))
    client = _client(server.endpoint)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def test_store_and_journal_read_from_disk_with_no_recent_hole(
    recorder: Recorder, served: tuple[StoreHistoryServer, ClientService]
) -> None:
    _server, client = served
    _offer(recorder, 500, 300)  # journal only, acknowledged after the server started
    table = client.history_table("DEV", "Prop", T0, T0 + 10**9, chunk_rows=250)
    assert table.column("i").to_pylist() == list(range(800))
    assert len(set(table.column("seq").to_pylist())) == 800
    for rounds in range(5):  # each acknowledged batch is there at once
        _offer(recorder, 800 + rounds, 1)
        last = client.history_table("DEV", "Prop", T0 + (800 + rounds) * 1000, T0 + 10**9)
        assert last.column("i").to_pylist() == [800 + rounds]
    recorder.convert_now()  # converted meanwhile: still each row once
    again = client.history_table("DEV", "Prop", T0, T0 + 10**9)
    assert again.column("i").to_pylist() == list(range(805))


def test_a_seam_wait_is_answered_when_the_journal_reaches_it(
    recorder: Recorder, served: tuple[StoreHistoryServer, ClientService]
) -> None:
    server, client = served
    replies: list[Any] = []

    def ask() -> None:
        filters = Data()
        for name, value in (("start", T0), ("end", T0 + 10**9), ("until", T0 + 900 * 1000)):
            filters.append(name, value, DataType.INT64)
        filters.append("wait_ms", 10_000, DataType.INT64)
        filters.append("format", "arrow", DataType.STRING)
        replies.append(client.access_point("history:DEV", "Prop").get(filters=filters))

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        from rda.testing import wait_until

        wait_until(lambda: server.handler.statistics().seam_waits == 1, "the wait is parked")
        _offer(recorder, 900, 1)
        thread.join(60)
        assert replies and replies[0].data["complete"] is True
        assert replies[0].data["rows"] == 500
    finally:
        thread.join(60)


def test_cli_serves_a_store_from_another_process(recorder: Recorder, tmp_path: Path) -> None:
    _offer(recorder, 0, 200)
    recorder.convert_now()
    _offer(recorder, 200, 100)
    env = dict(os.environ, PYTHONPATH=str(ROOT), RDA_DIRECTORY_FILE=str(tmp_path / "dir.json"))
    process = subprocess.Popen(
        [sys.executable, "-m", "rda._cli", "history", "serve", str(tmp_path), "--nice", "7"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line.startswith("serving history at tcp://127.0.0.1:"), line
        # --nice: it yields the CPU (rda record --serve starts it at 10).
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == min(19, mine + 7)
        client = _client(line.split()[-1])
        try:
            table = client.history_table("DEV", "Prop", T0, T0 + 10**9)
            assert table.column("i").to_pylist() == list(range(300))
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        if process.stderr is not None:
            process.stderr.close()
