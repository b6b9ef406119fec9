"""The recorder stores what a property declares and computes (issue 33, item 1): the units of
its fields (Parquet schema metadata ``rda.units``) and each value's alarm severity (column
``alarm_severity``), and History returns them (``history_table``: field metadata ``units``,
the ``alarm_severity`` column). Real ZeroMQ on 127.0.0.1: a declared device, a recorder
recording it over the network and serving its history.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.metadata import Field, Severity
from rda.business.server.builder import ServerBuilder
from rda.business.server.devices import Device, prop
from rda.business.server.requests import GetRequest
from rda.pipeline.recorder.service import Recorder
from rda.serialization.data import Data
from rda.serialization.header import DataContext
from rda.testing import wait_until

FIELDS = {
    "current": Field(units="A", precision=3, warning=(-9.0, 9.0), alarm=(-10.0, 10.0)),
    "count": Field(description="no units"),
}


class Supply(Device):
    """``PS9/Acq``: publishes the currents of ``VALUES`` in turn, declared with units and
    alarm limits."""

    VALUES = (1.0, 9.5, 12.0)  # NONE, MINOR, MAJOR

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.last = AcquiredData(Data(current=0.0, count=0), DataContext(acq_stamp=time.time_ns()))

    @prop("Acq", fields=FIELDS)
    def acq(self, request: GetRequest) -> AcquiredData:
        with self.lock:
            return self.last

    def publish_value(self, count: int) -> None:
        value = Data(current=self.VALUES[count % 3], count=count)
        with self.lock:
            self.last = AcquiredData(value, DataContext(acq_stamp=time.time_ns()))
            self.publish("Acq", self.last)


@pytest.fixture
def recorded(no_thread_leak: None, tmp_path: Path) -> Iterator[tuple[Recorder, ClientService]]:
    device = Supply()
    server = ServerBuilder("SupplyServer").device("PS9", device).directory(None).build().start()
    static = StaticDirectory({"PS9": server.endpoint})
    rec_client = ClientService(static, Config(request_timeout=10.0))
    recorder = Recorder(
        tmp_path,
        ["PS9/Acq"],
        rec_client,
        recorder_id="meta",
        flush_interval=0.02,
        convert=False,
        serve=ServerBuilder("MetaHistory").directory(None),
    )
    recorder.start()
    assert recorder.history_server is not None
    client = ClientService(
        StaticDirectory({"history:*": recorder.history_server.endpoint}), Config(request_timeout=30)
    )
    try:
        wait_until(lambda: recorder.statistics().received >= 1, "the FIRST update recorded")
        for count in range(1, 7):
            device.publish_value(count)
        wait_until(lambda: recorder.statistics().received >= 7, "six updates recorded")
        assert recorder.flush()
        yield recorder, client
    finally:
        client.close()
        recorder.stop()
        rec_client.close()
        server.stop()


def test_units_and_alarm_severity_are_stored_and_returned(
    recorded: tuple[Recorder, ClientService],
) -> None:
    recorder, client = recorded
    assert recorder.units_of("PS9", "Acq") == {"current": "A"}
    # From the journal (not converted yet), then from Parquet: the same answer.
    for converted in (False, True):
        if converted:
            assert recorder.convert_now() > 0
        table = client.history_table("PS9", "Acq", time.time_ns() - 60 * 10**9)
        rows = [r for r in table.to_pylist() if r["update_type"] != "FIRST"]
        assert [r["count"] for r in rows] == [1, 2, 3, 4, 5, 6]
        severities = [Severity(r["alarm_severity"]) for r in rows]
        assert severities == [Severity.MINOR, Severity.MAJOR, Severity.NONE] * 2
        assert table.schema.field("current").metadata == {b"units": b"A"}
        assert table.schema.field("count").metadata is None
    files = list(Path(recorder.store.base).glob("device=PS9/**/*.parquet"))
    assert files
    stored = pq.read_schema(files[0])
    assert json.loads(stored.metadata[b"rda.units"]) == {"current": "A"}
    assert str(stored.field("alarm_severity").type) == "int8"
