"""The seam of ``subscribe(backfill=..., backfill_columnar=True)``, step by step, without a
network: the same rules as tests/test_backfill_seam.py (no hole, no repeat, HISTORY before
FIRST, the bridge, its gap), the past delivered as ``HistoryChunk`` s of several rows each.

The live messages are built as the wire delivers them; the history fetch cuts a list of
recorded updates into Arrow tables of ``CHUNK`` rows, shaped as ``history_table`` shapes them;
the subscription's scheduler is a list of tasks run by the test, so every interleaving below
is chosen, not hoped for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from rda.business.client.history import Backfill, shape_table
from rda.business.client.statistics import ClientCounters
from rda.business.client.subscriptions import HistoryChunk, Notification, Subscription
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import HistoryUnavailableError
from rda.serialization.header import (
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    encode_context,
)
from rda.serialization.message import BodyKind, Buffer, Message
from rda.transport.protocol import Incoming, Kind, decode_frames, encode_message

RECORDED = {n: n * 10 for n in range(1, 40)}  # counter value -> acquisition stamp
CHUNK = 4  # rows per chunk the fake history server sends


def live(sub: Subscription, n: int, seq: int, update: UpdateType) -> Message:
    header = Header(
        RequestType.NOTIFICATION_DATA, sub.id, "CNT", "Count", "", update, HeaderFlags.NONE
    )
    body: list[tuple[BodyKind, Buffer]] = [
        (BodyKind.DATA, binary.encode(Data(n=n))),
        (BodyKind.DATA_CONTEXT, encode_context(DataContext(acq_stamp=RECORDED[n]), seq)),
    ]
    event = decode_frames(encode_message(Kind.REPLY, header, body), from_server=True)
    assert isinstance(event, Incoming)
    return event.message


def chunk_of(values: list[int]) -> HistoryChunk:
    """The chunk a history server sends for these counter values, shaped for the client."""
    count = len(values)
    table = pa.table(
        {
            "acq_stamp": pa.array([RECORDED[n] for n in values], pa.int64()),
            "cycle_stamp": pa.array([0] * count, pa.int64()),
            "cycle_name": pa.array([""] * count, pa.string()),
            "selector": pa.array([""] * count, pa.string()),
            "recorder_id": pa.array(["rec"] * count, pa.string()),
            "seq": pa.array(values, pa.int64()),
            "error": pa.nulls(count, pa.string()),
            "data": pa.StructArray.from_arrays([pa.array(values, pa.int64())], ["n"]),
        }
    )
    return HistoryChunk(shape_table(table))


class Stand:
    def __init__(self, start: int, fail: bool = False, queue_size: int = 1000) -> None:
        self.tasks: list[Callable[[], None]] = []
        self.fetches: list[tuple[int, int]] = []
        self.fail = fail

        def submit(group: str, task: Callable[[], None], on_drop: object) -> bool:
            self.tasks.append(task)
            return True

        self.sub = Subscription(
            7, "tcp://x", "CNT", "Count", "", None, None, queue_size, ClientCounters(),
            submit, lambda s: None, Backfill(self.fetch, start),
        )  # fmt: skip

    def fetch(self, start: int, until: int) -> Iterator[Notification]:
        self.fetches.append((start, until))
        if self.fail:
            raise HistoryUnavailableError("no recorder")
        values = [n for n, stamp in RECORDED.items() if start <= stamp < until]
        for at in range(0, len(values), CHUNK):
            yield chunk_of(values[at : at + CHUNK])

    def run_tasks(self) -> None:
        while self.tasks:
            self.tasks.pop(0)()

    def delivered(self) -> list[tuple[int | str, str, int]]:
        """Each row (a chunk's one by one) as (value or error, update type, gap)."""
        out: list[tuple[int | str, str, int]] = []
        while (n := self.sub.poll_nowait()) is not None:
            if isinstance(n, HistoryChunk):
                assert n.update_type is UpdateType.HISTORY and n.gap == 0
                out.extend((v, "CHUNK", 0) for v in n.table.column("n").to_pylist())
                continue
            what = type(n.error).__name__ if n.error is not None else int(n.data["n"])
            out.append((what, n.update_type.name, n.gap))
        return out


def test_chunks_then_first_then_a_bridge_over_the_update_the_server_raced_past() -> None:
    stand = Stand(start=35)  # from counter value 4 (stamp 40) on
    sub = stand.sub
    sub.deliver_message(live(sub, 10, 1, UpdateType.FIRST))
    assert stand.delivered() == []  # held until its past is delivered
    stand.run_tasks()
    assert stand.fetches == [(35, 100)]  # [start, stamp of FIRST)
    assert stand.delivered() == [(n, "CHUNK", 0) for n in range(4, 10)] + [(10, "FIRST", 0)]
    # Values 11-13 were published between the server's get for FIRST and the activation of
    # this subscriber: the live stream goes on with 14, its seq showing the three as missed.
    sub.deliver_message(live(sub, 14, 5, UpdateType.NORMAL))
    sub.deliver_message(live(sub, 15, 6, UpdateType.NORMAL))
    assert stand.delivered() == []
    stand.run_tasks()
    assert stand.fetches[1] == (101, 140)  # after FIRST, before the first live update
    assert stand.delivered() == [
        (11, "CHUNK", 0),
        (12, "CHUNK", 0),
        (13, "CHUNK", 0),
        (14, "NORMAL", 0),  # its gap of 3 was the bridge's rows, delivered: none missing
        (15, "NORMAL", 0),
    ]
    sub.deliver_message(live(sub, 16, 7, UpdateType.NORMAL))
    assert stand.tasks == []  # the seam is done: delivered directly
    assert stand.delivered() == [(16, "NORMAL", 0)]


def test_the_bridge_takes_back_a_gap_of_rows_not_of_chunks() -> None:
    """The bridge's rows come in one chunk of five: the first live update's gap of six (five
    the server raced past, one real loss) is reduced by five rows, not by one chunk."""
    stand = Stand(start=95)
    sub = stand.sub
    sub.deliver_message(live(sub, 10, 1, UpdateType.FIRST))
    stand.run_tasks()
    global CHUNK
    saved, CHUNK = CHUNK, 10
    try:
        sub.deliver_message(live(sub, 17, 8, UpdateType.NORMAL))  # 11-16 not received
        stand.run_tasks()
    finally:
        CHUNK = saved
    got = stand.delivered()
    assert got[0] == (10, "FIRST", 0)
    # The recorder had 11-16 (the fake records everything): the bridge delivers all six.
    assert got[1:] == [(n, "CHUNK", 0) for n in range(11, 17)] + [(17, "NORMAL", 0)]


def test_a_real_loss_after_the_bridge_stays_counted() -> None:
    stand = Stand(start=95)
    sub = stand.sub
    sub.deliver_message(live(sub, 10, 1, UpdateType.FIRST))
    stand.run_tasks()
    sub.deliver_message(live(sub, 12, 3, UpdateType.NORMAL))  # seq 2 (value 11) skipped
    sub.deliver_message(live(sub, 14, 5, UpdateType.NORMAL))  # value 13: a real loss
    stand.run_tasks()
    assert stand.delivered() == [
        (10, "FIRST", 0),
        (11, "CHUNK", 0),
        (12, "NORMAL", 0),
        (14, "NORMAL", 1),
    ]


def test_updates_arriving_during_the_fetch_are_bridged_in_the_same_task() -> None:
    stand = Stand(start=0)
    sub = stand.sub
    sub.deliver_message(live(sub, 20, 1, UpdateType.FIRST))
    sub.deliver_message(live(sub, 22, 2, UpdateType.NORMAL))
    sub.deliver_message(live(sub, 23, 3, UpdateType.NORMAL))
    stand.run_tasks()
    assert stand.fetches == [(0, 200), (201, 220)]
    got = stand.delivered()
    assert [n for n, _, _ in got] == list(range(1, 24))  # one run: no hole, no repeat
    assert [kind for _, kind, _ in got[:19]] == ["CHUNK"] * 19
    assert got[19:22] == [(20, "FIRST", 0), (21, "CHUNK", 0), (22, "NORMAL", 0)]


def test_a_failed_fetch_is_one_error_notification_then_live() -> None:
    stand = Stand(start=0, fail=True)
    sub = stand.sub
    sub.deliver_message(live(sub, 5, 1, UpdateType.FIRST))
    stand.run_tasks()
    assert stand.delivered() == [("HistoryUnavailableError", "HISTORY", 0), (5, "FIRST", 0)]
    sub.deliver_message(live(sub, 6, 2, UpdateType.NORMAL))
    assert stand.tasks == [] and stand.delivered() == [(6, "NORMAL", 0)]


def test_a_full_queue_drops_a_live_update_rather_than_a_chunk_of_rows() -> None:
    """Once the seam is done, a full queue drops its oldest plain update; a chunk is many
    rows, which one missed update in a gap would not count: it is kept like a marker."""
    stand = Stand(start=75, queue_size=3)  # values 8 and 9: one chunk
    sub = stand.sub
    sub.deliver_message(live(sub, 10, 1, UpdateType.FIRST))
    stand.run_tasks()
    sub.deliver_message(live(sub, 11, 2, UpdateType.NORMAL))
    stand.run_tasks()  # no bridge rows (11 follows 10); the seam is done
    assert stand.tasks == []
    sub.deliver_message(live(sub, 12, 3, UpdateType.NORMAL))  # the queue is full: one goes
    assert stand.delivered() == [
        (8, "CHUNK", 0),
        (9, "CHUNK", 0),
        (10, "FIRST", 0),
        (12, "NORMAL", 1),  # 11 was dropped, and counted
    ]


def test_a_history_chunk_says_what_it_holds() -> None:
    chunk = chunk_of([1, 2, 3])
    assert chunk.rows == 3 and chunk.update_type is UpdateType.HISTORY and chunk.error is None
    assert chunk.context.acq_stamp == RECORDED[3]  # the last row's
    assert chunk.table.column_names[0] == "time"
    with pytest.raises(TypeError, match=r"3 rows in \.table"):
        chunk.data  # noqa: B018
    assert "rows=3" in repr(chunk)
