"""CURVE identities drive the authorization policy: the ZAP User-Id is the principal the policy
decides on, over real loopback sockets (the two halves are tested alone in test_security.py and
test_authz.py; this is where they meet)."""

from __future__ import annotations

from typing import Any

import pytest

import rda.security as security
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.serialization.errors import NotAuthorizedError

POLICY = {
    "roles": ["operator", "expert"],
    "principals": {"alice": ["operator"], "bob": ["expert"]},
    "rules": [
        {"role": "expert", "effect": "allow"},
        {"role": "operator", "operation": "get", "effect": "allow"},
    ],
}


class Supply(RequestReplyCallback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []

    def get(self, request: GetRequest) -> None:
        self.calls.append(("get", request.client.principal, request.client.roles))
        request.complete(Data(value=1.5))

    def set(self, request: SetRequest) -> None:
        self.calls.append(("set", request.client.principal, request.client.roles))
        request.complete()


class Stand:
    def __init__(self) -> None:
        self.server_keys = security.generate_keypair()
        self.keys = {name: security.generate_keypair() for name in ("alice", "bob", "carol")}
        self.supply = Supply()
        clients = {name: kp.public for name, kp in self.keys.items()}
        self.server: Server = (
            ServerBuilder("SECURED")
            .endpoint("tcp://127.0.0.1:0")
            .request_reply(self.supply)
            .devices("*")
            .directory(None)
            .security(security.ServerSecurity(self.server_keys, clients=clients))
            .policy(security.Policy.from_dict(POLICY))
            .build()
        )
        self.clients: list[ClientService] = []

    def client(self, name: str, **info: Any) -> ClientService:
        client = ClientService(
            StaticDirectory({"*": self.server.endpoint}),
            Config(request_timeout=5.0),
            security=security.ClientSecurity(self.keys[name], self.server_keys.public),
            client_info=info,
            principal="bob",  # declared: never believed on a CURVE server
        )
        self.clients.append(client)
        return client


@pytest.fixture
def stand(no_thread_leak: None) -> Any:
    s = Stand()
    s.server.start()
    try:
        yield s
    finally:
        for c in s.clients:
            c.close()
        s.server.stop()


def test_the_curve_identity_is_the_principal_the_policy_decides_on(stand: Stand) -> None:
    alice = stand.client("alice").access_point("PS1", "Current")
    assert alice.get().data["value"] == 1.5
    with pytest.raises(NotAuthorizedError, match=r"alice .*operator.* may not set PS1/Current"):
        alice.set(Data(value=2.0))
    stand.client("bob").access_point("PS1", "Current").set(Data(value=2.0))
    # Neither the declared "bob" nor a forged authenticated_principal made alice an expert.
    assert stand.supply.calls == [
        ("get", "alice", ("operator",)),
        ("set", "bob", ("expert",)),
    ]


def test_a_forged_principal_beside_a_curve_key_counts_for_nothing(stand: Stand) -> None:
    carol = stand.client("carol", authenticated_principal="bob")
    with pytest.raises(NotAuthorizedError, match=r"carol \(roles: none\) may not get"):
        carol.access_point("PS1", "Current").get()
    assert stand.supply.calls == []
    denied = stand.server.statistics().denied
    assert denied == {("carol", "get"): 1}


def test_a_callers_lane_is_a_curve_session_of_the_same_identity(stand: Stand) -> None:
    client = stand.client("alice")
    alice = client.access_point("PS1", "Current")
    alice.get()  # opens the shared connection
    assert alice.get().data["value"] == 1.5  # on the caller's lane, its own CURVE handshake
    with pytest.raises(NotAuthorizedError, match=r"alice .*operator.* may not set PS1/Current"):
        alice.set(Data(value=2.0))
    assert client.statistics().transport.lanes == 1
    assert stand.server.statistics().transport.lanes == 1
    assert stand.supply.calls == [("get", "alice", ("operator",))] * 2
    assert stand.server.statistics().denied == {("alice", "set"): 1}
