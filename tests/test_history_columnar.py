"""Columnar history (docs/history.md, "Columnar history"): ``client.history_table`` and
``history_batches`` over Arrow IPC chunks, against a real recorder's history server on
127.0.0.1 (store and journal together), compared with the Notifications of ``client.history``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import ServerBuilder
from rda.pipeline.recorder.query import HistoryReader
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data, DataType
from rda.serialization.errors import HistoryUnavailableError, RdaError, TimeoutError
from rda.serialization.header import DataContext

T0 = 1_790_000_000_000_000_000  # 2026-09-21


@pytest.fixture(autouse=True, scope="module")
def _zmq_garbage_collector() -> None:
    """Chunks above 64 KiB travel zero-copy, which starts pyzmq's process-wide garbage
    collector thread: start it before the thread-leak checks take their snapshot."""
    from zmq.utils.garbage import gc

    if not gc.is_alive():
        gc.start()


@pytest.fixture
def served(no_thread_leak: None, tmp_path: Path) -> Iterator[tuple[Recorder, ClientService]]:
    recorder = Recorder(
        tmp_path,
        recorder_id="col",
        flush_interval=0.02,
        convert=False,
        serve=ServerBuilder("Columnar").directory(None),
    )
    recorder.start()
    assert recorder.history_server is not None
    client = ClientService(
        StaticDirectory({"history:*": recorder.history_server.endpoint}),
        Config(request_timeout=30.0),
    )
    try:
        yield recorder, client
    finally:
        client.close()
        recorder.stop()


def _value(i: int) -> Data:
    data = Data()
    data.append("i", i, DataType.INT32)
    data.append("x", i * 0.5, DataType.FLOAT64)
    data.append("wave", np.arange(4, dtype=np.float32) + i, DataType.FLOAT32_ARRAY)
    data.append("image", np.arange(6, dtype=np.int16).reshape(2, 3) + i, DataType.INT16_ARRAY)
    data.append("seq", i * 2, DataType.INT64)  # a field named like a meta column
    return data


def _offer(recorder: Recorder, first: int, count: int, value=_value) -> None:  # type: ignore[no-untyped-def]
    for i in range(first, first + count):
        context = DataContext("CYCLE", T0 + i * 10, T0 + i * 1000, "SEL")
        assert recorder.offer("DEV", "Prop", None, Sample(value(i), context))
    assert recorder.flush()


def test_history_table_spans_store_and_journal_with_types_kept(
    served: tuple[Recorder, ClientService],
) -> None:
    recorder, client = served
    _offer(recorder, 0, 1200)
    assert recorder.convert_now() > 0  # 0..1199 in Parquet
    _offer(recorder, 1200, 800)  # journal only
    table = client.history_table("DEV", "Prop", T0, T0 + 2000 * 1000, chunk_rows=333)
    assert table.num_rows == 2000
    assert table.column_names[:8] == [
        "time",
        "acq_stamp",
        "cycle_stamp",
        "cycle_name",
        "selector",
        "recorder_id",
        "seq",
        "error",
    ]
    assert table.schema.field("time").type == pa.timestamp("ns", tz="UTC")
    assert table.schema.field("i").type == pa.int32()
    assert table.schema.field("x").type == pa.float64()
    assert table.schema.field("wave").type == pa.list_(pa.float32())
    assert table.column("i").to_pylist() == list(range(2000))
    assert table.column("acq_stamp").to_pylist() == [T0 + i * 1000 for i in range(2000)]
    assert table.column("cycle_stamp")[7].as_py() == T0 + 70
    assert set(table.column("selector").to_pylist()) == {"SEL"}
    assert table.column("error").null_count == 2000
    assert table.column("data.seq").to_pylist() == [2 * i for i in range(2000)]
    assert len(set(table.column("seq").to_pylist())) == 2000  # each row once
    image = table.column("image")[1500].as_py()
    assert np.array(image["elements"]).reshape(image["dims"]).tolist() == [
        [1500, 1501, 1502],
        [1503, 1504, 1505],
    ]
    # The same rows as the Notifications of client.history (which is built on the chunks).
    rows = client.history("DEV", "Prop", T0, T0 + 2000 * 1000)
    assert [n.context.acq_stamp for n in rows] == table.column("acq_stamp").to_pylist()
    assert rows[1500].data.type_of("image") is DataType.INT16_ARRAY
    frame = table.to_pandas()
    assert len(frame) == 2000 and str(frame["time"].dtype) == "datetime64[ns, UTC]"
    assert frame["x"].iloc[10] == 5.0
    window = client.history_table("DEV", "Prop", T0 + 1100 * 1000, T0 + 1300 * 1000, limit=50)
    assert window.column("i").to_pylist() == list(range(1100, 1150))


def test_a_chunk_is_one_arrow_stream_read_without_a_copy(
    served: tuple[Recorder, ClientService],
) -> None:
    recorder, client = served
    big = np.linspace(0.0, 1.0, 32768)  # 256 KiB a row: the stream goes as its own frame
    _offer(recorder, 0, 4, lambda i: Data(i=i, wave=big + i))
    filters = Data()
    filters.append("format", "arrow", DataType.STRING)
    filters.append("start", T0, DataType.INT64)
    filters.append("end", T0 + 10**9, DataType.INT64)
    reply = client.access_point("history:DEV", "Prop").get(filters=filters)
    stream = reply.data.get_array("arrow")
    assert reply.data["rows"] == 4 and reply.data["more"] is False
    chunk = pa.ipc.open_stream(pa.py_buffer(stream)).read_all()
    assert chunk.num_rows == 4
    waves = chunk.column("data").chunks[0].field("wave").values.to_numpy()
    assert np.shares_memory(waves, stream)  # the values are the received bytes
    assert waves[:32768].tolist() == big.tolist()


def test_a_big_chunk_leaves_the_server_as_its_own_frame() -> None:
    """The reply's Arrow stream is a body frame of its own (out of band), not copied into the
    DATA frame: a writable view was copied, 16 MiB per chunk."""
    from rda.pipeline.recorder.query import Chunk
    from rda.pipeline.recorder.serve import encode_chunk
    from rda.serialization.binary import OUT_OF_BAND_MIN
    from rda.serialization.message import BodyKind, encode_data_body

    table = pa.table({"acq_stamp": pa.array(np.arange(OUT_OF_BAND_MIN, dtype=np.int64))})
    reply = encode_chunk(Chunk(table, False), True)
    stream = reply.get_array("arrow")
    bodies = encode_data_body(reply)
    assert [kind for kind, _ in bodies] == [BodyKind.DATA, BodyKind.ARRAY]
    assert len(memoryview(bodies[1][1])) == stream.nbytes
    assert len(memoryview(bodies[0][1])) < 1024
    assert pa.ipc.open_stream(pa.py_buffer(stream)).read_all().equals(table)


def test_history_batches_are_asked_for_one_chunk_at_a_time(
    served: tuple[Recorder, ClientService],
) -> None:
    recorder, client = served
    _offer(recorder, 0, 1000)
    assert recorder.history is not None
    before = recorder.history.statistics().queries
    batches = client.history_batches("DEV", "Prop", T0, T0 + 10**9, chunk_rows=100)
    first = next(batches)
    assert first.num_rows == 100 and first.column("i").to_pylist() == list(range(100))
    assert recorder.history.statistics().queries == before + 1  # one chunk, not ten
    assert sum(b.num_rows for b in batches) == 900
    assert recorder.history.statistics().queries == before + 10


def test_a_field_changing_type_starts_a_new_chunk(
    served: tuple[Recorder, ClientService],
) -> None:
    """A new schema version (a field changes type) cannot share a table with the old one:
    the chunk ends before it, the batches carry both, the table says why it cannot."""
    recorder, client = served
    _offer(recorder, 0, 10, lambda i: Data(v=i))
    _offer(recorder, 10, 10, lambda i: Data(v=f"s{i}"))
    batches = list(client.history_batches("DEV", "Prop", T0, T0 + 10**9))
    assert [b.num_rows for b in batches] == [10, 10]
    assert batches[0].schema.field("v").type == pa.int64()
    assert batches[1].schema.field("v").type == pa.string()
    with pytest.raises(ValueError, match="changes type"):
        client.history_table("DEV", "Prop", T0, T0 + 10**9)
    # Notifications are per row: the whole window comes back.
    assert [n.data["v"] for n in client.history("DEV", "Prop", T0, T0 + 10**9)] == [
        *range(10),
        *(f"s{i}" for i in range(10, 20)),
    ]


def test_empty_window_and_errors(served: tuple[Recorder, ClientService]) -> None:
    recorder, client = served
    context = DataContext("", 0, T0 + 5, "")
    recorder.offer("DEV", "Prop", None, Sample(None, context, TimeoutError("late")))
    recorder.offer("DEV", "Prop", None, Sample(Data(v=1.5), DataContext(acq_stamp=T0 + 6)))
    assert recorder.flush()
    table = client.history_table("DEV", "Prop", T0, T0 + 10)
    assert table.column("error").to_pylist()[0].startswith("TimeoutError")
    assert table.column("v").to_pylist() == [None, 1.5]
    empty = client.history_table("DEV", "Prop", T0 + 100, T0 + 200)
    assert empty.num_rows == 0 and "acq_stamp" in empty.column_names
    with pytest.raises(HistoryUnavailableError, match="not recorded"):
        client.history_table("OTHER", "Prop", T0, T0 + 10)


def test_a_request_without_the_arrow_format_is_refused_with_a_reason(
    served: tuple[Recorder, ClientService],
) -> None:
    """An older client (row-by-row chunks) gets a message that says why, not a broken reply."""
    recorder, client = served
    _offer(recorder, 0, 1)
    filters = Data()
    filters.append("start", T0, DataType.INT64)
    filters.append("end", T0 + 10, DataType.INT64)
    with pytest.raises(RdaError, match="Arrow IPC chunks"):
        client.access_point("history:DEV", "Prop").get(filters=filters)


def test_reader_chunk_is_an_arrow_table(served: tuple[Recorder, ClientService]) -> None:
    recorder, _ = served
    _offer(recorder, 0, 50)
    reader = HistoryReader(recorder.store, recorder.journal, lambda: 0, recorder.recorder_id)
    chunk = reader.chunk("DEV", "Prop", T0, T0 + 10**9, max_rows=20)
    assert isinstance(chunk.table, pa.Table) and len(chunk) == 20 and chunk.more
    assert chunk.table.column_names[-1] == "data"
    assert chunk.table.column("recorder_id").to_pylist() == ["col"] * 20


def test_from_recorder_gives_the_table_local_get_gives(
    served: tuple[Recorder, ClientService],
) -> None:
    """``rda history get --from-recorder`` (``remote_get``, on ``history_table``) and the store
    read with pyarrow (``local_get``) answer the same rows, columns and Arrow types."""
    from rda.pipeline.history.local import local_get
    from rda.pipeline.history.remote import remote_get

    recorder, client = served
    _offer(recorder, 0, 300)
    recorder.convert_now()
    window = (T0, T0 + 300 * 1000)
    remote = remote_get("DEV/Prop", *window, client=client)
    local = local_get(recorder.store, "DEV/Prop", *window)
    assert remote.num_rows == local.num_rows == 300
    for name in ("acq_stamp", "ts", "cycle_name", "cycle_stamp", "selector", "i", "x", "wave"):
        assert remote.schema.field(name).type == local.schema.field(name).type, name
        assert remote.column(name).to_pylist() == local.column(name).to_pylist(), name
    fields = remote_get("DEV/Prop#image", *window, client=client)
    assert fields.column_names[-1] == "image" and fields.num_rows == 300


def test_aio_history_table(served: tuple[Recorder, ClientService]) -> None:
    import asyncio

    import rda.aio

    recorder, client = served
    _offer(recorder, 0, 40)

    async def main() -> pa.Table:
        aio = rda.aio.ClientService(client.directory, Config(request_timeout=30.0))
        try:
            return await aio.history_table("DEV", "Prop", T0, T0 + 10**9)
        finally:
            aio.close()

    assert asyncio.run(main()).column("i").to_pylist() == list(range(40))


def test_aio_history_batches_lazily(served: tuple[Recorder, ClientService]) -> None:
    """``rda.aio``'s ``history_batches``: the rows of ``history_table`` as batches, one chunk
    asked for at a time (the server's query count grows as the loop goes on), and leaving the
    loop early asks for no more."""
    import asyncio

    import rda.aio

    recorder, client = served
    _offer(recorder, 0, 90)
    server = recorder.history
    assert server is not None

    async def main() -> tuple[list[int], list[int], int]:
        aio = rda.aio.ClientService(client.directory, Config(request_timeout=30.0))
        try:
            rows: list[int] = []
            asked: list[int] = []
            async for batch in aio.history_batches("DEV", "Prop", T0, T0 + 10**9, chunk_rows=20):
                asked.append(server.statistics().queries)
                rows.extend(batch.column("i").to_pylist())
            early = server.statistics().queries
            async for _ in aio.history_batches("DEV", "Prop", T0, T0 + 10**9, chunk_rows=20):
                break
            return rows, asked, server.statistics().queries - early
        finally:
            aio.close()

    rows, asked, after_break = asyncio.run(main())
    assert rows == list(range(90))
    assert asked == sorted(asked) and asked[0] < asked[-1]  # fetched as consumed, not at once
    assert after_break == 1


def test_a_store_changing_under_every_listing_is_an_error_at_the_client(
    served: tuple[Recorder, ClientService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history server's reader meets a listed file gone at each of its RELISTS listings
    (a store compacted faster than it reads): the client gets HistoryUnavailableError, the
    server counts it, and serves the next query."""
    import pyarrow.fs as pafs

    from rda.pipeline.recorder.store import Store

    recorder, client = served
    _offer(recorder, 0, 10)
    listing = Store.files

    def files_and_a_ghost(self: Store, path: str) -> list[Any]:
        ghost = pafs.FileInfo(f"{path}/part-col-999-999.parquet", pafs.FileType.File, size=10)
        return [*listing(self, path), ghost]

    monkeypatch.setattr(Store, "files", files_and_a_ghost)
    with pytest.raises(HistoryUnavailableError, match="changed under the read"):
        client.history_table("DEV", "Prop", T0, T0 + 10**9)
    assert recorder.history is not None
    statistics = recorder.history.statistics()
    assert statistics.failed == 1 and statistics.relists == 3
    monkeypatch.setattr(Store, "files", listing)
    assert client.history_table("DEV", "Prop", T0, T0 + 10**9).num_rows == 10


def test_a_window_asked_again_is_served_from_the_decoded_cache(
    served: tuple[Recorder, ClientService],
) -> None:
    """The history server keeps decoded Parquet files (bounded by bytes) and counts it: the
    second pull of a window decodes nothing (misses unchanged, hits grown), same rows."""
    recorder, client = served
    _offer(recorder, 0, 300)
    recorder.convert_now()
    assert recorder.history is not None
    first = client.history_table("DEV", "Prop", T0, T0 + 10**9, chunk_rows=100)
    before = recorder.history.statistics()
    again = client.history_table("DEV", "Prop", T0, T0 + 10**9, chunk_rows=100)
    after = recorder.history.statistics()
    assert before.cache_misses >= 1 and 0 < before.cache_bytes <= 512 << 20
    assert after.cache_misses == before.cache_misses
    assert after.cache_hits >= before.cache_hits + 3  # one per chunk at least
    assert again.equals(first)
