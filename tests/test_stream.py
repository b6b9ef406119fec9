"""The ``rda-journal`` streaming source on journals written by the real recorder core.

Offsets and planning are tested without Spark (fast); the Spark tests run real streaming
queries with ``availableNow`` into idempotent sinks (one Parquet directory per batch id, so a
replayed batch overwrites its own output), including a failure mid-stream and a restart on the
same checkpoint, which must end with every row exactly once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, In
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

from rda.pipeline.recorder.service import Recorder, Sample
from rda.pipeline.stream.sources import (
    JournalBatchReader,
    JournalDataSource,
    JournalError,
    JournalOptions,
    JournalStreamReader,
    SegmentRef,
    group_segments,
    plan_partitions,
    plan_segments,
    read_segment_rows,
)
from rda.serialization.data import Data
from rda.serialization.errors import RemoteError
from rda.serialization.header import DataContext
from rda.testing import wait_until

T0 = 1_795_300_000_000_000_000


def _write(
    root: Path, recorder_id: str, batches: list[list[tuple[str, int]]]
) -> list[dict[str, Any]]:
    """Record ``batches`` (each one journal segment) of (device, value); return the rows."""
    recorder = Recorder(
        root, recorder_id=recorder_id, convert=False, flush_interval=3600.0, flush_rows=10**6
    )
    recorder.start()
    expected = []
    try:
        seq = recorder.acked_seq
        for batch in batches:
            for device, value in batch:
                data = Data(x=value, y=value / 4, name=f"v{value}")
                assert recorder.offer(
                    device, "Acq", None, Sample(data, DataContext(acq_stamp=T0 + value))
                )
                seq += 1
                expected.append(
                    {
                        "recorder_id": recorder_id,
                        "seq": seq,
                        "device": device,
                        "acq_stamp": T0 + value,
                        "data": {"x": value, "y": value / 4, "name": f"v{value}"},
                    }
                )
            assert recorder.flush()
    finally:
        recorder.stop(convert=False)
    return expected


def _segments(root: Path, recorder_id: str) -> list[Path]:
    return sorted((root / "_journal" / recorder_id).glob("seg-*.arrow"))


def _options(root: Path, **extra: str) -> JournalOptions:
    return JournalOptions.parse({"root": str(root), **extra})


# --- without Spark ----------------------------------------------------------------------------


def test_offsets_advance_by_whole_segments_round_robin(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", i)] for i in range(3)])  # seq 1, 2, 3: one per segment
    _write(tmp_path, "b", [[("PS1", 10), ("PS1", 11)], [("PS1", 12)]])  # seq 1-2, 3
    reader = JournalStreamReader(_options(tmp_path))
    start = reader.initialOffset()
    assert start == {"a": 0, "b": 0}
    assert reader.latestOffset(start, ReadMaxFiles(3)) == {"a": 2, "b": 2}
    assert reader.latestOffset({"a": 2, "b": 2}, ReadMaxFiles(3)) == {"a": 3, "b": 3}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"a": 3, "b": 3}
    # A row limit never splits a segment, and always makes progress.
    assert reader.latestOffset(start, ReadMaxRows(1)) == {"a": 1, "b": 0}
    assert reader.latestOffset({"a": 3, "b": 3}, ReadAllAvailable()) == {"a": 3, "b": 3}


def test_available_now_target_ignores_later_segments(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", 1)]])
    reader = JournalStreamReader(_options(tmp_path))
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _write(tmp_path, "a", [[("PS1", 2)]])
    _write(tmp_path, "late", [[("PS1", 3)]])
    assert reader.latestOffset(start, ReadAllAvailable()) == {"a": 1}


def test_a_new_recorder_starts_with_its_baseline(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", 1)]])
    reader = JournalStreamReader(_options(tmp_path))
    start = reader.initialOffset()
    _write(tmp_path, "b", [[("PS1", 2)], [("PS1", 3)]])
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first == {"a": 1, "b": 0}
    assert [p.recorder_id for p in plan_segments(reader.options, start, first)] == ["a"]
    second = reader.latestOffset(first, ReadAllAvailable())
    assert second == {"a": 1, "b": 2}
    assert [(p.first_seq, p.last_seq) for p in plan_segments(reader.options, first, second)] == [
        (1, 1),
        (2, 2),
    ]


def test_planning_is_deterministic_and_detects_deleted_segments(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", i), ("PS2", i)] for i in range(4)])  # seq 1-2, 3-4, 5-6, 7-8
    options = _options(tmp_path)
    planned = plan_segments(options, {"a": 2}, {"a": 6})
    assert [(p.first_seq, p.last_seq) for p in planned] == [(3, 4), (5, 6)]
    assert [p.path for p in plan_segments(options, {"a": 2}, {"a": 6})] == [p.path for p in planned]
    _segments(tmp_path, "a")[1].unlink()  # retention deleted seq 3-4 before the stream read it
    with pytest.raises(JournalError, match=r"seq 3\.\.4 are gone.*failOnDataLoss"):
        plan_segments(options, {"a": 2}, {"a": 6})
    lenient = _options(tmp_path, failOnDataLoss="false")
    assert [p.first_seq for p in plan_segments(lenient, {"a": 2}, {"a": 6})] == [5]
    _segments(tmp_path, "a")[-1].unlink()  # the tail of the range is gone too
    with pytest.raises(JournalError, match=r"seq 7\.\.8"):
        plan_segments(options, {"a": 6}, {"a": 8})


def test_read_flattens_the_union_and_filters(tmp_path: Path) -> None:
    expected = _write(tmp_path, "a", [[("PS1", 1), ("PS2", 2), ("PS1", 3)]])
    partition = plan_segments(_options(tmp_path), {"a": 0}, {"a": 3})[0]
    rows = read_segment_rows(_options(tmp_path), partition).to_pylist()
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert [r["device"] for r in rows] == [e["device"] for e in expected]
    assert [json.loads(r["data"]) for r in rows] == [e["data"] for e in expected]
    assert rows[0]["ts"].timestamp() == pytest.approx((T0 + 1) / 1e9)
    only = read_segment_rows(_options(tmp_path, device="PS1"), partition).to_pylist()
    assert [r["seq"] for r in only] == [1, 3]
    struct = _options(tmp_path, device="PS2", property="Acq", data="struct")
    assert read_segment_rows(struct, partition).to_pylist()[0]["data"] == expected[1]["data"]


def test_error_rows_and_nan(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, recorder_id="a", convert=False, flush_interval=3600.0)
    recorder.start()
    try:
        failure = RemoteError("Boom", "before any value")
        recorder.offer("PS9", "Acq", None, Sample(None, DataContext(acq_stamp=5), failure))
        recorder.offer("PS9", "Acq", None, Sample(Data(v=math.nan), DataContext(acq_stamp=6)))
        assert recorder.flush()
    finally:
        recorder.stop(convert=False)
    for mode, nan in (("json", '{"v":NaN}'), ("struct", None)):
        options = _options(tmp_path, data=mode, device="PS9", property="Acq")
        rows = read_segment_rows(options, plan_segments(options, {"a": 0}, {"a": 2})[0])
        error, value = rows.to_pylist()
        assert error["error"].startswith("RemoteError") and error["data"] is None
        assert error["schema_version"] == 0 and value["schema_version"] == 1
        if nan is None:
            assert math.isnan(value["data"]["v"])
        else:
            assert value["data"] == nan


def test_read_of_a_vanished_segment(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", 1)]])
    partition = plan_segments(_options(tmp_path), {"a": 0}, {"a": 1})[0]
    Path(partition.path).unlink()
    with pytest.raises(JournalError, match="gone"):
        read_segment_rows(_options(tmp_path), partition)
    assert read_segment_rows(_options(tmp_path, failOnDataLoss="false"), partition).num_rows == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'root'"),
        ({"root": "/x", "data": "xml"}, "json or struct"),
        ({"root": "/x", "maxSegmentsPerTrigger": "0"}, ">= 1"),
        ({"root": "/x", "maxSegmentsPerTrigger": "many"}, "integer"),
        ({"root": "/x", "startingOffsets": "middle"}, "earliest or latest"),
        ({"root": "/x", "failOnDataLoss": "maybe"}, "true or false"),
        ({"root": "/x", "data": "struct", "device": "PS*", "property": "Acq"}, "literal"),
        ({"root": "/x", "data": "struct", "device": "PS1", "property": "Acq"}, "no recorded"),
    ],
)
def test_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JournalOptions.parse(options)


def test_partitions_group_consecutive_segments_of_a_recorder(tmp_path: Path) -> None:
    refs = [SegmentRef("a", "x", 1, 40), SegmentRef("a", "y", 41, 90), SegmentRef("a", "z", 91, 99)]
    refs.append(SegmentRef("b", "w", 1, 5))
    groups = group_segments(refs, 60)
    assert [[s.path for s in g.segments] for g in groups] == [["x"], ["y", "z"], ["w"]]
    assert [[s.path for s in g.segments] for g in group_segments(refs[:1], 10)] == [["x"]]
    _write(tmp_path, "a", [[("PS1", i), ("PS2", i)] for i in range(3)])
    options = _options(tmp_path, rowsPerPartition="4")
    assert [len(p.segments) for p in plan_partitions(options, {"a": 0}, {"a": 6})] == [2, 1]


def test_batch_filters_prune_keys_recorders_and_segments(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", i), ("PS2", i)] for i in range(3)])  # seq 1-2, 3-4, 5-6
    _write(tmp_path, "b", [[("PS2", 9)]])
    reader = JournalBatchReader(_options(tmp_path))
    seq_filter = GreaterThan(("seq",), 2)
    pushed = [EqualTo(("device",), "PS2"), In(("recorder_id",), ("a",)), seq_filter]
    unsupported = EqualTo(("error",), "x")
    assert list(reader.pushFilters([*pushed, unsupported])) == [seq_filter, unsupported]
    partitions = reader.partitions()
    assert [(s.recorder_id, s.first_seq) for p in partitions for s in p.segments] == [
        ("a", 3),
        ("a", 5),
    ]
    rows = [r for p in partitions for batch in reader.read(p) for r in batch.to_pylist()]
    assert [(r["device"], r["seq"]) for r in rows] == [("PS2", 4), ("PS2", 6)]


def test_latest_starts_after_what_exists(tmp_path: Path) -> None:
    _write(tmp_path, "a", [[("PS1", 1)], [("PS1", 2)]])
    reader = JournalStreamReader(_options(tmp_path, startingOffsets="latest"))
    assert reader.initialOffset() == {"a": 2}


# --- with Spark -------------------------------------------------------------------------------


def _stream(spark: Any, root: Path, **options: str) -> Any:
    spark.dataSource.register(JournalDataSource)
    reader = spark.readStream.format("rda-journal").option("root", str(root))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _sink(out: Path, fail_on: set[int] | None = None) -> Any:
    """An idempotent sink: batch N always lands in out/batch=N (a replay overwrites it)."""

    def write(batch: Any, batch_id: int) -> None:
        if fail_on is not None and batch_id in fail_on:
            fail_on.discard(batch_id)
            raise RuntimeError(f"sink failure in batch {batch_id}")
        batch.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    return write


def _delivered(out: Path) -> list[tuple[str, int]]:
    table = pq.read_table(out, columns=["recorder_id", "seq"])
    return sorted(
        zip(table.column("recorder_id").to_pylist(), table.column("seq").to_pylist(), strict=True)
    )


@pytest.mark.timeout(240)  # the first Spark test also starts the JVM
def test_available_now_delivers_every_row(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "store"
    expected = _write(root, "a", [[("PS1", i), ("PS2", i)] for i in range(5)])
    expected += _write(root, "b", [[("PS3", 100 + i)] for i in range(3)])
    out = tmp_path / "out"
    query = (
        _stream(spark, root, maxSegmentsPerTrigger="3")
        .writeStream.foreachBatch(_sink(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(list(out.glob("batch=*"))) == 3  # 8 segments, at most 3 per batch
    rows = pq.read_table(out).to_pylist()
    got = sorted(
        (r["recorder_id"], r["seq"], r["device"], r["acq_stamp"], json.loads(r["data"]))
        for r in rows
    )
    want = sorted(
        (e["recorder_id"], e["seq"], e["device"], e["acq_stamp"], e["data"]) for e in expected
    )
    assert got == want


@pytest.mark.timeout(240)  # the first Spark test also starts the JVM
def test_failure_and_restart_deliver_every_row_exactly_once(spark: Any, tmp_path: Path) -> None:
    root, out, checkpoint = tmp_path / "store", tmp_path / "out", tmp_path / "checkpoint"
    expected = _write(root, "a", [[("PS1", i), ("PS2", i)] for i in range(6)])

    def run(fail_on: set[int] | None) -> Any:
        query = (
            _stream(spark, root, maxSegmentsPerTrigger="2")
            .writeStream.foreachBatch(_sink(out, fail_on))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except Exception as exc:  # the forced failure surfaces as a StreamingQueryException
            return exc
        finally:
            # The restart must not race the failed query's cleanup (same checkpoint, same id).
            wait_until(
                lambda: not any(q.id == query.id for q in spark.streams.active),
                "the failed query to stop",
                timeout=30.0,
            )
        return query.exception()

    failure = run({1})
    assert failure is not None and "sink failure in batch 1" in str(failure), failure
    assert _delivered(out) == [("a", s) for s in range(1, 5)]  # batch 0 only: seq 1-4
    # The recorder goes on while the query is down; the restart replays batch 1 from its offsets.
    expected += _write(root, "a", [[("PS3", 50)]])
    restarted = run(None)
    assert restarted is None, restarted
    delivered = _delivered(out)
    assert delivered == sorted((e["recorder_id"], e["seq"]) for e in expected)
    assert len(delivered) == len(set(delivered)) == 13


@pytest.mark.timeout(240)  # the first Spark test also starts the JVM
def test_struct_data_for_one_property(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "store"
    expected = _write(root, "a", [[("PS1", 1), ("PS2", 2)], [("PS1", 3)]])
    spark.dataSource.register(JournalDataSource)
    frame = (
        spark.read.format("rda-journal")
        .option("root", str(root))
        .options(device="PS1", property="Acq", data="struct")
        .load()
    )
    rows = frame.orderBy("seq").select("seq", "data.x", "data.y", "data.name").collect()
    filtered = spark.read.format("rda-journal").option("root", str(root)).load()
    assert [r.seq for r in filtered.where("device = 'PS1' AND seq > 1").collect()] == [3]
    want = [e for e in expected if e["device"] == "PS1"]
    assert [tuple(r) for r in rows] == [
        (e["seq"], e["data"]["x"], e["data"]["y"], e["data"]["name"]) for e in want
    ]
