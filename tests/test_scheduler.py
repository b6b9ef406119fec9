"""GroupTaskScheduler: per-group FIFO, parallel groups, overflow policies, shutdown.

Concurrency is proven with events and barriers, never with sleeps; every wait is bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rda.business.scheduler import GroupTaskScheduler, OverflowPolicy, SchedulerStatistics
from rda.serialization import binary
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.testing import wait_until

WAIT = 10.0  # generous bound for conditions that normally hold within milliseconds


@pytest.fixture
def scheduler_factory() -> Iterator[Callable[..., GroupTaskScheduler]]:
    made: list[GroupTaskScheduler] = []

    def make(**kwargs: object) -> GroupTaskScheduler:
        sched = GroupTaskScheduler(**kwargs)  # type: ignore[arg-type]
        made.append(sched)
        return sched

    yield make
    for sched in made:
        sched.close()


class Blocker:
    """A task that signals it started and then waits until released: pins a group busy."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.started.set()
        assert self.release.wait(WAIT)


def test_tasks_of_one_group_run_in_fifo_order_one_at_a_time(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=4, queue_limit=10_000)
    groups = ["A", "B", "C"]
    seen: dict[str, list[int]] = {g: [] for g in groups}
    active = dict.fromkeys(groups, 0)
    overlap: list[str] = []
    guard = threading.Lock()

    def task(group: str, i: int) -> None:
        with guard:
            active[group] += 1
            if active[group] > 1:
                overlap.append(group)
        seen[group].append(i)
        with guard:
            active[group] -= 1

    n = 300
    for i in range(n):
        for g in groups:
            assert sched.submit(g, partial(task, g, i))
    wait_until(lambda: sched.statistics().executed == n * len(groups))
    assert overlap == []
    for g in groups:
        assert seen[g] == list(range(n))


def test_different_groups_run_in_parallel(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=2)
    # Each task waits at the barrier: it only passes if both run at the same time.
    barrier = threading.Barrier(2, timeout=WAIT)
    passed: list[str] = []

    def meet(name: str) -> None:
        barrier.wait()
        passed.append(name)

    assert sched.submit("A", lambda: meet("A"))
    assert sched.submit("B", lambda: meet("B"))
    wait_until(lambda: sched.statistics().executed == 2)
    assert sorted(passed) == ["A", "B"]
    assert sched.statistics().failed == 0


def test_one_busy_group_does_not_block_another(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=2)
    block = Blocker()
    assert sched.submit("flooded", block)
    assert block.started.wait(WAIT)
    for _ in range(5):
        sched.submit("flooded", lambda: None)
    admin = threading.Event()
    assert sched.submit("admin", admin.set)
    assert admin.wait(WAIT)
    assert sched.queue_depth("flooded") == 5
    block.release.set()


def test_reject_policy_refuses_and_counts(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=1, queue_limit=2, policy="reject")
    block = Blocker()
    sched.submit("PS1", block)
    assert block.started.wait(WAIT)
    ran: list[int] = []
    drops: list[int] = []
    assert sched.submit("PS1", lambda: ran.append(1))
    assert sched.submit("PS1", lambda: ran.append(2))
    assert not sched.submit("PS1", lambda: ran.append(3), on_drop=lambda: drops.append(3))
    assert sched.queue_depth("PS1") == 2
    block.release.set()
    wait_until(lambda: sched.statistics().executed == 3)
    assert ran == [1, 2]
    assert drops == []  # a rejected task is the caller's to answer, not a drop
    stats = sched.statistics()
    assert (stats.rejected, stats.dropped_newest, stats.dropped_oldest) == (1, 0, 0)


def test_drop_newest_discards_the_new_task_and_calls_its_on_drop(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=1, queue_limit=2, policy="drop_newest")
    block = Blocker()
    sched.submit("PS1", block)
    assert block.started.wait(WAIT)
    ran: list[int] = []
    drops: list[int] = []
    for i in range(4):
        sched.submit("PS1", partial(ran.append, i), on_drop=partial(drops.append, i))
    assert drops == [2, 3]  # called synchronously, in the submitting thread
    block.release.set()
    wait_until(lambda: sched.statistics().executed == 3)
    assert ran == [0, 1]
    stats = sched.statistics()
    assert (stats.rejected, stats.dropped_newest, stats.dropped_oldest) == (0, 2, 0)


