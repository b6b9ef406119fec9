"""rda.testing.wait_until: waits for what another thread does, and says what never happened."""

from __future__ import annotations

import threading

import pytest

from rda.testing import wait_until


def test_returns_at_once_what_the_predicate_found() -> None:
    assert wait_until(lambda: [1, 2], "a list") == [1, 2]


def test_waits_for_another_thread() -> None:
    done: list[str] = []
    release = threading.Event()

    def work() -> None:
        release.wait(10)
        done.append("work")

    worker = threading.Thread(target=work, name="worker", daemon=True)
    worker.start()
    release.set()
    assert wait_until(lambda: done, "the worker to finish") == ["work"]
    worker.join(10)


def test_a_timeout_says_what_was_awaited_and_what_the_probe_saw() -> None:
    seen = [1, 2]
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: len(seen) == 3, "three items", timeout=0.05, probe=lambda: seen)
    assert (
        str(failed.value) == "timed out after 0.05 s waiting for three items (last probe: [1, 2])"
    )


def test_without_a_message_the_lambda_s_source_is_named() -> None:
    seen = {"a": [1]}
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: len(seen["a"]) == 2, timeout=0.01)  # a comment, (not) part of it
    assert str(failed.value) == 'timed out after 0.01 s waiting for lambda: len(seen["a"]) == 2'
    with pytest.raises(AssertionError) as failed:
        wait_until(
            lambda: sorted(seen, key=lambda k: (k, 0)) == [],
            timeout=0.01,
        )
    assert str(failed.value).endswith(
        "waiting for lambda: sorted(seen, key=lambda k: (k, 0)) == []"
    )


def test_without_a_message_a_named_function_is_named() -> None:
    def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"waiting for .*never\(\)$"):
        wait_until(never, timeout=0.01)


def test_a_probe_that_fails_does_not_hide_the_timeout() -> None:
    def broken() -> object:
        raise RuntimeError("probe broke")

    with pytest.raises(AssertionError, match=r"waiting for x \(last probe: <probe raised"):
        wait_until(lambda: False, "x", timeout=0.01, probe=broken)


def test_the_predicate_s_own_error_propagates_at_once() -> None:
    calls = 0

    def fails() -> bool:
        nonlocal calls
        calls += 1
        raise KeyError("gone")

    with pytest.raises(KeyError):
        wait_until(fails, "never", timeout=5.0)
    assert calls == 1


def test_it_polls_with_back_off_not_a_busy_spin() -> None:
    # Pauses grow from 1 ms to 20 ms: within 0.3 s that is at most about 20 calls. A loaded
    # machine only makes the count smaller, so the bound cannot be broken by slowness.
    calls = 0

    def never() -> bool:
        nonlocal calls
        calls += 1
        return False

    with pytest.raises(AssertionError):
        wait_until(never, "never", timeout=0.3)
    assert 2 <= calls <= 40


def test_the_predicate_is_checked_once_more_at_the_deadline() -> None:
    calls = 0

    def late() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 2

    # A timeout shorter than the first pause: one call now, one after sleeping to the deadline.
    assert wait_until(late, "a second look", timeout=0.0001)


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        wait_until(lambda: True, "anything", timeout=0)
