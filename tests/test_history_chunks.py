"""The history reader's chunks under their row and byte bounds: every row once, in order.

The store mixes what makes chunking hard: a Parquet file of several row groups (read as one
table whose columns are chunked by group), journal
segments overlapping it and each other in stamp order (rows offered out of order), rows at
equal stamps, and a segment both converted and still in the journal. Whatever ``max_rows`` and
``max_bytes`` a reader asks, the chunks concatenated are the window's rows, each once, in
``(acq_stamp, recorder_id, seq)`` order, and a chunk of more than one row stays within its
byte bound (give or take a row: sizes are a source's mean row size) when rows are of one size.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rda.pipeline.recorder import converter, query
from rda.pipeline.recorder.converter import Converter
from rda.pipeline.recorder.journal import Journal
from rda.pipeline.recorder.query import Cursor, HistoryReader
from rda.pipeline.recorder.service import Recorder, Sample
from rda.pipeline.recorder.store import Store
from rda.serialization.data import Data
from rda.serialization.header import DataContext, UpdateType

pytestmark = pytest.mark.timeout(300)


def _reader(root: Any) -> HistoryReader:
    """A reader of recorder "r1"'s store and journal under ``root``, with its converter's
    current progress."""
    return HistoryReader(
        Store.open(root), Journal(root, "r1"), lambda: Converter(root, "r1").max_seq, "r1"
    )


T0 = 1_700_000_000 * 10**9
ROWS = 600
WAVE = 64  # float64 values per row: rows of about half a KiB


@pytest.fixture(scope="module", params=["uniform", "mixed"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[HistoryReader, list[tuple[int, int]], bool]:
    """The store (see the module docstring), the window's row keys ``(acq_stamp, seq)`` in
    order, and whether all rows are of one size: "mixed" alternates small and big values by
    segment, so the row sizes the chunk counts differ between a file and the segments (also
    for the rows read from both places)."""
    uniform = request.param == "uniform"
    root = tmp_path_factory.mktemp("chunks")
    shuffle = random.Random(7)
    stamps = [T0 + (i // 3) * 1000 for i in range(ROWS)]  # three rows per stamp
    recorder = Recorder(root, recorder_id="r1", convert=False, serve=False, flush_rows=50)
    recorder.start()
    patch = pytest.MonkeyPatch()
    patch.setattr(converter, "ROW_GROUP_BYTES", 20_000)  # row groups of a few dozen rows
    try:
        for batch in range(0, ROWS, 100):
            part = stamps[batch : batch + 100]
            shuffle.shuffle(part)  # out of order within a batch: sources overlap
            for stamp in part:
                length = WAVE if uniform else (16 if batch % 200 else 4 * WAVE)
                value = Data(x=stamp, wave=np.full(length, float(stamp % 97)))
                assert recorder.offer("DEV", "Acq", None, Sample(value, DataContext("", 0, stamp)))
            recorder.flush(60)
            if batch == 300:
                recorder.convert_now()  # the first half in Parquet, the rest in the journal
    finally:
        recorder.stop(convert=False)
        patch.undo()
    journal = Journal(root, "r1")
    # The converter's max_seq read as one segment less than it is: that segment is listed in
    # the journal and found in the store, read from both places.
    converted = Converter(root, "r1").max_seq - 50
    reader = HistoryReader(Store.open(root), journal, lambda: converted, "r1")
    whole = reader.chunk("DEV", "Acq", T0, T0 + 10**12, max_rows=10**6, max_bytes=1 << 40)
    assert not whole.more and len(whole) == ROWS
    keys = _keys(whole.table)
    assert keys == sorted(keys)
    return reader, keys, uniform


def _keys(table: Any) -> list[tuple[int, int]]:
    stamps, seqs = table.column("acq_stamp").to_pylist(), table.column("seq").to_pylist()
    return list(zip(stamps, seqs, strict=True))


def _read(reader: HistoryReader, max_rows: int, max_bytes: int) -> list[Any]:
    after = None
    chunks = []
    while True:
        chunk = reader.chunk(
            "DEV", "Acq", T0, T0 + 10**12, after=after, max_rows=max_rows, max_bytes=max_bytes
        )
        chunks.append(chunk.table)
        if not chunk.more:
            return chunks
        assert len(chunk), "a chunk with more to come is never empty"
        last = chunk.table.slice(len(chunk) - 1).to_pylist()[0]
        after = Cursor(last["acq_stamp"], last["recorder_id"], last["seq"])


@settings(max_examples=25)
@given(max_rows=st.integers(1, 700), max_bytes=st.integers(1, 200_000))
def test_every_row_once_in_order_within_the_bounds(
    store: tuple[HistoryReader, list[tuple[int, int]], bool], max_rows: int, max_bytes: int
) -> None:
    reader, keys, uniform = store
    chunks = _read(reader, max_rows, max_bytes)
    got = [key for table in chunks for key in _keys(table)]
    assert got == keys
    row = max(t.nbytes / t.num_rows for t in chunks if t.num_rows)
    for table in chunks:
        assert table.num_rows <= max_rows
        if uniform and table.num_rows > 1:
            assert table.nbytes <= max_bytes + 2 * row, (table.num_rows, table.nbytes)


def test_a_segment_written_between_two_chunks_is_in_the_next(tmp_path: Any) -> None:
    """The reader lists the journal again only when its directory's names changed (a long
    answer lists once per chunk): a segment made after the first chunk must be in the next,
    and the store's text columns come back as plain strings (read through dictionaries)."""
    recorder = Recorder(tmp_path, recorder_id="r1", convert=False, serve=False, flush_rows=50)
    recorder.start()
    try:

        def offer(stamps: range) -> None:
            for stamp in stamps:
                value = Data(x=stamp)
                context = DataContext("cyc", stamp, T0 + stamp, "")
                assert recorder.offer("DEV", "Acq", None, Sample(value, context))
            recorder.flush(60)

        offer(range(0, 100))
        recorder.convert_now()  # 0-99 in Parquet
        offer(range(100, 200))  # in the journal
        reader = _reader(tmp_path)
        first = reader.chunk("DEV", "Acq", T0, T0 + 10**12, max_rows=150)
        assert first.more and len(first) == 150
        for name in ("cycle_name", "selector", "recorder_id", "error"):
            assert first.table.schema.field(name).type == "string", name
        assert set(first.table.column("cycle_name").to_pylist()) == {"cyc"}
        offer(range(200, 300))  # new segments after the first chunk
        last = first.table.slice(149).to_pylist()[0]
        after = Cursor(last["acq_stamp"], last["recorder_id"], last["seq"])
        rest = reader.chunk("DEV", "Acq", T0, T0 + 10**12, after=after, max_rows=1000)
        assert not rest.more
        got = (
            first.table.column("acq_stamp").to_pylist() + rest.table.column("acq_stamp").to_pylist()
        )
        assert got == [T0 + stamp for stamp in range(300)]
    finally:
        recorder.stop(convert=False)


