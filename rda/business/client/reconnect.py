"""Reconnection back-off: exponential, capped, jittered; pure and clock-injected.

The transport never reconnects (docs/architecture.md); the client business layer does, and this module
decides *when*. It holds no thread and reads no clock of its own: the caller hands in ``now``
(a monotonic time from the service's clock) and gets back the time of the next attempt, so the
schedule is tested with plain numbers and a seeded random generator.

Why jitter: when a server restarts, every client lost it at the same instant; without jitter
they would all retry in lock-step and hit the new process together at each step. Jitter
spreads them. We use "equal jitter" (a random fraction taken *off* the nominal delay) rather
than "full jitter" (uniform in [0, delay]) so that the first retry is never ~0 s, which would
turn a flapping server into a busy loop, and so the cap is never exceeded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff", "BackoffPolicy"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delays in seconds: ``initial * factor**n``, capped, minus up to ``jitter`` of itself
    (0 <= jitter < 1). The cap is ``restart_cap`` for the first ``restart_window`` seconds of
    an outage (the delays so far add up to less), ``maximum`` after that.

    Why two caps (issue 27): a server killed and restarted is usually listening again within
    a few seconds, and a client waits for the back-off step in progress: with steps grown to
    1-2 s, 2,000 subscriptions resumed 0.7 s (p50) and up to 1.9 s after the new server
    listened. Steps of at most 0.25 s in the first 10 s bound that wait; a refused connect to a
    host that is up costs one SYN/RST, and after the window an outage that lasts gets the
    slow schedule again.
    """

    initial: float = 0.02
    maximum: float = 2.0
    factor: float = 2.0
    jitter: float = 0.25
    restart_cap: float = 0.25
    restart_window: float = 10.0

    def __post_init__(self) -> None:
        if self.initial <= 0:
            raise ValueError(f"initial back-off must be positive, got {self.initial}")
        if self.maximum < self.initial:
            raise ValueError(
                f"maximum back-off ({self.maximum}) must be at least the initial ({self.initial})"
            )
        if self.factor < 1:
            raise ValueError(f"back-off factor must be at least 1, got {self.factor}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.restart_cap <= 0 or self.restart_window < 0:
            raise ValueError(
                f"restart_cap must be positive and restart_window >= 0, got "
                f"{self.restart_cap} and {self.restart_window}"
            )

    def nominal(self, attempt: int) -> float:
        """The un-jittered delay before attempt number ``attempt`` (0-based), capped."""
        # Step by step: which cap applies depends on the time waited so far. Once past the
        # window and at ``maximum`` every later step is ``maximum``: return early, so a long
        # outage (``attempt`` keeps growing) costs a few dozen steps, never a power overflow.
        waited = 0.0
        grown = self.initial
        for n in range(attempt + 1):
            in_window = waited < self.restart_window
            step = min(grown, self.restart_cap if in_window else self.maximum, self.maximum)
            if n == attempt:
                break
            waited += step
            grown = min(grown * self.factor, self.maximum)
            if not in_window and grown >= self.maximum:
                return self.maximum
        return step


class Backoff:
    """The back-off state of one server endpoint.

    ``next_attempt(now)`` returns when to try next and advances the schedule; ``reset()`` is
    called when a connection that succeeded is lost after lasting at least the policy's
    ``maximum`` delay, so that outage starts again from ``initial``. A connection lost sooner
    (a server that acknowledges and then asks for a reconnection at once) is one more failed
    attempt: redialled at the initial delay each time, it made a client reconnect 57 times a
    second forever (issue 37).
    Not thread-safe: the client service calls it under its own lock.
    """

    def __init__(self, policy: BackoffPolicy | None = None, rng: random.Random | None = None):
        self.policy = policy or BackoffPolicy()
        self._rng = rng or random.Random()
        self.attempts = 0

    def __repr__(self) -> str:
        return f"Backoff(attempts={self.attempts}, policy={self.policy!r})"

    def next_delay(self) -> float:
        """The delay before the next attempt, jittered; advances the schedule."""
        nominal = self.policy.nominal(self.attempts)
        self.attempts += 1
        return nominal * (1.0 - self.policy.jitter * self._rng.random())

    def next_attempt(self, now: float) -> float:
        """The time (on the caller's clock) of the next attempt; advances the schedule."""
        return now + self.next_delay()

    def reset(self) -> None:
        """The connection succeeded: the next outage starts from ``initial`` again."""
        self.attempts = 0
