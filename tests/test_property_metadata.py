"""Property metadata end to end, over real ZeroMQ on 127.0.0.1: declared on a ``Device`` and
on a callback server, described to clients (through the file directory, CURVE and the RBAC
policy), control limits refused on set, alarms sent with notifications and get replies; and
older clients: a message carrying an alarm decodes as before on the path that ignores it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pydantic
import pytest

import rda
import rda.aio
import rda.security as security
from rda import ServerBuilder
from rda.admin.metrics import ServerCollector
from rda.business.client.replies import describe_result
from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import (
    DisconnectedError,
    NoSuchDeviceError,
    NotAuthorizedError,
    RemoteError,
)
from rda.serialization.header import DataContext, RequestType
from rda.serialization.message import BodyKind, Message, decode_alarm, encode_alarm
from rda.testing import wait_until
from rda.transport import protocol
from rda.transport.protocol import Incoming, Kind, decode_frames, encode_routed

pytestmark = pytest.mark.timeout(60)

CONFIG = Config(heartbeat_interval=0.2, heartbeat_timeout=5.0, request_timeout=10.0)
CURRENT = rda.Field(units="A", precision=3, limits=(-10, 10), warning=(-8, 8), alarm=(-9, 9))


class Setting(pydantic.BaseModel):
    current: Annotated[float, CURRENT] = pydantic.Field(description="output current")
    mode: str = "DC"


class Supply(rda.Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 0.0
        self.sets: list[float] = []

    @rda.prop("Setting", schema=Setting)
    def setting(self, request: GetRequest) -> Data:
        """What the supply is asked to give.

        Not shown: only the first paragraph describes it."""
        return Data(current=self.current, mode="DC")

    @setting.setter
    def write_setting(self, value: Setting, request: SetRequest) -> None:
        self.sets.append(value.current)
        self.current = value.current

    @rda.prop(
        "Acquisition",
        fields={
            "voltage": rda.Field(units="V", precision=2, alarm=(None, 50)),
            "wave": rda.Field(units="mm", warning=(-1, 1)),
        },
        description="measured",
    )
    def acquisition(self, request: GetRequest) -> Data:
        return Data(voltage=self.current * 5, wave=[0.0, self.current / 5])

    @rda.prop("Plain")
    def plain(self, request: GetRequest) -> Data:
        return Data(x=1.0)


class Raw(RequestReplyCallback):
    def __init__(self) -> None:
        self.sets: list[Data] = []
        self.level = 0.0

    def get(self, request: GetRequest) -> None:
        request.complete(Data(level=self.level))

    def set(self, request: SetRequest) -> None:
        self.sets.append(request.data)
        request.complete()


@pytest.fixture
def served() -> Iterator[tuple[Server, Supply, Raw, ClientService]]:
    supply, raw = Supply(), Raw()
    before = set(threading.enumerate())
    server = (
        ServerBuilder("Meta")
        .config(CONFIG)
        .device("PS1", supply)
        .devices("TANK*")
        .request_reply(raw)
        .describe(
            "TANK1",
            "Level",
            {"level": rda.Field(units="m", precision=1, limits=(0, 5), alarm=(0.5, 4.5))},
            description="tank level",
        )
        .build()
        .start()
    )
    # The server registered in this test's file directory; the client finds it there.
    client = ClientService(config=CONFIG)
    yield server, supply, raw, client
    client.close()
    server.stop()
    wait_until(lambda: not [t for t in threading.enumerate() if t not in before])


def test_describe_a_device_property(served: tuple[Server, Supply, Raw, ClientService]) -> None:
    _, _, _, client = served
    described = client.access_point("PS1", "Setting").describe(timeout=10)
    assert described == rda.PropertyDescription(
        "PS1",
        "Setting",
        {"current": rda.Field("A", "output current", 3, (-10, 10), (-8, 8), (-9, 9))},
        "What the supply is asked to give.",
        settable=True,
    )
    acquisition = client.access_point("PS1", "Acquisition").describe(timeout=10)
    assert list(acquisition.fields) == ["voltage", "wave"]
    assert acquisition.fields["voltage"].alarm == (None, 50.0)
    assert (acquisition.description, acquisition.settable) == ("measured", False)
    assert client.access_point("PS1", "Plain").describe(timeout=10).fields == {}
    with pytest.raises(NoSuchDeviceError, match="PS1/Nope: no such property"):
        client.access_point("PS1", "Nope").describe(timeout=10)


def test_describe_a_callback_property(served: tuple[Server, Supply, Raw, ClientService]) -> None:
    _, _, _, client = served
    level = client.access_point("TANK1", "Level").describe(timeout=10)
    assert level.fields["level"] == rda.Field(
        units="m", precision=1, limits=(0, 5), alarm=(0.5, 4.5)
    )
    assert (level.description, level.settable) == ("tank level", True)
    # Undeclared: no fields, settable (the server hands its sets to the callback).
    assert client.access_point("TANK2", "Level").describe(timeout=10) == rda.PropertyDescription(
        "TANK2", "Level", {}, "", True
    )


def test_set_outside_the_limits_is_refused_naming_field_value_and_limit(
    served: tuple[Server, Supply, Raw, ClientService],
) -> None:
    server, supply, raw, client = served
    setting = client.access_point("PS1", "Setting")
    setting.set({"current": 10.0}, timeout=10)  # on the limit: accepted
    with pytest.raises(RemoteError) as refused:
        setting.set({"current": 12.5}, timeout=10)
    assert str(refused.value) == (
        "PropertyValidationError: PS1/Setting: "
        "current 12.5 A above the high limit 10 (limits -10 to 10)"
    )
    assert supply.sets == [10.0]
    level = client.access_point("TANK1", "Level")
    with pytest.raises(RemoteError, match=r"TANK1/Level: level -1 m below the low limit 0"):
        level.set({"level": -1}, timeout=10)
    level.set({"level": 2.0}, timeout=10)
    assert [d["level"] for d in raw.sets] == [2.0]  # the refused set never reached it
    # The refusals are counted as the client's bad requests, not as handler faults.
    assert server.statistics().handler_errors == 0


def test_alarm_on_notifications_and_get_replies(
    served: tuple[Server, Supply, Raw, ClientService],
) -> None:
    server, supply, _, client = served
    ap = client.access_point("PS1", "Setting")
    assert ap.get(timeout=10).alarm is rda.Alarm.NONE
    sub = ap.subscribe()
    try:
        first = sub.poll(10)
        assert first is not None and first.alarm is rda.Alarm.NONE
        for value in (8.5, 9.5, -9.25, 1.0):
            supply.publish("Setting", Data(current=value, mode="DC"))
        got = [sub.poll(10) for _ in range(4)]
        alarms = [n.alarm for n in got if n is not None]
        assert [a.severity for a in alarms] == [
            rda.Severity.MINOR,
            rda.Severity.MAJOR,
            rda.Severity.MAJOR,
            rda.Severity.NONE,
        ]
        assert alarms[1] == rda.Alarm(
            rda.Severity.MAJOR, "current 9.500 A above high alarm 9", "current"
        )
        supply.publish_error("Setting", "probe lost")
        error = sub.poll(10)
        assert error is not None and error.alarm.severity is rda.Severity.INVALID
        assert "probe lost" in error.alarm.message
    finally:
        sub.close()
    supply.current = 9.5
    reply = ap.get(timeout=10)
    assert reply.alarm == rda.Alarm(
        rda.Severity.MAJOR, "current 9.500 A above high alarm 9", "current"
    )
    array = client.access_point("PS1", "Acquisition").get(timeout=10)
    assert array.alarm.severity is rda.Severity.MINOR and "wave[1]" in array.alarm.message
    counts = server.alarm_counts()
    assert counts[rda.Severity.MAJOR] == 1 and counts[rda.Severity.MINOR] == 1
    # The exporter: one series per severity, no device label.
    family = next(
        m for m in ServerCollector(server).collect() if m.name == "rda_properties_in_alarm"
    )
    assert {s.labels["severity"]: s.value for s in family.samples} == {
        "minor": 1,
        "major": 1,
        "invalid": 0,
    }
    assert all(set(s.labels) == {"server", "severity"} for s in family.samples)
    # Admin ``devices`` lists the metadata and the last alarm state.
    devices = client.admin(server.endpoint, "devices", timeout=10)
    rows = {p["name"]: p for p in devices["properties"]["PS1"]["properties"]}
    assert rows["Setting"]["alarm"] == "MAJOR"
    field = rows["Setting"]["fields"][0]
    assert (field["field"], field["units"], field["limits"]) == ("current", "A", "-10..10")


def test_no_alarm_body_without_alarm_limits(
    served: tuple[Server, Supply, Raw, ClientService],
) -> None:
    """Nothing declared, nothing sent: the reply is byte for byte what it was before."""
    _, _, _, client = served
    plain = client.access_point("PS1", "Plain")
    assert plain.get(timeout=10).alarm is rda.Alarm.NONE
    sub = plain.subscribe()
    try:
        first = sub.poll(10)
        assert first is not None and first.alarm is rda.Alarm.NONE
    finally:
        sub.close()


def test_describe_through_curve_and_the_policy(tmp_path: Path) -> None:
    """describe is a get: who may get may describe, who may not is refused."""
    server_keys, alice, bob = (security.generate_keypair() for _ in range(3))
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'roles = ["reader"]\n[principals]\nalice = ["reader"]\n\n'
        '[[rules]]\nrole = "reader"\ndevice = "PS*"\noperation = "get"\neffect = "allow"\n'
        '[[rules]]\nrole = "*"\noperation = "admin:*"\neffect = "allow"\n'
    )
    server = (
        ServerBuilder("Secure")
        .config(CONFIG)
        .device("PS1", Supply())
        .security(
            security.ServerSecurity(server_keys, clients={"alice": alice.public, "bob": bob.public})
        )
        .policy(policy)
        .build()
        .start()
    )
    clients = [
        ClientService(config=CONFIG, security=security.ClientSecurity(keys))
        for keys in (alice, bob)
    ]
    try:
        described = clients[0].access_point("PS1", "Setting").describe(timeout=10)
        assert described.fields["current"].units == "A"
        with pytest.raises(NotAuthorizedError):
            clients[1].access_point("PS1", "Setting").describe(timeout=10)
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_describe_answered_by_a_server_that_predates_it() -> None:
    """An older server hands the describe selector to its get handler and answers with the
    value (a get REPLY): the client says what happened instead of misreading it."""
    with pytest.raises(rda.ProtocolError, match="before property metadata"):
        describe_result(_reply_message(Data(level=1.0), None))


def _reply_message(data: Data, alarm: bytes | None) -> Message:
    """A get REPLY as a server sends it (optionally with an alarm), decoded as a client does."""
    from rda.business.server.replies import get_reply_frames
    from rda.serialization.header import Header

    header = Header(RequestType.GET, 7, "PS1", "Setting")
    frames = get_reply_frames(header, AcquiredData(data, DataContext("CPS.USER.ALL", 1, 2)), alarm)
    event = decode_frames([bytes(f) for f in frames], from_server=True)
    assert isinstance(event, Incoming)
    return event.message


@pytest.mark.parametrize("compiled", [True, False])
def test_an_older_client_decodes_a_reply_with_an_alarm_as_before(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alarm rides in a body of a kind (3) every decoder since version 3 knows and never
    reads in a reply: the compiled and the Python frame parsers accept the message, and the
    value, context and sequence read exactly as from the same reply without the alarm."""
    if not compiled:
        monkeypatch.setattr(protocol, "_parse_compiled", None)
    data = Data(current=9.5, mode="DC")
    with_alarm = _reply_message(
        data, encode_alarm(2, "current 9.500 A above high alarm 9", "current")
    )
    without = _reply_message(data, None)
    assert [k for k, _ in with_alarm.body] == [BodyKind.DATA, BodyKind.DATA_CONTEXT, 3]
    # What an older client reads of a reply: data, context, seq and the exception; all equal.
    for read in ("data", "context", "seq", "exception"):
        assert getattr(with_alarm, read) == getattr(without, read)
    assert with_alarm.alarm == (2, "current 9.500 A above high alarm 9", "current")
    assert without.alarm == (0, "", "")
    # A notification's tail as SubscriptionSource builds it, alarm last: same seq peek.
    routed = encode_routed(
        Kind.REPLY,
        RequestType.NOTIFICATION_DATA,
        3,
        "PS1",
        "Setting",
        "",
        [
            (BodyKind.DATA, bytes(binary.encode(data))),
            (BodyKind.DATA_CONTEXT, bytes(with_alarm.frame(BodyKind.DATA_CONTEXT) or b"")),
            (BodyKind.REPLY_CONTEXT, encode_alarm(1, "m", "current")),
        ],
    )
    event = decode_frames([bytes(f) for f in routed], from_server=True)
    assert isinstance(event, Incoming) and event.message.data == data


