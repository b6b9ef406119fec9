"""Only the subscription measures of ``rda bench rpc`` (separate processes: raw, rda, rda_user,
rda_documented, each against raw in the same run), alternated between two checkouts.

    python issue38_s5_notify_rounds.py A=/path/before B=/path/after --runs 3 --rounds 3 \
        --out issue38_s5_notify_ab.json

Each run is a child process with ``PYTHONPATH`` and the benchmark scripts of one checkout
(its ``benchmarks/_contestants.py`` and its ``rpc.py --serve`` children), running ``--rounds``
rounds of ``subscription_1`` (``--updates`` updates) and ``subscription_10`` (a quarter of
them), the contestants' order rotating per round as in ``rpc.py``'s ``one_round``. The runs
alternate A B A B ...; the report lists each round's ratio to raw and, per checkout, the
median and range of those ratios and the worst uncounted loss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

MEASURES = ("subscription_1", "subscription_10")
NAMES = ("rda", "rda_user", "rda_documented")


def one_run(rounds: int, updates: int) -> dict[str, Any]:
    """In the child: ``rounds`` rounds of the two subscription measures."""
    import zmq
    from _contestants import Raw, Rda, RdaDocumented, RdaUser
    from rpc import Child

    children = [Child("raw"), Child("rda"), Child("rda_documented")]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    contestants: list[Any] = []
    per_round: list[dict[str, Any]] = []
    try:
        contestants = [
            Raw(ctx, children[0].endpoint),
            Rda("rda", children[1].endpoint),
            RdaUser("rda_user", children[1].endpoint),
            RdaDocumented("rda_documented", children[2].endpoint),
        ]
        for index in range(rounds):
            order = [(index + k) % len(contestants) for k in range(len(contestants))]
            results: list[dict[str, Any]] = [{} for _ in contestants]
            for count, n in ((1, updates), (10, updates // 4)):
                for i in order:
                    results[i][f"subscription_{count}"] = contestants[i].subscribers(count, n)
            row: dict[str, Any] = {"load": os.getloadavg()[0]}
            for i, c in enumerate(contestants):
                row[c.name] = results[i]
            per_round.append(row)
    finally:
        for c in contestants:
            c.close()
        ctx.term()
        for child in children:
            child.close()
    return {"rounds": per_round}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in sorted({r["side"] for r in runs}):
        rows = [row for r in runs if r["side"] == side for row in r["rounds"]]
        side_out: dict[str, Any] = {"rounds": len(rows)}
        for m in MEASURES:
            raw = [row["raw"][m]["updates_per_s"] for row in rows]
            side_out[f"raw_{m}_per_s_median"] = statistics.median(raw)
            for name in NAMES:
                ratios = [
                    row[name][m]["updates_per_s"] / row["raw"][m]["updates_per_s"] for row in rows
                ]
                losses = [row[name][m]["uncounted_losses"] for row in rows]
                side_out[f"{name}_{m}"] = {
                    "median": round(statistics.median(ratios), 3),
                    "min": round(min(ratios), 3),
                    "max": round(max(ratios), 3),
                    "worst_uncounted_losses": max(losses),
                }
        out[side] = side_out
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="*", help="NAME=/path/to/checkout (alternated in order)")
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run")
    parser.add_argument("--updates", type=int, default=40000, help="rpc.py's default")
    parser.add_argument("--out", help="JSON report")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        json.dump(one_run(args.rounds, args.updates), sys.stdout)
        return
    trees = [t.split("=", 1) for t in args.trees]
    runs: list[dict[str, Any]] = []
    for k in range(args.runs):
        for side, root in trees:
            bench = os.path.join(root, "benchmarks")
            env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{bench}")
            command = [
                sys.executable, __file__, "--child", "--rounds", str(args.rounds),
                "--updates", str(args.updates),
            ]  # fmt: skip
            done = subprocess.run(command, cwd=bench, env=env, capture_output=True, text=True)
            if done.returncode:
                print(done.stderr, file=sys.stderr)
                raise SystemExit(f"run {k} of {side} failed")
            run = json.loads(done.stdout)
            run["side"], run["tree"], run["run"] = side, root, k
            runs.append(run)
            print(side, k, json.dumps(summary([run])[side]), file=sys.stderr, flush=True)
    report = {"runs": runs, "summary": summary(runs)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
