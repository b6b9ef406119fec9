"""The 64-in-flight measure of ``benchmarks/rpc.py`` alone, for the futures (issue 38, item 4's
lighter ``get_async()`` future): raw pyzmq, ``rda_documented`` (docs/client.md's window of 64
``get_async()`` futures, each waited with ``result(timeout=10)``, against the documented
callback server), ``rda_user`` (the same window with ``result()``, against rpc.py's rda
server) and ``rda`` (rpc.py's own in-flight pattern, against the same server), in separate
server processes, taking turns chunk by chunk as rpc.py does. Prints one
JSON line: per contestant the rate of each round, each round's ratio to raw, and the load.

Run it alternately from two trees (PYTHONPATH) to compare them: the ratio to raw of one run
is what is compared, the machine's load moves the rates between runs.

    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue38_futures_inflight.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import rpc
import zmq
from _contestants import Raw, Rda, RdaDocumented, RdaUser


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per contestant per round")
    args = parser.parse_args()
    load_before = os.getloadavg()
    children = [rpc.Child("raw"), rpc.Child("rda"), rpc.Child("rda_documented")]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    contestants: list[Any] = []
    try:
        contestants.append(Raw(ctx, children[0].endpoint))
        contestants.append(RdaDocumented("rda_documented", children[2].endpoint))
        contestants.append(RdaUser("rda_user", children[1].endpoint))
        contestants.append(Rda("rda", children[1].endpoint, subscriptions=False))
        for c in contestants:
            c.in_flight(0.3)  # warm up (and connected)
        rates: dict[str, list[float]] = {c.name: [] for c in contestants}
        chunk = args.seconds / rpc.CHUNKS
        for _ in range(args.rounds):
            turns = rpc.interleaved(contestants, lambda c: c.in_flight(chunk), rpc.CHUNKS)
            for c, r in zip(contestants, turns, strict=True):
                rates[c.name].append(statistics.fmean(r))
    finally:
        for c in contestants:
            c.close()
        ctx.term()
        for child in children:
            child.close()
    raw = rates["raw"]
    report: dict[str, Any] = {
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "rates_per_s": rates,
    }
    for name in ("rda", "rda_documented", "rda_user"):
        ratios = [r / b for r, b in zip(rates[name], raw, strict=True)]
        report[f"ratio_{name}_per_round"] = ratios
        report[f"ratio_{name}_median"] = statistics.median(ratios)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
