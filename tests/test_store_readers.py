"""The store is readable without rda (docs/history.md, "Store layout"): DuckDB and pandas read
the Parquet files a real recorder wrote and find the rows, types and counts that History
(the history server's ``history_table``) answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.dataset as ds
import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import ServerBuilder
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data, DataType
from rda.serialization.errors import TimeoutError
from rda.serialization.header import DataContext

DAY = 86_400 * 10**9
T0 = 1_790_000_000_000_000_000 // DAY * DAY  # 2026-09-21T00:00Z


def _value(i: int) -> Data:
    data = Data()
    data.append("i", i, DataType.INT32)
    data.append("x", i * 0.25, DataType.FLOAT64)
    data.append("wave", np.arange(3, dtype=np.float32) + i, DataType.FLOAT32_ARRAY)
    data.append("name", f"n{i}", DataType.STRING)
    return data


@pytest.fixture
def recorded(no_thread_leak: None, tmp_path: Path) -> Iterator[tuple[Path, ClientService]]:
    """Two devices over two UTC days, converted to Parquet, and one error row."""
    recorder = Recorder(
        tmp_path,
        recorder_id="duck",
        flush_interval=0.02,
        convert=False,
        serve=ServerBuilder("Duck").directory(None),
    )
    recorder.start()
    assert recorder.history_server is not None
    client = ClientService(
        StaticDirectory({"history:*": recorder.history_server.endpoint}),
        Config(request_timeout=30.0),
    )
    try:
        for device in ("DEV1", "DEV2"):
            for i in range(500):
                context = DataContext("C", 0, T0 + i * (DAY // 250), "")  # spans two days
                assert recorder.offer(device, "Prop", None, Sample(_value(i), context))
        late = DataContext("", 0, T0 + 3, "")
        assert recorder.offer("DEV1", "Prop", None, Sample(None, late, TimeoutError("late")))
        assert recorder.flush()
        assert recorder.convert_now() > 0
        yield tmp_path, client
    finally:
        client.close()
        recorder.stop()


def test_duckdb_counts_what_history_answers(recorded: tuple[Path, ClientService]) -> None:
    root, client = recorded
    history = client.history_table("DEV1", "Prop", T0, T0 + 3 * DAY)
    con = duckdb.connect()
    answer = con.execute(
        f"SELECT count(*), min(acq_stamp), sum(data.i) FROM read_parquet('{root}/**/*.parquet') "
        "WHERE device = 'DEV1'"
    ).fetchone()
    assert answer is not None
    count, first, total = answer
    assert count == history.num_rows == 501
    assert first == history.column("acq_stamp")[0].as_py() == T0
    assert total == sum(v for v in history.column("i").to_pylist() if v is not None)
    days = con.execute(
        f"SELECT date, count(*) FROM read_parquet('{root}/**/*.parquet') "
        "WHERE device = 'DEV2' GROUP BY date ORDER BY date"
    ).fetchall()
    assert [n for _, n in days] == [250, 250]
    # Field types survive: int32 stays INTEGER, the array FLOAT[], the error row a NULL value.
    kinds = dict(
        con.execute(
            f"SELECT column_name, column_type FROM (DESCRIBE SELECT data.* "
            f"FROM read_parquet('{root}/device=DEV1/**/*.parquet'))"
        ).fetchall()
    )
    assert kinds == {"i": "INTEGER", "x": "DOUBLE", "wave": "FLOAT[]", "name": "VARCHAR"}
    errors = con.execute(
        f"SELECT count(*) FROM read_parquet('{root}/**/*.parquet') WHERE error IS NOT NULL"
    ).fetchone()
    assert errors == (1,)


def test_pandas_reads_the_store_with_its_types(recorded: tuple[Path, ClientService]) -> None:
    root, client = recorded
    frame = ds.dataset(root / "device=DEV2", partitioning="hive").to_table().to_pandas()
    assert len(frame) == 500
    values = frame["data"].dropna()
    assert values.iloc[7]["i"] == 7 and values.iloc[7]["name"] == "n7"
    assert list(values.iloc[7]["wave"]) == [7.0, 8.0, 9.0]
    history = client.history_table("DEV2", "Prop", T0, T0 + 3 * DAY).to_pandas()
    assert str(history["i"].dtype) == "int32"
    assert sorted(frame["acq_stamp"]) == history["acq_stamp"].tolist()
