"""The etcd directory (issue 22), on a real etcd this script starts (rda.testing.LocalEtcd).

Measured, with baselines from the same run:

* ``resolve_cached``: ``EtcdDirectory.resolve`` with the watched cache warm (10,000 devices);
* ``resolve_first``: a new ``EtcdDirectory`` and its first ``resolve`` (loads every device
  entry and opens the watch), with 10 and with 10,000 devices registered;
* ``register_10k``: a server registering 10,000 devices (lease + 101 transactions);
* ``list_10k``: ``servers()`` + ``devices()`` in process, and the ``rda directory list --json``
  command (a new Python process: interpreter start included);
* ``kill9_to_gone``: from ``kill -9`` of a registered server process to the watch seeing its
  entry deleted (bounded by the ttl: the lease is refreshed every ttl/3, etcd checks expiry
  every 500 ms);
* ``move_to_first``: from a replacing server's registration (its ``on_start`` hook) to the
  FIRST update of the client's subscription from it (goal: < 100 ms plus the back-off step;
  here no back-off is involved: the watch moves it);
* baselines: one raw pyzmq REQ/REP round trip over tcp loopback, and one raw etcd gateway
  ``/v3/kv/range`` of one key with httpx (what an uncached resolution would cost).

Usage: ``python benchmarks/directory.py [--devices N] [--repeats R]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import zmq

import rda
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.serialization.data import Data
from rda.serialization.header import UpdateType
from rda.testing import LocalEtcd

TTL = 2.0


def pct(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50_us": round(s[len(s) // 2] * 1e6, 1),
        "p99_us": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6, 1),
        "n": len(s),
    }


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def raw_zmq_round_trip(n: int) -> dict[str, float]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    rep = ctx.socket(zmq.REP)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    req = ctx.socket(zmq.REQ)
    req.connect(f"tcp://127.0.0.1:{port}")

    def serve() -> None:
        for _ in range(n + 10):
            rep.send(rep.recv())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def call() -> None:
        req.send(b"x" * 64)
        req.recv()

    for _ in range(10):
        call()
    result = pct(timed(call, n))
    thread.join(5)
    req.close(0)
    rep.close(0)
    ctx.term()
    return result


def raw_gateway_range(url: str, n: int) -> dict[str, float]:
    import base64

    key = base64.b64encode(b"/bench/devices/DEV00000").decode()
    with httpx.Client(trust_env=False) as client:
        return pct(timed(lambda: client.post(f"{url}/v3/kv/range", json={"key": key}), n))


class Named(RequestReplyCallback):
    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, request: GetRequest) -> None:
        request.complete(Data(server=self.name))


def move_to_first(url: str, repeats: int) -> dict[str, Any]:
    """A server replaced by another (the old one still running): registration -> FIRST."""
    registered: list[float] = []

    def server(name: str, replace: bool) -> rda.Server:
        directory = rda.EtcdDirectory(url, prefix="/move/", ttl=TTL)
        return (
            rda.ServerBuilder("Mover")
            .request_reply(Named(name))
            .devices("MOVE1")
            .directory(directory)
            .replace(replace)
            .on_start(lambda _s: registered.append(time.perf_counter()))
            .build()
            .start()
        )

    samples: list[float] = []
    current = server("s0", False)
    directory = rda.EtcdDirectory(url, prefix="/move/", ttl=TTL)
    config = rda.Config(heartbeat_interval=10.0, heartbeat_timeout=60.0)
    client = rda.ClientService(directory=directory, config=config)
    try:
        sub = client.access_point("MOVE1", "Acquisition").subscribe()
        note = sub.poll(10)
        assert note is not None and note.update_type is UpdateType.FIRST
        for i in range(1, repeats + 1):
            name = f"s{i}"
            newcomer = server(name, True)
            while True:
                note = sub.poll(10)
                assert note is not None, "no FIRST from the newcomer"
                if note.error is None and note.data["server"] == name:
                    samples.append(time.perf_counter() - registered[-1])
                    break
            current.stop()
            current = newcomer
        sub.close()
    finally:
        client.close()
        directory.close()
        current.stop()
    return {**pct(samples), "samples_ms": [round(s * 1e3, 1) for s in samples]}


KILLED = """
import sys, time, rda
d = rda.EtcdDirectory(sys.argv[1], prefix="/kill/", ttl=float(sys.argv[2]))
d.register("Victim", "tcp://127.0.0.1:1", ["VICTIM1"])
print("ready", flush=True)
time.sleep(600)
"""


def kill9_to_gone(url: str, repeats: int) -> dict[str, Any]:
    samples: list[float] = []
    with rda.EtcdDirectory(url, prefix="/kill/", ttl=TTL) as watcher:
        gone = threading.Event()
        watcher.watch(lambda name, ep: gone.set() if ep is None else None)
        for _ in range(repeats):
            gone.clear()
            proc = subprocess.Popen(
                [sys.executable, "-c", KILLED, url, str(TTL)], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.perf_counter()
            proc.wait(10)
            proc.stdout.close()
            assert gone.wait(TTL + 10), "entry not gone"
            samples.append(time.perf_counter() - killed)
    return {
        "ttl_s": TTL,
        "samples_s": [round(s, 2) for s in samples],
        "max_s": round(max(samples), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n_dev = args.devices
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "devices": n_dev,
    }
    with tempfile.TemporaryDirectory() as tmp, LocalEtcd(Path(tmp) / "etcd") as etcd:
        url = etcd.url
        results["etcd"] = subprocess.run(
            [etcd.binary, "--version"], capture_output=True, text=True, check=False
        ).stdout.split("\n")[0]
        results["raw_zmq_round_trip"] = raw_zmq_round_trip(2000)
        names = [f"DEV{i:05d}" for i in range(n_dev)]
        server_side = rda.EtcdDirectory(url, prefix="/bench/", ttl=10.0)
        register = []
        for _ in range(min(args.repeats, 3)):
            t = time.perf_counter()
            server_side.register("Big", "tcp://10.0.0.1:5555", names)
            register.append(time.perf_counter() - t)
            server_side.unregister("Big")
        results["register_10k_s"] = [round(s, 3) for s in register]
        server_side.register("Big", "tcp://10.0.0.1:5555", names)
        results["raw_gateway_range"] = raw_gateway_range(url, 300)

        with rda.EtcdDirectory(url, prefix="/bench/") as client:
            client.resolve("DEV00000")
            picks = [names[(i * 7919) % n_dev] for i in range(20_000)]
            it = iter(picks)
            results["resolve_cached"] = pct(timed(lambda: client.resolve(next(it)), 20_000))
            t = time.perf_counter()
            servers, devices = client.servers(), client.devices()
            results["list_10k_in_process_ms"] = round((time.perf_counter() - t) * 1e3, 1)
            assert len(devices) == n_dev and len(servers) == 1

        def first(prefix: str, device: str) -> Callable[[], object]:
            def call() -> object:
                d = rda.EtcdDirectory(url, prefix=prefix)
                try:
                    return d.resolve(device)
                finally:
                    d.close()

            return call

        results["resolve_first_10k"] = pct(timed(first("/bench/", "DEV00042"), args.repeats * 2))
        small = rda.EtcdDirectory(url, prefix="/small/", ttl=10.0)
        small.register("Small", "tcp://10.0.0.2:5555", [f"S{i}" for i in range(10)])
        results["resolve_first_10"] = pct(timed(first("/small/", "S3"), args.repeats * 4))
        small.close()

        env = {
            **os.environ,
            "RDA_DIRECTORY_URL": url.replace("http://", "etcd://"),
            "RDA_DIRECTORY_PREFIX": "/bench/",
        }
        rda_cli = str(Path(sys.executable).with_name("rda"))
        cli = []
        for _ in range(min(args.repeats, 3)):
            t = time.perf_counter()
            done = subprocess.run(
                [rda_cli, "directory", "list", "--json"], env=env, capture_output=True, check=True
            )
            cli.append(time.perf_counter() - t)
            assert len(json.loads(done.stdout)["servers"][0]["devices"]) == n_dev
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import rda"], check=True)
        results["list_10k_cli_s"] = [round(s, 3) for s in cli]
        results["python_import_rda_s"] = round(time.perf_counter() - t, 3)
        server_side.close()

        results["kill9_to_gone"] = kill9_to_gone(url, min(args.repeats, 3))
        results["move_to_first"] = move_to_first(url, args.repeats)
    raw_us = results["raw_zmq_round_trip"]["p50_us"]
    results["ratios_to_raw_zmq_p50"] = {
        "resolve_cached": round(results["resolve_cached"]["p50_us"] / raw_us, 3),
        "raw_gateway_range": round(results["raw_gateway_range"]["p50_us"] / raw_us, 2),
        "resolve_first_10": round(results["resolve_first_10"]["p50_us"] / raw_us, 1),
        "move_to_first": round(results["move_to_first"]["p50_us"] / raw_us, 1),
    }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
