"""Soak: the real ZeroMQ stack in separate processes, under random kills, pauses and policy
reloads, with the simulator's subscription and request invariants checked from outside.

``rda.testing.simulation`` runs the business layer in one thread, in simulated time; this
runs the production threads, sockets and processes in real time. Servers (``soak.py server``)
publish a counter ``k`` on every device (with ``life``, the server's incarnation) and write
what they published to a state file; clients (``soak.py client``) subscribe to every device,
make gets and sets, check each update against the previous one and write a report. The
parent starts them, then for ``--minutes`` kills servers (SIGKILL, restarted after a while
at the same port), pauses servers and clients (SIGSTOP/SIGCONT, some past the heartbeat
timeout) and rewrites the servers' policy file (SIGHUP: ``Server.reload_policy``). The first
``--baseline`` seconds run without faults: the raw baseline of the same run. Then the faults
stop, every server publishes a last value, and the parent compares:

* ``lost_uncounted``: updates missing inside an epoch without a gap counting them (must be 0);
* ``counted_not_missing``: a gap counted for updates that were not missing (must be 0: the
  simulator's ``received-plus-gaps`` both ways), except on the update right after a FIRST,
  which may count updates the FIRST already showed (``seam_overcounted``, reported);
* ``first_missing``: a value before any FIRST of its epoch (must be 0);
* ``caught_up``: each client's last value of each device is the server's last published one;
* ``requests``: every get and set ended once (``unended`` and ``late_values`` must be 0).

Usage: ``python benchmarks/soak.py [--minutes 5] [--servers 2] [--clients 3] [--seed 1]
[--out FILE]``; prints JSON (and writes it to ``--out``); exit status 1 when an invariant
broke.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

HEARTBEAT = (0.5, 3.0)  # interval, timeout (s): pauses past 3 s drop connections
PUBLISH_HZ = 50.0
DEVICES_PER_SERVER = 2

POLICY_OPEN = """
roles = ["user"]
default_roles = ["user"]
anonymous_roles = ["user"]
[[rules]]
role = "*"
effect = "allow"
"""

# C1 may not set: the clients count the NotAuthorizedError answers this causes.
POLICY_NARROW = """
roles = ["user", "writer"]
default_roles = ["user", "writer"]
anonymous_roles = ["user"]
principals = { C1 = ["user"] }
[[rules]]
role = "writer"
operation = "set"
effect = "allow"
[[rules]]
role = "user"
operation = "set"
effect = "deny"
[[rules]]
role = "*"
effect = "allow"
"""


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # a reader never sees half a file


# --- the server process -----------------------------------------------------------------


def serve(name: str, port: int, policy: Path, state: Path, life: int) -> None:
    from rda.business.server.builder import ServerBuilder
    from rda.business.server.devices import Device
    from rda.business.server.requests import GetRequest, SetRequest
    from rda.serialization.data import Data

    class Counter(Device):
        def __init__(self) -> None:
            super().__init__()
            self.k = 0
            self.v = 0

        @Device.property("Acq")
        def acq(self, request: GetRequest) -> Data:
            return Data(k=self.k, life=life)

        @Device.property("Setting")
        def setting(self, request: GetRequest) -> Data:
            return Data(v=self.v)

        @setting.setter
        def write_setting(self, value: Data, request: SetRequest) -> None:
            self.v = int(value["v"])

    devices = {f"{name}.D{j}": Counter() for j in range(DEVICES_PER_SERVER)}
    builder = (
        ServerBuilder(name)
        .endpoint(f"tcp://127.0.0.1:{port}")
        .directory(None)
        .heartbeat(*HEARTBEAT)
        .policy(policy)
        .trust_declared_principals()
    )
    for device_name, device in devices.items():
        builder.device(device_name, device)
    server = builder.build().start()
    publishing = threading.Event()
    publishing.set()
    stop = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: server.reload_policy())
    signal.signal(signal.SIGUSR1, lambda *_: publishing.clear())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    period = 1.0 / PUBLISH_HZ
    next_at = time.monotonic()
    last_state = 0.0
    while not stop.is_set():
        if publishing.is_set():
            for device in devices.values():
                device.k += 1
                device.publish("Acq", Data(k=device.k, life=life))
        now = time.monotonic()
        if now - last_state > 0.2 or not publishing.is_set():
            _write_json(
                state,
                {
                    "life": life,
                    "k": {n: d.k for n, d in devices.items()},
                    "publishing": publishing.is_set(),
                },
            )
            last_state = now
        next_at += period
        stop.wait(max(0.0, next_at - time.monotonic()))
    server.stop()


# --- the client process -----------------------------------------------------------------


class Watch:
    """One subscription, checked as the simulator's SubWatch checks it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.epoch = False
        self.last: tuple[int, int] | None = None  # (life, k)
        self.received = 0
        self.gaps = 0
        self.errors = 0
        self.firsts = 0
        self.lost_uncounted = 0
        self.counted_not_missing = 0
        # The update right after a FIRST may count updates the FIRST already showed (published
        # while its get ran: the server counts them, it cannot tell): allowed, reported apart.
        self.seam_overcounted = 0
        self.after_first = False
        self.first_missing = 0
        self.problems: list[str] = []
        self.last_error = ""
        self.last_at = 0.0  # time.monotonic() of the last notification (a stuck one shows)
        self.updates: list[str] = []  # the last notifications, for a broken run's look

    def listener(self, n: Any) -> None:
        from rda.serialization.header import UpdateType

        with self.lock:
            self.last_at = time.monotonic()
            self.updates.append(
                f"{time.time():.3f} {n.update_type.name} seq={n.seq} gap={n.gap} "
                + (f"{type(n.error).__name__}: {n.error}" if n.error is not None else "")
                + ("" if n.error is not None else f"{n.data['life']}/{n.data['k']}")
            )
            del self.updates[:-12]
            if n.error is not None:
                self.errors += 1
                self.last_error = f"{n.update_type.name}: {type(n.error).__name__}: {n.error}"
                self.epoch = n.update_type is UpdateType.FIRST
                self.last = None
                return
            data = n.data
            value = (int(data["life"]), int(data["k"]))
            self.received += 1
            if n.update_type is UpdateType.FIRST:
                self.firsts += 1
                self.epoch, self.last = True, value
                self.after_first = True
                return
            if not self.epoch:
                self.first_missing += 1
                self.problems.append(f"{n.update_type.name} {value} before a FIRST")
                return
            self.gaps += n.gap
            after_first, self.after_first = self.after_first, False
            last = self.last
            if last is not None and last[0] == value[0]:
                missing = value[1] - last[1] - 1 - n.gap
                if missing > 0:
                    self.lost_uncounted += missing
                    self.problems.append(
                        f"{last} -> {value} gap {n.gap} missing; before: "
                        + " | ".join(self.updates[-6:])
                    )
                elif missing < 0 and after_first:
                    self.seam_overcounted += -missing
                elif missing < 0:
                    self.counted_not_missing += -missing
                    # With the notifications before it: why was a gap counted that was not?
                    self.problems.append(
                        f"{last} -> {value} gap {n.gap} counted, not missing; before: "
                        + " | ".join(self.updates[-6:])
                    )
            self.last = value

    def report(self) -> dict[str, Any]:
        with self.lock:
            return {
                "received": self.received,
                "gaps": self.gaps,
                "errors": self.errors,
                "firsts": self.firsts,
                "lost_uncounted": self.lost_uncounted,
                "counted_not_missing": self.counted_not_missing,
                "seam_overcounted": self.seam_overcounted,
                "first_missing": self.first_missing,
                "last": self.last,
                "last_error": self.last_error,
                "quiet_seconds": round(time.monotonic() - self.last_at, 1) if self.last_at else -1,
                "updates": list(self.updates),
                "problems": self.problems[:20],
            }


