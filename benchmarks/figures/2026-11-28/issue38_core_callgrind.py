"""Instructions (callgrind Ir) per blocking get, one side at a time (issue 38, item 1).

``--side server``: ``benchmarks/rpc.py --serve KIND`` runs under callgrind, this process is the
client; ``--side client``: this process must itself run under callgrind. Instrumentation is
on for exactly ``--gets`` gets after 300 warm-up ones (``callgrind_control -i on/off``), so
start-up and shut-down are not counted. The counts move by about 1 % between rounds, whatever
the machine's load; CPU time and latency swing by 30-100 % on a shared machine.

    OUT=/tmp/cg_server.out
    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue38_core_callgrind.py --side server \\
        --out $OUT
    PYTHONPATH=. valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg_c.out \\
        python benchmarks/figures/2026-11-28/issue38_core_callgrind.py --side client
    grep -h ^totals /tmp/cg_c.out*      # divided by --gets: instructions per get

``--kind raw``: the raw pyzmq baseline (a DEALER against rpc.py's ROUTER loop).
``--pattern futures``: instead of blocking gets, docs/client.md's window of 64 ``get_async()``
futures, the oldest waited with ``result(timeout=10)`` and replaced by a new one (rpc.py's
``rda_documented`` in flight); raw keeps 64 requests outstanding on its DEALER the same way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

WINDOW = 64  # requests in flight with --pattern futures (rpc.py's IN_FLIGHT)
RPC = Path(__file__).resolve().parents[3] / "benchmarks" / "rpc.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=("server", "client"), required=True)
    parser.add_argument("--kind", choices=("rda", "raw"), default="rda")
    parser.add_argument("--pattern", choices=("get", "futures"), default="get")
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--out", default="/tmp/cg_server.out")
    args = parser.parse_args()
    cmd = [sys.executable, str(RPC), "--serve", args.kind]
    if args.side == "server":
        grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd = [*grind, f"--callgrind-out-file={args.out}", *cmd]
    child = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    endpoint = child.stdout.readline().strip()
    close: Callable[[], None]
    if args.kind == "raw":
        import zmq

        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(endpoint)

        outstanding = WINDOW if args.pattern == "futures" else 0
        for _ in range(outstanding):
            dealer.send_multipart([b"SCALAR", b"1"])

        def get() -> object:
            if outstanding:  # the oldest of the window's replies, then one more request
                reply = dealer.recv_multipart(copy=False)
                dealer.send_multipart([b"SCALAR", b"1"])
                return reply
            dealer.send_multipart([b"SCALAR", b"1"])
            return dealer.recv_multipart(copy=False)

        def close() -> None:
            for _ in range(outstanding):
                dealer.recv_multipart(copy=False)
            dealer.close()
            ctx.term()
    else:
        from rda.business.client.service import ClientService
        from rda.business.config import Config
        from rda.business.directory import StaticDirectory

        service = ClientService(StaticDirectory({"*": endpoint}), Config(workers=2))
        ap = service.access_point("SCALAR", "Acquisition")

        window: deque[Future[Any]] = deque()
        if args.pattern == "futures":
            window.extend(ap.get_async() for _ in range(WINDOW))

        def get() -> object:
            if window:  # the oldest future, waited as docs/client.md shows, then a new one
                value = window.popleft().result(timeout=10).data["current"]
                window.append(ap.get_async())
                return value
            return ap.get().data["current"]

        def close() -> None:
            for future in window:
                future.result(timeout=10)
            service.close()

    for _ in range(300):
        get()
    target = str(child.pid if args.side == "server" else os.getpid())
    quiet = {"check": True, "stdout": subprocess.DEVNULL}
    subprocess.run(["callgrind_control", "-i", "on", target], **quiet)  # type: ignore[call-overload]
    for _ in range(args.gets):
        get()
    subprocess.run(["callgrind_control", "-i", "off", target], **quiet)  # type: ignore[call-overload]
    close()
    child.stdin.close()
    child.wait(60)


if __name__ == "__main__":
    main()
