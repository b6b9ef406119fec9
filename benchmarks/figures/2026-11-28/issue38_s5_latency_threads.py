"""Where a blocking get's time goes, per thread (issue 38, fifth session): raw pyzmq, rda
(every default), rda with ``Config.lane_spin`` (``--spin`` seconds) and PyTango, each against
its own ``rpc.py --serve`` server process, taking turns block by block (``--block`` gets,
``--rounds`` turns each, the first rotating). Per contestant: p25/p50/p75/p99 of the round
trip, the calling thread's CPU per get, and for every thread of the client process (this one)
and of its server process that ran during the blocks, per get: voluntary and involuntary
context switches, CPU (``schedstat`` run time) and time runnable but waiting for a CPU
(``schedstat`` wait time); the client's main thread's figures include reading those counters
(about 1-2 us per get with blocks of 1000; ``caller_cpu_us``, from ``time.thread_time``
around the gets alone, does not). Optionally ``--pin-client CPUS --pin-server CPUS`` (``taskset``
lists) pin the processes, every thread. Prints one JSON object.

    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue38_s5_latency_threads.py --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import _tango
import rpc
import zmq
from _contestants import Raw, Rda

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory

Counters = dict[int, tuple[str, int, int, int, int]]


def threads(pid: int) -> Counters:
    """Per thread id: (name, voluntary, involuntary switches, run ns, wait ns)."""
    out: Counters = {}
    base = Path(f"/proc/{pid}/task")
    for task in base.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text().splitlines()
            vol = int(next(x for x in status if x.startswith("voluntary_ctxt")).split()[1])
            inv = int(next(x for x in status if x.startswith("nonvoluntary_ctxt")).split()[1])
            run, wait, _ = (int(x) for x in (task / "schedstat").read_text().split())
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue
        out[int(task.name)] = (name, vol, inv, run, wait)
    return out


def per_get(before: Counters, after: Counters, n: int, into: dict[str, list[float]]) -> None:
    for tid, (name, vol, inv, run, wait) in after.items():
        if tid in before:
            b = before[tid]
            row = into.setdefault(f"{name}:{tid}", [0.0, 0.0, 0.0, 0.0])
            for i, d in enumerate(
                (vol - b[1], inv - b[2], (run - b[3]) / 1e3, (wait - b[4]) / 1e3)
            ):
                row[i] += d / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=1000)
    parser.add_argument("--spin", type=float, default=0.0001)
    parser.add_argument("--pin-client", default="")
    parser.add_argument("--pin-server", default="")
    parser.add_argument("--no-tango", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    names = ["raw", "rda", "rda_spin"] + (
        [] if args.no_tango or not _tango.available() else ["tango"]
    )
    kinds = {"raw": "raw", "rda": "rda", "rda_spin": "rda", "tango": "tango"}
    children = {kind: rpc.Child(kind) for kind in {kinds[n] for n in names}}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    clients: dict[str, Any] = {}
    try:
        for name in names:
            endpoint = children[kinds[name]].endpoint
            if name == "raw":
                clients[name] = Raw(ctx, endpoint)
            elif name == "tango":
                clients[name] = _tango.Tango(endpoint)
            else:
                c = Rda(name, endpoint)
                c.client.close()
                spin = args.spin if name == "rda_spin" else 0.0
                config = Config(workers=2, lane_spin=spin)
                c.client = ClientService(StaticDirectory({"*": endpoint}), config)
                clients[name] = c
        pins = [(args.pin_client, os.getpid())]
        pins += [(args.pin_server, child.proc.pid) for child in children.values()]
        for cpus, pid in pins:
            if cpus:
                pin = ["taskset", "-a", "-cp", cpus, str(pid)]
                subprocess.run(pin, check=True, capture_output=True)
        calls: dict[str, Callable[[], object]] = {
            n: clients[n].round_trip("get_scalar") for n in names
        }
        for name in names:
            for _ in range(500):
                calls[name]()
        samples: dict[str, list[float]] = {n: [] for n in names}
        cpu = dict.fromkeys(names, 0.0)
        client_threads: dict[str, dict[str, list[float]]] = {n: {} for n in names}
        server_threads: dict[str, dict[str, list[float]]] = {n: {} for n in names}
        me = os.getpid()
        for turn in range(args.rounds):
            for k in range(len(names)):
                name = names[(turn + k) % len(names)]
                call, out = calls[name], samples[name]
                server = children[kinds[name]].proc.pid
                c0, s0, t0 = threads(me), threads(server), time.thread_time()
                for _ in range(args.block):
                    start = time.perf_counter()
                    call()
                    out.append(time.perf_counter() - start)
                cpu[name] += time.thread_time() - t0
                n = args.block * args.rounds
                per_get(c0, threads(me), n, client_threads[name])
                per_get(s0, threads(server), n, server_threads[name])
        report: dict[str, Any] = {"load_average_before": load_before, "args": vars(args)}
        for name in names:
            s = sorted(samples[name])
            q = {
                f"p{p}_us": round(s[min(len(s) - 1, len(s) * p // 100)] * 1e6, 1)
                for p in (25, 50, 75, 99)
            }
            keep = {
                side: {
                    t: dict(
                        zip(
                            ("vol", "invol", "run_us", "wait_us"),
                            (round(x, 3) for x in v),
                            strict=True,
                        )
                    )
                    for t, v in rows.items()
                    if v[0] > 0.02 or v[2] > 0.3
                }
                for side, rows in (
                    ("client", client_threads[name]),
                    ("server", server_threads[name]),
                )
            }
            report[name] = {
                **q,
                "caller_cpu_us": round(cpu[name] / len(s) * 1e6, 1),
                "threads": keep,
            }
        report["load_average_after"] = os.getloadavg()
        print(json.dumps(report, indent=1))
    finally:
        for c in clients.values():
            c.close()
        ctx.term()
        for child in children.values():
            child.close()


if __name__ == "__main__":
    main()
