"""Puts through the pvAccess gateway (docs/gateway.md, "Security").

Refused without ``--allow-put``; with it, allowed only as the rule file says (account, host,
PV), each logged with its peer; a refused put is answered with the reason, a set rda refuses
with rda's error text. The rules, the peer's address and the conversion to rda types are
also checked without a network.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from p4p import Type, Value
from p4p.client.raw import RemoteError
from p4p.client.thread import Context
from pydantic import BaseModel, Field

import rda
from rda.business.server.builder import Server
from rda.business.server.devices import Device, prop
from rda.business.server.requests import GetRequest, SetRequest
from rda.gateway.naming import PvName
from rda.gateway.puts import PutGate, PutRefused, PutRules, load_rules, peer_host, to_set
from rda.testing import GatewayProcess, PvaIsland

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 20.0


# -- without a network -----------------------------------------------------------------------


def test_a_rule_matches_account_host_and_pv() -> None:
    rules = PutRules.model_validate(
        {"allow": [{"account": "op*", "host": "10.0.1.*", "pvs": ["PS*/Setting*"]}]}
    )
    assert rules.allows("operator", "10.0.1.7", "PS1/Setting.current")
    assert not rules.allows("guest", "10.0.1.7", "PS1/Setting.current")
    assert not rules.allows("operator", "10.0.2.7", "PS1/Setting.current")
    assert not rules.allows("operator", "10.0.1.7", "PS1/Acquisition.current")
    assert not PutRules().allows("operator", "10.0.1.7", "PS1/Setting")  # no rule: nothing


def test_a_broken_rule_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('[[allow]]\naccount = "x"\npvz = ["A/B"]\n')
    with pytest.raises(ValueError, match=r"rules\.toml"):
        load_rules(path)
    path.write_text("[[allow]\n")
    with pytest.raises(ValueError, match=r"rules\.toml"):
        load_rules(path)
    path.write_text('[[allow]]\nhost = "127.0.0.1"\npvs = ["A/B"]\n')
    assert load_rules(path).allows("anyone", "127.0.0.1", "A/B")


def test_the_peer_host_is_the_address_without_port() -> None:
    assert peer_host("127.0.0.1:5075") == "127.0.0.1"
    assert peer_host("[::1]:5075") == "::1"
    assert peer_host("somewhere") == "somewhere"


def _scalar(code: str, value: Any) -> Any:
    return Value(Type([("value", code)]), {"value": value})


def test_a_field_put_takes_the_current_type() -> None:
    current = rda.Data(current=1.5, count=3, name="x", flags=np.zeros(3, dtype=np.int16))
    assert to_set(("current",), current, _scalar("d", 2))["current"] == 2.0
    data = to_set(("count",), current, _scalar("d", 4.0))
    assert data["count"] == 4
    assert data.type_of("count") == current.type_of("count")
    with pytest.raises(PutRefused, match=r"count: 2\.5 is not an integer"):
        to_set(("count",), current, _scalar("d", 2.5))
    assert to_set(("name",), current, _scalar("s", "y"))["name"] == "y"
    flags = to_set(("flags",), current, _scalar("ad", [1.0, 2.0]))
    assert flags.type_of("flags") is rda.DataType.INT16_ARRAY
    assert list(flags["flags"]) == [1, 2]
    with pytest.raises(PutRefused, match="no field other"):
        to_set(("other",), current, _scalar("d", 1.0))
    with pytest.raises(PutRefused, match="nested"):
        to_set(("a", "b"), current, _scalar("d", 1.0))


def test_a_property_put_sets_the_changed_fields() -> None:
    current = rda.Data(current=1.5, count=3)
    type_ = Type([("value", ("S", None, [("current", "d"), ("count", "i")]))])
    value = Value(type_, {})
    value["value.count"] = 7
    data = to_set((), current, value)
    assert dict(data.items()) == {"count": 7}
    with pytest.raises(PutRefused, match="changes no field"):
        to_set((), current, Value(type_, {}))


class _Op:
    """A pvAccess put as p4p hands it to the handler."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def account(self) -> str:
        return "mallory"

    def peer(self) -> str:
        return "10.9.8.7:40000"

    def value(self) -> Any:
        return _scalar("d", 1.0)

    def done(self, value: Any = None, error: str | None = None) -> None:
        assert error is not None
        self.errors.append(error)


def test_a_flood_of_refused_puts_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = PutGate(cast(Any, None), clock=lambda: 0.0)  # time stands still: one interval
    pv = SimpleNamespace(text="PS1/Setting.current", name=PvName("PS1", "Setting", ("current",)))
    op = _Op()
    with caplog.at_level(logging.INFO, logger="rda.gateway.puts"):
        for _ in range(50):
            gate(cast(Any, pv), op)
    assert gate.refused == 50 and len(op.errors) == 50
    assert all("puts are disabled" in e for e in op.errors)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines == [
        "put PS1/Setting.current by mallory@10.9.8.7 refused: puts are disabled "
        "(the gateway runs without --allow-put)"
    ]


