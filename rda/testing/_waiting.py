"""A bounded wait for a condition that another thread, process or socket will make true.

A test of real ZeroMQ, of a dispatcher thread or of a subprocess cannot know when the other
side will have done its work: on a loaded machine a thread can be descheduled for seconds.
:func:`wait_until` polls the condition with a generous bound, so that a slow machine makes
such a test slower but never red, and when the bound does pass the ``AssertionError`` says
what never happened. It waits *for* something; it is never the evidence that something did
*not* happen (prove that with a later event or a counter).

Where time itself is the subject (heartbeats, deadlines), drive it with :class:`FakeClock`
instead of waiting for it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
"""Seconds :func:`wait_until` waits by default: generous, for a loaded 2-core machine."""

# The first re-check comes quickly (most conditions hold within a millisecond or two), then the
# pauses double up to a short cap: no busy spin stealing the core the awaited thread needs,
# and at most a few hundredths of a second between the condition holding and the test seeing it.
_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.02
_LONGEST_REPR = 500


def wait_until(
    predicate: Callable[[], T | None],
    message: str = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    probe: Callable[[], object] | None = None,
) -> T:
    """Wait until ``predicate()`` returns something truthy, and return it (never ``None``).

    ``predicate`` is called at once, then again after pauses that grow from 1 ms to 20 ms,
    until it holds or ``timeout`` seconds (default 10) have passed; it is called one last
    time at the deadline. If it never holds, ``AssertionError`` says
    what was awaited: ``message`` (say what should happen, e.g. ``"the server to drop the
    peer"``; without one, the predicate's source), and, when ``probe`` is given, what
    ``probe()`` returned at the end, so that a failing test shows how far things got.

    Exceptions from ``predicate`` propagate at once. The time is real time
    (``time.monotonic``): a :class:`FakeClock` does not move it.

    Example::

        from rda.testing import wait_until

        received: list[rda.Notification] = []
        client.access_point("PSU1", "Acquisition").subscribe(listener=received.append)
        wait_until(
            lambda: len(received) >= 3,
            "three notifications",
            probe=lambda: received,
        )
        # on timeout: AssertionError: timed out after 10 s waiting for three notifications
        #             (last probe: [Notification(...)])

    Being truthy is the condition, so a predicate can return what it found::

        line = wait_until(lambda: find_line(log_path, "listening"), "the server to listen")
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, not {timeout!r}")
    deadline = time.monotonic() + timeout
    pause = _FIRST_PAUSE
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE)
    raise AssertionError(_timed_out(predicate, message, timeout, probe))


def _timed_out(
    predicate: Callable[[], object],
    message: str,
    timeout: float,
    probe: Callable[[], object] | None,
) -> str:
    text = f"timed out after {timeout:g} s waiting for {message or _describe(predicate)}"
    if probe is not None:
        try:
            seen = _short(repr(probe()))
        except Exception as error:  # the report must not hide the timeout behind another error
            seen = f"<probe raised {error!r}>"
        text += f" (last probe: {seen})"
    return text


def _describe(predicate: Callable[[], object]) -> str:
    """A lambda's own source (``lambda: len(seen) == 3``), a function's name otherwise."""
    name = getattr(predicate, "__qualname__", None)
    if name is not None and "<lambda>" not in name:
        return f"{name}()"
    try:
        lines = inspect.getsource(predicate).split("\n")
    except (OSError, TypeError):
        return repr(predicate)
    text = " ".join(line.strip() for line in lines if line.strip())
    start = text.find("lambda")
    return _short(text if start < 0 else _expression(text[start:]))


def _expression(text: str) -> str:
    """``text`` up to the comma or closing bracket that ends the expression it starts with
    (getsource gives the whole lines the lambda is on: the call around it too)."""
    depth = 0
    quote = ""
    for at, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return text[:at].strip()
            depth -= 1
        elif char in ",#" and depth == 0:
            return text[:at].strip()
    return text.strip()


def _short(text: str) -> str:
    return text if len(text) <= _LONGEST_REPR else text[: _LONGEST_REPR - 3] + "..."