def test_a_chunk_of_journal_rows_is_a_slice_of_the_mapped_segment(tmp_path: Any) -> None:
    """A journal segment is memory-mapped and its rows are in stamp order: each chunk that
    reads it takes a slice, not a filtered copy of the whole segment (with arrays, a filter
    copied every array of the segment on every chunk). Counted in Arrow's allocations."""
    recorder = Recorder(tmp_path, recorder_id="r1", convert=False, serve=False, flush_rows=1000)
    recorder.start()
    wave = np.linspace(0.0, 1.0, 8192)  # 64 KiB a row: the segment holds 2.5 MiB of values
    try:
        for i in range(40):
            value = Data(index=i, wave=wave)
            assert recorder.offer("DEV", "Acq", None, Sample(value, DataContext("", 0, T0 + i)))
        recorder.flush(60)
    finally:
        recorder.stop(convert=False)
    reader = HistoryReader(Store.open(tmp_path), Journal(tmp_path, "r1"), lambda: 0, "r1")
    pool = pa.default_memory_pool()
    after = None
    grown = []
    stamps: list[int] = []
    while True:
        before = pool.bytes_allocated()
        chunk = reader.chunk("DEV", "Acq", T0, T0 + 10**12, after=after, max_rows=5)
        grown.append(pool.bytes_allocated() - before)
        stamps += chunk.table.column("acq_stamp").to_pylist()
        if not chunk.more:
            break
        last = chunk.table.slice(len(chunk) - 1).to_pylist()[0]
        after = Cursor(last["acq_stamp"], last["recorder_id"], last["seq"])
        del chunk
    assert stamps == [T0 + i for i in range(40)]
    # The first chunk decodes the segment (its layout, kept); the others allocate a few
    # small columns each, far below one row's 64 KiB of values.
    assert max(grown[1:]) < 64 << 10, grown


