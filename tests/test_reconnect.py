"""The reconnection back-off schedule and the client's timer thread, on fake clocks."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rda.business.client.reconnect import Backoff, BackoffPolicy
from rda.business.client.timer import Timer
from rda.testing._clock import FakeClock


def test_delays_double_from_initial_up_to_the_cap_without_jitter() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.02, maximum=0.2, jitter=0.0))
    delays = [backoff.next_delay() for _ in range(7)]
    assert delays == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.2, 0.2, 0.2])
    assert backoff.attempts == 7


def test_reset_starts_the_next_outage_from_initial() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.05, maximum=1.0, jitter=0.0))
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.05)


def test_next_attempt_is_relative_to_the_given_time() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.1, maximum=1.0, jitter=0.0))
    assert backoff.next_attempt(100.0) == pytest.approx(100.1)
    assert backoff.next_attempt(200.0) == pytest.approx(200.2)


def test_seeded_jitter_is_reproducible_and_spreads_clients() -> None:
    policy = BackoffPolicy(initial=0.02, maximum=2.0, jitter=0.5)
    first, second = Backoff(policy, random.Random(7)), Backoff(policy, random.Random(7))
    a = [first.next_delay() for _ in range(8)]
    b = [second.next_delay() for _ in range(8)]
    assert a == b
    assert a != [Backoff(policy, random.Random(8)).next_delay() for _ in range(8)]
    firsts = {Backoff(policy, random.Random(seed)).next_delay() for seed in range(20)}
    assert len(firsts) > 10  # twenty clients do not retry in lock-step


@settings(max_examples=100, deadline=None)
@given(
    initial=st.floats(0.001, 1.0),
    ratio=st.floats(1.0, 100.0),
    jitter=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**32),
    steps=st.integers(1, 60),
)
def test_jittered_delays_stay_within_bounds(
    initial: float, ratio: float, jitter: float, seed: int, steps: int
) -> None:
    policy = BackoffPolicy(initial=initial, maximum=initial * ratio, jitter=jitter)
    backoff = Backoff(policy, random.Random(seed))
    for attempt in range(steps):
        nominal = policy.nominal(attempt)
        delay = backoff.next_delay()
        assert nominal * (1 - jitter) - 1e-12 <= delay <= nominal + 1e-12
        assert delay <= policy.maximum + 1e-12
        assert delay > 0


def test_nominal_survives_very_long_outages() -> None:
    policy = BackoffPolicy(initial=0.02, maximum=2.0)
    assert policy.nominal(10_000) == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0},
        {"initial": 1.0, "maximum": 0.5},
        {"factor": 0.5},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"restart_cap": 0.0},
        {"restart_window": -1.0},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(**kwargs)


def test_timer_runs_due_callbacks_when_a_fake_clock_advances(no_thread_leak: None) -> None:
    clock = FakeClock()
    timer = Timer(clock)
    fired: list[str] = []
    try:
        timer.call_at(5.0, lambda: fired.append("a"))
        timer.call_at(2.0, lambda: fired.append("b"))
        cancelled = timer.call_at(3.0, lambda: fired.append("c"))
        cancelled.cancel()
        assert timer.pending() == 2
        clock.advance(1.0)
        assert fired == []
        clock.advance(1.5)
        assert fired == ["b"]
        clock.advance(10.0)
        assert fired == ["b", "a"]
        assert timer.pending() == 0
    finally:
        timer.close()
    assert clock.listeners == 0


def test_timer_deadlines_expire_only_keys_still_live(no_thread_leak: None) -> None:
    clock = FakeClock()
    waiting = {1, 2, 3}
    expired: list[int] = []

    def expire(key: int) -> None:
        waiting.discard(key)
        expired.append(key)

    timer = Timer(clock, expire=expire, live=waiting.__contains__)
    try:
        timer.deadline(5.0, 1)
        timer.deadline(2.0, 2)
        timer.deadline(3.0, 3)
        fired: list[str] = []
        timer.call_at(2.5, lambda: fired.append("handle"))  # handles and keys share the heap
        waiting.discard(3)  # answered: nothing to cancel, its entry is skipped
        assert timer.pending() == 3
        clock.advance(2.0)
        assert expired == [2]
        clock.advance(1.0)
        assert expired == [2] and fired == ["handle"]
        clock.advance(10.0)
        assert expired == [2, 1]
        assert timer.pending() == 0
    finally:
        timer.close()


def test_timer_deadlines_of_answered_keys_do_not_pile_up(no_thread_leak: None) -> None:
    clock = FakeClock()
    waiting: set[int] = set()
    timer = Timer(clock, expire=waiting.discard, live=waiting.__contains__)
    try:
        for key in range(20_000):
            waiting.add(key)
            timer.deadline(100.0, key)
            if key >= 64:
                waiting.discard(key - 64)  # 64 in flight, answered in order
        assert timer.pending() == 64
        assert len(timer._heap) <= 2 * 1024 + 64  # pruned, not 20,000 entries
        clock.advance(200.0)
        assert waiting == set()  # the 64 still waiting expired
    finally:
        timer.close()


def test_timer_thread_fires_on_the_real_clock(no_thread_leak: None) -> None:
    timer = Timer(time.monotonic)
    done = threading.Event()
    try:
        timer.call_later(0.01, done.set)
        assert done.wait(5.0)
    finally:
        timer.close()


def test_timer_compacts_cancelled_entries_and_survives_a_raising_callback(
    no_thread_leak: None,
) -> None:
    clock = FakeClock()
    timer = Timer(clock)
    fired: list[int] = []
    try:
        handles = [timer.call_at(100.0 + i, lambda: None) for i in range(3000)]
        for handle in handles:
            handle.cancel()
        assert timer.pending() == 0
        assert len(timer._heap) < 3000  # rebuilt once cancelled entries dominated

        def boom() -> None:
            raise RuntimeError("boom")

        timer.call_at(1.0, boom)
        timer.call_at(1.0, lambda: fired.append(1))
        clock.advance(2.0)
        assert fired == [1]
    finally:
        timer.close()


def test_a_restarting_server_is_retried_at_least_every_quarter_second_for_ten_seconds() -> None:
    """Issue 27 (6): the step in progress bounds the resume after a restart; with steps grown
    to 1.3-2 s, subscriptions resumed up to 1.9 s after the restarted server listened."""
    policy = BackoffPolicy(initial=0.02, maximum=2.0, jitter=0.0)
    backoff = Backoff(policy)
    waited, steps = 0.0, []
    while waited < policy.restart_window:
        steps.append(backoff.next_delay())
        waited += steps[-1]
    assert steps[:5] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.25])
    assert max(steps) == pytest.approx(0.25)
    # A longer outage gets the slow schedule (and its retry traffic) back.
    assert backoff.next_delay() == pytest.approx(2.0)
    assert BackoffPolicy(maximum=0.1).nominal(20) == pytest.approx(0.1)  # the smaller cap wins
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.02)
