"""rda.testing.simulation: the seed budget of ``make test``, exact replay, and every bug the
simulator found, kept as a regression test with its seed (docs/testing.md)."""

from __future__ import annotations

import os

import pytest

from rda.testing.simulation import ALL_FAULTS, SimSettings, run_seed, run_seeds, shrink

#: The budget ``make test`` runs with every fault (see docs/testing.md for the arithmetic).
BUDGET = int(os.environ.get("RDA_SIM_SEEDS", "2000"))


@pytest.mark.timeout(1800)
def test_seed_budget_with_every_fault_keeps_every_invariant() -> None:
    summary = run_seeds(range(BUDGET), SimSettings())
    print(summary.report())
    failures = [f"seed {r.seed}: {r.failure}" for r in summary.failures]
    assert not failures, "\n".join(failures)
    # The faults really happened: a budget that injected nothing would prove nothing.
    for what in (
        "crashes",
        "pauses",
        "resets",
        "partitions",
        "stalls",
        "slow-consumers",
        "policy-reloads",
        "churn",
    ):
        assert summary.counts.get(what, 0) > 0, f"no {what} in {BUDGET} seeds"


def test_a_seed_replays_exactly() -> None:
    first = run_seed(11)
    again = run_seed(11)
    assert first.failure is None
    assert (first.steps, first.simulated, first.counts) == (
        again.steps,
        again.simulated,
        again.counts,
    )
    assert first.trace == again.trace


def test_a_broken_invariant_names_itself_and_the_events_before_it() -> None:
    # A fault the product must survive, turned into a bug: a listener that sees every update
    # twice breaks received-plus-gaps, and the failure says so with its trace.
    from rda.testing.simulation import _invariants

    original = _invariants.SubWatch.listener

    def twice(self: _invariants.SubWatch, n: object) -> None:
        original(self, n)  # type: ignore[arg-type]
        if getattr(n, "update_type", None) is not None and n.update_type.name == "NORMAL":  # type: ignore[attr-defined]
            original(self, n)  # type: ignore[arg-type]

    _invariants.SubWatch.listener = twice  # type: ignore[method-assign]
    try:
        result = run_seed(3, SimSettings(faults=frozenset()))
        small, again = shrink(3, SimSettings(faults=frozenset()))
    finally:
        _invariants.SubWatch.listener = original  # type: ignore[method-assign]
    assert result.failure is not None
    assert result.failure.name in ("sequence-increases", "received-plus-gaps")
    assert result.trace, "a failure comes with the events before it"
    # Shrunk: the workload ends right after the failure, which stays the same one.
    assert again.failure is not None and again.failure.name == result.failure.name
    assert small.duration < SimSettings().duration


# --- regressions: (faults, seed) that broke an invariant before the fix named ---

REGRESSIONS = [
    # A slow consumer's full queue dropped the FIRST update (first-after-subscribe):
    # subscriptions._Inbox keeps FIRSTs and errors and drops the oldest plain update.
    pytest.param("slow-consumer", 2, id="slow-consumer-2-first-dropped"),
    pytest.param("slow-consumer", 4, id="slow-consumer-4-first-dropped"),
    pytest.param("slow-consumer", 5, id="slow-consumer-5-first-dropped"),
    # A set made while its server was away timed out for its user, then went out on the
    # CONNECT_ACK and took effect after a later, acknowledged set (set-then-get): the client
    # session core drops a get or set from its backlog once its request ended.
    pytest.param(",".join(ALL_FAULTS), 2464, id="all-2464-timed-out-set-sent-later"),
    # A paused client handled a reply after its deadline, before its timer ran, and gave the
    # user a value after the timeout (no-reply-after-timeout): RequestTable.reply ends such
    # a request as a timeout.
    pytest.param("pause,delay", 7044, id="pause-7044-value-after-timeout"),
    pytest.param("pause,delay", 7051, id="pause-7051-value-after-timeout"),
]


@pytest.mark.parametrize(("faults", "seed"), REGRESSIONS)
def test_regression_seed(faults: str, seed: int) -> None:
    chosen = frozenset(faults.split(",")) & frozenset(ALL_FAULTS)
    result = run_seed(seed, SimSettings(faults=chosen))
    assert result.failure is None, f"seed {seed} ({faults}): {result.failure}"
