"""CPU per blocking get from /proc, both processes, every thread: raw pyzmq (a DEALER against
``rpc.py --serve raw``), rda's bench client against ``--serve rda`` and the documented client
against ``--serve rda_documented``, in turns (the first rotating per round). Also the
voluntary and involuntary context switches per get, both processes together.

    ROUNDS=5 N=4000 python issue38_cpu_per_get.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

import zmq  # noqa: E402
from rpc import Child  # noqa: E402

from rda.business.client.service import ClientService  # noqa: E402
from rda.business.config import Config  # noqa: E402
from rda.business.directory import StaticDirectory  # noqa: E402

N = int(os.environ.get("N", "4000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
TICK = os.sysconf("SC_CLK_TCK")


def counts(pid: int) -> tuple[int, int, int]:
    """(CPU clock ticks of the process, including threads that ended; voluntary and
    involuntary context switches of its live threads)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = int(fields[11]) + int(fields[12])
    vcs = ics = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                status = f.read()
        except OSError:
            continue  # a thread that ended meanwhile
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt"):
                vcs += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt"):
                ics += int(line.split()[1])
    return cpu, vcs, ics


def main() -> None:
    kids = {k: Child(k) for k in ("raw", "rda", "rda_documented")}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(kids["raw"].endpoint)
    sent = [0]

    def raw_get() -> object:
        sent[0] += 1
        dealer.send_multipart([b"SCALAR", str(sent[0]).encode()])
        return dealer.recv_multipart(copy=False)

    bench = ClientService(StaticDirectory({"*": kids["rda"].endpoint}), Config(workers=2))
    user = ClientService(StaticDirectory({"*": kids["rda_documented"].endpoint}), Config(workers=2))
    ap1 = bench.access_point("SCALAR", "Acquisition")
    ap2 = user.access_point("SCALAR", "Acquisition")
    calls: dict[str, Callable[[], object]] = {
        "raw": raw_get,
        "rda": lambda: ap1.get().data["current"],
        "rda_documented": lambda: ap2.get(timeout=5.0).data["value"],
    }
    rows: dict[str, list[tuple[float, ...]]] = {k: [] for k in calls}
    try:
        for call in calls.values():
            for _ in range(300):
                call()
        for r in range(ROUNDS):
            names = list(calls)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                call, server = calls[name], kids[name].proc.pid
                a, b = counts(os.getpid()), counts(server)
                t0 = time.perf_counter()
                for _ in range(N):
                    call()
                wall = time.perf_counter() - t0
                a2, b2 = counts(os.getpid()), counts(server)
                rows[name].append(
                    (
                        (a2[0] - a[0]) / TICK / N * 1e6,
                        (b2[0] - b[0]) / TICK / N * 1e6,
                        wall / N * 1e6,
                        (a2[1] - a[1] + b2[1] - b[1]) / N,
                        (a2[2] - a[2] + b2[2] - b[2]) / N,
                    )
                )
    finally:
        bench.close()
        user.close()
        dealer.close()
        ctx.term()
        for kid in kids.values():
            kid.close()
    print(f"N={N} rounds={ROUNDS} load={os.getloadavg()[0]:.1f}")
    for name, got in rows.items():
        cols = list(zip(*got, strict=True))

        def f(j: int, cols: list[tuple[float, ...]] = cols) -> str:
            return f"{statistics.median(cols[j]):6.1f} [{min(cols[j]):.1f}-{max(cols[j]):.1f}]"

        total = [x[0] + x[1] for x in got]
        print(
            f"{name:15s} client cpu {f(0)}  server cpu {f(1)}  total "
            f"{statistics.median(total):6.1f} [{min(total):.1f}-{max(total):.1f}]  "
            f"wall/get {f(2)}  vcs/get {f(3)} ics/get {f(4)}"
        )


if __name__ == "__main__":
    main()
