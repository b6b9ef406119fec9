"""The pvAccess gateway through an rda server's outage, and clients that leave mid-monitor
(docs/gateway.md, "Outage" and "Subscriptions").

The gateway runs in a process of its own; the rda server in this one, stopped and started
again on the same port. Every EPICS client of a property shares one rda subscription (the
server counts one subscriber), a client killed mid-monitor costs nothing afterwards (the
server's count goes back to zero), and an outage turns the PVs INVALID, then valid again
after the reconnection: a stopped server at once (its connections close), a paused one
(``rda serve demo`` in a process of its own, SIGSTOP) after the heartbeat timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from p4p import Value
from p4p.client.thread import Context

import rda
from rda.business.server.builder import Server
from rda.business.server.devices import Device, prop
from rda.business.server.requests import GetRequest
from rda.testing import (
    GatewayProcess,
    PvaIsland,
    PvaMonitor,
    PvaProcess,
    free_port,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent


class Ticker(Device):
    """``Tick``: a counter published at 20 Hz."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-gateway-tick", daemon=True)

    @prop("Tick", blocking=False)
    def tick(self, request: GetRequest) -> rda.Data:
        return rda.Data(count=self.count)

    def start(self, server: Server) -> None:
        self._thread.start()

    def stop(self, server: Server) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.count += 1
            self.publish("Tick", rda.Data(count=self.count))


def serve(port: int) -> Server:
    device = Ticker()
    builder = rda.ServerBuilder("GatewayOutage").endpoint(f"tcp://127.0.0.1:{port}")
    builder.directory(None).device("TICK", device).on_start(device.start).on_stop(device.stop)
    return builder.build().start()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[list[Server], PvaIsland, Any, str]]:
    port = free_port()
    servers = [serve(port)]
    endpoint = servers[0].endpoint
    island = PvaIsland()
    gateway = GatewayProcess(island, tmp_path / "gateway.log", ["--refresh", "0.5"], endpoint)
    gateway.start(env={"PYTHONPATH": str(ROOT)})
    ctx = Context("pva", conf=island.client_conf(), useenv=False, nt=False)
    try:
        yield servers, island, ctx, endpoint
    finally:
        ctx.close()
        assert gateway.stop() == 0, gateway.output()
        for server in servers:
            server.stop()


def _values(updates: list[Any]) -> list[Any]:
    return [u for u in updates if isinstance(u, Value)]


def _subscribers(endpoint: str) -> int:
    with rda.ClientService(directory=rda.StaticDirectory({"*": endpoint})) as client:
        return int(client.admin(endpoint, "subscriptions", timeout=10)["count"])


