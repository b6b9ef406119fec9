"""Metrics an operator can alarm on (issue 25): bounded labels, outcomes that say whose fault a
failure is, per-device figures under a cap, series that exist from the start.

A real server on the in-memory transport (rda.testing) with a policy and trusted declared
principals; the collectors are read as Prometheus would read them (the text exposition,
parsed back).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import rda
from rda.admin.metrics import ServerCollector, registry_for
from rda.business.config import Config
from rda.business.scheduler import SchedulerStatistics
from rda.business.server.builder import Server
from rda.business.server.devices import Device
from rda.business.server.outcomes import outcome_of, register_client_error
from rda.business.server.requests import GetRequest, SetRequest
from rda.business.server.statistics import (
    DENIED_PRINCIPALS,
    OUTCOMES,
    REQUEST_TYPES,
    RequestCounters,
)
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError, NoSuchDeviceError, OverloadError
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind
from rda.testing import FakeClock, MemoryNetwork, RawPeer, wait_until
from rda.transport.api import ServerHandler, TransportSettings
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_message,
)

POLICY = """\
roles = ["operator", "admin"]

[principals]
olga = ["operator"]
ada = ["admin", "operator"]

[[rules]]
role = "operator"
device = "PS*"
operation = "[gs]et"
effect = "allow"

[[rules]]
role = "admin"
operation = "admin:*"
effect = "allow"
"""


class Setting(pydantic.BaseModel):
    current: float


class OutOfRange(Exception):
    """An application's own typed error, registered as bad_request below."""


register_client_error(OutOfRange, "bad_request")


