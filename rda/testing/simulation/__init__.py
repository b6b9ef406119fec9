"""rda.testing.simulation: servers and clients of the real business layer under a million
fault schedules, in simulated time, every run reproducible from its seed.

``python -m rda.testing.simulation --seeds N`` runs seeds in parallel; a failure prints the
seed, the broken invariant and the events before it; ``--replay SEED`` runs it again.
From Python: :func:`run_seed`, :func:`run_seeds`, :func:`replay`. What it models, the
invariants and how to run one's own devices in it: docs/testing.md.
"""

from rda.testing.simulation._model import ALL_FAULTS, InvariantBroken, SimSettings
from rda.testing.simulation._runner import Summary, replay, run_seed, run_seeds, shrink
from rda.testing.simulation._world import RunResult, Simulation

__all__ = [
    "ALL_FAULTS",
    "InvariantBroken",
    "RunResult",
    "SimSettings",
    "Simulation",
    "Summary",
    "replay",
    "run_seed",
    "run_seeds",
    "shrink",
]
