"""What a simulated run is made of: its faults, its size, the trace and a broken invariant."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["ALL_FAULTS", "InvariantBroken", "SimSettings", "Trace"]

#: Every fault the simulator can inject (``--faults`` takes a comma-separated subset).
ALL_FAULTS: tuple[str, ...] = (
    "delay",  # message transit times drawn from the seed (order between connections varies)
    "reset",  # a connection reset: both ends hear it, what was in flight is lost
    "partition",  # a half-open connection for a while: only heartbeats can tell
    "stall",  # a client's pipe is full for a while: per-peer queue, conflation, drops
    "pause",  # a client or server process paused (SIGSTOP) for a while, past heartbeats
    "crash",  # a server process killed, restarted at its endpoint after a while
    "handler-error",  # a get or set handler raises
    "overrun",  # a handler completes after its client's deadline
    "slow-consumer",  # a client's listeners paused while its dispatcher runs
    "policy-reload",  # a server's RBAC policy replaced (who may set changes)
    "churn",  # a client process ends (closing its service) and another starts
    "clock-step",  # a machine's wall clock jumps (seconds to hours, either way)
)


@dataclass(frozen=True, slots=True)
class SimSettings:
    """The size of a run; the seed draws everything else (topology, workload, faults)."""

    faults: frozenset[str] = frozenset(ALL_FAULTS)
    max_servers: int = 2
    max_clients: int = 3
    #: Simulated seconds of workload and faults, then a quiet period to check progress.
    duration: float = 3.0
    quiet: float = 10.0
    max_steps: int = 200_000
    #: Admin commands (``info``, ``clients``, ``subscriptions``) in the workload. Off, a seed
    #: draws exactly what it drew before they were added (the regression seeds' world).
    admin: bool = True
    #: Devices complete each ``Acq`` get up to 20 ms after reading the value (as a device
    #: thread would; ``request.complete`` from elsewhere). Off by default so that recorded
    #: seeds keep their schedules; it found the FIRST-seam loss (docs/testing.md).
    late_gets: bool = False


class InvariantBroken(AssertionError):
    """A named invariant does not hold; ``str()`` says what broke."""

    def __init__(self, name: str, message: str, at: float) -> None:
        super().__init__(f"[{name}] at t={at:.6f}: {message}")
        self.name = name
        self.detail = message
        self.at = at

    def __reduce__(self) -> tuple[type[InvariantBroken], tuple[str, str, float]]:
        return (InvariantBroken, (self.name, self.detail, self.at))  # across processes


@dataclass(slots=True)
class Trace:
    """The last events of a run (what a failure prints), kept cheaply as tuples."""

    keep: int = 60
    events: deque[tuple[float, str, str]] = field(default_factory=deque)
    verbose: bool = False

    def add(self, at: float, kind: str, detail: str) -> None:
        events = self.events
        events.append((at, kind, detail))
        if len(events) > self.keep:
            events.popleft()
        if self.verbose:
            print(f"{at:12.6f} {kind:10} {detail}")

    def lines(self) -> list[str]:
        return [f"{at:12.6f} {kind:10} {detail}" for at, kind, detail in self.events]