class Supply(Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 1.0

    @Device.property("Current", schema=Setting)
    def current_(self, request: GetRequest) -> Data:
        return Data(current=self.current)

    @current_.setter  # type: ignore[no-redef]
    def current_(self, value: Setting, request: SetRequest) -> None:
        if value.current > 100:
            raise OutOfRange("above 100 A")
        self.current = value.current

    @Device.property("Status")
    def status(self, request: GetRequest) -> Data:
        return Data(ok=True)

    @Device.property("Boom")
    def boom(self, request: GetRequest) -> Data:
        raise RuntimeError("a real fault")


@dataclass
class Stand:
    network: MemoryNetwork
    server: Server
    ids: Iterator[int]

    def raw(self, principal: str | None) -> RawPeer:
        peer = self.network.raw_peer("srv")
        info: dict[str, Any] = {"application": "raw"}
        if principal is not None:
            info["principal"] = principal
        peer.send(encode_connect(info))
        assert isinstance(decode_frames(peer.recv(), from_server=True), ConnectAck)
        return peer

    def call(
        self, peer: RawPeer, rtype: RequestType, device: str, prop: str, data: Data | None = None
    ) -> tuple[str, str] | None:
        """Send one request, wait for its answer: None for a reply, else (type, message)."""
        rid = next(self.ids)
        body = [] if data is None else [(BodyKind.DATA, binary.encode(data))]
        peer.send(encode_message(Kind.REQUEST, Header(rtype, rid, device, prop), body))
        while True:
            event = decode_frames(peer.recv(10.0), from_server=True)
            if isinstance(event, Incoming) and event.message.header.id == rid:
                return event.message.exception

    def series(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of the server's exposition (process collector left out)."""
        text = generate_latest(registry_for(ServerCollector(self.server), process=False))
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples
        }


def _stand(tmp_path: Path, **config: Any) -> Iterator[Stand]:
    clock = FakeClock()
    network = MemoryNetwork(clock=clock)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)

    def transport(h: ServerHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.server("srv", h, s, info)

    builder = (
        rda.ServerBuilder("Srv")
        .config(Config(heartbeat_interval=1.0, heartbeat_timeout=30.0, **config))
        .device("PS1", Supply())
        .device("PS2", Supply())
        .device("PS3", Supply())
        .directory(None)
        .transport(transport)
        .clock(clock)
        .policy(policy)
        .trust_declared_principals(True)
    )
    server = builder.build().start()
    yield Stand(network, server, iter(range(1, 1_000_000)))
    server.stop()
    network.close()


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    yield from _stand(tmp_path)


def test_every_type_and_outcome_is_exposed_from_the_start(stand: Stand) -> None:
    series = stand.series()
    for rtype in REQUEST_TYPES:
        for outcome in OUTCOMES:
            key = ("rda_requests_total", (("outcome", outcome), ("server", "Srv"), ("type", rtype)))
            assert series[key] == 0.0, key
        count = ("rda_request_duration_seconds_count", (("server", "Srv"), ("type", rtype)))
        assert series[count] == 0.0
    other = (("device", "other"), ("property", "other"), ("server", "Srv"))
    assert series[("rda_device_requests_total", other)] == 0.0
    assert series[("rda_property_notifications_sent_total", other)] == 0.0
    assert series[("rda_scheduler_group_queue_depth", (("group", "other"), ("server", "Srv")))] == 0
    assert series[("rda_connections_accepted_total", (("server", "Srv"),))] == 0.0
    info = [k for k in series if k[0] == "rda_server_info"]
    assert len(info) == 1 and dict(info[0][1])["version"] == rda.__version__


def test_outcomes_say_whose_fault_a_failure_is(stand: Stand) -> None:
    olga, anonymous = stand.raw("olga"), stand.raw(None)
    get, set_ = RequestType.GET, RequestType.SET
    assert stand.call(olga, get, "PS1", "Current") is None
    assert stand.call(olga, get, "PS1", "Nope") == (
        "NoSuchDeviceError",
        "PS1/Nope: no such property (known: Boom, Current, Status)",
    )
    assert stand.call(olga, get, "PSX", "Current") == ("NoSuchDeviceError", "PSX: no such device")
    refused = stand.call(olga, set_, "PS1", "Status", Data(ok=False))
    assert refused is not None and refused[0] == "ReadOnlyPropertyError"
    invalid = stand.call(olga, set_, "PS1", "Current", Data(current="lots"))
    assert invalid is not None and invalid[0] == "PropertyValidationError"
    typed = stand.call(olga, set_, "PS1", "Current", Data(current=500.0))
    assert typed is not None and typed[0] == "OutOfRange"
    fault = stand.call(olga, get, "PS1", "Boom")
    assert fault == ("RuntimeError", "a real fault")
    denied = stand.call(anonymous, set_, "PS1", "Current", Data(current=2.0))
    assert denied is not None and denied[0] == "NotAuthorizedError"

    stats = stand.server.statistics()
    moved = {key: n for key, n in stats.requests.items() if n}
    assert moved == {
        ("get", "ok"): 1,
        ("get", "not_found"): 2,
        ("set", "bad_request"): 3,
        ("get", "handler_error"): 1,
        ("set", "denied"): 1,
    }
    # Of seven failures only the RuntimeError is the server's fault.
    assert stats.handler_errors == 1


def test_outcome_of_follows_the_class_hierarchy() -> None:
    class Missing(NoSuchDeviceError):
        pass

    assert outcome_of(Missing("x")) == "not_found"
    assert outcome_of(OverloadError("x")) == "overload"
    assert outcome_of(DisconnectedError("x")) == "disconnected"
    assert outcome_of(KeyError("x")) == "handler_error"
    with pytest.raises(ValueError, match="outcome must be one of"):
        register_client_error(KeyError, "ok")


def _word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(3, 12)))


def test_a_thousand_random_names_and_principals_mint_no_series(stand: Stand) -> None:
    """Every label comes from a closed set or the server's configuration: a client declaring
    random principals and sending random admin commands, devices and properties adds nothing
    to the exposition once each kind of request has been seen."""
    rng = random.Random(25)

    def round_of_junk(principal: str) -> None:
        peer = stand.raw(principal)
        assert stand.call(peer, RequestType.ADMIN, _word(rng), "") is not None
        assert stand.call(peer, RequestType.GET, _word(rng), _word(rng)) is not None
        assert stand.call(peer, RequestType.SET, "PS1", _word(rng), Data(x=1)) is not None
        peer.close()

    # Each shape of request once, so that the series they use exist (the denial counter has
    # no zero series: its labels are only known when a denial happens).
    round_of_junk(_word(rng))
    round_of_junk("olga")
    before = stand.series()
    for _ in range(1000):
        round_of_junk(_word(rng))
    after = stand.series()
    assert sorted(after) == sorted(before)
    denied = stand.server.statistics().denied
    assert set(denied) == {
        ("other", "admin:unknown"),
        ("other", "get"),
        ("other", "set"),
        ("olga", "admin:unknown"),
        ("olga", "get"),  # her role may get PS* only
    }
    assert sum(denied.values()) == 3 * 1001 + 2
    # The requests were counted all the same: only the labels are bounded.
    assert after[("rda_connections_accepted_total", (("server", "Srv"),))] == 1002
    wait_until(
        lambda: stand.server.statistics().connections_closed >= 1002,
        "the 1002 closes to reach the server",
        timeout=30.0,
        probe=lambda: stand.server.statistics().connections_closed,
    )
    assert stand.server.statistics().connections_closed == 1002


