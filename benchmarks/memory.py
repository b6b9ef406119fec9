"""Memory per connection and per subscription: RSS for N clients x M subscriptions.

The server is an rda server in its own process (``rpc.py --serve rda``); the clients run in
``--processes`` other processes (a ``ClientService`` each, one worker thread), so the figure
for each side is its own. Phases, each measured as the resident set size (``VmRSS``) of the
server process and the sum over the client processes:

1. ``idle``: everything imported and started, no client connected;
2. ``connected``: every client connected (one get each);
3. ``subscribed``: every client holds M subscriptions (distinct devices, FIRST update received).

``per_connection_kib`` and ``per_subscription_kib`` are the deltas divided by the counts.
Prints one JSON object.

    .venv/bin/python benchmarks/memory.py [--quick] [--clients 1000] [--subscriptions 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _structure


def rss_kib(pid: int | None = None) -> int:
    for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/<pid>/status")


def client_process(endpoint: str, clients: int, subscriptions: int) -> None:
    """Child: report RSS idle, after connecting, after subscribing; one line each, driven by
    stdin lines so that the parent measures every process in the same phase."""
    from rda.business.client.service import ClientService
    from rda.business.config import Config
    from rda.business.directory import StaticDirectory

    directory = StaticDirectory({"*": endpoint})
    print(json.dumps({"idle": rss_kib()}), flush=True)
    sys.stdin.readline()
    services = [ClientService(directory, Config(workers=1)) for _ in range(clients)]
    for service in services:
        service.access_point("SCALAR", "Acquisition").get()
    print(json.dumps({"connected": rss_kib()}), flush=True)
    sys.stdin.readline()
    subs = []
    for service in services:
        for j in range(subscriptions):
            sub = service.access_point(f"DEV{j}", "Acquisition").subscribe()
            if sub.poll(30) is None:
                raise RuntimeError("no FIRST update within 30 s")
            subs.append(sub)
    print(json.dumps({"subscribed": rss_kib()}), flush=True)
    sys.stdin.readline()
    for sub in subs:
        sub.close()
    for service in services:
        service.close()


class Clients:
    def __init__(self, endpoint: str, clients: int, subscriptions: int) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--client-process",
                endpoint,
                str(clients),
                str(subscriptions),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def read(self, phase: str) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a client process died before {phase}")
        value: int = json.loads(line)[phase]
        return value

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 clients (smoke run)")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--subscriptions", type=int, default=10)
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--client-process", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_process:
        endpoint, clients, subscriptions = args.client_process
        client_process(endpoint, int(clients), int(subscriptions))
        return
    if args.quick:
        args.clients = 100
    rpc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rpc.py")
    server = _structure.Child(rpc, "rda")
    per_process = [args.clients // args.processes] * args.processes
    per_process[0] += args.clients - sum(per_process)
    procs = [Clients(server.endpoint, n, args.subscriptions) for n in per_process if n]
    report: dict[str, Any] = {
        "clients": args.clients,
        "subscriptions_per_client": args.subscriptions,
        "client_processes": len(procs),
    }
    phases: dict[str, dict[str, int]] = {}
    started = time.perf_counter()
    try:
        for phase in ("idle", "connected", "subscribed"):
            clients_kib = sum(p.read(phase) for p in procs)
            phases[phase] = {"server_kib": rss_kib(server.proc.pid), "clients_kib": clients_kib}
            for p in procs:
                p.go()
    finally:
        for p in procs:
            p.close()
        server.close()
    n, subs = args.clients, args.clients * args.subscriptions
    idle, connected, subscribed = phases["idle"], phases["connected"], phases["subscribed"]
    report["rss"] = phases
    report["per_connection_kib"] = {
        side: round((connected[side] - idle[side]) / n, 2) for side in idle
    }
    report["per_subscription_kib"] = {
        side: round((subscribed[side] - connected[side]) / subs, 2) for side in idle
    }
    report["seconds"] = round(time.perf_counter() - started, 1)
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
