"""CURVE encryption and ZAP authentication on real loopback sockets, and the key files."""

from __future__ import annotations

import os
import selectors
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

import rda
import rda.security as security
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import FileDirectory, StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import (
    GetRequest,
    RequestReplyCallback,
    SetRequest,
    SubscriptionRequest,
)
from rda.business.server.subscriptions import SubscriptionCallback
from rda.serialization.data import Data
from rda.serialization.header import UpdateType
from rda.testing import FakeClock, wait_until

MARKER = "PLAINTEXT-MARKER-7f3a9c"


class Handler(RequestReplyCallback):
    def __init__(self) -> None:
        self.calls = 0
        self.principals: list[Any] = []
        self.value = MARKER

    def get(self, request: GetRequest) -> None:
        self.calls += 1
        self.principals.append(request.client.info.get("authenticated_principal"))
        request.complete(Data(text=self.value))

    def set(self, request: SetRequest) -> None:
        self.calls += 1
        self.value = str(request.data["text"])
        request.complete()


class Subs(SubscriptionCallback):
    def __init__(self) -> None:
        self.calls = 0

    def subscribe(self, request: SubscriptionRequest) -> None:
        self.calls += 1
        request.accept()


class Keys:
    def __init__(self) -> None:
        self.server = security.generate_keypair()
        self.alice = security.generate_keypair()
        self.mallory = security.generate_keypair()


@pytest.fixture
def keys() -> Keys:
    return Keys()


def build(keys: Keys | None, handler: Handler, subs: Subs | None = None, port: int = 0) -> Server:
    builder = (
        ServerBuilder("SECURE")
        .endpoint(f"tcp://127.0.0.1:{port}")
        .request_reply(handler)
        .subscription(subs or Subs())
        .devices("*")
        .directory(None)
    )
    if keys is not None:
        builder.security(security.ServerSecurity(keys.server, clients={"alice": keys.alice.public}))
    return builder.build()


def client_for(
    endpoint: str, keypair: security.KeyPair | None, server_key: str | None, **config: Any
) -> ClientService:
    sec = None if keypair is None else security.ClientSecurity(keypair, server_key=server_key)
    return ClientService(
        StaticDirectory({"*": endpoint}),
        Config(**{"request_timeout": 5.0, "workers": 2, **config}),
        security=sec,
    )


# ----------------------------------------------------------------------------- key files


def test_keypair_round_trip_and_public_file(tmp_path: Path) -> None:
    pair = security.generate_keypair()
    assert len(pair.public) == 40 and len(pair.secret) == 40
    assert pair.secret not in repr(pair)
    security.save_keypair(pair, tmp_path / "alice.key_secret")
    assert (tmp_path / "alice.key_secret").stat().st_mode & 0o777 == 0o600
    assert security.load_keypair(tmp_path / "alice.key_secret") == pair
    assert security.load_public_key(tmp_path / "alice.key") == pair.public
    assert pair.secret not in (tmp_path / "alice.key").read_text()
    assert security.load_clients(tmp_path) == {"alice": pair.public}


def test_secret_file_readable_by_others_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "op.key_secret"
    security.save_keypair(security.generate_keypair(), path)
    os.chmod(path, 0o644)
    with pytest.raises(security.KeyFileError, match=r"op\.key_secret.*mode 0644.*chmod 600"):
        security.load_keypair(path)


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("public = ", "malformed"),
        ('secret = "x"\n', "no 'public' key"),
        ('public = "short"\nsecret = "short"\n', "'public' must be 40 Z85 characters"),
        ('public = 5\nsecret = "x"\n', "'public' must be a string"),
    ],
)
def test_malformed_key_file_is_one_clear_error(tmp_path: Path, text: str, fault: str) -> None:
    path = tmp_path / "bad.key_secret"
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(security.KeyFileError, match=rf"bad\.key_secret.*{fault}"):
        security.load_keypair(path)


def test_mismatched_halves_and_missing_file(tmp_path: Path) -> None:
    a, b = security.generate_keypair(), security.generate_keypair()
    path = tmp_path / "mixed.key_secret"
    path.write_text(f'public = "{a.public}"\nsecret = "{b.secret}"\n')
    os.chmod(path, 0o600)
    with pytest.raises(security.KeyFileError, match="does not belong to the secret key"):
        security.load_keypair(path)
    with pytest.raises(security.KeyFileError, match=r"nope\.key_secret: no such file"):
        security.load_keypair(tmp_path / "nope.key_secret")


def test_bad_clients_directory_stops_the_build(tmp_path: Path, keys: Keys) -> None:
    (tmp_path / "eve.key").write_text('public = "not a key"\n')
    builder = ServerBuilder("X").directory(None).devices("*")
    builder.security(security.ServerSecurity(keys.server, clients=tmp_path))
    with pytest.raises(security.KeyFileError, match=r"eve\.key.*'public' must be 40"):
        builder.build()


# ------------------------------------------------------------------------ on the network