def test_known_admin_commands_keep_their_label(stand: Stand) -> None:
    olga = stand.raw("olga")
    refused = stand.call(olga, RequestType.ADMIN, "disconnect", "")
    assert refused is not None and refused[0] == "NotAuthorizedError"
    assert stand.server.statistics().denied == {("olga", "admin:disconnect"): 1}


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Stand]:
    yield from _stand(tmp_path, metrics_devices=2)


def test_device_pairs_are_capped_and_the_rest_is_other(capped: Stand) -> None:
    ada = capped.raw("ada")
    for device in ("PS1", "PS2", "PS3"):
        for _ in range(2):
            assert capped.call(ada, RequestType.GET, device, "Current") is None
    # Typos never take a slot, even while slots are free.
    assert capped.call(ada, RequestType.GET, "PS9", "Current") is not None
    assert capped.call(ada, RequestType.GET, "PS1", "Nope") is not None
    assert capped.call(ada, RequestType.GET, "PS1", "Boom") is not None  # PS1/Boom never ok
    series = capped.series()

    def pair(device: str, prop: str) -> tuple[tuple[str, str], ...]:
        return (("device", device), ("property", prop), ("server", "Srv"))

    requests = {k[1]: v for k, v in series.items() if k[0] == "rda_device_requests_total"}
    assert requests == {
        pair("PS1", "Current"): 2,
        pair("PS2", "Current"): 2,
        pair("other", "other"): 5,  # PS3 twice, three failures
    }
    errors = {k[1]: v for k, v in series.items() if k[0] == "rda_device_errors_total"}
    assert errors[pair("other", "other")] == 3 and errors[pair("PS1", "Current")] == 0
    count = series[("rda_device_request_duration_seconds_count", pair("PS2", "Current"))]
    assert count == 2
    assert series[("rda_device_pairs", (("server", "Srv"),))] == 2
    assert series[("rda_device_pairs_limit", (("server", "Srv"),))] == 2


class _GroupServer:
    """Just what ``group_families`` reads."""

    def devices(self) -> list[str]:
        return ["PS1", "PS2"]


def test_busiest_groups_name_only_the_servers_devices() -> None:
    from rda.admin.device_metrics import group_families

    stats: Any = type("S", (), {})()
    stats.scheduler = SchedulerStatistics(
        9, 1, 0, 0, 0, 0, 0, 3, 9, busiest=(("PS1", 5), ("made-up", 3), ("__admin__", 1))
    )
    (family,) = group_families(_GroupServer(), stats, "Srv")  # type: ignore[arg-type]
    assert {s.labels["group"]: s.value for s in family.samples} == {
        "other": 3,
        "PS1": 5,
        "__admin__": 1,
    }


def test_every_family_exposed_is_documented(stand: Stand) -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    olga = stand.raw("olga")
    assert stand.call(olga, RequestType.GET, "PS1", "Current") is None
    names = {name for name, _ in stand.series()}
    families = {re.sub(r"_(bucket|count|sum|created)$", "", name) for name in names}
    undocumented = {f for f in families if f"`{f}`" not in docs}
    assert not undocumented, sorted(undocumented)


def test_denial_principals_are_capped() -> None:
    counters = RequestCounters()
    for i in range(DENIED_PRINCIPALS + 50):
        counters.denied(f"key{i:03d}", "get")
    denied = counters.denials()
    assert len(denied) == DENIED_PRINCIPALS
    # "other" is one of the DENIED_PRINCIPALS label values: 99 keys of their own, 51 past them
    assert denied[("other", "get")] == 51
    assert denied[("key000", "get")] == 1