def test_drop_oldest_evicts_the_oldest_waiting_task(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=1, queue_limit=2, policy="drop_oldest")
    block = Blocker()
    sched.submit("PS1", block)
    assert block.started.wait(WAIT)
    ran: list[int] = []
    drops: list[tuple[int, str]] = []

    def record_drop(i: int) -> None:
        drops.append((i, threading.current_thread().name))

    results = [
        sched.submit(
            "PS1",
            partial(ran.append, i),
            on_drop=partial(record_drop, i),
        )
        for i in range(5)
    ]
    assert results == [True] * 5
    me = threading.current_thread().name
    assert drops == [(0, me), (1, me), (2, me)]
    block.release.set()
    wait_until(lambda: sched.statistics().executed == 3)
    assert ran == [3, 4]
    stats = sched.statistics()
    assert (stats.rejected, stats.dropped_newest, stats.dropped_oldest) == (0, 0, 3)
    assert stats.max_queue_depth == 2


def test_overflow_is_per_group(scheduler_factory: Callable[..., GroupTaskScheduler]) -> None:
    sched = scheduler_factory(workers=1, queue_limit=1, policy="reject")
    block = Blocker()
    sched.submit("A", block)
    assert block.started.wait(WAIT)
    assert sched.submit("A", lambda: None)
    assert not sched.submit("A", lambda: None)
    assert sched.submit("B", lambda: None)  # B has its own queue
    block.release.set()


def test_raising_task_is_logged_counted_and_the_worker_lives_on(
    scheduler_factory: Callable[..., GroupTaskScheduler], caplog: pytest.LogCaptureFixture
) -> None:
    sched = scheduler_factory(workers=1)

    def boom() -> None:
        raise ValueError("handler exploded")

    after = threading.Event()
    with caplog.at_level(logging.ERROR, logger="rda.business.scheduler"):
        sched.submit("PS1", boom)
        sched.submit("PS1", after.set)
        assert after.wait(WAIT)
        wait_until(lambda: sched.statistics().executed == 1)
    stats = sched.statistics()
    assert (stats.failed, stats.executed) == (1, 1)
    records = [r for r in caplog.records if "PS1" in r.getMessage()]
    assert records and records[0].exc_info is not None
    assert "handler exploded" in str(records[0].exc_info[1])


def test_raising_on_drop_does_not_reach_the_submitter(
    scheduler_factory: Callable[..., GroupTaskScheduler], caplog: pytest.LogCaptureFixture
) -> None:
    sched = scheduler_factory(workers=1, queue_limit=1, policy="drop_newest")
    block = Blocker()
    sched.submit("PS1", block)
    assert block.started.wait(WAIT)
    sched.submit("PS1", lambda: None)

    def bad_drop() -> None:
        raise RuntimeError("on_drop failed")

    with caplog.at_level(logging.ERROR, logger="rda.business.scheduler"):
        assert not sched.submit("PS1", lambda: None, on_drop=bad_drop)
    assert any("on_drop" in r.getMessage() for r in caplog.records)
    block.release.set()


def test_statistics_track_queue_running_and_groups(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=2, queue_limit=10)
    assert sched.statistics() == SchedulerStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0)
    a, b = Blocker(), Blocker()
    sched.submit("A", a)
    sched.submit("B", b)
    assert a.started.wait(WAIT) and b.started.wait(WAIT)
    for _ in range(3):
        sched.submit("A", lambda: None)
    sched.submit("B", lambda: None)
    stats = sched.statistics()
    assert (stats.running, stats.queued, stats.groups, stats.max_queue_depth) == (2, 4, 2, 3)
    assert sched.queue_depth("A") == 3 and sched.queue_depth("nobody") == 0
    a.release.set()
    b.release.set()
    wait_until(lambda: sched.statistics().executed == 6)
    stats = sched.statistics()
    assert (stats.running, stats.queued) == (0, 0)
    # Idle groups are forgotten: memory does not grow with distinct keys.
    wait_until(lambda: sched.statistics().groups == 0)


def test_many_distinct_groups_leave_nothing_behind(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=2)
    for i in range(2000):
        sched.submit(f"sub-{i}", lambda: None)
    wait_until(lambda: sched.statistics().executed == 2000)
    assert sched.statistics().groups == 0
    assert sched._groups == {} and len(sched._ready) == 0


