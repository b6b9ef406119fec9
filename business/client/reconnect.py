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
    """Delays in seconds: ``initial * factor**n``, capped at ``maximum``, minus up to
    ``jitter`` of itself (0 <= jitter < 1)."""

    initial: float = 0.02
    maximum: float = 2.0
    factor: float = 2.0
    jitter: float = 0.25

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

    def nominal(self, attempt: int) -> float:
        """The un-jittered delay before attempt number ``attempt`` (0-based), capped."""
        # Compare exponents rather than computing factor**attempt for large attempts: after a
        # long outage ``attempt`` keeps growing and the power would overflow a float.
        delay = self.initial
        for _ in range(attempt):
            delay *= self.factor
            if delay >= self.maximum:
                return self.maximum
        return min(delay, self.maximum)


class Backoff:
    """The back-off state of one server endpoint.

    ``next_attempt(now)`` returns when to try next and advances the schedule; ``reset()`` is
    called when a connection succeeds, so the next outage starts again from ``initial``.
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
