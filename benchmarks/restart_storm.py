"""Resume after a restart storm: subscriptions back after kill -9 and a restart on the same port.

Separate processes on 127.0.0.1: one server process, ``--processes`` client processes, each
with ``--clients`` ``ClientService``s holding ``--subs`` subscriptions each (the issue's run:
50 x 4 x 10 = 2,000 subscriptions). Each round kills the server with SIGKILL, starts a new
server process on the same port (after ``--down`` seconds, beyond its own start-up time) and
measures, per subscription, the time from the moment the new server listens (its
``time.monotonic()`` after ``start()``, one clock for every process on Linux) to the client
receiving its FIRST update. While the storm lasts (and at least one second after listening),
the benchmark process makes a new ``ClientService`` and sends one ``admin ping``, in a loop:
those latencies (connect + ping) say whether the server still answers admin and new clients
(no thundering herd that starves them).

Baseline in the same run: raw pyzmq at the same size, a ROUTER answering each message and
DEALERs that libzmq reconnects by itself (``RECONNECT_IVL`` 100 ms, its default), each sending
``--subs`` messages when its socket monitor reports the connection (``EVENT_CONNECTED``);
"resumed" is the answer to each. ``ratio_p50`` = rda p50 / raw p50.

    .venv/bin/python benchmarks/restart_storm.py [--processes 50 --clients 4 --subs 10]
        [--rounds 3] [--down 0] [--round-timeout 20]

Prints one JSON object: per round and overall, p50/p99/max seconds from listening to FIRST,
subscriptions that never resumed within ``--round-timeout``, admin ping latencies.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.abspath(__file__)
DEVICES = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- children


def serve_rda(port: int) -> None:
    """Child: an rda server (admin included) with DEV0..DEV9/Value; says when it listens."""
    import rda
    from rda.business.server.devices import Device
    from rda.business.server.requests import GetRequest
    from rda.serialization.data import Data

    class Value(Device):
        @Device.property("Value")
        def value(self, request: GetRequest) -> Data:
            return Data(value=1.0)

    builder = rda.ServerBuilder("Storm").endpoint(f"tcp://127.0.0.1:{port}").directory(None)
    for k in range(DEVICES):
        builder.device(f"DEV{k}", Value())
    server = builder.build().start()
    say(listening=time.monotonic(), pid=os.getpid())
    sys.stdin.readline()  # killed with SIGKILL; a closed stdin ends it otherwise
    server.stop()


def client_rda(endpoint: str, clients: int, subs: int) -> None:
    """Child: ``clients`` services x ``subs`` subscriptions; one line per FIRST update."""
    from rda.business.client.service import ClientService
    from rda.business.config import Config
    from rda.business.directory import StaticDirectory
    from rda.serialization.header import UpdateType

    lock = threading.Lock()
    directory = StaticDirectory({"*": endpoint})
    services = [ClientService(directory, Config(workers=1)) for _ in range(clients)]
    held = []
    for c, service in enumerate(services):
        for j in range(subs):
            index = c * subs + j

            def listener(note: Any, index: int = index) -> None:
                if note.error is not None:
                    with lock:  # DisconnectedError once per outage; anything else is news
                        say(error=type(note.error).__name__, message=str(note.error)[:300])
                elif note.update_type is UpdateType.FIRST:
                    with lock:
                        say(first=index, t=time.monotonic())

            ap = service.access_point(f"DEV{index % DEVICES}", "Value")
            held.append(ap.subscribe(listener=listener))
    sys.stdin.readline()
    for service in services:
        service.close()


def serve_raw(port: int) -> None:
    """Child: a raw pyzmq ROUTER that answers every message with itself."""
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    say(listening=time.monotonic(), pid=os.getpid())
    while True:
        router.send_multipart(router.recv_multipart())


def client_raw(endpoint: str, clients: int, subs: int) -> None:
    """Child: ``clients`` DEALERs that libzmq reconnects; on each EVENT_CONNECTED each sends
    ``subs`` messages; one line per answer that follows a (re)connection."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    poller = zmq.Poller()
    dealers, monitors = {}, {}
    for c in range(clients):
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        m = d.get_monitor_socket(zmq.EVENT_CONNECTED)
        d.connect(endpoint)
        dealers[d], monitors[m] = c, d
        poller.register(d, zmq.POLLIN)
        poller.register(m, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            if sock is sys.stdin or sock == sys.stdin.fileno():
                return
            if sock in monitors:
                recv_monitor_message(sock)
                d, c = monitors[sock], dealers[monitors[sock]]
                for j in range(subs):
                    d.send(b"%d" % (c * subs + j), zmq.NOBLOCK)
            elif sock in dealers:
                index = int(sock.recv())
                say(first=index, t=time.monotonic())


# ----------------------------------------------------------------------------- parent


class Child:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, HERE, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.partial = b""

    def lines(self) -> list[dict[str, Any]]:
        """The complete lines available now (non-blocking after select)."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            raise RuntimeError(f"child {self.proc.args!r} ended")
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        return [json.loads(line) for line in complete if line]

    def first_line(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError("no line from the server within the timeout")
            got = self.lines()
            if got:
                return got[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def stop(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
            self.proc.wait(20)
        except (BrokenPipeError, subprocess.TimeoutExpired, ValueError):
            pass
        self.kill()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": None if not values else round(max(values), 4),
    }


class Pinger(threading.Thread):
    """A new client every time, ``admin ping`` once, in a loop while a round lasts (rda only):
    counted from the first ping started after the new server listens (``since``)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(name="storm-pinger", daemon=True)
        self.endpoint = endpoint
        self.since = float("inf")
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        from rda.business.client.service import ClientService
        from rda.business.config import Config
        from rda.business.directory import StaticDirectory

        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with ClientService(StaticDirectory({}), Config()) as client:
                    client.admin(self.endpoint, "ping", timeout=5.0)
            except Exception:
                if started >= self.since:
                    self.failures += 1
                self.stop.wait(0.02)
                continue
            if started >= self.since:
                self.latencies.append(time.monotonic() - started)
            self.stop.wait(0.01)


def storm(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One contestant ("rda" or "raw"): start, settle, then ``--rounds`` kill/restart rounds."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    role_server, role_client = ("--serve", "--client")
    if kind != "rda":
        role_server, role_client = ("--raw-serve", "--raw-client")
    total = args.processes * args.clients * args.subs
    server = Child(role_server, str(port))
    server.first_line(60)
    clients = [
        Child(role_client, endpoint, str(args.clients), str(args.subs))
        for _ in range(args.processes)
    ]
    by_fd = {c.fd: (n, c) for n, c in enumerate(clients)}
    seen: dict[tuple[int, int], float] = {}  # (process, index) -> last FIRST time
    errors: dict[str, int] = {}  # error notifications by type (DisconnectedError: per outage)
    samples: dict[str, str] = {}  # the first message of each other type

    def collect(until: float, want: int, after: float) -> int:
        """Read FIRST lines until ``want`` subscriptions have one later than ``after``."""
        while True:
            done = sum(1 for t in seen.values() if t > after)
            remaining = until - time.monotonic()
            if done >= want or remaining <= 0:
                return done
            ready, _, _ = select.select(list(by_fd), [], [], min(remaining, 0.5))
            for fd in ready:
                n, child = by_fd[fd]
                for line in child.lines():
                    if "error" in line:
                        errors[line["error"]] = errors.get(line["error"], 0) + 1
                        if line["error"] != "DisconnectedError":
                            samples.setdefault(line["error"], line["message"])
                        continue
                    seen[(n, line["first"])] = line["t"]

    rounds: list[dict[str, Any]] = []
    values: list[float] = []
    try:
        settled = collect(time.monotonic() + args.settle_timeout, total, 0.0)
        if settled < total:
            raise RuntimeError(f"{kind}: only {settled} of {total} subscriptions got FIRST")
        for r in range(args.rounds):
            pinger = Pinger(endpoint) if kind == "rda" else None
            if pinger is not None:
                pinger.start()
            killed = time.monotonic()
            server.kill()
            time.sleep(args.down)
            server = Child(role_server, str(port))
            listening = server.first_line(60)["listening"]
            if pinger is not None:
                pinger.since = listening
            collect(listening + args.round_timeout, total, killed)
            if pinger is not None:
                # Pings get one second after listening at least, storm or not.
                time.sleep(max(0.0, listening + 1.0 - time.monotonic()))
                pinger.stop.set()
                pinger.join(10)
            resumed = [t - listening for t in seen.values() if t > killed]
            result = {
                "round": r + 1,
                "down_s": round(listening - killed, 3),
                "resume_s": summary(resumed),
                "never_resumed": total - len(resumed),
            }
            if pinger is not None:
                pings = {**summary(pinger.latencies), "n": len(pinger.latencies)}
                result["new_client_admin_ping_s"] = pings
                result["new_client_admin_ping_failures"] = pinger.failures
            rounds.append(result)
            values.extend(resumed)
    finally:
        for c in clients:
            c.stop()
        server.kill()
    return {
        "rounds": rounds,
        "resume_s": summary(values),
        "never_resumed": sum(r["never_resumed"] for r in rounds),
        "error_notifications": errors,
        "error_samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=50)
    parser.add_argument("--clients", type=int, default=4, help="ClientServices per process")
    parser.add_argument("--subs", type=int, default=10, help="subscriptions per client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--down", type=float, default=0.0, help="extra seconds down per round")
    parser.add_argument("--round-timeout", type=float, default=20.0)
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument("--no-raw", action="store_true", help="skip the raw pyzmq baseline")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--raw-serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--raw-client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        return serve_rda(args.serve)
    if args.raw_serve is not None:
        return serve_raw(args.raw_serve)
    if args.client:
        return client_rda(args.client[0], int(args.client[1]), int(args.client[2]))
    if args.raw_client:
        return client_raw(args.raw_client[0], int(args.raw_client[1]), int(args.raw_client[2]))
    started = time.monotonic()
    report: dict[str, Any] = {
        "benchmark": "restart_storm",
        "processes": args.processes,
        "clients_per_process": args.clients,
        "subscriptions_per_client": args.subs,
        "subscriptions": args.processes * args.clients * args.subs,
        "rounds": args.rounds,
        "extra_down_s": args.down,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    report["rda"] = storm("rda", args)
    if not args.no_raw:
        report["raw_pyzmq"] = storm("raw", args)
        rda_p50, raw_p50 = report["rda"]["resume_s"]["p50"], report["raw_pyzmq"]["resume_s"]["p50"]
        if rda_p50 is not None and raw_p50:
            report["ratio_p50"] = round(rda_p50 / raw_p50, 2)
    goal = report["rda"]["resume_s"]
    report["goal_met"] = bool(
        goal["p50"] is not None
        and goal["p50"] <= 0.3
        and goal["max"] <= 0.6
        and report["rda"]["never_resumed"] == 0
    )
    report["seconds"] = round(time.monotonic() - started, 1)
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