def test_alarm_body_decoding_is_strict() -> None:
    assert decode_alarm(encode_alarm(3, "", "")) == (3, "", "")
    with pytest.raises(rda.DecodeError):
        decode_alarm(bytes(binary.encode(Data(alarm_severity="x"))))


def test_describe_and_alarms_with_asyncio(
    served: tuple[Server, Supply, Raw, ClientService],
) -> None:
    """rda.aio: describe is a coroutine too; a get's alarm comes the same way."""
    server, supply, _, _ = served
    supply.current = 8.5

    async def main() -> tuple[rda.PropertyDescription, rda.Alarm]:
        client = rda.aio.ClientService(StaticDirectory({"*": server.endpoint}), CONFIG)
        async with client:
            ap = client.access_point("PS1", "Setting")
            return await ap.describe(timeout=10), (await ap.get(timeout=10)).alarm

    described, alarm = asyncio.run(main())
    assert described == server.describe("PS1", "Setting")
    assert alarm == rda.Alarm(rda.Severity.MINOR, "current 8.500 A above high warning 8", "current")


def test_a_local_error_notification_is_invalid() -> None:
    """A disconnection (made by the client, no message) reads as INVALID with its text."""
    lost = Notification(error=DisconnectedError("PS1/Setting: connection lost"))
    assert lost.alarm == rda.Alarm(rda.Severity.INVALID, "PS1/Setting: connection lost")
    assert Notification(Data(x=1.0)).alarm is rda.Alarm.NONE


