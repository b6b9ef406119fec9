"""Admin commands and /metrics end to end: a real server on 127.0.0.1, a real ClientService.

The server is the business ServerBuilder wired by ``rda.admin.install`` (what the facade
does), serving one declarative device with a fast property and a blocking one (to saturate
the device's scheduler group while admin must still answer).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from prometheus_client.parser import text_string_to_metric_families

import rda.admin
from rda.admin.metrics import metrics_endpoint, start_client_metrics
from rda.admin.registry import AdminContext, CommandRegistry
from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest, SetRequest
from rda.serialization.data import Data, DataType
from rda.serialization.errors import NoSuchDeviceError, OverloadError, RemoteError
from rda.testing import wait_until


class Magnet(Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 1.5
        self.release = threading.Event()
        self.started = threading.Event()

    @Device.property("Setting")
    def setting(self, request: GetRequest) -> Data:
        data = Data(current=self.current)
        data.append("mode", 3, type=DataType.INT32)
        return data

    @setting.setter  # type: ignore[no-redef]
    def setting(self, value: Data, request: SetRequest) -> None:
        self.current = float(value["current"])

    @Device.property("Slow")
    def slow(self, request: GetRequest) -> Data:
        self.started.set()
        self.release.wait(10.0)
        return Data(done=True)


@dataclass
class Rig:
    server: Server
    client: ClientService
    magnet: Magnet

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def admin(self, command: str, **args: Any) -> Data:
        return self.client.admin(self.endpoint, command, timeout=10.0, **args)


def start_rig(registry: CommandRegistry | None = None) -> Rig:
    magnet = Magnet()
    builder = (
        ServerBuilder("MagnetServer")
        .device("MAG1", magnet)
        .directory(None)
        .workers(2)
        .queue_limit(3)
        .metrics_port(0)
    )
    server = rda.admin.install(builder, registry).build().start()
    client = ClientService(directory=StaticDirectory({"*": server.endpoint}))
    return Rig(server, client, magnet)


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = start_rig()
    yield r
    r.magnet.release.set()
    r.client.close()
    r.server.stop()


def test_ping_info_devices_over_the_wire(rig: Rig) -> None:
    assert rig.admin("ping", echo="x")["echo"] == "x"
    info = rig.admin("info")
    assert info["name"] == "MagnetServer"
    assert info["endpoint"] == rig.endpoint
    assert info["uptime"] >= 0.0
    assert info["settings"]["workers"] == 2
    assert info["metrics_url"].startswith("http://127.0.0.1:")
    assert rig.admin("devices")["devices"] == ["MAG1"]
    names = [c["name"] for c in rig.admin("commands")["commands"]]
    assert {"ping", "info", "stats", "disconnect"} <= set(names)


def test_clients_and_disconnect(rig: Rig) -> None:
    alone = rig.admin("clients")
    assert alone["count"] == 1
    mine = alone["clients"][0]["peer"]
    assert alone["clients"][0]["info"]["pid"] > 0
    other = ClientService(directory=StaticDirectory({"*": rig.endpoint}))
    try:
        other.access_point("MAG1", "Setting").get(timeout=10.0)
        reply = rig.admin("clients")
        assert reply["count"] == 2
        victim = next(c["peer"] for c in reply["clients"] if c["peer"] != mine)
        assert rig.admin("disconnect", peer=victim)["disconnected"] == victim
        wait_until(lambda: [c["peer"] for c in rig.admin("clients")["clients"]] == [mine])
        with pytest.raises(RemoteError) as info:
            rig.admin("disconnect", peer="00")
        assert info.value.type == "AdminArgumentsError"
        assert "no connected client" in info.value.message
    finally:
        other.close()


def test_subscriptions_show_sources_and_counts(rig: Rig) -> None:
    assert rig.admin("subscriptions")["count"] == 0
    sub = rig.client.access_point("MAG1", "Setting").subscribe()
    try:
        first = sub.poll(timeout=10.0)
        assert first is not None and first.error is None
        rig.magnet.publish("Setting", Data(current=2.0))
        second = sub.poll(timeout=10.0)
        assert second is not None and second.data["current"] == 2.0
        reply = rig.admin("subscriptions", device="MAG*")
        assert reply["count"] == 1
        source = reply["sources"][0]
        assert (source["device"], source["property"], source["subscribers"]) == (
            "MAG1",
            "Setting",
            1,
        )
        assert source["notifications_sent"] >= 1
        assert "last_update" in source
        assert rig.admin("subscriptions", device="OTHER*")["count"] == 0
    finally:
        sub.close()


def test_stats_count_requests(rig: Rig) -> None:
    ap = rig.client.access_point("MAG1", "Setting")
    for _ in range(3):
        ap.get(timeout=10.0)
    stats = rig.admin("stats")
    assert stats["requests"]["get"]["ok"] == 3
    assert stats["durations"]["get"]["count"] == 3
    assert stats["transport"]["bytes_in"] > 0
    # Per (device, property) rows; outcomes that never happened are left out of the table.
    rows = [dict(r.items()) for r in stats["devices"]["rows"]]
    assert [(r["device"], r["property"], r["requests"], r["errors"]) for r in rows] == [
        ("MAG1", "Setting", 3, 0)
    ]
    assert rows[0]["p50"] > 0
    assert set(stats["requests"]) == {"get"} and set(stats["requests"]["get"]) == {"ok"}


def test_log_level_over_the_wire(rig: Rig) -> None:
    logger = logging.getLogger("rda.admin.e2e")
    try:
        assert rig.admin("log-level", logger="rda.admin.e2e", level="ERROR")["level"] == "ERROR"
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(logging.NOTSET)


def test_bad_command_and_bad_arguments_reach_the_client(rig: Rig) -> None:
    with pytest.raises(NoSuchDeviceError, match="unknown admin command 'nope'"):
        rig.admin("nope")
    with pytest.raises(RemoteError) as info:
        rig.admin("log-level", level="LOUD")
    assert info.value.type == "AdminArgumentsError"
    # The server is unaffected.
    assert rig.admin("ping")["pong"] is True


def test_admin_answers_while_device_group_is_saturated(rig: Rig) -> None:
    slow = rig.client.access_point("MAG1", "Slow")
    pending: list[Future[AcquiredData]] = [slow.get_async(timeout=20.0)]
    assert rig.magnet.started.wait(10.0)
    # One runs (blocked); of 7 more, three wait (queue_limit=3) and four are rejected.
    pending += [slow.get_async(timeout=20.0) for _ in range(7)]
    wait_until(lambda: sum(f.done() for f in pending) == 4)
    rejected = [f for f in pending if f.done()]
    assert all(isinstance(f.exception(), OverloadError) for f in rejected)
    started = time.monotonic()
    assert rig.admin("ping")["pong"] is True
    assert time.monotonic() - started < 5.0
    stats = rig.admin("stats")
    assert stats["scheduler"]["queued"] == 3
    busiest = [dict(r.items()) for r in stats["scheduler"]["busiest"]["rows"]]
    assert busiest == [{"group": "MAG1", "waiting": 3}]
    assert stats["requests"]["get"]["overload"] == 4
    rig.magnet.release.set()
    for f in pending:
        if f not in rejected:
            assert f.result(timeout=20.0).data["done"] is True


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_move_after_requests(rig: Rig) -> None:
    endpoint = metrics_endpoint(rig.server)
    assert endpoint is not None
    server = ("server", "MagnetServer")
    get_ok = (
        "rda_requests_total",
        frozenset({server, ("type", "get"), ("outcome", "ok")}),
    )
    clients = ("rda_connected_clients", frozenset({server}))
    rig.client.access_point("MAG1", "Setting").get(timeout=10.0)
    before = scrape(endpoint.url)
    assert before[get_ok] == 1
    assert before[clients] == 1
    for _ in range(4):
        rig.client.access_point("MAG1", "Setting").get(timeout=10.0)
    after = scrape(endpoint.url)
    assert after[get_ok] == 5
    count = ("rda_request_duration_seconds_count", frozenset({server, ("type", "get")}))
    assert after[count] == 5
    received = ("rda_received_bytes_total", frozenset({server}))
    assert after[received] > before[received]


@pytest.mark.usefixtures("no_thread_leak")
def test_metrics_endpoint_stops_with_the_server() -> None:
    r = start_rig()
    try:
        endpoint = metrics_endpoint(r.server)
        assert endpoint is not None
        url = endpoint.url
    finally:
        r.client.close()
        r.server.stop()
    assert metrics_endpoint(r.server) is None
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


class Greeting(pydantic.BaseModel):
    name: str


def test_custom_registry_commands_over_the_wire() -> None:
    registry = CommandRegistry(group=None)

    @registry.command("greet", Greeting)
    def greet(ctx: AdminContext, args: Greeting) -> dict[str, object]:
        return {"greeting": f"hello {args.name} from {ctx.server.name}"}

    r = start_rig(registry)
    try:
        assert r.admin("greet", name="ops")["greeting"] == "hello ops from MagnetServer"
        with pytest.raises(NoSuchDeviceError, match="available: greet"):
            r.admin("ping")
    finally:
        r.client.close()
        r.server.stop()


def test_client_metrics_of_a_real_client(rig: Rig) -> None:
    with start_client_metrics(rig.client, name="tester") as endpoint:
        label = frozenset({("client", "tester")})
        before = scrape(endpoint.url)[("rda_client_replies_total", label)]
        rig.client.access_point("MAG1", "Setting").get(timeout=10.0)
        after = scrape(endpoint.url)
        assert after[("rda_client_replies_total", label)] == before + 1
        assert after[("rda_client_connections", label)] == 1


def test_metrics_port_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_METRICS_PORT", "0")
    builder = ServerBuilder("EnvMetrics").device("MAG9", Magnet()).directory(None)
    server = rda.admin.install(builder).build().start()
    try:
        endpoint = metrics_endpoint(server)
        assert endpoint is not None
        samples = scrape(endpoint.url)
        assert samples[("rda_connected_clients", frozenset({("server", "EnvMetrics")}))] == 0
    finally:
        server.stop()
    assert metrics_endpoint(server) is None


def test_no_metrics_port_no_endpoint() -> None:
    builder = ServerBuilder("NoMetrics").device("MAG8", Magnet()).directory(None)
    server = rda.admin.install(builder).build().start()
    try:
        assert metrics_endpoint(server) is None
        assert "metrics_url" not in rda.admin.dispatch(server, "info", Data(), None)
    finally:
        server.stop()
