"""The seam of ``subscribe(backfill=...)``, step by step, without a network (history.Backfill).

The live messages are built as the wire delivers them; the history fetch is a function over a
list of recorded updates; the subscription's scheduler is a list of tasks run by the test, so
every interleaving below is chosen, not hoped for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from rda.business.client.history import Backfill
from rda.business.client.statistics import ClientCounters
from rda.business.client.subscriptions import Notification, Subscription
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError, HistoryUnavailableError
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


class Stand:
    def __init__(self, start: int, fail: bool = False) -> None:
        self.tasks: list[Callable[[], None]] = []
        self.fetches: list[tuple[int, int]] = []
        self.fail = fail
        self.crash = False

        def submit(group: str, task: Callable[[], None], on_drop: object) -> bool:
            self.tasks.append(task)
            return True

        self.sub = Subscription(
            7, "tcp://x", "CNT", "Count", "", None, None, 1000, ClientCounters(), submit,
            lambda s: None, Backfill(self.fetch, start),
        )  # fmt: skip

    def fetch(self, start: int, until: int) -> Iterator[Notification]:
        self.fetches.append((start, until))
        if self.crash:
            raise RuntimeError("bug in a fetch")
        if self.fail:
            raise HistoryUnavailableError("no recorder")
        for n, stamp in RECORDED.items():
            if start <= stamp < until:
                yield Notification(Data(n=n), DataContext(acq_stamp=stamp), UpdateType.HISTORY)

    def run_tasks(self) -> None:
        while self.tasks:
            self.tasks.pop(0)()

    def delivered(self) -> list[tuple[int | str, str]]:
        out: list[tuple[int | str, str]] = []
        while (n := self.sub.poll_nowait()) is not None:
            what = type(n.error).__name__ if n.error is not None else int(n.data["n"])
            out.append((what, n.update_type.name))
        return out


def test_history_then_first_then_a_bridge_over_the_update_the_server_raced_past() -> None:
    stand = Stand(start=35)  # from counter value 4 (stamp 40) on
    sub = stand.sub
    sub.deliver_message(live(sub, 10, 1, UpdateType.FIRST))
    assert stand.delivered() == []  # held until its past is delivered
    stand.run_tasks()
    assert stand.fetches == [(35, 100)]  # [start, stamp of FIRST)
    assert stand.delivered() == [(n, "HISTORY") for n in range(4, 10)] + [(10, "FIRST")]
    # Value 11 was published between the server's get for FIRST and the activation of this
    # subscriber: the live stream goes on with 12 at the next sequence number, no gap shown.
    sub.deliver_message(live(sub, 12, 2, UpdateType.NORMAL))
    sub.deliver_message(live(sub, 13, 3, UpdateType.NORMAL))
    assert stand.delivered() == []
    stand.run_tasks()
    assert stand.fetches[1] == (101, 120)  # after FIRST, before the first live update
    assert stand.delivered() == [(11, "HISTORY"), (12, "NORMAL"), (13, "NORMAL")]
    sub.deliver_message(live(sub, 14, 4, UpdateType.NORMAL))
    assert stand.tasks == []  # the seam is done: delivered directly
    assert stand.delivered() == [(14, "NORMAL")]


def test_the_bridge_takes_back_the_gap_the_server_counted_for_what_it_covers() -> None:
    """A server counts what it published while it prepared FIRST as missed (the next seq
    skips it, issue 36); the bridge delivers those rows from the recorder, so the first live
    update after it must not report them missing too."""
    stand = Stand(start=95)
    sub = stand.sub
    sub.deliver_message(live(sub, 10, 1, UpdateType.FIRST))
    stand.run_tasks()
    sub.deliver_message(live(sub, 12, 3, UpdateType.NORMAL))  # seq 2 (value 11) skipped
    sub.deliver_message(live(sub, 14, 5, UpdateType.NORMAL))  # value 13: a real loss
    stand.run_tasks()
    got = []
    while (n := sub.poll_nowait()) is not None:
        got.append((int(n.data["n"]), n.update_type.name, n.gap))
    assert got == [
        (10, "FIRST", 0),
        (11, "HISTORY", 0),
        (12, "NORMAL", 0),  # its gap of 1 was value 11, delivered by the bridge
        (14, "NORMAL", 1),  # a gap after the seam stays counted
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
    assert [n for n, _ in got] == list(range(1, 24))
    assert got[19] == (20, "FIRST") and got[20] == (21, "HISTORY") and got[21] == (22, "NORMAL")


def test_a_failed_fetch_is_one_error_notification_then_live() -> None:
    stand = Stand(start=0, fail=True)
    sub = stand.sub
    sub.deliver_message(live(sub, 5, 1, UpdateType.FIRST))
    stand.run_tasks()
    assert stand.delivered() == [("HistoryUnavailableError", "HISTORY"), (5, "FIRST")]
    sub.deliver_message(live(sub, 6, 2, UpdateType.NORMAL))  # one error, not one per phase
    assert stand.tasks == [] and stand.delivered() == [(6, "NORMAL")]


def test_an_outage_before_the_first_live_update_ends_the_bridge() -> None:
    stand = Stand(start=0)
    sub = stand.sub
    sub.deliver_message(live(sub, 3, 1, UpdateType.FIRST))
    stand.run_tasks()
    stand.delivered()
    sub.deliver_error(DisconnectedError("lost"))
    sub.deliver_message(live(sub, 9, 1, UpdateType.FIRST))  # re-subscribed: a new sequence
    sub.deliver_message(live(sub, 10, 2, UpdateType.NORMAL))
    assert stand.tasks == []  # no second backfill after an outage (documented)
    assert stand.delivered() == [
        ("DisconnectedError", "NORMAL"),
        (9, "FIRST"),
        (10, "NORMAL"),
    ]


def test_the_protocol_page_lists_every_update_type() -> None:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    listing = ", ".join(f"{t.name} {t.value}" for t in UpdateType)
    assert listing == "NORMAL 0, FIRST 1, IMMEDIATE 2, HISTORY 3"
    assert f"update type, u8: `{listing}`" in text
    assert f"Update types: `{listing}`" in text


def test_a_fetch_that_breaks_is_reported_and_the_subscription_goes_live() -> None:
    stand = Stand(start=0)
    stand.crash = True
    sub = stand.sub
    sub.deliver_message(live(sub, 5, 1, UpdateType.FIRST))
    stand.run_tasks()
    assert stand.delivered() == [("HistoryUnavailableError", "HISTORY"), (5, "FIRST")]
    sub.deliver_message(live(sub, 6, 2, UpdateType.NORMAL))  # no bridge after a failure
    assert stand.tasks == []
    assert stand.delivered() == [(6, "NORMAL")]
