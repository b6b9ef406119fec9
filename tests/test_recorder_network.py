"""The recorder against a real server over ZeroMQ: what it stores equals what a parallel
subscription delivered; and the ``record`` command line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rda.admin.cli.common import Options
from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import (
    GetRequest,
    RequestReplyCallback,
    SetRequest,
    SubscriptionRequest,
)
from rda.business.server.subscriptions import SubscriptionCallback
from rda.demo import build_demo_server
from rda.pipeline.recorder.cli import record
from rda.pipeline.recorder.service import Recorder
from rda.serialization.data import Data
from rda.serialization.header import DataContext, UpdateType
from rda.testing import wait_until

T0 = 1_750_000_000_000_000_000


class Handler(RequestReplyCallback):
    def get(self, request: GetRequest) -> None:
        context = DataContext("CPS.USER.ALL", T0, T0, request.selector)
        request.complete(AcquiredData(_value(0, request.device), context))

    def set(self, request: SetRequest) -> None:
        request.complete()


class Subs(SubscriptionCallback):
    def subscribe(self, request: SubscriptionRequest) -> None:
        request.accept()


def _value(i: int, device: str) -> Data:
    return Data(
        current=i * 0.25,
        device=device,
        wave=np.linspace(0, i, 8, dtype=np.float32),
        image=np.arange(6, dtype=np.int32).reshape(2, 3) + i,
        names=["a", f"n{i}"],
        sub=Data(flag=i % 2 == 0),
    )


def _plain(value: Any) -> Any:
    if isinstance(value, Data):
        return {name: _plain(v) for name, v in value.items()}
    if isinstance(value, np.ndarray):
        if value.ndim == 1:
            return value.tolist()
        return {"elements": value.ravel().tolist(), "dims": list(value.shape)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@pytest.fixture
def served(no_thread_leak: None) -> Iterator[tuple[Server, ClientService]]:
    server = (
        ServerBuilder("RecorderTest")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(Handler())
        .subscription(Subs())
        .devices("*")
        .directory(None)
        .build()
    )
    server.start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(request_timeout=5.0))
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def test_recorded_rows_equal_what_a_subscription_delivered(
    served: tuple[Server, ClientService], tmp_path: Path
) -> None:
    server, client = served
    recorder = Recorder(
        tmp_path,
        ["PS1/Acquisition", "PS2/Acquisition"],
        client,
        recorder_id="net",
        flush_interval=0.02,
    )
    recorder.start()
    try:
        watcher = client.access_point("PS1", "Acquisition").subscribe()
        delivered = []
        first = watcher.poll(10)
        assert first is not None and first.error is None
        delivered.append((first.context.acq_stamp, _plain(first.data)))
        wait_until(lambda: recorder.statistics().received == 2)  # one FIRST update per device
        wait_until(lambda: sum(s.subscribers for s in server.subscriptions()) == 3)
        for i in range(1, 31):
            for source in server.subscriptions():
                context = DataContext("CPS.USER.ALL", T0 + i, T0 + i, "")
                source.notify(AcquiredData(_value(i, source.device), context))
            note = watcher.poll(10)
            assert note is not None and note.error is None
            delivered.append((note.context.acq_stamp, _plain(note.data)))
            wait_until(lambda i=i: recorder.statistics().received == 2 + 2 * i)  # type: ignore[misc]
        watcher.close()
        assert recorder.flush()
    finally:
        recorder.stop()
    table = pq.read_table(tmp_path / "device=PS1" / "property=Acquisition")
    rows = sorted(table.to_pylist(), key=lambda r: r["seq"])
    assert [(r["acq_stamp"], r["data"]) for r in rows] == delivered
    assert all(r["recorder_id"] == "net" and r["error"] is None for r in rows)
    assert recorder.statistics().gaps == 0 and recorder.statistics().overflow == 0


def test_record_command_runs_for_a_duration(
    served: tuple[Server, ClientService], tmp_path: Path
) -> None:
    server, _ = served
    runner = CliRunner()
    result = runner.invoke(
        record,
        [str(tmp_path), "PS1/Acquisition@CPS.USER.ALL", "--id", "cli", "--duration", "1", "--json"],
        obj=Options(endpoint=server.endpoint, config_file=None),
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["recorder_id"] == "cli" and stats["state"] == "stopped"
    assert stats["acked_rows"] == 1  # the FIRST update
    rows = pq.read_table(tmp_path / "device=PS1").to_pylist()
    assert len(rows) == 1 and rows[0]["selector"] == "CPS.USER.ALL"
    assert rows[0]["data"] == _plain(_value(0, "PS1"))


def test_record_command_rejects_a_bad_pattern(tmp_path: Path) -> None:
    result = CliRunner().invoke(record, [str(tmp_path), "no-slash"])
    assert result.exit_code == 2 and "DEVICE/PROPERTY" in result.output


def test_record_the_demo_devices(tmp_path: Path, no_thread_leak: None) -> None:
    """The issue's round trip: record the demo server (found through the per-test directory
    file, device globs included) and compare with what a parallel subscription delivered."""
    server = build_demo_server(rate_hz=50.0)  # registers into the per-test directory file
    server.start()
    recorder = Recorder(
        tmp_path / "store",
        ["PS*/Acquisition", "BPM1/Orbit", "FAULTY/Status"],
        recorder_id="demo",
        flush_interval=0.05,
    )
    try:
        recorder.start()
        assert recorder.statistics().subscriptions == 5
        wait_until(lambda: recorder.statistics().received >= 10)
        delivered: dict[tuple[str, str], list[tuple[int, str, Any]]] = {}
        with ClientService(StaticDirectory({"*": server.endpoint})) as client:
            for device, prop in [("PS2", "Acquisition"), ("BPM1", "Orbit")]:
                sub = client.access_point(device, prop).subscribe()
                notes = delivered.setdefault((device, prop), [])
                while len(notes) < 40:
                    note = sub.poll(10)
                    assert note is not None and note.error is None
                    if note.update_type is UpdateType.NORMAL:
                        notes.append(
                            (note.context.acq_stamp, note.context.cycle_name, _plain(note.data))
                        )
                sub.close()
        last = recorder.statistics().received
        wait_until(lambda: recorder.statistics().received >= last + 10)  # past what we compare
    finally:
        recorder.stop()
        server.stop()
    stats = recorder.statistics()
    assert (stats.gaps, stats.overflow, stats.write_errors) == (0, 0, 0)
    for (device, prop), notes in delivered.items():
        table = pq.read_table(tmp_path / "store" / f"device={device}" / f"property={prop}")
        stored = {
            r["acq_stamp"]: (r["acq_stamp"], r["cycle_name"], r["data"]) for r in table.to_pylist()
        }
        assert [stored.get(stamp) for stamp, _, _ in notes] == notes
    faulty = pq.read_table(tmp_path / "store" / "device=FAULTY").to_pylist()
    assert faulty and all("interlock chain open" in r["error"] for r in faulty)
    recorded = {p.name for p in (tmp_path / "store").glob("device=*")}
    assert recorded == {f"device={d}" for d in ("PS1", "PS2", "PS3", "BPM1", "FAULTY")}
