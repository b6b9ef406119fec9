"""The simulation's driver: every piece of background work, run one step at a time.

It implements ``rda.business.driver.Driver``: the business layer's schedulers, timers and
deadline watchers, and the in-memory transports' dispatchers, made while it is installed,
are adopted here instead of starting threads. Each adopted part belongs to the process
(``owner``) that was being built or stepped when it was made, so that a paused process does
nothing and a crashed one loses all of its parts at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rda.business.driver import Background

__all__ = ["Adopted", "SimClock", "SimDriver", "SimWallClock"]


class SimClock:
    """Simulated monotonic time, read by every part of a run; only the simulation moves it.

    A ``FakeClock`` without its lock and listeners: a run has one thread, and no part of it
    waits for an advance (the driver steps the timers itself), so ``on_advance`` registers
    nothing. It is read hundreds of thousands of times per run.
    """

    __slots__ = ("now",)

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def set(self, when: float) -> None:
        if when < self.now:
            raise ValueError(f"a clock cannot go backwards (set({when!r}) at {self.now!r})")
        self.now = when

    def on_advance(self, callback: Callable[[], None]) -> Callable[[], None]:
        return _nothing


def _nothing() -> None:
    return None


class SimWallClock:
    """The wall clock of each simulated machine: simulated time plus that machine's steps.

    Installed as the business layer's wall clock (``rda.business.driver.wall_clock``) for a
    run. A read belongs to the process the driver is running (``SimDriver.owner``), and a
    process to its machine: a server's incarnations (``S0#2``) and a client's paused
    listeners (``C1/listeners``) share their machine's clock, which keeps its steps across
    a restart, as a real machine's does. The monotonic ``SimClock`` never steps.
    """

    #: Simulated START is this wall-clock time (a date in 2027, seconds since the epoch).
    EPOCH = 1_800_000_000.0

    def __init__(self, clock: SimClock, driver: SimDriver) -> None:
        self._clock = clock
        self._driver = driver
        self._base = self.EPOCH - clock.now
        self.offsets: dict[str, float] = {}  # machine -> how far its wall clock was stepped
        self._machines: dict[str, str] = {}

    @staticmethod
    def machine(owner: str) -> str:
        return owner.split("#")[0].split("/")[0]

    def offset(self, owner: str) -> float:
        machine = self._machines.get(owner)
        if machine is None:
            machine = self._machines[owner] = self.machine(owner)
        return self.offsets.get(machine, 0.0)

    def step(self, machine: str, seconds: float) -> None:
        self.offsets[machine] = self.offsets.get(machine, 0.0) + seconds

    def seconds(self) -> float:
        return self._clock.now + self._base + self.offset(self._driver.owner)

    def nanoseconds(self) -> int:
        return round(self.seconds() * 1e9)


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
