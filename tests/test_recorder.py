"""The recorder's storage core and subscription layer, without a network."""

from __future__ import annotations

import errno
import logging
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import rda.pipeline.recorder.journal as journal_module
from rda.pipeline.recorder.journal import MAX_TYPES
from rda.pipeline.recorder.metrics import start_recorder_metrics
from rda.pipeline.recorder.service import Recorder, Sample, parse_pattern
from rda.serialization.data import Data
from rda.serialization.errors import DecodeError, RemoteError
from rda.serialization.header import DataContext
from rda.testing import wait_until

pytestmark = pytest.mark.usefixtures("no_thread_leak")
T0 = 1_700_000_000_000_000_000


def _context(i: int, selector: str = "CPS.USER.ALL") -> DataContext:
    return DataContext("CPS.USER.ALL", T0 + i - 1, T0 + i, selector)


def _store(root: Path) -> list[dict[str, Any]]:
    rows = []
    for path in root.glob("device=*/property=*/date=*/part-*.parquet"):
        device = path.parent.parent.parent.name.removeprefix("device=")
        prop = path.parent.parent.name.removeprefix("property=")
        for row in pq.read_table(path).to_pylist():
            rows.append({**row, "device": device, "property": prop})
    return sorted(rows, key=lambda r: (r["recorder_id"], r["seq"]))


def _expected(value: Any) -> Any:
    if isinstance(value, Data):
        return {name: _expected(v) for name, v in value.items()}
    if isinstance(value, np.ndarray):
        if value.ndim == 1:
            return value.tolist()
        return {"elements": value.ravel().tolist(), "dims": list(value.shape)}
    if isinstance(value, list):
        return [_expected(v) for v in value]
    return value


def _recorder(root: Path, **kwargs: Any) -> Recorder:
    options: dict[str, Any] = {"recorder_id": "r1", "flush_interval": 0.02}
    options.update(kwargs)
    return Recorder(root, **options)


def test_round_trip_of_every_row(tmp_path: Path) -> None:
    inputs = []
    for i in range(1, 301):
        data = Data(
            current=i * 0.5,
            count=i,
            label=f"v{i}",
            wave=np.arange(i % 5, dtype=np.float32),
            image=np.full((2, 2), i, np.int16),
            names=["a", str(i)],
            sub=Data(ok=i % 2 == 0),
        )
        inputs.append((f"PS{i % 3}", "Acquisition", data))
    recorder = _recorder(tmp_path)
    recorder.start()
    for i, (device, prop, data) in enumerate(inputs, start=1):
        assert recorder.offer(device, prop, None, Sample(data, _context(i)))
    assert recorder.flush()
    assert recorder.acked_seq == 300
    recorder.stop()
    rows = _store(tmp_path)
    assert [r["seq"] for r in rows] == list(range(1, 301))
    for row, (device, prop, data) in zip(rows, inputs, strict=True):
        assert (row["device"], row["property"]) == (device, prop)
        assert row["data"] == _expected(data)
        assert row["acq_stamp"] == T0 + row["seq"] and row["cycle_stamp"] == T0 + row["seq"] - 1
        assert row["selector"] == "CPS.USER.ALL" and row["error"] is None
    stats = recorder.statistics()
    assert (stats.state, stats.received, stats.acked_rows, stats.overflow) == (
        "stopped",
        300,
        300,
        0,
    )
    assert stats.parquet_files >= 3 and stats.converted_segments >= 1


def test_a_repeated_first_is_not_stored_and_update_types_are(tmp_path: Path) -> None:
    """Issue 37, item 17: every FIRST after a reconnection was stored as a row, so the archive
    held the same acquisition twice (same stamp, same value) at each reconnection. Checked
    against main at d880094: 4 rows stored below, and no ``update_type`` column. Now a FIRST
    repeating the stored row is counted (``repeated_first``), not stored; a FIRST with a new
    stamp or value is stored; every row says its update type."""
    from rda.serialization.header import UpdateType

    recorder = _recorder(tmp_path)
    recorder.start()
    offers = [
        (Data(x=1.0), 1, UpdateType.FIRST),
        (Data(x=2.0), 2, UpdateType.NORMAL),
        (Data(x=2.0), 2, UpdateType.FIRST),  # resubscribed: the last value again
        (Data(x=3.0), 2, UpdateType.FIRST),  # same stamp, other value: stored
    ]
    for data, i, kind in offers:
        assert recorder.offer("PS1", "Acq", None, Sample(data, _context(i), update_type=kind))
    assert recorder.flush()
    recorder.stop()
    rows = _store(tmp_path)
    assert [(r["data"]["x"], r["update_type"]) for r in rows] == [
        (1.0, "FIRST"),
        (2.0, "NORMAL"),
        (3.0, "FIRST"),
    ]
    assert recorder.statistics().repeated_first == 1