class Requests:
    """Every request must end once, and no value after its timeout (with a scheduling slack)."""

    SLACK = 0.25

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.issued = 0
        self.outcomes: dict[str, int] = {}
        self.twice = 0
        self.late_values = 0
        self.pending: dict[int, tuple[float, float]] = {}
        self.ids = 0

    def add(self, future: Future[Any], timeout: float) -> None:
        with self.lock:
            self.ids += 1
            key = self.ids
            self.issued += 1
            self.pending[key] = (time.monotonic(), timeout)
        future.add_done_callback(lambda f: self.ended(key, f))

    def ended(self, key: int, future: Future[Any]) -> None:
        now = time.monotonic()
        error = future.exception()
        outcome = "ok" if error is None else type(error).__name__
        with self.lock:
            started = self.pending.pop(key, None)
            if started is None:
                self.twice += 1
                return
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if error is None and now > started[0] + started[1] + self.SLACK:
                self.late_values += 1

    def report(self) -> dict[str, Any]:
        now = time.monotonic()
        with self.lock:
            overdue = sum(1 for s, t in self.pending.values() if now > s + t + 5.0)
            return {
                "issued": self.issued,
                "outcomes": dict(self.outcomes),
                "ended_twice": self.twice,
                "late_values": self.late_values,
                "unended": overdue,
            }