def test_close_while_busy_finishes_running_and_drops_waiting() -> None:
    before = set(threading.enumerate())
    sched = GroupTaskScheduler(workers=2, name="closing")
    block = Blocker()
    finished = threading.Event()

    def running() -> None:
        block()
        finished.set()

    sched.submit("A", running)
    assert block.started.wait(WAIT)
    ran: list[int] = []
    drops: list[int] = []
    for i in range(3):
        sched.submit("A", partial(ran.append, i), on_drop=partial(drops.append, i))

    # Release the running task only once close() has begun, from another thread.
    def release_when_closing() -> None:
        wait_until(lambda: sched.closed)
        block.release.set()

    releaser = threading.Thread(target=release_when_closing)
    releaser.start()
    sched.close(timeout=WAIT)
    releaser.join(WAIT)
    assert finished.is_set()  # the running task was allowed to finish
    assert ran == []
    assert drops == [0, 1, 2]
    assert not sched.submit("A", lambda: None)
    assert sched.statistics().rejected == 1
    assert set(threading.enumerate()) <= before  # no worker thread outlives close
    sched.close()  # idempotent


def test_worker_threads_are_named_and_gone_after_close() -> None:
    before = set(threading.enumerate())
    with GroupTaskScheduler(workers=3, name="named") as sched:
        names = {t.name for t in threading.enumerate()} - {t.name for t in before}
        assert names == {"named-0", "named-1", "named-2"}
        assert sched.submit("x", lambda: None)
    assert set(threading.enumerate()) <= before


def test_close_is_bounded_when_a_task_does_not_finish(caplog: pytest.LogCaptureFixture) -> None:
    sched = GroupTaskScheduler(workers=1, name="stuck")
    block = Blocker()
    sched.submit("A", block)
    assert block.started.wait(WAIT)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rda.business.scheduler"):
        sched.close(timeout=0.05)
    assert time.monotonic() - start < WAIT
    assert any("stuck-0" in r.getMessage() for r in caplog.records)
    block.release.set()
    sched._threads[0].join(WAIT)
    assert not sched._threads[0].is_alive()


