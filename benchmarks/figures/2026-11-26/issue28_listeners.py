"""Subscription delivery of issue 28: raw pyzmq, rda with a ``set_wakeup`` consumer (``rda``)
and with ``subscribe(listener=...)`` (``rda_user``) against one rda server, in turns. Run from
the repository root:

    .venv/bin/python benchmarks/figures/2026-11-26/issue28_listeners.py UPDATES SUBSCRIBERS TURNS
"""

import sys

sys.path.insert(0, "benchmarks")

import rpc
import zmq
from _contestants import Raw, Rda, RdaUser


def main() -> None:
    updates, count, turns = (int(a) for a in sys.argv[1:4])
    ctx = zmq.Context()
    children = [rpc.Child("raw"), rpc.Child("rda")]
    contestants: list[rpc.Contestant] = [
        Raw(ctx, children[0].endpoint),
        Rda("rda", children[1].endpoint),
        RdaUser("rda_user", children[1].endpoint),
    ]
    try:
        results = rpc.interleaved(contestants, lambda c: c.subscribers(count, updates), turns)
        for c, runs in zip(contestants, results, strict=True):
            rates = [round(r["updates_per_s"]) for r in runs]
            counted = [r.get("gaps", 0) + r.get("dropped", 0) for r in runs]
            uncounted = [r.get("uncounted_losses") for r in runs]
            print(c.name, rates, "lost-counted", counted, "uncounted", uncounted)
    finally:
        for c in contestants:
            c.close()
        ctx.term()
        for child in children:
            child.close()


if __name__ == "__main__":
    main()