def client(name: str, directory: dict[str, str], report: Path, seed: int) -> None:
    from rda.business.client.service import ClientService
    from rda.business.config import Config
    from rda.business.directory import StaticDirectory
    from rda.serialization.errors import RdaError

    config = Config(heartbeat_interval=HEARTBEAT[0], heartbeat_timeout=HEARTBEAT[1])
    service = ClientService(StaticDirectory(directory), config, principal=name)
    watches = {device: Watch() for device in directory}
    subs = [
        service.access_point(device, "Acq").subscribe(listener=w.listener, queue_size=100)
        for device, w in watches.items()
    ]
    requests = Requests()
    stop = threading.Event()
    closed = {device: sub for device, sub in zip(watches, subs, strict=True)}
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(seed)
    devices = sorted(directory)
    value = 0
    while not stop.wait(0.02):
        device = rng.choice(devices)
        timeout = rng.choice((0.2, 1.0))
        future: Future[Any]
        try:
            if rng.random() < 0.7:
                future = service.access_point(device, "Acq").get_async(timeout=timeout)
            else:
                value += 1
                ap = service.access_point(device, "Setting")
                future = ap.set_async({"v": value}, timeout=timeout)
        except RdaError:
            continue
        requests.add(future, timeout)
        if requests.issued % 50 == 0:
            _write_report(report, watches, requests, service, closed)
    _write_report(report, watches, requests, service, closed)
    for sub in subs:
        sub.close()
    service.close()


def _write_report(
    path: Path, watches: dict[str, Watch], requests: Requests, service: Any, subs: dict[str, Any]
) -> None:
    stats = service.statistics()
    _write_json(
        path,
        {
            "devices": {d: w.report() for d, w in watches.items()},
            "requests": requests.report(),
            # What the client itself says (a subscription that stays quiet: why?).
            "subscription_closed": {d: bool(s.closed) for d, s in subs.items()},
            "connections": [
                {
                    "endpoint": c.endpoint,
                    "state": c.state,
                    "connects": c.connects,
                    "reconnects": c.reconnects,
                    "subscriptions": c.subscriptions,
                    "last_reason": c.last_reason,
                    "disconnected_seconds": round(c.disconnected_seconds, 1),
                }
                for c in stats.servers
            ],
            "transport": {
                "heartbeat_timeouts": stats.transport.heartbeat_timeouts,
                "decode_errors": stats.transport.decode_errors,
            },
        },
    )