def test_close_from_inside_a_task_does_not_deadlock() -> None:
    sched = GroupTaskScheduler(workers=1, name="self-closing")
    done = threading.Event()

    def closer() -> None:
        sched.close(timeout=WAIT)
        done.set()

    sched.submit("A", closer)
    assert done.wait(WAIT)
    sched._threads[0].join(WAIT)
    assert not sched._threads[0].is_alive()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "workers"),
        ({"queue_limit": 0}, "queue_limit"),
        ({"policy": "drop_random"}, "drop_random"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GroupTaskScheduler(**kwargs)  # type: ignore[arg-type]


def test_a_dropped_task_never_decodes_its_body(
    scheduler_factory: Callable[..., GroupTaskScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[bytes] = []

    def counting_decode(frame: bytes | memoryview) -> object:
        decoded.append(bytes(frame))
        return {"decoded": bytes(frame)}

    monkeypatch.setattr(binary, "decode", counting_decode, raising=False)

    def message(body: bytes) -> Message:
        header = Header(RequestType.SET, 1, "PS1", "Setting")
        return Message(header, [(BodyKind.DATA, memoryview(body))])

    sched = scheduler_factory(workers=1, queue_limit=1, policy="drop_oldest")
    block = Blocker()
    sched.submit("PS1", block)
    assert block.started.wait(WAIT)

    dropped_msg, kept_msg = message(b"dropped-body"), message(b"kept-body")
    dropped_calls: list[str] = []
    bodies: list[object] = []
    sched.submit(
        "PS1", lambda: bodies.append(dropped_msg.data), on_drop=lambda: dropped_calls.append("x")
    )
    sched.submit("PS1", lambda: bodies.append(kept_msg.data))
    assert dropped_calls == ["x"]
    block.release.set()
    wait_until(lambda: sched.statistics().executed == 2)
    assert decoded == [b"kept-body"]
    assert bodies == [{"decoded": b"kept-body"}]
    # The dropped body was never decoded: reading it now is its first decode.
    assert dropped_msg.data == {"decoded": b"dropped-body"}
    assert decoded == [b"kept-body", b"dropped-body"]


def test_concurrent_submitters_keep_per_group_order(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=4, queue_limit=100_000)
    n_threads, per_thread, n_groups = 3, 1000, 20
    seen: dict[str, list[tuple[int, int]]] = {f"g{i}": [] for i in range(n_groups)}
    start = threading.Barrier(n_threads, timeout=WAIT)

    def submitter(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            group = f"g{i % n_groups}"
            assert sched.submit(group, partial(seen[group].append, (t, i)))

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    wait_until(lambda: sched.statistics().executed == n_threads * per_thread)
    for records in seen.values():
        for t in range(n_threads):
            mine = [i for who, i in records if who == t]
            assert mine == sorted(mine) and len(mine) == per_thread // n_groups
    wait_until(lambda: sched.statistics().groups == 0)


def test_a_task_may_submit_to_its_own_group(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=1)
    order: list[int] = []
    done = threading.Event()

    def step(i: int) -> None:
        order.append(i)
        if i < 5:
            assert sched.submit("chain", partial(step, i + 1))
        else:
            done.set()

    sched.submit("chain", partial(step, 0))
    assert done.wait(WAIT)
    assert order == [0, 1, 2, 3, 4, 5]


def test_groups_take_turns_so_a_flood_cannot_starve_another_group(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=1)
    block = Blocker()
    order: list[str] = []
    sched.submit("flooded", block)
    assert block.started.wait(WAIT)
    for i in range(100):
        sched.submit("flooded", partial(order.append, f"flood-{i}"))
    sched.submit("admin", partial(order.append, "admin"))
    block.release.set()
    wait_until(lambda: sched.statistics().executed == 102)
    # Groups take turns: "admin" became ready while "flooded" was running, so it goes next,
    # ahead of the 100 flood tasks queued before it (a global FIFO would put it last).
    assert order.index("admin") == 0
    assert order[1:] == [f"flood-{i}" for i in range(100)]


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(["reject", "drop_oldest", "drop_newest"]),
    limit=st.integers(1, 3),
    groups=st.lists(st.sampled_from("abc"), max_size=12),
)
def test_overflow_matches_a_model(policy: OverflowPolicy, limit: int, groups: list[str]) -> None:
    """With the only worker pinned, every submission is decided by the queue state alone."""
    model: dict[str, deque[int]] = {g: deque() for g in "abc"}
    expected_drops: list[int] = []
    expected_results: list[bool] = []
    for i, g in enumerate(groups):
        queue = model[g]
        if len(queue) < limit:
            queue.append(i)
            expected_results.append(True)
        elif policy == "reject":
            expected_results.append(False)
        elif policy == "drop_newest":
            expected_drops.append(i)
            expected_results.append(False)
        else:
            expected_drops.append(queue.popleft())
            queue.append(i)
            expected_results.append(True)

    ran: dict[str, list[int]] = {g: [] for g in "abc"}
    drops: list[int] = []
    with GroupTaskScheduler(workers=1, queue_limit=limit, policy=policy) as sched:
        block = Blocker()
        sched.submit("pin", block)
        assert block.started.wait(WAIT)
        try:
            results = [
                sched.submit(g, partial(ran[g].append, i), on_drop=partial(drops.append, i))
                for i, g in enumerate(groups)
            ]
            assert results == expected_results
            assert drops == expected_drops
            depths = {g: sched.queue_depth(g) for g in "abc"}
            assert depths == {g: len(q) for g, q in model.items()}
            stats = sched.statistics()
            assert stats.queued == sum(len(q) for q in model.values())
            assert stats.rejected == expected_results.count(False) - (
                len(expected_drops) if policy == "drop_newest" else 0
            )
            assert stats.dropped_oldest + stats.dropped_newest == len(expected_drops)
        finally:
            block.release.set()  # a failed example must not leave the worker pinned
        total = 1 + stats.queued
        wait_until(lambda: sched.statistics().executed == total)
    assert ran == {g: list(q) for g, q in model.items()}


def test_busy_groups_interleave_on_one_worker(
    scheduler_factory: Callable[..., GroupTaskScheduler],
) -> None:
    sched = scheduler_factory(workers=1)
    block = Blocker()
    sched.submit("pin", block)
    assert block.started.wait(WAIT)
    order: list[str] = []
    for i in range(3):
        sched.submit("a", partial(order.append, f"a{i}"))
    for i in range(3):
        sched.submit("b", partial(order.append, f"b{i}"))
    block.release.set()
    wait_until(lambda: sched.statistics().executed == 7)
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]
