"""Seeds in parallel, replay of one seed, and the command line.

``run_seed(seed)`` runs one seed in this process; ``run_seeds(seeds, jobs)`` spreads them
over processes (each run is single-threaded and deterministic, so processes are the
parallelism); ``replay(seed)`` runs one again with every event printed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from rda.testing.simulation._model import SimSettings
from rda.testing.simulation._world import START as _START
from rda.testing.simulation._world import RunResult, Simulation

__all__ = ["Summary", "replay", "run_seed", "run_seeds", "shrink"]


def run_seed(seed: int, settings: SimSettings | None = None, verbose: bool = False) -> RunResult:
    """Run ``seed`` once; the result says whether an invariant broke, and where."""
    return Simulation(seed, settings or SimSettings(), verbose).run()


def replay(seed: int, settings: SimSettings | None = None) -> RunResult:
    """Run ``seed`` again, printing every event as it happens."""
    return run_seed(seed, settings, verbose=True)


def shrink(seed: int, settings: SimSettings | None = None) -> tuple[SimSettings, RunResult]:
    """A smaller run of ``seed`` that still breaks the same invariant: faults left out one at
    a time, then the workload shortened, each change kept only if the failure stays.

    The seed draws differently once a fault is gone, so this is a search among smaller
    schedules of the same seed, not a cut of the original one; what it returns replays
    exactly (``--replay SEED`` with the settings it prints)."""
    settings = settings or SimSettings()
    best = run_seed(seed, settings)
    if best.failure is None:
        raise ValueError(f"seed {seed} breaks no invariant with these settings")
    name = best.failure.name

    def still_fails(candidate: SimSettings) -> RunResult | None:
        result = run_seed(seed, candidate)
        failure = result.failure
        return result if failure is not None and failure.name == name else None

    # Nothing after the failure matters: a workload (and faults) that end right after it
    # replay the same steps up to it.
    assert best.failure is not None
    cut = replace(settings, duration=max(0.01, best.failure.at - _START + 0.001))
    if (result := still_fails(cut)) is not None:
        settings, best = cut, result
    for fault in sorted(settings.faults):
        candidate = replace(settings, faults=settings.faults - {fault})
        if (result := still_fails(candidate)) is not None:
            settings, best = candidate, result
    while settings.duration > 0.1:
        candidate = replace(settings, duration=settings.duration / 2)
        if (result := still_fails(candidate)) is None:
            break
        settings, best = candidate, result
    return settings, best


@dataclass(slots=True)
class Summary:
    """What a batch of seeds did."""

    seeds: int = 0
    steps: int = 0
    simulated: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0
    failures: list[RunResult] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, result: RunResult) -> None:
        self.seeds += 1
        self.steps += result.steps
        self.simulated += result.simulated
        self.cpu += result.cpu
        if result.failure is not None:
            self.failures.append(result)
        for key, value in result.counts.items():
            self.counts[key] = self.counts.get(key, 0) + value

    def report(self) -> str:
        rate = self.steps / self.wall if self.wall else 0.0
        per_min = self.seeds / self.wall * 60 if self.wall else 0.0
        lines = [
            f"{self.seeds} seeds, {len(self.failures)} failed; {self.steps} steps, "
            f"{self.simulated:.0f} s simulated in {self.wall:.1f} s "
            f"({rate:.0f} steps/s, {per_min:.0f} seeds/min); per CPU second "
            f"{self.steps / self.cpu if self.cpu else 0.0:.0f} steps, "
            f"{self.seeds / self.cpu if self.cpu else 0.0:.1f} seeds",
            "  " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())),
        ]
        return "\n".join(lines)


def _worker_signals() -> None:
    """A worker stops on the pool's SIGTERM and ignores Ctrl-C (the parent handles it).

    A forked worker inherits its parent's handlers; a parent that had installed a Python
    SIGTERM handler that only sets a flag (a server's stop event, say) left a worker idle on
    the pool's queue lock unkillable, and the pool's shutdown waited for it forever."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _one(args: tuple[int, SimSettings]) -> RunResult:
    seed, settings = args
    return run_seed(seed, settings)


def run_seeds(
    seeds: Iterable[int], settings: SimSettings | None = None, jobs: int | None = None
) -> Summary:
    """Run ``seeds`` on ``jobs`` processes (default: the CPUs this process may use)."""
    settings = settings or SimSettings()
    todo: Sequence[int] = list(seeds)
    jobs = jobs or len(os.sched_getaffinity(0))
    summary = Summary()
    start = time.perf_counter()
    if jobs <= 1:
        for seed in todo:
            summary.add(run_seed(seed, settings))
    else:
        # fork: the children inherit the imported modules (no re-import per process).
        with multiprocessing.get_context("fork").Pool(jobs, initializer=_worker_signals) as pool:
            for result in pool.imap_unordered(
                _one, ((s, settings) for s in todo), chunksize=max(1, len(todo) // (jobs * 8))
            ):
                summary.add(result)
            # Every result is in: let the workers end on their own before the block's
            # terminate() (which signals them).
            pool.close()
            pool.join()
    summary.wall = time.perf_counter() - start
    summary.failures.sort(key=lambda r: r.seed)
    return summary