class _BadBody:
    error = None
    context = DataContext()

    @property
    def data(self) -> Data:
        raise DecodeError("truncated body", 3)


def test_errors_are_recorded_as_rows(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    recorder.start()
    recorder.offer("PS1", "Acq", "SEL", Sample(Data(x=1), _context(1, "")))
    recorder.offer(
        "PS1", "Acq", "SEL", Sample(None, _context(2, ""), RemoteError("Boom", "it broke"))
    )
    recorder.offer("PS2", "Acq", None, Sample(None, _context(3), RemoteError("Boom", "first")))
    recorder.offer("PS1", "Acq", None, _BadBody())
    recorder.stop()
    rows = _store(tmp_path)
    assert [(r["device"], r["seq"]) for r in rows] == [
        ("PS1", 1),
        ("PS1", 2),
        ("PS2", 3),
        ("PS1", 4),
    ]
    assert rows[0]["error"] is None and rows[0]["selector"] == "SEL"
    assert rows[1]["data"] is None and "it broke" in rows[1]["error"]
    assert rows[1]["error"].startswith("RemoteError")
    assert rows[2]["data"] is None and "first" in rows[2]["error"]
    assert rows[3]["error"].startswith("DecodeError") and rows[3]["data"] is None


def test_overflow_is_counted_not_silent(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path, queue_limit=3)
    results = [recorder.offer("PS1", "Acq", None, Sample(Data(x=i))) for i in range(5)]
    assert results == [True, True, True, False, False]
    stats = recorder.statistics()
    assert (stats.overflow, stats.queue_depth, stats.state) == (2, 3, "created")
    recorder.start()
    assert recorder.flush()
    recorder.stop()
    assert [r["data"]["x"] for r in _store(tmp_path)] == [0, 1, 2]


def test_seq_continues_after_restart_and_retention(tmp_path: Path) -> None:
    first = _recorder(tmp_path, retention=0.0)
    first.start()
    for i in range(10):
        first.offer("PS1", "Acq", None, Sample(Data(x=i)))
    first.stop()
    assert first.converter.apply_retention() >= 1
    assert first.journal.segments() == []
    second = _recorder(tmp_path)
    second.start()
    assert second.acked_seq == 10
    second.offer("PS1", "Acq", None, Sample(Data(x=10)))
    assert second.flush()
    assert second.acked_seq == 11
    second.stop()
    assert [r["seq"] for r in _store(tmp_path)] == list(range(1, 12))


def test_full_disk_stops_acknowledging_loudly_then_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = journal_module.write_durably

    def full(path: Path, payload: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    recorder = _recorder(tmp_path)
    recorder.start()
    recorder.offer("PS1", "Acq", None, Sample(Data(x=0)))
    assert recorder.flush()
    monkeypatch.setattr(journal_module, "write_durably", full)
    with caplog.at_level(logging.ERROR, logger="rda.pipeline.recorder.service"):
        for i in range(1, 6):
            recorder.offer("PS1", "Acq", None, Sample(Data(x=i)))
        wait_until(lambda: recorder.statistics().state == "error")
    stats = recorder.statistics()
    assert recorder.acked_seq == 1 and stats.write_errors >= 1
    assert stats.last_error is not None and "No space" in stats.last_error
    assert stats.pending_rows + stats.queue_depth == 5
    assert any("not acknowledging" in r.message for r in caplog.records)
    monkeypatch.setattr(journal_module, "write_durably", real)
    wait_until(lambda: recorder.acked_seq == 6)
    assert recorder.statistics().state == "running"
    recorder.stop()
    assert [r["data"]["x"] for r in _store(tmp_path)] == [0, 1, 2, 3, 4, 5]


def test_recorders_share_a_root(tmp_path: Path) -> None:
    one, two = _recorder(tmp_path, recorder_id="r1"), _recorder(tmp_path, recorder_id="r2")
    one.start()
    two.start()
    for i in range(20):
        (one if i % 2 else two).offer("PS1", "Acq", None, Sample(Data(x=i), _context(i)))
    one.stop()
    two.stop()
    rows = _store(tmp_path)
    assert sorted((r["recorder_id"], r["seq"]) for r in rows) == [
        (rid, seq) for rid in ("r1", "r2") for seq in range(1, 11)
    ]
    assert sorted(r["data"]["x"] for r in rows) == list(range(20))


def test_type_change_opens_a_schema_version(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    recorder.start()
    recorder.offer("PS1", "Acq", None, Sample(Data(a=1)))
    recorder.offer("PS1", "Acq", None, Sample(Data(a=2, b=0.5)))  # gains a field: same version
    recorder.offer("PS1", "Acq", None, Sample(Data(a="one")))  # changes a type: version 2
    recorder.stop()
    assert recorder.statistics().schema_changes == 1
    assert [v["number"] for v in recorder.catalog.versions("PS1", "Acq")] == [1, 2]
    versions = {}
    for path in tmp_path.glob("device=PS1/property=Acq/date=*/*.parquet"):
        table = pq.read_table(path)
        versions[table.schema.metadata[b"rda.schema_version"]] = table.column("data").to_pylist()
    assert versions == {b"1": [{"a": 1, "b": None}, {"a": 2, "b": 0.5}], b"2": [{"a": "one"}]}


def test_narrower_reordered_and_widened_values_of_one_version_read_back_by_field(
    tmp_path: Path,
) -> None:
    """Values of one schema version in other shapes (fewer fields, another order, a version
    widened after a shape was first seen), in one segment and across segments: each field
    lands in its column (the segment transposes only values with exactly its fields)."""
    shapes = [
        Data(a=1, b=2),
        Data(a=3),
        Data(b=4, a=5),
        Data(a=6, b=7, c=8),  # widens the version
        Data(a=9),
        Data(b=10, a=11),
        Data(a=12, b=13, c=14),
    ]
    recorder = _recorder(tmp_path, flush_interval=5.0)
    recorder.start()
    for turn in range(2):
        for data in shapes:
            assert recorder.offer("PS1", "Acq", None, Sample(data))
        if turn == 0:
            assert recorder.flush()  # the second turn in a segment of its own
    recorder.stop()
    assert [v["number"] for v in recorder.catalog.versions("PS1", "Acq")] == [1]
    expected = [{"a": d["a"], "b": d.get("b"), "c": d.get("c")} for d in shapes] * 2
    assert [r["data"] for r in _store(tmp_path)] == expected


def test_keys_of_one_type_share_a_segment_and_more_types_than_it_holds_start_another(
    tmp_path: Path,
) -> None:
    recorder = _recorder(tmp_path, flush_interval=5.0)
    try:
        for i in range(1000):  # a thousand properties of one type: one segment
            recorder.offer(f"D{i}", "Acq", None, Sample(Data(x=i)))
        # MAX_TYPES + 3 value types (one field name each): the segment closes at the 128th.
        for i in range(MAX_TYPES + 3):
            recorder.offer(f"T{i}", "Acq", None, Sample(Data(**{f"f{i}": i})))
        recorder.start()
        assert recorder.flush()
        assert recorder.acked_seq == 1000 + MAX_TYPES + 3
        assert recorder.statistics().segments_written == 2
    finally:
        recorder.stop()
    assert len(_store(tmp_path)) == 1000 + MAX_TYPES + 3


class _FakeSubscription:
    def __init__(self, listener: Callable[[Any], None], selector: str | None) -> None:
        self.listener = listener
        self.selector = selector
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _FakeDirectory:
    def devices(self) -> list[str]:
        return ["PS1", "PS2", "BPM1", "XPS3"]


class _FakeClient:
    directory = _FakeDirectory()

    def __init__(self) -> None:
        self.subscriptions: dict[tuple[str, str], _FakeSubscription] = {}

    def access_point(self, device: str, prop: str) -> Any:
        client = self

        class Point:
            def subscribe(
                self, selector: str | None = None, listener: Callable[[Any], None] | None = None
            ) -> _FakeSubscription:
                assert listener is not None
                sub = client.subscriptions[(device, prop)] = _FakeSubscription(listener, selector)
                return sub

        return Point()


def test_subscription_layer_resolves_globs_and_records(tmp_path: Path) -> None:
    client = _FakeClient()
    recorder = _recorder(tmp_path, patterns=["PS*/Acq@CPS.USER.ALL", "BPM1/Orbit"], client=client)
    recorder.start()
    assert sorted(client.subscriptions) == [("BPM1", "Orbit"), ("PS1", "Acq"), ("PS2", "Acq")]
    assert client.subscriptions[("PS1", "Acq")].selector == "CPS.USER.ALL"
    assert client.subscriptions[("BPM1", "Orbit")].selector is None
    assert recorder.statistics().subscriptions == 3
    client.subscriptions[("PS2", "Acq")].listener(Sample(Data(i=1), DataContext(acq_stamp=T0)))
    client.subscriptions[("BPM1", "Orbit")].listener(Sample(Data(pos=np.zeros(4))))
    recorder.stop()
    assert all(sub.closed for sub in client.subscriptions.values())
    rows = _store(tmp_path)
    assert [(r["device"], r["property"], r["selector"]) for r in rows] == [
        ("PS2", "Acq", "CPS.USER.ALL"),
        ("BPM1", "Orbit", ""),
    ]


def test_parse_pattern() -> None:
    assert parse_pattern("PS*/Acq") == ("PS*", "Acq", None)
    assert parse_pattern("BPM1/Orbit@CPS.USER.ALL") == ("BPM1", "Orbit", "CPS.USER.ALL")
    for bad in ("PS1", "/Acq", "PS1/", "PS1/Ac*"):
        with pytest.raises(ValueError, match="pattern"):
            parse_pattern(bad)


def test_recorder_id_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="recorder id"):
        Recorder(tmp_path, recorder_id="a/b")


def test_prometheus_metrics_read_the_statistics(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    recorder.start()
    endpoint = start_recorder_metrics(recorder, 0)
    try:
        for i in range(3):
            recorder.offer("PS1", "Acq", None, Sample(Data(x=i)))
        assert recorder.flush()
        with urllib.request.urlopen(
            f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10
        ) as reply:
            text = reply.read().decode()
    finally:
        endpoint.close()
        recorder.stop()
    assert 'rda_recorder_rows_acked_total{recorder="r1"} 3.0' in text
    assert 'rda_recorder_acked_seq{recorder="r1"} 3.0' in text
    assert 'rda_recorder_state{recorder="r1",state="running"} 1.0' in text
    assert 'rda_recorder_overflow_total{recorder="r1"} 0.0' in text


def test_alternating_types_do_not_open_a_version_per_segment(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    recorder.start()
    for i in range(6):
        recorder.offer("PS1", "Acq", None, Sample(Data(a=i) if i % 2 else Data(a=f"s{i}")))
        assert recorder.flush()  # one segment per value
    recorder.stop()
    assert [v["number"] for v in recorder.catalog.versions("PS1", "Acq")] == [1, 2]
    assert [r["seq"] for r in _store(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_stop_while_the_disk_is_full_ends_promptly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(path: Path, payload: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(journal_module, "write_durably", denied)
    recorder = _recorder(tmp_path)
    recorder.start()
    recorder.offer("PS1", "Acq", None, Sample(Data(x=1)))
    wait_until(lambda: recorder.statistics().state == "error")
    started = time.monotonic()
    recorder.stop(timeout=20.0)
    assert time.monotonic() - started < 15.0
    assert recorder._writer is not None and not recorder._writer.is_alive()
    stats = recorder.statistics()
    assert (stats.state, stats.acked_seq, stats.acked_rows) == ("error", 0, 0)
    assert stats.last_error is not None and "Permission denied" in stats.last_error


def test_one_recorder_id_runs_once_per_root(tmp_path: Path) -> None:
    first = _recorder(tmp_path)
    first.start()
    second = _recorder(tmp_path)
    with pytest.raises(RuntimeError, match="already running"):
        second.start()
    first.stop()
    third = _recorder(tmp_path)
    third.start()  # the lock went with the first recorder's stop
    third.stop()


def test_the_core_never_imports_pyarrow() -> None:
    code = (
        "import sys, rda, rda.business.client.service, rda.business.server.builder, rda.serialization.data;"
        "import rda.admin.cli.main;"
        "print('pyarrow' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
