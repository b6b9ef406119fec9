"""Before/after of issue 28 in one run: raw pyzmq; main's servers (``rda``: handlers on
workers, ``rda_inline``: declared non-blocking), run by main's checkout and venv; this
branch's default server. Sequential latencies in blocks of 50 and 64 in flight in turns,
per round, then the median ratios to raw. Run from the repository root:

    .venv/bin/python benchmarks/figures/2026-11-26/issue28_before_after.py ROUNDS ROUND_TRIPS
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, "benchmarks")

import _structure
import rpc
import zmq
from _contestants import Raw, Rda

MAIN = "/work/main"  # a checkout of main with its own venv (make install)


class MainChild(_structure.Child):
    """``rpc.py --serve kind`` of main's checkout, in main's venv."""

    def __init__(self, kind: str) -> None:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [f"{MAIN}/.venv/bin/python", f"{MAIN}/benchmarks/rpc.py", "--serve", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=MAIN,
            env=env,
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        assert self.endpoint


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    round_trips = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    ctx = zmq.Context()
    children = [rpc.Child("raw"), MainChild("rda"), MainChild("rda_inline"), rpc.Child("rda")]
    names = ["raw", "main_workers", "main_inline", "new_default"]
    contestants = [Raw(ctx, children[0].endpoint)] + [
        Rda(name, child.endpoint, subscriptions=False)
        for name, child in zip(names[1:], children[1:], strict=True)
    ]
    try:
        out = []
        for _ in range(rounds):
            res = rpc.interleaved_latencies(contestants, round_trips)
            rates = rpc.interleaved(contestants, lambda c: c.in_flight(0.3), 4)
            row = {
                c.name: {k: round(v["p50_us"], 1) for k, v in res[i].items()}
                for i, c in enumerate(contestants)
            }
            for i, c in enumerate(contestants):
                row[c.name]["in_flight"] = round(sum(rates[i]) / len(rates[i]))
            out.append(row)
            print(json.dumps(row), flush=True)
        ratios = {
            name: {
                key: round(sorted(o[name][key] / o["raw"][key] for o in out)[len(out) // 2], 2)
                for key in out[0]["raw"]
            }
            for name in names[1:]
        }
        print("median ratios", json.dumps(ratios))
    finally:
        for c in contestants:
            c.close()
        ctx.term()
        for child in children:
            child.close()


if __name__ == "__main__":
    main()
