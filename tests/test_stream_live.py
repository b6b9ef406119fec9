"""The best-effort ``rda-live`` source against a real demo server on tcp loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rda.business.config import Config
from rda.business.server.builder import Server
from rda.demo import build_demo_server
from rda.pipeline.stream.live import LiveDataSource, LiveStreamReader, notification_row
from rda.serialization.data import Data
from rda.serialization.errors import DecodeError
from rda.serialization.header import DataContext
from rda.testing import wait_until

CONFIG = Config(heartbeat_interval=0.2, heartbeat_timeout=5.0)


@pytest.fixture
def server() -> Iterator[Server]:
    demo = build_demo_server(directory=None, config=CONFIG, rate_hz=50.0)
    with demo:
        yield demo


class _Bad:
    context = DataContext(acq_stamp=1_500, selector="S")
    error = None

    @property
    def data(self) -> Data:
        raise DecodeError("truncated body")


def test_rows_from_notifications() -> None:
    good = type("N", (), {"context": DataContext(acq_stamp=2_000_000), "error": None})()
    good.data = Data(x=1, v=[1.5, 2.5])
    row = notification_row("PS1", "Acq", good, 7)
    assert row[:4] == ("PS1", "Acq", "", 2_000_000)
    assert row[4].timestamp() == pytest.approx(0.002)
    assert json.loads(row[9]) == {"x": 1, "v": [1.5, 2.5]} and row[8] is None
    bad = notification_row("PS1", "Acq", _Bad(), 7)
    assert bad[2] == "S" and bad[9] is None and bad[8].startswith("DecodeError")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'signals'"),
        ({"signals": "PS*/Acquisition"}, "no globs"),
        ({"signals": "PS1"}, "DEVICE/PROPERTY"),
        ({"signals": "PS1/Acquisition", "endpoint": "localhost:5"}, "endpoint"),
        ({"signals": "PS1/Acquisition", "queueSize": "big"}, "queueSize"),
    ],
)
def test_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LiveStreamReader(options)


def test_reader_drains_subscriptions(no_thread_leak: None, server: Server) -> None:
    reader = LiveStreamReader(
        {"signals": "PS1/Acquisition, PS2/Acquisition@CPS.USER.SFTPRO", "endpoint": server.endpoint}
    )
    try:
        offset = reader.initialOffset()
        rows: list[tuple[Any, ...]] = []

        def read_more() -> bool:
            nonlocal offset
            batch, end = reader.read(offset)
            got = list(batch)
            assert end == {"rows": offset["rows"] + len(got)}
            rows.extend(got)
            offset = end
            return {r[0] for r in rows} == {"PS1", "PS2"}

        wait_until(read_more, "rows of PS1 and PS2", timeout=20.0, probe=lambda: rows)
        assert all(r[1] == "Acquisition" and r[3] > 0 and r[8] is None for r in rows)
        assert "current" in json.loads(rows[0][9])
        assert list(reader.readBetweenOffsets({"rows": 0}, offset)) == []  # no replay
    finally:
        reader.stop()


@pytest.mark.timeout(240)  # the first Spark test also starts the JVM
def test_live_stream_receives_rows(spark: Any, server: Server) -> None:
    spark.dataSource.register(LiveDataSource)
    received: list[Any] = []
    lock = threading.Lock()

    def collect(batch: Any, batch_id: int) -> None:
        rows = batch.collect()
        with lock:
            received.extend(rows)

    query = (
        spark.readStream.format("rda-live")
        .option("signals", "PS1/Acquisition,BPM1/Orbit")
        .option("endpoint", server.endpoint)
        .load()
        .writeStream.foreachBatch(collect)
        .trigger(processingTime="300 milliseconds")
        .start()
    )

    def devices() -> set[str]:
        with lock:
            return {r["device"] for r in received}

    try:
        wait_until(
            lambda: devices() == {"PS1", "BPM1"} or query.exception() is not None,
            "rows of both devices (or the query's failure)",
            timeout=120.0,
            probe=devices,
        )
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    with lock:
        rows = list(received)
    assert {r["device"] for r in rows} == {"PS1", "BPM1"}, query.recentProgress
    orbit = next(r for r in rows if r["device"] == "BPM1")
    values = json.loads(orbit["data"])
    assert len(values["orbit"]) == 2 and len(values["orbit"][0]) == 64
    assert orbit["ts"].timestamp() == pytest.approx(orbit["acq_stamp"] / 1e9, abs=1e-5)