def test_authorized_client_gets_sets_subscribes_as_its_principal(
    no_thread_leak: None, keys: Keys
) -> None:
    handler, subs = Handler(), Subs()
    server = build(keys, handler, subs).start()
    client = client_for(server.endpoint, keys.alice, keys.server.public)
    got: list[Any] = []
    try:
        ap = client.access_point("PS1", "Text")
        assert ap.get().data["text"] == MARKER
        ap.set(Data(text="changed"))
        assert ap.get().data["text"] == "changed"
        sub = ap.subscribe(listener=got.append)
        wait_until(lambda: len(got) >= 1)
        assert got[0].error is None and got[0].update_type is UpdateType.FIRST
        sub.close()
        # The two direct gets (the subscription's first value is fetched by the server).
        assert handler.principals[:2] == ["alice", "alice"]
        assert server.statistics().transport.auth_failures == 0
    finally:
        client.close()
        server.stop()


def test_declared_principal_is_never_believed(no_thread_leak: None, keys: Keys) -> None:
    handler = Handler()
    server = build(keys, handler).start()
    client = ClientService(
        StaticDirectory({"*": server.endpoint}),
        Config(request_timeout=5.0),
        security=security.ClientSecurity(keys.alice, keys.server.public),
        client_info={"authenticated_principal": "admin"},
    )
    plain_server = build(None, Handler()).start()
    plain = ClientService(
        StaticDirectory({"*": plain_server.endpoint}),
        Config(request_timeout=5.0),
        client_info={"authenticated_principal": "admin"},
    )
    try:
        client.access_point("PS1", "Text").get()
        assert handler.principals == ["alice"]
        plain_handler = plain_server._rr
        assert isinstance(plain_handler, Handler)
        plain.access_point("PS1", "Text").get()
        assert plain_handler.principals == [None]
    finally:
        client.close()
        plain.close()
        server.stop()
        plain_server.stop()


@pytest.mark.parametrize("who", ["no keys", "unknown key", "wrong server key"])
def test_refused_client_fails_fast_and_reaches_no_handler(
    no_thread_leak: None, keys: Keys, who: str
) -> None:
    handler, subs = Handler(), Subs()
    server = build(keys, handler, subs).start()
    pair, server_key = {
        "no keys": (None, None),
        "unknown key": (keys.mallory, keys.server.public),
        "wrong server key": (keys.alice, keys.mallory.public),
    }[who]
    # A long connect timeout: a refusal must come from the handshake, not from a timer.
    client = client_for(server.endpoint, pair, server_key, request_timeout=30.0)
    try:
        # NotAuthorizedError, not TimeoutError nor the connect timer's DisconnectedError:
        # the handshake said no (the type tells, not the elapsed time on a loaded machine).
        with pytest.raises(rda.NotAuthorizedError, match="security handshake refused"):
            client.access_point("PS1", "Text").get(timeout=30.0)
        wait_until(lambda: server.statistics().transport.auth_failures >= 1)
        assert handler.calls == 0 and subs.calls == 0
        # The server keeps serving an authorized client.
        good = client_for(server.endpoint, keys.alice, keys.server.public)
        try:
            assert good.access_point("PS1", "Text").get().data["text"] == MARKER
        finally:
            good.close()
    finally:
        client.close()
        server.stop()


def test_refused_subscription_ends_and_nothing_retries(no_thread_leak: None, keys: Keys) -> None:
    # Issue 26: a refused handshake is final for the endpoint until something changes; the
    # subscription ends with NotAuthorizedError instead of retrying on the back-off forever.
    server = build(keys, Handler()).start()
    clock = FakeClock()
    client = ClientService(
        StaticDirectory({"*": server.endpoint}),
        Config(reconnect_initial=1.0, reconnect_max=1.0),
        security=security.ClientSecurity(keys.mallory, keys.server.public),
        clock=clock,
        rng_seed=1,
    )

    def failures() -> int:
        # Refused connection attempts, as the client saw them (one each).
        return client.statistics().transport.disconnects

    def dialled() -> int:
        # Connections the client opened to the server: counted when it dials, in the
        # dialling thread.
        (state,) = client.statistics().servers
        return state.connects

    try:
        sub = client.access_point("PS1", "Text").subscribe()
        ended = sub.poll(timeout=10.0)
        assert ended is not None and isinstance(ended.error, rda.NotAuthorizedError)
        assert sub.poll(timeout=1.0) is None and sub.closed
        assert failures() == 1
        assert dialled() == 1
        # Back-off periods pass on the (fake) clock: no attempt follows. A retry due by then
        # would have been dialled in advance() itself (the client's timer runs due calls in
        # the thread that advances a FakeClock), so it would be counted already.
        for _ in range(3):
            clock.advance(1.5)
        assert dialled() == 1
        assert client.statistics().servers[0].state == "refused"
        # A new request is a new decision: it dials once (the second connection ever), and is
        # refused once.
        with pytest.raises(rda.NotAuthorizedError, match="does not accept this client's key"):
            client.access_point("PS1", "Text").get(timeout=10.0)
        assert dialled() == 2
        assert failures() == 2
        wait_until(
            lambda: server.statistics().transport.auth_failures >= 2,
            "the server to count both refusals",
        )
    finally:
        client.close()
        server.stop()