def test_the_alarm_encoder_sends_each_alarms_body_and_records_each_change() -> None:
    """A server's per-notification alarm step: the body of each value in alarm is the alarm's
    own encoding (kept bodies reused when an alarm repeats, also past the bound of kept ones),
    no body within the limits, and the table's state follows each change of severity."""
    from rda.business.server.properties import AlarmEncoder, PropertyTable

    field = rda.Field(units="A", precision=1, warning=(-8, 8), alarm=(-9, 9))
    declared = {("PS1", "Setting"): rda.PropertyDescription("PS1", "Setting", {"current": field})}
    table = PropertyTable({}, declared, True)
    encoder = table.encoder("PS1", "Setting")
    assert encoder is not None
    key = ("PS1", "Setting")
    assert encoder(Data(current=1.0, mode="DC")) is None
    assert table.alarm_states()[key] is rda.Severity.NONE
    # 9.51 and 9.54 read "9.5 A" at precision 1: one alarm, sent twice.
    for value in (9.51, 9.54):
        body = encoder(Data(current=value, mode="DC"))
        assert body == encode_alarm(2, "current 9.5 A above high alarm 9", "current")
        assert table.alarm_states()[key] is rda.Severity.MAJOR
    body = encoder(Data(current=-8.25, mode="DC"))
    assert body == encode_alarm(1, "current -8.2 A below low warning -8", "current")
    assert table.alarm_states()[key] is rda.Severity.MINOR
    # More distinct alarms than it keeps: each body still its own alarm's.
    for i in range(AlarmEncoder.MAX_BODIES + 20):
        value = 10.0 + i
        message = f"current {int(value)} A above high alarm 9"
        assert encoder(Data(current=value, mode="DC")) == encode_alarm(2, message, "current")
    nan = encoder(Data(current=float("nan"), mode="DC"))
    assert nan == encode_alarm(3, "current is not a number", "current")
    assert table.alarm_states()[key] is rda.Severity.INVALID
    assert encoder(Data(current=0.5, mode="DC")) is None
    assert table.alarm_states()[key] is rda.Severity.NONE
