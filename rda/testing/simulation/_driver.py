"""The simulation's driver: every piece of background work, run one step at a time.

It implements ``rda.business.driver.Driver``: the business layer's schedulers, timers and
deadline watchers, and the in-memory transports' dispatchers, made while it is installed,
are adopted here instead of starting threads. Each adopted part belongs to the process
(``owner``) that was being built or stepped when it was made, so that a paused process does
nothing and a crashed one loses all of its parts at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rda.business.driver import Background

__all__ = ["Adopted", "SimDriver"]


@dataclass(slots=True, eq=False)
class Adopted:
    """One adopted part and the simulated process it belongs to."""

    owner: str
    work: Background


class SimDriver:
    """Holds the adopted parts in adoption order (deterministic for a given seed)."""

    def __init__(self) -> None:
        self.parts: list[Adopted] = []
        self.owner = "sim"
        self.paused: set[str] = set()
        self.dead: set[str] = set()

    # --- rda.business.driver.Driver ---

    def adopt(self, work: Background) -> None:
        self.parts.append(Adopted(self.owner, work))

    def release(self, work: Background) -> None:
        self.parts = [p for p in self.parts if p.work is not work]

    # --- the simulation ---

    @contextmanager
    def owning(self, owner: str) -> Iterator[None]:
        """Parts made (and work done) inside belong to ``owner``."""
        before, self.owner = self.owner, owner
        try:
            yield
        finally:
            self.owner = before

    def ready(self) -> list[Adopted]:
        """Parts of running processes that can do something now."""
        blocked = self.paused
        return [p for p in self.parts if p.owner not in blocked and p.work.ready()]

    def next_deadline(self) -> float | None:
        blocked = self.paused
        best: float | None = None
        for p in self.parts:
            if p.owner in blocked:
                continue
            at = p.work.next_deadline()
            if at is not None and (best is None or at < best):
                best = at
        return best

    def step(self, part: Adopted) -> None:
        with self.owning(part.owner):
            part.work.step()

    def crash(self, owner: str) -> None:
        """The process died: its parts are gone, none runs again."""
        self.parts = [p for p in self.parts if p.owner != owner]
        self.dead.add(owner)