def test_text_columns_read_through_dictionaries_equal_a_plain_read(tmp_path: Any) -> None:
    """The Parquet text columns are read as dictionaries and made plain again: one-valued
    columns by repeating the value, others by a cast; with nulls (values without an error),
    empty strings and several values per column, the chunk equals pyarrow's plain read."""
    recorder = Recorder(tmp_path, recorder_id="r1", convert=False, serve=False, flush_rows=50)
    recorder.start()
    try:
        for i in range(300):
            context = DataContext("cyc" if i < 150 else "", i, T0 + i, "")
            error = RuntimeError("boom") if i % 7 == 0 else None
            update = UpdateType.FIRST if i == 0 else UpdateType.NORMAL
            sample = Sample(Data(x=i), context, error, update)
            assert recorder.offer("DEV", "Acq", "sel" if i % 2 else None, sample)
        recorder.flush(60)
        recorder.convert_now()
    finally:
        recorder.stop(convert=False)
    reader = _reader(tmp_path)
    chunk = reader.chunk("DEV", "Acq", T0, T0 + 10**12, max_rows=1000)
    assert len(chunk) == 300 and not chunk.more
    files = sorted(tmp_path.glob("device=DEV/**/*.parquet"))
    assert files, "the rows were converted"
    plain = pa.concat_tables(pq.read_table(f) for f in files).sort_by([("acq_stamp", "ascending")])
    for name in ("cycle_name", "selector", "recorder_id", "error", "update_type"):
        assert chunk.table.schema.field(name).type == "string", name
        column = chunk.table.column(name)
        column.validate(full=True)
        assert column.to_pylist() == plain.column(name).to_pylist(), name


def test_a_window_larger_than_the_cache_read_again_is_mostly_kept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row groups read in order, more of them than the cache holds: read again while the
    kept ones are hot, the window decodes only what did not fit (an LRU evicted each group
    before it was asked again, and decoded all of them every time); the rows are the same."""
    monkeypatch.setattr(converter, "ROW_GROUP_BYTES", 20_000)
    recorder = Recorder(tmp_path, recorder_id="r1", convert=False, serve=False, flush_rows=100)
    recorder.start()
    try:
        for i in range(2000):
            value = Data(x=i, wave=np.full(64, float(i)))
            assert recorder.offer("DEV", "Acq", None, Sample(value, DataContext("", 0, T0 + i)))
        recorder.flush(60)
        recorder.convert_now()
    finally:
        recorder.stop(convert=False)
    monkeypatch.setattr(query, "_WHOLE_FILE_BYTES", 0)  # every file read by row group
    monkeypatch.setattr(query, "_TABLE_CACHE_BYTES", 1_000_000)  # two thirds of the window
    monkeypatch.setattr(query, "_HOT", 1e9)  # "recently used": whatever the machine's speed
    reader = _reader(tmp_path)

    def pull() -> tuple[list[tuple[int, int]], int]:
        misses = reader.cache()[1]
        keys = [key for table in _read(reader, 100, 1 << 30) for key in _keys(table)]
        return keys, reader.cache()[1] - misses

    first, decoded = pull()
    again, decoded_again = pull()
    assert first == again and len(first) == 2000
    groups = decoded  # the first pull decoded each row group once (then kept or aside)
    assert groups > 10
    held = reader.cache()[2]
    assert held <= 1_000_000 + 1_000_000 // 4
    # Kept: what fitted (about two thirds here); decoded again: only the rest.
    assert decoded_again <= groups // 2, (decoded_again, groups)