# -- through a gateway process ----------------------------------------------------------------


class SettingModel(BaseModel):
    current: float = Field(ge=-10.0, le=10.0)


class Supply(Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 0.0
        self.mode = 0

    @prop("Setting", schema=SettingModel, blocking=False)
    def setting(self, request: GetRequest) -> rda.Data:
        return rda.Data(current=self.current)

    @setting.setter
    def write_setting(self, value: SettingModel, request: SetRequest) -> None:
        self.current = value.current
        self.publish("Setting", rda.Data(current=value.current))

    @prop("Mode", blocking=False)
    def mode_get(self, request: GetRequest) -> rda.Data:
        return rda.Data(mode=self.mode)

    @mode_get.setter
    def mode_set(self, value: rda.Data, request: SetRequest) -> None:
        self.mode = int(value["mode"])
        self.publish("Mode", rda.Data(mode=self.mode))


@pytest.fixture
def server() -> Iterator[Server]:
    builder = rda.ServerBuilder("GatewayPuts").endpoint("tcp://127.0.0.1:0").directory(None)
    server = builder.device("SUP", Supply()).build().start()
    yield server
    server.stop()


def _gateway(tmp_path: Path, server: Server, args: list[str]) -> tuple[GatewayProcess, PvaIsland]:
    island = PvaIsland()
    args = ["--refresh", "0.5", *args]
    process = GatewayProcess(island, tmp_path / "gateway.log", args, endpoint=server.endpoint)
    process.start(env={"PYTHONPATH": str(ROOT)})
    return process, island


def _put_error(ctx: Any, name: str, value: Any) -> str:
    with pytest.raises(RemoteError) as caught:
        ctx.put(name, value, timeout=TIMEOUT, wait=True)
    return str(caught.value)


@pytest.mark.timeout(180)
def test_puts_are_refused_without_allow_put(tmp_path: Path, server: Server) -> None:
    process, island = _gateway(tmp_path, server, [])
    ctx = Context("pva", conf=island.client_conf(), useenv=False, nt=False)
    try:
        assert ctx.get("SUP/Setting.current", timeout=TIMEOUT)["value"] == 0.0
        assert "puts are disabled" in _put_error(ctx, "SUP/Setting.current", 1.0)
        assert ctx.get("SUP/Setting.current", timeout=TIMEOUT)["value"] == 0.0
    finally:
        ctx.close()
        assert process.stop() == 0
    assert "refused: puts are disabled" in process.output()


RULES = """
[[allow]]
account = "*"
host = "127.0.0.1"
pvs = ["SUP/Setting.current", "SUP/Mode"]

[[allow]]
account = "nobody-here"
host = "*"
pvs = ["SUP/Mode.mode"]
"""


@pytest.mark.timeout(180)
def test_puts_follow_the_rule_file_and_are_logged(tmp_path: Path, server: Server) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    process, island = _gateway(tmp_path, server, ["--allow-put", "--put-rules", str(rules)])
    ctx = Context("pva", conf=island.client_conf(), useenv=False, nt=False)
    direct = rda.ClientService(directory=rda.StaticDirectory({"*": server.endpoint}))
    try:
        ctx.put("SUP/Setting.current", 2.5, timeout=TIMEOUT, wait=True)
        assert direct.access_point("SUP", "Setting").get().data["current"] == 2.5
        # The property PV: the changed fields of value.
        ctx.put("SUP/Mode", {"value.mode": 3}, timeout=TIMEOUT, wait=True)
        assert direct.access_point("SUP", "Mode").get().data["mode"] == 3
        # Not in the rules for this account: refused by the gateway, rda never asked.
        refused = _put_error(ctx, "SUP/Mode.mode", 4)
        assert "put to SUP/Mode.mode not allowed for" in refused and "@127.0.0.1" in refused
        assert direct.access_point("SUP", "Mode").get().data["mode"] == 3
        # Allowed by the gateway, refused by the rda server: its error text comes back.
        error = _put_error(ctx, "SUP/Setting.current", 50.0)
        assert "PropertyValidationError" in error and "current" in error
        assert direct.access_point("SUP", "Setting").get().data["current"] == 2.5
    finally:
        ctx.close()
        direct.close()
        assert process.stop() == 0
    log = process.output()
    assert "put SUP/Setting.current {'current': 2.5} by " in log
    assert "@127.0.0.1" in log
    assert "put SUP/Mode.mode by" in log and "refused: put to SUP/Mode.mode not allowed" in log
    assert "put SUP/Setting.current by" in log and "failed: " in log


def test_allow_put_needs_a_rule_file() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rda._cli", "gateway", "pva", "--allow-put"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "--allow-put needs --put-rules FILE" in result.stderr
