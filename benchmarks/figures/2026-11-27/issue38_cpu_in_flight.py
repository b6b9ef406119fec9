"""CPU per get with 64 in flight, from /proc (client and server processes, every thread), and
voluntary context switches per get: raw pyzmq, rda's callbacks (``Rda``), futures
(``RdaUser``) and the documented program (``RdaDocumented``), one-second passes in turns.

    ROUNDS=5 python issue38_cpu_in_flight.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import zmq  # noqa: E402
from _contestants import Raw, Rda, RdaDocumented, RdaUser  # noqa: E402
from issue38_cpu_per_get import TICK, counts  # noqa: E402
from rpc import Child  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))


def main() -> None:
    kids = {k: Child(k) for k in ("raw", "rda", "rda_documented")}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    clients: dict[str, Raw | Rda] = {
        "raw": Raw(ctx, kids["raw"].endpoint),
        "rda": Rda("rda", kids["rda"].endpoint),
        "rda_user": RdaUser("rda_user", kids["rda"].endpoint),
        "rda_documented": RdaDocumented("rda_documented", kids["rda_documented"].endpoint),
    }
    server_of = {"raw": "raw", "rda": "rda", "rda_user": "rda", "rda_documented": "rda_documented"}
    rows: dict[str, list[tuple[float, ...]]] = {k: [] for k in clients}
    try:
        for client in clients.values():
            client.in_flight(0.3)  # warm up
        for r in range(ROUNDS):
            names = list(clients)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                server = kids[server_of[name]].proc.pid
                a, b = counts(os.getpid()), counts(server)
                t0 = time.perf_counter()
                rate = clients[name].in_flight(1.0)
                gets = rate * (time.perf_counter() - t0)
                a2, b2 = counts(os.getpid()), counts(server)
                rows[name].append(
                    (
                        rate,
                        (a2[0] - a[0]) / TICK / gets * 1e6,
                        (b2[0] - b[0]) / TICK / gets * 1e6,
                        (a2[1] - a[1] + b2[1] - b[1]) / gets,
                    )
                )
    finally:
        for client in clients.values():
            client.close()
        ctx.term()
        for kid in kids.values():
            kid.close()
    print(f"rounds={ROUNDS} load={os.getloadavg()[0]:.1f}")
    for name, got in rows.items():
        cols = list(zip(*got, strict=True))

        def f(j: int, cols: list[tuple[float, ...]] = cols) -> str:
            return f"{statistics.median(cols[j]):8.1f} [{min(cols[j]):.1f}-{max(cols[j]):.1f}]"

        print(
            f"{name:15s} gets/s {f(0)}  client cpu/get {f(1)}  server cpu/get {f(2)}  "
            f"vcs/get {f(3)}"
        )


if __name__ == "__main__":
    main()
