"""Default acquisition stamps (issue 12, defect 1): a server that gives no ``DataContext`` (or
one with ``acq_stamp == 0``) sends the wall-clock time of ``complete``/``notify``; the recorder
never stores a 0 stamp silently; a context-less server's rows are found in "the last hour"."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.pipeline.history.local import local_get
from rda.pipeline.recorder.metrics import RecorderCollector
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext, UpdateType
from rda.testing import FakeClock, MemoryNetwork, OneServerDirectory, wait_until
from rda.transport.api import ClientHandler, ServerHandler, TransportSettings

CONFIG = Config(heartbeat_interval=1.0, heartbeat_timeout=30.0)
T0 = 1_750_000_000_000_000_000
HOUR_NS = 3_600 * 10**9


class ContextLess(RequestReplyCallback):
    """Answers the way the README's first server does: ``AcquiredData(data)``, no context;
    ``Cycle`` gives a context with a cycle name but no acquisition stamp; ``Stamped`` a full one."""

    def get(self, request: GetRequest) -> None:
        if request.property == "Cycle":
            request.complete(AcquiredData(Data(x=2), DataContext("CPS.USER.MD1", 7, 0)))
        elif request.property == "Stamped":
            request.complete(AcquiredData(Data(x=3), DataContext(acq_stamp=T0)))
        else:
            request.complete(AcquiredData(Data(x=1)))


@pytest.fixture
def memory(no_thread_leak: None) -> Iterator[tuple[Server, ClientService]]:
    clock = FakeClock()
    network = MemoryNetwork(clock=clock)

    def server_transport(h: ServerHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.server("srv", h, s, info)

    def client_transport(h: ClientHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.client(h, s, info)

    server = (
        ServerBuilder("Stamps")
        .config(CONFIG)
        .request_reply(ContextLess())
        .directory(None)
        .transport(server_transport)
        .clock(clock)
        .build()
        .start()
    )
    client = ClientService(
        directory=OneServerDirectory(server.endpoint),
        config=CONFIG,
        transport_factory=client_transport,
        clock=clock,
    )
    try:
        yield server, client
    finally:
        client.close()
        server.stop()
        network.close()


def test_get_without_context_is_stamped_at_complete(memory: tuple[Server, ClientService]) -> None:
    _, client = memory
    before = time.time_ns()
    acq = client.access_point("PS1", "Acquisition").get(timeout=5)
    after = time.time_ns()
    assert acq.data == Data(x=1)
    assert before <= acq.context.acq_stamp <= after
    # A context with other fields but no stamp keeps them and gains the stamp.
    cycle = client.access_point("PS1", "Cycle").get(timeout=5).context
    assert (cycle.cycle_name, cycle.cycle_stamp) == ("CPS.USER.MD1", 7)
    assert before <= cycle.acq_stamp <= time.time_ns()
    # A stamp the server gave is sent as given.
    assert client.access_point("PS1", "Stamped").get(timeout=5).context.acq_stamp == T0


def test_notify_without_context_is_stamped_at_notify(memory: tuple[Server, ClientService]) -> None:
    server, client = memory
    before = time.time_ns()
    sub = client.access_point("PS1", "Acquisition").subscribe()
    first = sub.poll(10)
    assert first is not None and first.update_type is UpdateType.FIRST
    assert before <= first.context.acq_stamp <= time.time_ns()  # the FIRST comes from get
    (source,) = server.subscriptions()
    stamps = []
    for value in range(3):
        at = time.time_ns()
        source.notify(AcquiredData(Data(x=value)))
        note = sub.poll(10)
        assert note is not None and note.error is None and note.data == Data(x=value)
        assert at <= note.context.acq_stamp <= time.time_ns()
        stamps.append(note.context.acq_stamp)
    assert stamps == sorted(stamps)
    source.notify(Data(x=9))  # a bare Data too
    note = sub.poll(10)
    assert note is not None and note.context.acq_stamp >= stamps[-1]
    source.notify(AcquiredData(Data(x=10), DataContext(acq_stamp=T0)))
    note = sub.poll(10)
    assert note is not None and note.context.acq_stamp == T0
    sub.close()


def test_context_less_server_round_trip_is_found_in_the_last_hour(
    no_thread_leak: None, tmp_path: Path
) -> None:
    server = (
        ServerBuilder("ContextLess")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(ContextLess())
        .devices("*")
        .directory(None)
        .build()
        .start()
    )
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(request_timeout=5.0))
    recorder = Recorder(
        tmp_path, ["PS1/Acquisition"], client, recorder_id="ctx", flush_interval=0.02
    )
    try:
        recorder.start()
        wait_until(lambda: recorder.statistics().received == 1)  # the FIRST update
        (source,) = server.subscriptions()
        for i in range(20):
            source.notify(AcquiredData(Data(x=i)))
        wait_until(lambda: recorder.statistics().received == 21)
        assert recorder.flush()
    finally:
        recorder.stop()
        client.close()
        server.stop()
    assert recorder.statistics().missing_acq_stamps == 0  # the server stamped every row
    now = time.time_ns()
    rows = local_get(tmp_path, "PS1/Acquisition", now - HOUR_NS, now).to_pylist()
    assert [r["x"] for r in rows] == [1, *range(20)]
    assert all(now - HOUR_NS < r["acq_stamp"] <= now for r in rows)


def test_recorder_counts_logs_and_flags_rows_without_a_stamp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import pyarrow.parquet as pq

    recorder = Recorder(tmp_path, [], recorder_id="zero", flush_interval=0.02)
    recorder.start()
    try:
        with caplog.at_level(logging.WARNING, logger="rda.pipeline.recorder.service"):
            before = time.time_ns()
            for i in range(3):
                assert recorder.offer("PS1", "Acquisition", None, Sample(Data(x=i)))
            assert recorder.offer(
                "PS1", "Acquisition", None, Sample(Data(x=3), DataContext(acq_stamp=T0))
            )
            assert recorder.flush()
            after = time.time_ns()
        stats = recorder.statistics()
        assert stats.missing_acq_stamps == 3 and stats.received == 4
        metrics = {
            sample.name: sample.value
            for family in RecorderCollector(recorder).collect()
            for sample in family.samples
        }
        assert metrics["rda_recorder_missing_acq_stamps_total"] == 3.0
        warnings = [r for r in caplog.records if "acq_stamp" in r.getMessage()]
        assert len(warnings) == 1 and "PS1/Acquisition" in warnings[0].getMessage()
    finally:
        recorder.stop()
    rows = sorted(pq.read_table(tmp_path / "device=PS1").to_pylist(), key=lambda r: r["seq"])
    assert len(rows) == 4
    for row in rows[:3]:
        # Stored at the time the recorder received it (recognisable: equal to recv_stamp),
        # never at 1970.
        assert row["acq_stamp"] == row["recv_stamp"] and before <= row["acq_stamp"] <= after
    assert rows[3]["acq_stamp"] == T0 != rows[3]["recv_stamp"]  # a stamp as sent is kept
    found = local_get(tmp_path, "PS1/Acquisition", before, after + 1).to_pylist()
    assert [r["x"] for r in found] == [0, 1, 2]
