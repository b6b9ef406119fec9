"""Declarative devices served end to end over tcp loopback, read with ``ClientService``."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, Field

from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device, DeviceProperty, PropertyValidationError, prop
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError, RemoteError
from rda.serialization.header import DataContext, UpdateType
from rda.testing import wait_until

CONFIG = Config(heartbeat_interval=0.2, heartbeat_timeout=5.0)


class SettingModel(BaseModel):
    current: float = Field(ge=-100, le=100)
    ramp: bool = False


class Status(BaseModel):
    ok: bool
    text: str


class PowerSupply(Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 0.0
        self.sets: list[SettingModel] = []

    @Device.property("Setting", schema=SettingModel)
    def setting(self, request: GetRequest) -> Data:
        return Data(current=self.current)

    @setting.setter
    def write_setting(self, value: SettingModel, request: SetRequest) -> None:
        self.sets.append(value)
        self.current = value.current

    @prop("Status")
    def status(self, request: GetRequest) -> Status:
        return Status(ok=True, text=f"fine on {request.selector or 'any cycle'}")

    @prop("Info")
    def info(self, request: GetRequest) -> dict[str, object]:
        return {"model": "PS-9000", "channels": 2}

    @prop("Stamped")
    def stamped(self, request: GetRequest) -> AcquiredData:
        return AcquiredData(Data(x=1), DataContext("CPS.USER.MD1", 5, 6))

    @prop("Later")
    def later(self, request: GetRequest) -> None:
        threading.Thread(target=request.complete, args=(Data(late=True),)).start()

    @prop("Bad")
    def bad(self, request: GetRequest) -> object:
        return 42


class Raw(RequestReplyCallback):
    def get(self, request: GetRequest) -> None:
        request.complete(Data(raw=request.device))


@pytest.fixture
def served() -> Iterator[tuple[Server, PowerSupply, ClientService]]:
    ps = PowerSupply()
    before = set(threading.enumerate())
    server = (
        ServerBuilder("Devices")
        .config(CONFIG)
        .device("PS1", ps)
        .devices("RAW1")
        .request_reply(Raw())
        .directory(None)
        .build()
    )
    server.start()
    client = ClientService(directory=StaticDirectory({"*": server.endpoint}), config=CONFIG)
    yield server, ps, client
    client.close()
    server.stop()
    wait_until(lambda: not [t for t in threading.enumerate() if t not in before])


def test_properties_are_collected_by_wire_name() -> None:
    props = PowerSupply.properties()
    assert set(props) == {"Setting", "Status", "Info", "Stamped", "Later", "Bad"}
    assert isinstance(PowerSupply.setting, DeviceProperty)
    assert props["Setting"].set_function is not None and props["Status"].set_function is None

    class Bigger(PowerSupply):
        @prop("Extra")
        def extra(self, request: GetRequest) -> Data:
            return Data()

    assert set(Bigger.properties()) == set(props) | {"Extra"}


def test_getter_return_types(served: tuple[Server, PowerSupply, ClientService]) -> None:
    _, _, client = served
    status = client.access_point("PS1", "Status").get(selector="CPS.USER.SFTPRO", timeout=5)
    assert status.data == Data(ok=True, text="fine on CPS.USER.SFTPRO")
    assert status.context.acq_stamp > 0  # plain values are stamped by the server
    assert client.access_point("PS1", "Info").get(timeout=5).data == Data(
        model="PS-9000", channels=2
    )
    stamped = client.access_point("PS1", "Stamped").get(timeout=5)
    assert stamped.context.cycle_name == "CPS.USER.MD1" and stamped.context.acq_stamp == 6
    assert client.access_point("PS1", "Later").get(timeout=5).data == Data(late=True)
    with pytest.raises(RemoteError, match="expected Data, dict"):
        client.access_point("PS1", "Bad").get(timeout=5)


def test_set_is_validated_by_the_schema(served: tuple[Server, PowerSupply, ClientService]) -> None:
    _, ps, client = served
    ap = client.access_point("PS1", "Setting")
    ap.set(Data(current=12.5), timeout=5)
    assert ps.sets == [SettingModel(current=12.5)]
    assert ap.get(timeout=5).data == Data(current=12.5)
    with pytest.raises(RemoteError) as info:
        ap.set(Data(current="lots"), timeout=5)
    assert info.value.type == "PropertyValidationError"
    assert info.value.message.startswith("PS1/Setting: current: Input should be a valid number")
    with pytest.raises(RemoteError, match="current: Input should be less than or equal to 100"):
        ap.set(Data(current=1000.0), timeout=5)
    assert ps.current == 12.5


def test_unknown_and_read_only(served: tuple[Server, PowerSupply, ClientService]) -> None:
    _, _, client = served
    with pytest.raises(NoSuchDeviceError, match="PS1/Nope: no such property"):
        client.access_point("PS1", "Nope").get(timeout=5)
    with pytest.raises(RemoteError, match="PS1/Status: read-only property"):
        client.access_point("PS1", "Status").set(Data(ok=False), timeout=5)
    # Devices not served by a Device object go to the raw callback.
    assert client.access_point("RAW1", "X").get(timeout=5).data == Data(raw="RAW1")


def test_unknown_device_without_raw_callback() -> None:
    server = (
        ServerBuilder("OnlyDevices").config(CONFIG).device("PS2", PowerSupply()).directory(None)
    ).build()
    with (
        server,
        ClientService(directory=StaticDirectory({"*": server.endpoint}), config=CONFIG) as c,
        pytest.raises(NoSuchDeviceError, match="PS9: no such device"),
    ):
        c.access_point("PS9", "Setting").get(timeout=5)


def test_publish_reaches_subscribers_and_set_sends_immediate(
    served: tuple[Server, PowerSupply, ClientService],
) -> None:
    _, ps, client = served
    assert ps.name == "PS1"
    assert ps.publish("Setting", Data(current=0.0)) == 0  # nobody listens yet
    sub = client.access_point("PS1", "Setting").subscribe()
    other = client.access_point("PS1", "Setting").subscribe(selector="CPS.USER.MD1")
    for s in (sub, other):
        first = s.poll(10)
        assert first is not None and first.update_type is UpdateType.FIRST
    assert ps.publish("Setting", {"current": 3.0}, selector="CPS.USER.MD1") == 1
    n = other.poll(10)
    assert n is not None and n.update_type is UpdateType.NORMAL and n.data["current"] == 3.0
    assert ps.publish("Setting", Data(current=4.0)) == 2
    client.access_point("PS1", "Setting").set(Data(current=5.0), timeout=5)
    seen = []
    for _ in range(2):
        n = sub.poll(10)
        assert n is not None
        seen.append((n.update_type, n.data["current"]))
    assert seen == [(UpdateType.NORMAL, 4.0), (UpdateType.IMMEDIATE, 5.0)]
    with pytest.raises(NoSuchDeviceError):
        ps.publish("Nope", Data())


def test_subscribing_to_an_unknown_property_fails(
    served: tuple[Server, PowerSupply, ClientService],
) -> None:
    server, _, client = served
    sub = client.access_point("PS1", "Nope").subscribe()
    n = sub.poll(10)
    assert n is not None and isinstance(n.error, NoSuchDeviceError)
    assert server.subscriptions() == []


def test_validation_message_lists_every_bad_field() -> None:
    p = PowerSupply.properties()["Setting"]
    with pytest.raises(PropertyValidationError) as info:
        p.validate("PS3", Data(current="x", ramp="maybe"))
    text = str(info.value)
    assert text.startswith("PS3/Setting: current: ")
    assert "; ramp: Input should be a valid boolean" in text


def test_subclass_without_super_init_is_served() -> None:
    """PyTango-style subclasses often skip super().__init__(); serving must still work."""

    class NoSuper(Device):
        def __init__(self) -> None:
            self.value = 7.0

        @prop("Value")
        def value_prop(self, request: GetRequest) -> Data:
            return Data(value=self.value)

    device = NoSuper()
    server = ServerBuilder("NoSuper").device("NS1", device).build().start()
    try:
        assert device.name == "NS1"
    finally:
        server.stop()
    assert device.name == "NS1"