def test_reconnects_after_a_secured_server_restart(no_thread_leak: None, keys: Keys) -> None:
    server = build(keys, Handler()).start()
    port = int(server.endpoint.rsplit(":", 1)[1])
    client = client_for(server.endpoint, keys.alice, keys.server.public)
    got: list[Any] = []
    restarted: Server | None = None
    try:
        sub = client.access_point("PS1", "Text").subscribe(listener=got.append)
        wait_until(lambda: len(got) == 1)
        server.stop()
        wait_until(lambda: len(got) == 2)
        assert isinstance(got[1].error, rda.DisconnectedError)
        restarted = build(keys, Handler(), port=port).start()
        wait_until(lambda: len(got) == 3)
        assert got[2].error is None and got[2].update_type is UpdateType.FIRST
        assert client.access_point("PS1", "Text").get().data["text"] == MARKER
        assert client.statistics().reconnects == 1
        sub.close()
    finally:
        client.close()
        if restarted is not None:
            restarted.stop()
        server.stop()


def test_server_key_comes_from_the_file_directory(
    no_thread_leak: None, keys: Keys, tmp_path: Path
) -> None:
    directory = FileDirectory(tmp_path / "dir.json")
    server = (
        ServerBuilder("KEYED")
        .request_reply(Handler())
        .devices("PS1")
        .directory(directory)
        .security(security.ServerSecurity(keys.server, clients={"alice": keys.alice.public}))
        .build()
        .start()
    )
    client = ClientService(
        directory, Config(request_timeout=5.0), security=security.ClientSecurity(keys.alice)
    )
    try:
        assert directory.server_key(server.endpoint) == keys.server.public
        assert client.access_point("PS1", "Text").get().data["text"] == MARKER
    finally:
        client.close()
        server.stop()


def test_static_directory_value_may_carry_the_server_key(keys: Keys) -> None:
    directory = StaticDirectory({"PS*": f"tcp://127.0.0.1:5555;server_key={keys.server.public}"})
    assert directory.resolve("PS1") == "tcp://127.0.0.1:5555"
    assert directory.server_key("tcp://127.0.0.1:5555") == keys.server.public
    client = ClientService(
        StaticDirectory({"*": "tcp://127.0.0.1:1"}),
        Config(request_timeout=5.0),
        security=security.ClientSecurity(keys.alice),
    )
    try:
        # No key anywhere for this endpoint: refused before any byte is sent.
        with pytest.raises(rda.NotAuthorizedError, match="no CURVE server key known"):
            client.access_point("PS1", "Text").get()
    finally:
        client.close()


# ------------------------------------------------------------------ what the wire shows


class Relay:
    """A loopback TCP relay that records every byte between one client and the server."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.seen = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-relay")
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        pairs: dict[socket.socket, socket.socket] = {}
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.02):
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    if sock is self._listener:
                        inner, _ = sock.accept()
                        outer = socket.create_connection(("127.0.0.1", self._target))
                        pairs[inner], pairs[outer] = outer, inner
                        sel.register(inner, selectors.EVENT_READ)
                        sel.register(outer, selectors.EVENT_READ)
                        continue
                    data = sock.recv(65536)
                    if not data:
                        return
                    self.seen += data
                    pairs[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in [self._listener, *pairs]:
                sock.close()
            sel.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


@pytest.mark.parametrize("secured", [False, True])
def test_traffic_carries_no_plaintext_marker(
    no_thread_leak: None, keys: Keys, secured: bool
) -> None:
    server = build(keys if secured else None, Handler()).start()
    relay = Relay(int(server.endpoint.rsplit(":", 1)[1]))
    client = client_for(
        f"tcp://127.0.0.1:{relay.port}",
        keys.alice if secured else None,
        keys.server.public if secured else None,
    )
    try:
        ap = client.access_point("PS1", "Text")
        assert ap.get().data["text"] == MARKER
        ap.set(Data(text=MARKER + "-set"))
        assert ap.get().data["text"] == MARKER + "-set"
    finally:
        client.close()
        relay.close()
        server.stop()
    # The plain run is the control: the same traffic shows the marker in clear text.
    assert (MARKER.encode() in relay.seen) is not secured
    assert len(relay.seen) > 200


def test_unauthenticated_peer_reads_nothing_useful(no_thread_leak: None, keys: Keys) -> None:
    server = build(keys, Handler()).start()
    port = int(server.endpoint.rsplit(":", 1)[1])
    client = client_for(server.endpoint, keys.alice, keys.server.public)
    raw = socket.create_connection(("127.0.0.1", port))
    raw.settimeout(0.2)
    read = bytearray()
    try:
        # A ZMTP 3.0 greeting offering the NULL mechanism, then garbage.
        raw.sendall(b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 16 + b"\x00" * 32)
        for _ in range(5):
            assert client.access_point("PS1", "Text").get().data["text"] == MARKER
            try:
                chunk = raw.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            read += chunk
        assert MARKER.encode() not in read
        wait_until(lambda: server.statistics().transport.auth_failures >= 1)
        assert server.statistics().transport.peers == 1
    finally:
        raw.close()
        client.close()
        server.stop()
