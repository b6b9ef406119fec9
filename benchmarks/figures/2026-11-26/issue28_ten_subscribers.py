"""10 subscribers against main's server and this branch's (the same client), beside raw
pyzmq, in turns: how many updates each server conflates for clients that fall behind. Run
from the repository root:

    .venv/bin/python benchmarks/figures/2026-11-26/issue28_ten_subscribers.py UPDATES COUNT TURNS
"""

import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/figures/2026-11-26")

import rpc
import zmq
from _contestants import Raw, Rda
from issue28_before_after import MainChild


def main() -> None:
    updates, count, turns = (int(a) for a in sys.argv[1:4])
    ctx = zmq.Context()
    children = [rpc.Child("raw"), MainChild("rda"), rpc.Child("rda")]
    contestants: list[rpc.Contestant] = [
        Raw(ctx, children[0].endpoint),
        Rda("main_server", children[1].endpoint),
        Rda("new_server", children[2].endpoint),
    ]
    try:
        results = rpc.interleaved(contestants, lambda c: c.subscribers(count, updates), turns)
        for c, runs in zip(contestants, results, strict=True):
            rates = [round(r["updates_per_s"]) for r in runs]
            counted = [r.get("gaps", 0) + r.get("dropped", 0) for r in runs]
            print(c.name, rates, "lost-counted", counted)
    finally:
        for c in contestants:
            c.close()
        ctx.term()
        for child in children:
            child.close()


if __name__ == "__main__":
    main()