# --- the parent ---------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from rda.testing import free_port

        self.args = args
        self.rng = random.Random(args.seed)
        self.work = work
        self.policy = work / "policy.toml"
        self.policy.write_text(POLICY_OPEN)
        self.servers: dict[str, dict[str, Any]] = {}
        for i in range(args.servers):
            name = f"S{i}"
            self.servers[name] = {"port": free_port(), "proc": None, "life": 0}
        self.directory = {
            f"{name}.D{j}": f"tcp://127.0.0.1:{s['port']}"
            for name, s in self.servers.items()
            for j in range(DEVICES_PER_SERVER)
        }
        self.clients: dict[str, subprocess.Popen[bytes]] = {}
        self.counts = {"kills": 0, "pauses": 0, "long_pauses": 0, "policy_reloads": 0}
        self.paused: set[int] = set()

    def _spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        log = open(self.work / f"{argv[0]}-{argv[1]}.log", "ab")  # noqa: SIM115 (the child's)
        return subprocess.Popen(
            [sys.executable, __file__, *argv], stdout=log, stderr=subprocess.STDOUT
        )

    def start_server(self, name: str) -> None:
        s = self.servers[name]
        s["life"] += 1
        s["proc"] = self._spawn(
            "server",
            name,
            str(s["port"]),
            str(self.policy),
            str(self.work / f"{name}.state.json"),
            str(s["life"]),
        )

    def start(self) -> None:
        for name in self.servers:
            self.start_server(name)
        directory = json.dumps(self.directory)
        for i in range(self.args.clients):
            name = f"C{i}"
            self.clients[name] = self._spawn(
                "client", name, directory, str(self.work / f"{name}.report.json"), str(i)
            )

    def fault(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.35:
            name = rng.choice(sorted(self.servers))
            proc = self.servers[name]["proc"]
            proc.kill()
            proc.wait()
            self.counts["kills"] += 1
            time.sleep(rng.uniform(0.05, 2.0))
            self.start_server(name)
        elif roll < 0.75:
            procs = [s["proc"] for s in self.servers.values()] + list(self.clients.values())
            proc = rng.choice(procs)
            span = rng.uniform(0.1, 2.0 * HEARTBEAT[1])
            proc.send_signal(signal.SIGSTOP)
            self.counts["pauses"] += 1
            if span > HEARTBEAT[1]:
                self.counts["long_pauses"] += 1
            time.sleep(span)
            proc.send_signal(signal.SIGCONT)
        else:
            text = POLICY_NARROW if self.policy.read_text() == POLICY_OPEN else POLICY_OPEN
            # Atomically: a server restarting meanwhile reads its policy at start, and some
            # prefixes of POLICY_NARROW are valid policies that deny every get and subscribe
            # (a server started on one refuses every client's re-subscription for good).
            tmp = self.policy.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.policy)
            for s in self.servers.values():
                s["proc"].send_signal(signal.SIGHUP)
            self.counts["policy_reloads"] += 1

    def run(self) -> dict[str, Any]:
        args = self.args
        self.start()
        started = time.monotonic()
        time.sleep(args.baseline)
        baseline = self.read_reports()
        end = started + args.baseline + args.minutes * 60
        while time.monotonic() < end:
            self.fault()
            time.sleep(self.rng.expovariate(1.0 / args.fault_every))
        # Faults over: let everyone reconnect, stop publishing, let the last values arrive.
        time.sleep(2 * HEARTBEAT[1] + 2.0)
        for s in self.servers.values():
            s["proc"].send_signal(signal.SIGUSR1)
        time.sleep(3.0)
        final = {
            name: json.loads((self.work / f"{name}.state.json").read_text())
            for name in self.servers
        }
        for proc in self.clients.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.clients.values():
            proc.wait(30)
        for s in self.servers.values():
            s["proc"].send_signal(signal.SIGTERM)
            s["proc"].wait(30)
        reports = self.read_reports()
        return self.verdict(time.monotonic() - started, baseline, reports, final)

    def read_reports(self) -> dict[str, Any]:
        out = {}
        for name in self.clients:
            path = self.work / f"{name}.report.json"
            if path.exists():
                out[name] = json.loads(path.read_text())
        return out

    def verdict(
        self,
        elapsed: float,
        baseline: dict[str, Any],
        reports: dict[str, Any],
        final: dict[str, Any],
    ) -> dict[str, Any]:
        totals = {
            "received": 0,
            "gaps": 0,
            "errors": 0,
            "firsts": 0,
            "lost_uncounted": 0,
            "counted_not_missing": 0,
            "seam_overcounted": 0,
            "first_missing": 0,
        }
        behind: list[str] = []
        requests: dict[str, int] = {"issued": 0, "ended_twice": 0, "late_values": 0, "unended": 0}
        outcomes: dict[str, int] = {}
        for client_name, report in reports.items():
            for device, d in report["devices"].items():
                for key in totals:
                    totals[key] += d[key]
                server = device.split(".")[0]
                want = [final[server]["life"], final[server]["k"][device]]
                if d["last"] != want:
                    behind.append(
                        f"{client_name} {device}: {d['last']} != {want} (last error "
                        f"{d['last_error']!r}, quiet {d.get('quiet_seconds')} s, closed "
                        f"{report.get('subscription_closed', {}).get(device)})"
                    )
            for key in requests:
                requests[key] += report["requests"][key]
            for key, value in report["requests"]["outcomes"].items():
                outcomes[key] = outcomes.get(key, 0) + value
        published = sum(sum(f["k"].values()) for f in final.values())
        broken = (
            totals["lost_uncounted"]
            or totals["counted_not_missing"]
            or totals["first_missing"]
            or behind
            or requests["ended_twice"]
            or requests["late_values"]
            or requests["unended"]
            or len(reports) != len(self.clients)
        )
        return {
            "seconds": round(elapsed, 1),
            "servers": len(self.servers),
            "clients": len(self.clients),
            "faults": self.counts,
            "published_last_life": published,
            "baseline_received": sum(
                d["received"] for r in baseline.values() for d in r["devices"].values()
            ),
            "baseline_gaps": sum(
                d["gaps"] for r in baseline.values() for d in r["devices"].values()
            ),
            "subscriptions": totals,
            "not_caught_up": behind,
            "requests": {**requests, "outcomes": outcomes},
            "invariants_held": not broken,
        }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        name, port, policy, state, life = sys.argv[2:7]
        serve(name, int(port), Path(policy), Path(state), int(life))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        name, directory, report, seed = sys.argv[2:6]
        client(name, json.loads(directory), Path(report), int(seed))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--baseline", type=float, default=20.0, help="seconds without faults")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument(
        "--fault-every", type=float, default=3.0, help="mean seconds between faults"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rda-soak-") as tmp:
        soak = Soak(args, Path(tmp))
        try:
            result = soak.run()
        finally:
            for s in soak.servers.values():
                if s["proc"] is not None and s["proc"].poll() is None:
                    s["proc"].send_signal(signal.SIGCONT)
                    s["proc"].kill()
            for proc in soak.clients.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
        if not result["invariants_held"]:
            # Keep the logs, reports and state files of a broken run for a look.
            kept = Path(tempfile.mkdtemp(prefix="rda-soak-broken-"))
            shutil.copytree(tmp, kept, dirs_exist_ok=True)
            result["kept"] = str(kept)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    sys.exit(0 if result["invariants_held"] else 1)


if __name__ == "__main__":
    main()
