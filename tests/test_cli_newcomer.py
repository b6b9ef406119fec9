"""The command line as a new user meets it (issue 26): each test is one defect found by trying,
run through click's CliRunner against a real server on 127.0.0.1 in this process."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import zmq
from click.testing import CliRunner, Result
from pydantic import BaseModel

import rda.security as security
from rda._cli import build
from rda.admin.cli.common import ExitCode
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device, PropertyValidationError
from rda.business.server.requests import GetRequest, SetRequest
from rda.serialization.data import Data
from rda.serialization.errors import NotAuthorizedError
from rda.transport._handshake import handshake_failure, speaks_zmtp

POLICY = {
    "roles": ["operator", "setter"],
    "principals": {"alice": ["operator"], "sam": ["setter"]},
    "rules": [
        {"role": "operator", "effect": "allow"},
        {"role": "setter", "operation": "set", "effect": "allow"},
    ],
}


class SettingModel(BaseModel):
    current: float
    mode: int


class Supply(Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 1.5
        self.mode = 1
        self.sets: list[SettingModel] = []

    @Device.property("Setting", schema=SettingModel)
    def setting(self, request: GetRequest) -> Data:
        return Data(current=self.current, mode=self.mode)

    @setting.setter
    def write_setting(self, value: SettingModel, request: SetRequest) -> None:
        self.sets.append(value)
        self.current, self.mode = value.current, value.mode


@dataclass
class Stand:
    server: Server
    supply: Supply
    keys: Path  # NAME.key_secret and NAME.key of alice, sam, mallory and the server
    server_public: str = ""

    def key(self, name: str) -> str:
        return str(self.keys / f"{name}.key_secret")

    def client_args(self, name: str) -> tuple[str, ...]:
        """--key and --server-key for client ``name``."""
        return ("--key", self.key(name), "--server-key", str(self.keys / "server.key"))


def rda_cli(*args: str, endpoint: str | None = None) -> Result:
    """``rda [--endpoint EP] ARGS...`` (the global option before the subcommand, where every
    version of rda took it: item 7 has its own test)."""
    front = [] if endpoint is None else ["--endpoint", endpoint]
    return CliRunner().invoke(build(), [*front, *args], prog_name="rda")


def one_line_error(result: Result, code: ExitCode) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rda: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def plain() -> Iterator[Stand]:
    supply = Supply()
    server = ServerBuilder("PlainPS").endpoint("tcp://127.0.0.1:0").device("MYPS1", supply).build()
    server.start()
    try:
        yield Stand(server, supply, Path())
    finally:
        server.stop()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Stand]:
    pairs = {n: security.generate_keypair() for n in ("server", "alice", "sam", "mallory")}
    for name, pair in pairs.items():
        security.save_keypair(pair, tmp_path / f"{name}.key_secret")
    clients = {n: pairs[n].public for n in ("alice", "sam", "mallory")}
    supply = Supply()
    server = (
        ServerBuilder("SecuredPS")
        .endpoint("tcp://127.0.0.1:0")
        .device("PS1", supply)
        .security(security.ServerSecurity(pairs["server"], clients=clients))
        .policy(security.Policy.from_dict(POLICY))
        .build()
    )
    server.start()
    try:
        yield Stand(server, supply, tmp_path, pairs["server"].public)
    finally:
        server.stop()


# 1. A partial set of a property with a schema -------------------------------------------


def test_a_partial_set_keeps_the_fields_it_does_not_name(plain: Stand) -> None:
    result = rda_cli("set", "MYPS1/Setting", "mode=3")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == "MYPS1/Setting: set mode"
    assert plain.supply.sets == [SettingModel(current=1.5, mode=3)]
    help_text = " ".join(rda_cli("set", "--help").stdout.split())
    assert "the NAME=VALUE fields replace theirs in the value read" in help_text


def test_no_read_sends_only_the_given_fields(plain: Stand) -> None:
    line = one_line_error(
        rda_cli("set", "MYPS1/Setting", "mode=3", "--no-read"), ExitCode.REMOTE_ERROR
    )
    assert line == (
        "rda: server error: PropertyValidationError: MYPS1/Setting: current: Field required"
    )


# 2. A misspelt field is named ---------------------------------------------------------------


def test_a_misspelt_field_is_named_with_the_known_ones(plain: Stand) -> None:
    line = one_line_error(rda_cli("set", "MYPS1/Setting", "volts=3"), ExitCode.NO_SUCH_DEVICE)
    assert line == (
        "rda: MYPS1/Setting has no field 'volts' "
        "(fields: current, mode; --no-read sends it as given)"
    )
    assert plain.supply.sets == []


def test_the_server_names_unknown_fields_too(plain: Stand) -> None:
    line = one_line_error(
        rda_cli("set", "MYPS1/Setting", "volts=3", "--no-read"), ExitCode.REMOTE_ERROR
    )
    assert line == (
        "rda: server error: PropertyValidationError: MYPS1/Setting: unknown field 'volts' "
        "(fields: current, mode); current: Field required; mode: Field required"
    )
    prop = Supply.properties()["Setting"]
    with pytest.raises(PropertyValidationError, match=r"^PS1/Setting: unknown fields 'a', 'b' "):
        prop.validate("PS1", Data(current=1.0, mode=1, a=1, b=2))
    assert prop.validate("PS1", Data(current=1.0, mode=2)) == SettingModel(current=1.0, mode=2)


# 3. A denied set is reported as a set -----------------------------------------------------


def test_a_set_only_role_can_set_without_read(secured: Stand) -> None:
    result = rda_cli(
        "set",
        "PS1/Setting",
        "current=1",
        "mode=2",
        *secured.client_args("sam"),
        endpoint=secured.server.endpoint,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == (
        "PS1/Setting: set current, mode (not read first: sam (roles: setter) may not get "
        "PS1/Setting; types inferred from the values)"
    )
    assert secured.supply.sets == [SettingModel(current=1.0, mode=2)]


def test_a_denied_set_reports_the_set(secured: Stand) -> None:
    line = one_line_error(
        rda_cli(
            "set",
            "PS1/Setting",
            "current=1",
            *secured.client_args("mallory"),
            endpoint=secured.server.endpoint,
        ),
        ExitCode.NOT_AUTHORIZED,
    )
    assert line == (
        "rda: not authorized: mallory (roles: none) may not set PS1/Setting "
        "(not read first: mallory (roles: none) may not get PS1/Setting)"
    )
    assert secured.supply.sets == []


# 6. A public key file given as --key --------------------------------------------------------


def test_a_public_key_file_is_named_as_such(secured: Stand) -> None:
    public = secured.keys / "alice.key"
    assert public.stat().st_mode & 0o777 == 0o644
    expected = (
        f"rda: configuration: key file {public}: this is a public key file, not a key pair: "
        f"pass the key pair file ({secured.keys / 'alice.key_secret'}; "
        "`rda keys generate NAME` writes both)"
    )
    args = ("get", "PS1/Setting", "--key", str(public))
    endpoint = secured.server.endpoint
    assert one_line_error(rda_cli(*args, endpoint=endpoint), ExitCode.USAGE) == expected
    public.chmod(0o600)  # what the old message told the user to do: the same answer now
    assert one_line_error(rda_cli(*args, endpoint=endpoint), ExitCode.USAGE) == expected
    elsewhere = secured.keys / "copy.pub"
    elsewhere.write_text(public.read_text())
    with pytest.raises(security.KeyFileError, match=r"public key file.*NAME\.key_secret"):
        security.load_keypair(elsewhere)


# 7. Global options after the subcommand -----------------------------------------------------


def test_global_options_work_after_the_subcommand(plain: Stand, tmp_path: Path) -> None:
    endpoint = plain.server.endpoint
    result = rda_cli("get", "MYPS1/Setting", "--field", "mode", "--endpoint", endpoint)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "1"
    # After the subcommand wins over before it (the nearer one is meant).
    late = rda_cli("-e", "tcp://127.0.0.1:1", "get", "MYPS1/Setting", "-f", "mode", "-e", endpoint)
    assert late.exit_code == 0, late.stderr
    config = tmp_path / "rda.toml"
    config.write_text("request_timeout = 'soon'\n")
    bad = rda_cli("get", "MYPS1/Setting", "-e", endpoint, "--config", str(config))
    assert one_line_error(bad, ExitCode.USAGE).startswith("rda: configuration: ")
    wrong = rda_cli("set", "MYPS1/Setting", "mode=2", "--endpoint", "nowhere")
    assert wrong.exit_code == ExitCode.USAGE
    assert "'nowhere' is not an endpoint like tcp://host:port" in wrong.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["get"],
        ["set"],
        ["subscribe"],
        ["admin"],
        ["directory", "list"],
        ["serve"],
        ["bench"],
        ["keys", "generate"],
        ["keys", "show"],
        ["record"],
        ["compact"],
        ["history", "search"],
        ["history", "get"],
        ["history", "stats"],
    ],
)
def test_every_subcommand_help_shows_the_global_options(command: list[str]) -> None:
    result = rda_cli(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "--endpoint" in result.stdout and "--config" in result.stdout


# 4. A refused handshake ends a subscription (library and CLI) -----------------------------


@pytest.mark.parametrize("who", ["no key", "unknown key", "wrong server key"])
def test_a_refused_subscription_ends_not_authorized(
    secured: Stand, tmp_path: Path, who: str, no_thread_leak: None
) -> None:
    stranger = security.generate_keypair()
    client_security = {
        "no key": None,
        "unknown key": security.ClientSecurity(stranger, secured.server_public),
        "wrong server key": security.ClientSecurity(stranger, stranger.public),
    }[who]
    client = ClientService(
        StaticDirectory({"*": secured.server.endpoint}),
        Config(request_timeout=5.0),
        security=client_security,
    )
    try:
        sub = client.access_point("PS1", "Setting").subscribe()
        first = sub.poll(timeout=20.0)
        assert first is not None and isinstance(first.error, NotAuthorizedError), first
        assert str(first.error).startswith(
            f"subscribe PS1/Setting: {secured.server.endpoint}: security handshake refused: "
        )
        assert sub.poll(timeout=5.0) is None and sub.closed  # ended, not retrying
        stats = client.statistics()
        assert stats.subscriptions == 0
        (server,) = stats.servers
        assert server.state == "refused" and server.connects == 1
        assert server.last_reason.startswith("security handshake refused: ")
        # Nothing dials again by itself (the old code re-dialled on a 0.02-2 s back-off).
        assert all(ep.retry is None for ep in client._connections.endpoints())
    finally:
        client.close()


def test_rda_subscribe_without_a_key_exits_5_at_once(secured: Stand) -> None:
    result = rda_cli(
        "subscribe", "PS1/Setting", "--duration", "30", endpoint=secured.server.endpoint
    )
    assert result.exit_code == ExitCode.NOT_AUTHORIZED, (result.output, result.stderr)
    assert result.stderr.strip().splitlines()[-1] == (
        f"rda: not authorized: subscribe PS1/Setting: {secured.server.endpoint}: security "
        "handshake refused: the server requires CURVE security and this client has no key "
        "(--key FILE or RDA_KEY_FILE)"
    )
    get = rda_cli("get", "PS1/Setting", endpoint=secured.server.endpoint)
    assert get.exit_code == ExitCode.NOT_AUTHORIZED
    assert "the server requires CURVE security and this client has no key" in get.stderr


# 5. A peer that is not an rda server --------------------------------------------------------


class _OtherService:
    """A TCP service of another protocol: answers whatever it gets with an HTTP error."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, name="other-service")
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(5.0)
                with contextlib.suppress(OSError):
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5.0)


