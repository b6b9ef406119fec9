"""A clock that moves only when a test says so.

Code that takes ``clock: Callable[[], float]`` (the transports, the heartbeat tracker, the
schedulers) reads time through it; with a :class:`FakeClock` a test decides when ten seconds
have passed, without sleeping, and can assert what happens just before and just after a
deadline (as trio's ``MockClock`` does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["FakeClock"]


class FakeClock:
    """A monotonic clock driven by :meth:`advance`. Thread-safe.

    ``now()`` (or calling the clock) reads the time. ``advance(seconds)`` moves it and then
    calls every callback registered with :meth:`on_advance`, so that threads waiting for a
    deadline (the in-memory dispatchers) wake up and re-check their timers.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next_id = 0

    def now(self) -> float:
        with self._lock:
            return self._now

    def __call__(self) -> float:
        return self.now()

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now()!r})"

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (>= 0), wake the listeners, return the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance({seconds!r}))")
        with self._lock:
            self._now += seconds
            now = self._now
            listeners = list(self._listeners.values())
        # Outside the lock: a listener may read the clock.
        for listener in listeners:
            listener()
        return now

    def set(self, when: float) -> None:
        """Move the clock to ``when`` (not before the current time)."""
        with self._lock:
            delta = when - self._now
        self.advance(delta)

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from the advancing thread) after each advance.

        Returns a function that unregisters it; the callback must be quick and must not block.
        """
        with self._lock:
            key = self._next_id
            self._next_id += 1
            self._listeners[key] = callback

        def remove() -> None:
            with self._lock:
                self._listeners.pop(key, None)

        return remove

    @property
    def listeners(self) -> int:
        """How many callbacks are registered (tests use it to see that none leaked)."""
        with self._lock:
            return len(self._listeners)
