"""``python -m rda.testing.simulation --seeds N [--faults ...] [--replay SEED]``."""

from __future__ import annotations

import sys

import click

from rda.testing.simulation._model import ALL_FAULTS, SimSettings
from rda.testing.simulation._runner import replay, run_seeds, shrink


@click.command()
@click.option("--seeds", type=int, default=100, show_default=True, help="How many seeds to run.")
@click.option("--first", type=int, default=0, show_default=True, help="The first seed.")
@click.option(
    "--faults",
    default=",".join(ALL_FAULTS),
    show_default=True,
    help="Comma-separated faults to inject (or 'none').",
)
@click.option("--jobs", type=int, default=0, help="Processes (default: the available CPUs).")
@click.option("--duration", type=float, default=3.0, show_default=True)
@click.option("--quiet", type=float, default=10.0, show_default=True)
@click.option(
    "--late-gets",
    is_flag=True,
    help="Devices complete gets up to 20 ms after reading (reproduces the open FIRST seam).",
)
@click.option("--replay", "replay_seed", type=int, default=None, help="Replay one seed, verbosely.")
@click.option(
    "--shrink",
    "shrink_seed",
    type=int,
    default=None,
    help="Find fewer faults and a shorter workload with which this seed still fails.",
)
def main(
    seeds: int,
    first: int,
    faults: str,
    jobs: int,
    duration: float,
    quiet: float,
    late_gets: bool,
    replay_seed: int | None,
    shrink_seed: int | None,
) -> None:
    """Deterministic simulation of rda clients and servers under faults (docs/testing.md)."""
    chosen = frozenset() if faults == "none" else frozenset(f.strip() for f in faults.split(","))
    unknown = chosen - set(ALL_FAULTS)
    if unknown:
        raise click.BadParameter(f"unknown fault(s): {', '.join(sorted(unknown))}")
    settings = SimSettings(faults=chosen, duration=duration, quiet=quiet, late_gets=late_gets)
    if shrink_seed is not None:
        small, result = shrink(shrink_seed, settings)
        click.echo(f"seed {shrink_seed}: {result.failure} ({result.steps} steps)")
        click.echo("\n".join("  " + line for line in result.trace[-25:]))
        faults_arg = ",".join(sorted(small.faults)) or "none"
        click.echo(
            f"  replay: python -m rda.testing.simulation --replay {shrink_seed} "
            f"--faults {faults_arg} --duration {small.duration:g} --quiet {small.quiet:g}"
        )
        sys.exit(1)
    if replay_seed is not None:
        result = replay(replay_seed, settings)
        if result.failure is not None:
            click.echo(f"seed {replay_seed}: {result.failure}")
            sys.exit(1)
        click.echo(f"seed {replay_seed}: every invariant held ({result.steps} steps)")
        return
    summary = run_seeds(range(first, first + seeds), settings, jobs or None)
    click.echo(summary.report())
    for failed in summary.failures:
        click.echo(f"\nseed {failed.seed}: {failed.failure}")
        click.echo("\n".join("  " + line for line in failed.trace[-25:]))
        click.echo(f"  replay: python -m rda.testing.simulation --replay {failed.seed}")
    sys.exit(1 if summary.failures else 0)


if __name__ == "__main__":
    main()