def test_a_peer_that_is_not_rda_is_named_so_exit_6(no_thread_leak: None) -> None:
    other = _OtherService()
    try:
        assert speaks_zmtp(other.endpoint) is False
        result = rda_cli("get", "PS1/Setting", "--timeout", "20", endpoint=other.endpoint)
        assert result.exit_code == ExitCode.DISCONNECTED, (result.output, result.stderr)
        assert result.stderr.strip() == (
            "rda: disconnected: get PS1/Setting: the peer does not speak the rda protocol: "
            f"{other.endpoint} answered, but not with a ZeroMQ greeting (is it the endpoint "
            "of an rda server?)"
        )
    finally:
        other.close()


def test_the_missing_key_message_is_the_same_every_time(secured: Stand) -> None:
    assert speaks_zmtp(secured.server.endpoint) is True
    messages = set()
    for _ in range(8):
        result = rda_cli("get", "PS1/Setting", endpoint=secured.server.endpoint)
        assert result.exit_code == ExitCode.NOT_AUTHORIZED
        messages.add(result.stderr)
    assert len(messages) == 1, messages
    # Both events libzmq may report for this cause read the same.
    endpoint = secured.server.endpoint
    assert (
        handshake_failure(
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
            endpoint,
            curve=False,
        )
        == handshake_failure(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 104, endpoint, curve=False)
        == "security handshake refused: the server requires CURVE security and this client "
        "has no key (--key FILE or RDA_KEY_FILE)"
    )


# 8. One exit-code table for every subcommand ------------------------------------------------


def _leaves(group: click.Group, prefix: str) -> set[str]:
    names: set[str] = set()
    ctx = click.Context(group)
    # list_commands/get_command, not .commands: the rda group imports its commands when used.
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            names |= _leaves(command, f"{prefix}{name} ")
        else:
            names.add(f"{prefix}{name}")
    return names


def test_the_exit_code_table_covers_every_subcommand() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    section = text[text.index("## Exit codes") :]
    section = section[: section.index("\n## ", 1)]
    listed = {}
    for line in section.splitlines():
        match = re.match(r"\| `rda ([a-z ]+)` \| ([0-9, ]+)", line)
        if match:
            listed[match[1]] = {int(c) for c in match[2].split(",")}
    assert set(listed) == _leaves(build(), ""), "docs/cli.md's exit-code table is incomplete"
    documented = {int(m) for m in re.findall(r"^\| (\d) \|", section, re.M)}
    assert documented == {int(code) for code in ExitCode}
    assert all(codes <= documented for codes in listed.values())
    assert {2, 4} <= listed["history get"]  # usage errors and typos, as everywhere
