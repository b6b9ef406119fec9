"""Authorization on a running server: over ``rda.testing.MemoryNetwork`` (its client plays
ZAP's role and presents an authenticated principal) and over real tcp on 127.0.0.1 (declared
principals, trusted by the server). Denials never reach a handler, never decode the body, are
answered with NotAuthorizedError, counted in statistics / admin stats / metrics; the policy
reloads atomically; handlers see the principal and its roles."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import rda
from rda.admin.metrics import ServerCollector
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.policy import DenialLog, Policy, PolicyError
from rda.business.server.builder import Server
from rda.business.server.devices import Device
from rda.business.server.requests import ClientInfo, GetRequest, SetRequest
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import NotAuthorizedError, RemoteError
from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind
from rda.testing import FakeClock, MemoryNetwork, OneServerDirectory, RawPeer
from rda.transport.api import ClientHandler, ServerHandler, TransportSettings
from rda.transport.protocol import (
    ConnectAck,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_message,
)

CONFIG = Config(heartbeat_interval=1.0, heartbeat_timeout=30.0)

POLICY_TOML = """\
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
role = "operator"
operation = "subscribe"
effect = "allow"

[[rules]]
role = "admin"
operation = "admin:*"
effect = "allow"

[[rules]]
role = "*"
operation = "admin:[ps]*"
effect = "allow"
"""


class Supply(Device):
    """Records who called; ``Current`` is readable and settable."""

    def __init__(self, calls: list[tuple[str, str, tuple[str, ...]]] | None = None) -> None:
        super().__init__()
        self.current = 1.0
        # shared between the devices of one server: one list says who reached any handler
        self.calls = [] if calls is None else calls

    @Device.property("Current")
    def current_(self, request: GetRequest) -> Data:
        self.calls.append(("get", request.client.principal, request.client.roles))
        return Data(value=self.current)

    @current_.setter  # type: ignore[no-redef]
    def current_(self, value: Data, request: SetRequest) -> None:
        self.calls.append(("set", request.client.principal, request.client.roles))
        self.current = float(value["value"])


@dataclass
class Stand:
    network: MemoryNetwork
    clock: FakeClock
    server: Server
    supply: Supply
    policy_file: Path
    clients: list[ClientService] = field(default_factory=list)

    def client(self, principal: str | None, declared: str | None = None) -> ClientService:
        def transport(h: ClientHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
            return self.network.client(h, s, info, authenticated_principal=principal)

        client = ClientService(
            directory=OneServerDirectory(self.server.endpoint),
            config=CONFIG,
            transport_factory=transport,
            clock=self.clock,
            principal=declared,
        )
        self.clients.append(client)
        return client

    def admin(self, client: ClientService, command: str, **args: Any) -> Data:
        return client.admin(self.server.endpoint, command, timeout=10.0, **args)

    def raw(self, info: dict[str, Any]) -> RawPeer:
        peer = self.network.raw_peer("srv")
        peer.send(encode_connect(info))
        assert isinstance(decode_frames(peer.recv(), from_server=True), ConnectAck)
        return peer


def _build(tmp_path: Path, trust: bool = False) -> Iterator[Stand]:
    clock = FakeClock()
    network = MemoryNetwork(clock=clock)
    supply = Supply()
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML)

    def transport(h: ServerHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.server("srv", h, s, info)

    builder = (
        rda.ServerBuilder("Srv")
        .config(CONFIG)
        .device("PS1", supply)
        .device("MAG1", Supply(supply.calls))
        .directory(None)
        .transport(transport)
        .clock(clock)
        .policy(path)
        .trust_declared_principals(trust)
    )
    server = builder.build().start()
    stand = Stand(network, clock, server, supply, path)
    yield stand
    for client in stand.clients:
        client.close()
    server.stop()
    network.close()


@pytest.fixture
def stand(tmp_path: Path) -> Iterator[Stand]:
    yield from _build(tmp_path)


@pytest.fixture
def trusting(tmp_path: Path) -> Iterator[Stand]:
    yield from _build(tmp_path, trust=True)


def test_allowed_requests_reach_the_handler_with_principal_and_roles(stand: Stand) -> None:
    olga = stand.client("olga")
    olga.access_point("PS1", "Current").set(Data(value=2.5), timeout=10)
    assert olga.access_point("PS1", "Current").get(timeout=10).data["value"] == 2.5
    assert stand.supply.calls == [
        ("set", "olga", ("operator",)),
        ("get", "olga", ("operator",)),
    ]
    sub = olga.access_point("PS1", "Current").subscribe()
    first = sub.poll(10)
    assert first is not None and first.data["value"] == 2.5
    sub.close()
    assert stand.server.statistics().denied == {}


def test_denials_answer_not_authorized_and_never_reach_the_handler(stand: Stand) -> None:
    olga, nobody = stand.client("olga"), stand.client(None)
    with pytest.raises(NotAuthorizedError) as denied:
        olga.access_point("MAG1", "Current").get(timeout=10)  # device glob PS* only
    assert str(denied.value) == "olga (roles: operator) may not get MAG1/Current"
    with pytest.raises(NotAuthorizedError, match=r"anonymous \(roles: none\) may not set PS1/"):
        nobody.access_point("PS1", "Current").set(Data(value=9.0), timeout=10)
    sub = nobody.access_point("PS1", "Current").subscribe()
    refused = sub.poll(10)
    assert refused is not None and isinstance(refused.error, NotAuthorizedError)
    assert str(refused.error) == "anonymous (roles: none) may not subscribe PS1/Current"
    assert sub.poll(10) is None  # the subscription ended
    sub.close()
    assert stand.supply.calls == []
    assert stand.supply.current == 1.0
    stats = stand.server.statistics()
    assert stats.denied == {
        ("olga", "get"): 1,
        ("anonymous", "set"): 1,
        ("anonymous", "subscribe"): 1,
    }
    assert stats.requests[("get", "denied")] == 1
    assert stats.requests[("set", "denied")] == 1
    assert stats.requests[("subscribe", "denied")] == 1


def test_admin_disconnect_refused_for_operator_allowed_for_admin(stand: Stand) -> None:
    olga, ada = stand.client("olga"), stand.client("ada")
    olga.access_point("PS1", "Current").get(timeout=10)
    victim = next(c.peer for c in stand.server.clients() if c.principal == "olga")
    with pytest.raises(NotAuthorizedError, match=r"olga .* may not admin:disconnect Srv/disc"):
        stand.admin(olga, "disconnect", peer=victim)
    assert victim in [c.peer for c in stand.server.clients()]
    # ping and stats are open to everybody by the "admin:[ps]*" rule; clients is admin-only
    assert stand.admin(olga, "ping", echo="x")["echo"] == "x"
    with pytest.raises(NotAuthorizedError):
        stand.admin(olga, "clients")
    listed = stand.admin(ada, "clients")["clients"]
    assert {c["principal"] for c in listed} >= {"olga", "ada"}
    assert stand.admin(ada, "disconnect", peer=victim)["disconnected"] == victim
    assert victim not in [c.peer for c in stand.server.clients()]
    assert stand.server.statistics().denied == {
        ("olga", "admin:disconnect"): 1,
        ("olga", "admin:clients"): 1,
    }


def test_denials_in_admin_stats_and_metrics(stand: Stand) -> None:
    olga = stand.client("olga")
    for _ in range(3):
        with pytest.raises(NotAuthorizedError):
            olga.access_point("MAG1", "Current").set(Data(value=0.0), timeout=10)
    denied = stand.admin(olga, "stats")["denied"]
    assert denied["count"] == 3
    assert [dict(r.items()) for r in denied["rows"]] == [
        {"principal": "olga", "operation": "set", "count": 3}
    ]
    samples = [
        s
        for family in ServerCollector(stand.server).collect()
        if family.name == "rda_requests_denied"
        for s in family.samples
        if s.name == "rda_requests_denied_total"
    ]
    assert [(s.labels, s.value) for s in samples] == [
        ({"server": "Srv", "principal": "olga", "operation": "set"}, 3.0)
    ]


def test_a_client_cannot_forge_the_authenticated_principal(stand: Stand) -> None:
    forger = stand.raw({"application": "raw", "authenticated_principal": "ada", "principal": "ada"})
    ctx = binary.encode(Data(timeout_ms=5000))
    header = Header(RequestType.GET, 7, "PS1", "Current")
    forger.send(encode_message(Kind.REQUEST, header, [(BodyKind.REQUEST_CONTEXT, ctx)]))
    reply = _next_reply(forger)
    assert reply.header.request_type is RequestType.EXCEPTION
    assert reply.exception is not None and reply.exception[0] == "NotAuthorizedError"
    assert reply.exception[1].startswith("anonymous ")  # not trusted: declared names ignored
    forger.close()


def test_declared_principal_only_when_trusted(stand: Stand, trusting: Stand) -> None:
    with pytest.raises(NotAuthorizedError, match="anonymous"):
        stand.client(None, declared="olga").access_point("PS1", "Current").get(timeout=10)
    trusted = trusting.client(None, declared="olga")
    assert trusted.access_point("PS1", "Current").get(timeout=10).data["value"] == 1.0
    assert trusting.supply.calls == [("get", "olga", ("operator",))]
    # the authenticated identity wins over a declared one, trust or not
    with pytest.raises(NotAuthorizedError, match=r"^eve "):
        trusting.client("eve", declared="olga").access_point("PS1", "Current").get(timeout=10)


def _next_reply(peer: RawPeer) -> Any:
    while True:
        event = decode_frames(peer.recv(10.0), from_server=True)
        if isinstance(event, Incoming):
            return event.message


def test_a_denied_body_is_never_decoded(trusting: Stand) -> None:
    """Undecodable body bytes: allowed, they fail decoding (DecodeError); denied, the answer is
    NotAuthorizedError, so the body was never looked at."""
    garbage = b"\xff\xfe not a Data body \x00\x01"

    def set_with_garbage(principal: str, rid: int) -> tuple[str, str]:
        peer = trusting.raw({"application": "raw", "principal": principal})
        header = Header(RequestType.SET, rid, "PS1", "Current")
        peer.send(encode_message(Kind.REQUEST, header, [(BodyKind.DATA, garbage)]))
        reply = _next_reply(peer)
        peer.close()
        assert reply.header.id == rid and reply.exception is not None
        return reply.exception  # type: ignore[no-any-return]

    kind, _ = set_with_garbage("olga", 1)
    assert kind == "DecodeError"  # control: decoding these bytes does fail
    kind, message = set_with_garbage("mallory", 2)
    assert kind == "NotAuthorizedError" and message.startswith("mallory ")
    assert trusting.supply.calls == []
    # mallory is not listed in the policy: her label is "other" (issue 25, bounded labels)
    assert trusting.server.statistics().denied == {("other", "set"): 1}


def test_reload_good_and_broken(stand: Stand) -> None:
    olga = stand.client("olga")
    ap = olga.access_point("MAG1", "Current")
    with pytest.raises(NotAuthorizedError):
        ap.get(timeout=10)
    stand.policy_file.write_text(POLICY_TOML.replace('device = "PS*"', 'device = "*"'))
    reloaded = stand.admin(stand.client("ada"), "reload-policy")
    assert reloaded["rules"] == 4 and reloaded["source"] == str(stand.policy_file)
    assert ap.get(timeout=10).data["value"] == 1.0
    before = stand.server.policy
    broken = POLICY_TOML.replace('operation = "subscribe"', 'operation = "subscribe"\nrole = 3')
    stand.policy_file.write_text(broken)
    with pytest.raises(PolicyError, match=r"policy\.toml: not valid TOML: .*line 16"):
        stand.server.reload_policy()
    with pytest.raises(RemoteError, match="line 16"):
        stand.admin(stand.client("ada"), "reload-policy")
    assert stand.server.policy is before  # the old policy stays in force
    assert ap.get(timeout=10).data["value"] == 1.0
    stand.policy_file.write_text(POLICY_TOML.replace('effect = "allow"', 'effect = "alow"', 1))
    with pytest.raises(PolicyError, match=r"rules\[0\]\.effect \(line 11\)"):
        stand.server.reload_policy()
    assert stand.server.policy is before


@pytest.mark.parametrize(
    "text",
    [
        "",  # a zero-byte file
        POLICY_TOML[: POLICY_TOML.index("[[rules]]")],  # a write cut before its rules
    ],
    ids=["empty", "truncated"],
)
def test_reload_refuses_a_policy_that_locks_everyone_out(stand: Stand, text: str) -> None:
    """Issue 27 (1): an empty or truncated file loaded as a valid 0-rule policy and then denied
    even admin:reload-policy, so the server could no longer be fixed remotely."""
    ada = stand.client("ada")
    before = stand.server.policy
    stand.policy_file.write_text(text)
    with pytest.raises(PolicyError, match=r"policy\.toml: refused: it has no rules.*allow_empty"):
        stand.server.reload_policy()
    with pytest.raises(RemoteError, match="refused: it has no rules"):
        stand.admin(ada, "reload-policy")
    assert stand.server.policy is before  # still in force: ada can repair the file remotely
    stand.policy_file.write_text(POLICY_TOML.replace('device = "PS*"', 'device = "*"'))
    assert stand.admin(ada, "reload-policy")["rules"] == 4


def test_reload_refuses_losing_every_grant_of_reload_policy(stand: Stand) -> None:
    ada = stand.client("ada")
    # The operator rules survive, the two admin rules are gone.
    stand.policy_file.write_text(POLICY_TOML[: POLICY_TOML.index('[[rules]]\nrole = "admin"')])
    with pytest.raises(RemoteError, match=r"no principal could admin:reload-policy any more"):
        stand.admin(ada, "reload-policy")
    assert len(stand.server.policy.rules) == 4  # type: ignore[union-attr]
    # Forced: in force, and from then on nobody may reload remotely (as asked).
    assert stand.admin(ada, "reload-policy", allow_empty=True)["rules"] == 2
    with pytest.raises(NotAuthorizedError, match="may not admin:reload-policy"):
        stand.admin(ada, "reload-policy")
    # The server's own call still works, and a policy granting nothing to anyone is no loss.
    stand.policy_file.write_text("")
    assert stand.server.reload_policy(allow_empty=True).rules == []


def test_start_refuses_an_empty_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("roles = []\n")
    with pytest.raises(PolicyError, match="refused: it has no rules"):
        rda.ServerBuilder("Srv").policy(path)
    builder = rda.ServerBuilder("Srv").policy(path, allow_empty=True)
    assert builder.build().policy == Policy.from_toml(path)


def test_reload_policy_is_admin_only(stand: Stand) -> None:
    with pytest.raises(NotAuthorizedError, match=r"olga .* may not admin:reload-policy"):
        stand.admin(stand.client("olga"), "reload-policy")


def test_set_policy_gives_connected_clients_their_new_roles(stand: Stand) -> None:
    olga = stand.client("olga")
    olga.access_point("PS1", "Current").get(timeout=10)
    roles = Policy.from_dict(
        {
            "roles": ["chief"],
            "principals": {"olga": ["chief"]},
            "rules": [{"role": "chief", "effect": "allow"}],
        }
    )
    stand.server.set_policy(roles)
    olga.access_point("MAG1", "Current").get(timeout=10)
    assert stand.supply.calls[-1] == ("get", "olga", ("chief",))
    stand.server.set_policy(None)  # no policy: everything allowed, as without RBAC
    stand.client(None).access_point("MAG1", "Current").set(Data(value=3.0), timeout=10)
    assert stand.supply.calls[-1:] == [("set", "", ())]


def test_denial_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = DenialLog(lambda: now[0], interval=1.0)
    error = NotAuthorizedError("eve (roles: none) may not set A/B")
    with caplog.at_level(logging.WARNING, logger="rda.server"):
        for _ in range(1000):
            log.denied(error, b"\x01")
        now[0] = 1.5
        log.denied(error, b"\x01")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0] == "denied: eve (roles: none) may not set A/B (peer 01)"
    assert lines[1].endswith("(999 more denials not logged)")


def test_client_info_principal() -> None:
    info = {"principal": "bob", "authenticated_principal": "CN=alice"}
    assert ClientInfo.from_info(b"\x01", info).principal == "CN=alice"
    assert ClientInfo.from_info(b"\x01", {"principal": "bob"}).principal == ""
    assert ClientInfo.from_info(b"\x01", {"principal": "bob"}, trust_declared=True).principal == (
        "bob"
    )
    assert ClientInfo.from_info(b"\x01", {"principal": 5}, trust_declared=True).principal == ""
    assert ClientInfo(b"\x01").principal_name == "anonymous"


# -- real tcp ---------------------------------------------------------------------------------


@pytest.fixture
def tcp_server(tmp_path: Path) -> Iterator[tuple[Server, Supply]]:
    supply = Supply()
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML)
    server = (
        rda.ServerBuilder("TcpSrv")
        .device("PS1", supply)
        .device("MAG1", Supply(supply.calls))
        .directory(None)
        .policy(path)
        .trust_declared_principals()
        .build()
        .start()
    )
    yield server, supply
    server.stop()


def _tcp_client(server: Server, principal: str | None) -> ClientService:
    return ClientService(directory=StaticDirectory({"*": server.endpoint}), principal=principal)


def test_over_tcp_with_declared_principals(tcp_server: tuple[Server, Supply]) -> None:
    server, supply = tcp_server
    assert server.endpoint.startswith("tcp://127.0.0.1:")
    with _tcp_client(server, "olga") as olga, _tcp_client(server, "ada") as ada:
        olga.access_point("PS1", "Current").set(Data(value=4.0), timeout=10)
        with pytest.raises(NotAuthorizedError, match=r"olga .* may not set MAG1/Current"):
            olga.access_point("MAG1", "Current").set(Data(value=5.0), timeout=10)
        victim = next(c.peer for c in server.clients() if c.principal == "olga")
        with pytest.raises(NotAuthorizedError, match="admin:disconnect"):
            olga.admin(server.endpoint, "disconnect", timeout=10, peer=victim)
        assert ada.admin(server.endpoint, "disconnect", timeout=10, peer=victim)
    assert supply.calls == [("set", "olga", ("operator",))]
    assert supply.current == 4.0
    assert server.statistics().denied == {("olga", "set"): 1, ("olga", "admin:disconnect"): 1}


def test_over_tcp_a_forged_authenticated_principal_is_dropped(
    tcp_server: tuple[Server, Supply],
) -> None:
    server, supply = tcp_server
    forged = ClientService(
        directory=StaticDirectory({"*": server.endpoint}),
        client_info={"authenticated_principal": "ada"},
    )
    with forged, pytest.raises(NotAuthorizedError, match=r"^anonymous "):
        forged.access_point("PS1", "Current").get(timeout=10)
    assert supply.calls == []
