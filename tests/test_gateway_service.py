"""``rda.gateway.pva.PvaGateway`` in this process: selectors, statistics, a channel limit and
a bounded stop that leaves no thread behind (docs/gateway.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from p4p.client.thread import Context

import rda
from rda.business.server.builder import Server
from rda.business.server.devices import Device, prop
from rda.business.server.requests import GetRequest
from rda.gateway.pva import PvaGateway
from rda.testing import PvaIsland, wait_until

pytestmark = pytest.mark.timeout(120)


class Cycled(Device):
    """``Value``: the selector it was asked for, and a number."""

    @prop("Value", blocking=False)
    def value(self, request: GetRequest) -> rda.Data:
        return rda.Data(asked=request.selector or "", number=42)


@pytest.fixture
def server() -> Iterator[Server]:
    builder = rda.ServerBuilder("GatewayService").endpoint("tcp://127.0.0.1:0").directory(None)
    server = builder.device("CYC", Cycled()).build().start()
    yield server
    server.stop()


def _serve(server: Server, **kwargs: Any) -> tuple[PvaGateway, rda.ClientService, Any]:
    client = rda.ClientService(directory=rda.StaticDirectory({"*": server.endpoint}))
    island = PvaIsland()
    conf = {**island.environment(), "EPICS_PVAS_BROADCAST_PORT": str(island.broadcast_port)}
    gateway = PvaGateway(client, conf=conf, refresh=0.5, **kwargs).start()
    ctx = Context("pva", conf=gateway.conf(), useenv=False, nt=False)
    return gateway, client, ctx


def test_a_selector_suffix_reaches_the_server(no_thread_leak: None, server: Server) -> None:
    gateway, client, ctx = _serve(server)
    try:
        plain = ctx.get("CYC/Value", timeout=20)
        assert plain["value.asked"] == "" and plain["selector"] == ""
        lhc = ctx.get("CYC/Value@CPS.USER.LHC1", timeout=20)
        assert lhc["value.asked"] == "CPS.USER.LHC1"
        assert lhc["selector"] == "CPS.USER.LHC1"
        field = ctx.get("CYC/Value.asked@CPS.USER.SFTPRO", timeout=20)
        assert field["value"] == "CPS.USER.SFTPRO"
        stats = gateway.statistics()
        # One rda subscription per (property, selector): three selectors, three feeds.
        assert stats.feeds == 3 and stats.feeds_opened == 3 and stats.pvs == 3
        assert stats.devices == 1 and stats.gaps == 0
    finally:
        ctx.close()
        wait_until(lambda: gateway.statistics().feeds == 0, "the feeds to end with the channels")
        gateway.stop()
        client.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("rda-gateway")]


def test_channels_beyond_the_limit_are_refused_and_counted(server: Server) -> None:
    gateway, client, ctx = _serve(server, max_pvs=1)
    try:
        assert ctx.get("CYC/Value.number", timeout=20)["value"] == 42
        with pytest.raises(TimeoutError):
            ctx.get("CYC/Value.asked", timeout=3)
        assert gateway.statistics().channels_refused >= 1
        assert gateway.statistics().pvs == 1
    finally:
        ctx.close()
        gateway.stop()
        client.close()


def test_unknown_devices_and_properties_are_not_claimed(server: Server) -> None:
    gateway, client, ctx = _serve(server, devices="CYC*")
    try:
        assert ctx.get("CYC/Value.number", timeout=20)["value"] == 42
        for name in ("CYC/Nothing", "OTHER/Value", "not a name"):
            with pytest.raises(TimeoutError):
                ctx.get(name, timeout=2)
        assert gateway.statistics().pvs == 1  # none of them made a PV
    finally:
        ctx.close()
        gateway.stop()
        client.close()


def test_stop_is_idempotent_and_ends_every_thread(no_thread_leak: None, server: Server) -> None:
    gateway, client, ctx = _serve(server)
    assert ctx.get("CYC/Value.number", timeout=20)["value"] == 42
    gateway.stop()  # with a client still connected: it is disconnected
    gateway.stop()
    ctx.close()
    client.close()


def test_the_demo_devices(no_thread_leak: None) -> None:
    from rda.admin import install
    from rda.demo import demo_builder

    builder = demo_builder(directory=None)
    install(builder)  # the admin commands, as `rda serve demo` has them
    demo = builder.build().start()
    gateway, client, ctx = _serve(demo)
    try:
        setting = ctx.get("PS1/Setting.current", timeout=20)
        assert setting.getID() == "epics:nt/NTScalar:1.0"
        assert setting["display.units"] == "A" and setting["display.precision"] == 3
        assert (setting["control.limitLow"], setting["control.limitHigh"]) == (-100.0, 100.0)
        lhc = ctx.get("PS1/Acquisition@CPS.USER.LHC1", timeout=20)
        assert lhc["selector"] == "CPS.USER.LHC1" and lhc["value.unit"] == "A"
        orbit = ctx.get("BPM1/Orbit.orbit", timeout=20)
        assert orbit.getID() == "epics:nt/NTNDArray:1.0"
        assert [d.size for d in orbit.dimension] == [64, 2]
        assert list(ctx.get("BPM1/Orbit.planes", timeout=20)["value"]) == ["H", "V"]
        status = ctx.get("FAULTY/Status", timeout=20)
        assert status["alarm.severity"] == 3 and "interlock" in status["alarm.message"]
    finally:
        ctx.close()
        gateway.stop()
        client.close()
        demo.stop()


class Reshaped(Device):
    """``Shape``: a value whose layout :meth:`change` changes (a field more, another type)."""

    def __init__(self) -> None:
        super().__init__()
        self.value = rda.Data(x=1.0)

    @prop("Shape", blocking=False)
    def shape(self, request: GetRequest) -> rda.Data:
        return self.value

    def change(self, value: rda.Data) -> None:
        self.value = value
        self.publish("Shape", value)


def test_a_new_layout_reopens_the_pv_with_the_new_type() -> None:
    device = Reshaped()
    builder = rda.ServerBuilder("GatewayShape").endpoint("tcp://127.0.0.1:0").directory(None)
    server = builder.device("SHP", device).build().start()
    gateway, client, ctx = _serve(server)
    try:
        first = ctx.get("SHP/Shape", timeout=20)
        assert "x" in first["value"] and "y" not in first["value"]
        assert ctx.get("SHP/Shape.x", timeout=20)["value"] == 1.0
        device.change(rda.Data(x=2.0, y="two"))

        def reshaped() -> Any:
            value = ctx.get("SHP/Shape", timeout=20)
            return value if "y" in value["value"] else None

        value = wait_until(reshaped, "the property PV to carry the new field")
        assert value["value.y"] == "two" and value["value.x"] == 2.0
        # The field PV kept its type (a double both times) and shows the new value.
        wait_until(lambda: ctx.get("SHP/Shape.x", timeout=20)["value"] == 2.0, "x = 2.0")
        device.change(rda.Data(x="now a string"))
        wait_until(
            lambda: ctx.get("SHP/Shape.x", timeout=20)["value"] == "now a string",
            "the field PV reopened as a string",
        )
    finally:
        ctx.close()
        gateway.stop()
        client.close()
        server.stop()