def test_clients_share_one_subscription_and_may_leave_mid_monitor(
    setup: tuple[list[Server], PvaIsland, Any, str],
) -> None:
    _, island, ctx, endpoint = setup
    # p4p keeps a context's channels open until the context closes: a SharedPV sees channels
    # come and go, not monitors (docs/gateway.md, "Subscriptions").
    watcher = Context("pva", conf=island.client_conf(), useenv=False, nt=False)
    monitor = PvaMonitor(watcher)
    seen: list[Any] = []
    monitor.watch("TICK/Tick.count", lambda _, v: seen.append(v))
    other: list[Any] = []
    monitor.watch("TICK/Tick", lambda _, v: other.append(v))
    env = {**os.environ, **island.client_conf()}
    with subprocess.Popen(
        [sys.executable, "-m", "p4p.client.cli", "-w", "20", "monitor", "TICK/Tick.count"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    ) as cli:
        assert cli.stdout is not None
        lines: list[str] = []
        while len([x for x in lines if "isconnect" not in x]) < 2 and len(lines) < 20:
            lines.append(cli.stdout.readline())
        wait_until(
            lambda: len(_values(seen)) >= 2 and len(_values(other)) >= 2,
            "both monitors to get values",
        )
        # Three EPICS monitors on two PVs of one property: one rda subscriber.
        assert _subscribers(endpoint) == 1
        cli.kill()  # mid-monitor, no goodbye
        cli.wait(30)
    assert _subscribers(endpoint) == 1  # the watcher's channels still hold it
    monitor.close()
    watcher.close()
    wait_until(lambda: _subscribers(endpoint) == 0, "the gateway to end its rda subscription")
    # The gateway carries on: a new client gets a fresh value.
    value = ctx.get("TICK/Tick.count", timeout=20)
    assert value["alarm.severity"] == 0 and value["value"] > 0


def _stamp(value: Any) -> tuple[int, int]:
    return (value["timeStamp.secondsPastEpoch"], value["timeStamp.nanoseconds"])


def test_an_outage_is_invalid_and_recovers(
    setup: tuple[list[Server], PvaIsland, Any, str],
) -> None:
    servers, _, ctx, endpoint = setup
    updates: list[Any] = []
    monitor = PvaMonitor(ctx)
    monitor.watch("TICK/Tick.count", lambda _, v: updates.append(v))
    try:
        wait_until(lambda: any(isinstance(u, Value) for u in updates), "a first value")
        servers[0].stop()
        invalid = wait_until(
            lambda: next(
                (u for u in updates if isinstance(u, Value) and u["alarm.severity"] == 3), None
            ),
            "the PV to turn INVALID",
            timeout=30,
        )
        assert invalid["alarm.status"] == 2  # DRIVER: the gateway lost its source
        assert "Disconnected" in invalid["alarm.message"]
        start = len(updates)
        servers.append(serve(int(endpoint.rsplit(":", 1)[1])))
        back = wait_until(
            lambda: next(
                (u for u in updates[start:] if isinstance(u, Value) and u["alarm.severity"] == 0),
                None,
            ),
            "the PV to be valid again after the reconnection",
            timeout=60,
        )
        assert back["alarm.message"] == ""
        # A fresh acquisition, stamped after the outage was reported.
        assert _stamp(back) > _stamp(invalid)
        # The channel stayed connected through the outage (p4p reports "not yet connected"
        # once before the first value; nothing after it).
        first = next(i for i, u in enumerate(updates) if isinstance(u, Value))
        assert all(isinstance(u, Value) for u in updates[first:])
    finally:
        monitor.close()


def test_a_silent_server_is_invalid_after_the_heartbeat_timeout(tmp_path: Path) -> None:
    """A server that stops answering without closing its connections (paused with SIGSTOP):
    the rda client's heartbeat timeout, not a closed socket, turns the PVs INVALID."""
    # Real time on purpose: the rda server is a real process, paused; a 2 s heartbeat
    # timeout (both sides read RDA_HEARTBEAT_*) keeps the wait short.
    env = {
        "PYTHONPATH": str(ROOT),
        "RDA_HEARTBEAT_INTERVAL": "0.5",
        "RDA_HEARTBEAT_TIMEOUT": "2",
        "RDA_DIRECTORY_FILE": str(tmp_path / "directory.json"),
    }
    island = PvaIsland()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = PvaProcess(
        [sys.executable, "-m", "rda._cli", "serve", "demo", "--bind", endpoint],
        island,
        tmp_path / "server.log",
    )
    server.ready = endpoint
    gateway = GatewayProcess(island, tmp_path / "gateway.log", ["--refresh", "0.5"], endpoint)
    server.start(env=env)
    paused = False
    try:
        gateway.start(env=env)
        ctx = Context("pva", conf=island.client_conf(), useenv=False, nt=False)
        monitor = PvaMonitor(ctx)
        updates: list[Any] = []
        monitor.watch("PS1/Acquisition.current", lambda _, v: updates.append(v))
        try:
            wait_until(lambda: len(_values(updates)) >= 3, "values at 10 Hz")
            os.kill(server.pid, signal.SIGSTOP)
            paused = True
            start = len(updates)
            invalid = wait_until(
                lambda: next((u for u in updates[start:] if _severity(u) == 3), None),
                "the PV to turn INVALID after the heartbeat timeout",
                timeout=60,
            )
            assert "heartbeat timeout" in invalid["alarm.message"], invalid["alarm.message"]
            os.kill(server.pid, signal.SIGCONT)
            paused = False
            again = len(updates)
            wait_until(
                lambda: any(_severity(u) == 0 for u in updates[again:]),
                "values again once the server answers",
                timeout=60,
            )
        finally:
            monitor.close()
            ctx.close()
    finally:
        if paused:
            os.kill(server.pid, signal.SIGCONT)
        assert gateway.stop() == 0, gateway.output()
        server.stop()


def _severity(update: Any) -> int | None:
    return int(update["alarm.severity"]) if isinstance(update, Value) else None
