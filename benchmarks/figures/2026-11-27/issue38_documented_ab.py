"""A/B of the documented server (``rpc.py --serve rda_documented``): the library of checkout
``BEFORE`` against that of ``AFTER``, one client (``_contestants.RdaDocumented``), in turns.

Per measure, the median over ``ROUNDS`` rounds [min-max], and the server's CPU per operation
(the child's ``time.process_time``, every thread): a count the machine's load moves less
than a latency.

    BEFORE=/path/main AFTER=/path/branch ROUNDS=5 python issue38_documented_ab.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

from _contestants import RdaDocumented  # noqa: E402

RPC = os.path.join(HERE, "..", "..", "rpc.py")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
N = int(os.environ.get("N", "2000"))
UNITS = {
    "get_scalar": "p50 us",
    "get_object": "p50 us",
    "mib_fresh": "MB/s",
    "in_flight": "gets/s",
    "sub1": "updates/s",
}


class Kid:
    """The documented server in a child process, on the library at ``lib``."""

    def __init__(self, lib: str) -> None:
        env = dict(os.environ, PYTHONPATH=lib)
        self.proc = subprocess.Popen(
            [sys.executable, RPC, "--serve", "rda_documented"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()

    def cpu(self) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("cpu\n")
        self.proc.stdin.flush()
        seconds: float = json.loads(self.proc.stdout.readline())["seconds"]
        return seconds

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def measure(client: RdaDocumented, kid: Kid, what: str) -> tuple[float, float]:
    """(the measure, the server's CPU microseconds per operation)."""
    s0, w0 = kid.cpu(), time.perf_counter()
    if what in ("get_scalar", "get_object"):
        call = client.round_trip(what)
        lat = []
        for _ in range(N):
            t0 = time.perf_counter()
            call()
            lat.append(time.perf_counter() - t0)
        lat.sort()
        n, value = float(N), lat[N // 2] * 1e6
    elif what == "mib_fresh":
        n = 100.0
        value = n * 8 * 131072 / client.mib_fresh(100) / 1e6
    elif what == "in_flight":
        value = client.in_flight(1.0)
        n = value * (time.perf_counter() - w0)
    else:
        r = client.subscribers(1, 20000)
        assert r["uncounted_losses"] == 0
        n, value = float(r["received"]), r["updates_per_s"]
    return value, (kid.cpu() - s0) / n * 1e6


def main() -> None:
    libs = {"before": os.environ["BEFORE"], "after": os.environ["AFTER"]}
    whats = sys.argv[1:] or list(UNITS)
    kids = {k: Kid(v) for k, v in libs.items()}
    clients = {k: RdaDocumented("rda_documented", kids[k].endpoint) for k in kids}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {
        (k, w): [] for k in kids for w in whats
    }
    try:
        for c in clients.values():  # warm up
            for w in ("get_scalar", "get_object"):
                call = c.round_trip(w)
                for _ in range(200):
                    call()
            c.mib_fresh(10)
        for r in range(ROUNDS):
            for w in whats:
                order = list(kids) if r % 2 == 0 else list(kids)[::-1]
                for k in order:
                    results[(k, w)].append(measure(clients[k], kids[k], w))
    finally:
        for c in clients.values():
            c.close()
        for kid in kids.values():
            kid.close()
    for w in whats:
        for k in kids:
            values = [x[0] for x in results[(k, w)]]
            cpu = [x[1] for x in results[(k, w)]]
            print(
                f"{w:11s} {k:7s} {UNITS[w]:9s} {statistics.median(values):9.1f} "
                f"[{min(values):.1f}-{max(values):.1f}]  server cpu/op "
                f"{statistics.median(cpu):6.1f} us [{min(cpu):.1f}-{max(cpu):.1f}]"
            )


if __name__ == "__main__":
    main()
