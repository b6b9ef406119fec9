"""What every ``rda`` sub-command shares: exit codes, error reporting, the client factory.

Expected failures (timeout, unknown device, not authorized, remote error, lost connection, a
value that does not parse) end the program with one line on stderr and a documented exit code,
never a traceback: scripts branch on the code, humans read the line. Bugs still show their
traceback, because hiding those would hide the bug.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from rda.admin.cli.values import BadValueError
from rda.admin.format import dumps
from rda.business.client.service import ClientService
from rda.business.config import Config, ConfigError
from rda.business.directory import (
    ChainDirectory,
    DirectoryUnavailableError,
    NameTakenError,
    StaticDirectory,
    default_directory,
)
from rda.business.security import ClientSecurity, load_keypair, parse_server_key
from rda.serialization.errors import (
    DecodeError,
    DisconnectedError,
    NoSuchDeviceError,
    NotAuthorizedError,
    OverloadError,
    ProtocolError,
    RdaError,
    RemoteError,
    TimeoutError,
    TransportError,
)

__all__ = [
    "CONFIG_HELP",
    "ENDPOINT_HELP",
    "CliError",
    "ExitCode",
    "Options",
    "add_global_options",
    "check_endpoint",
    "cli_error",
    "emit_json",
    "fail",
    "open_client",
    "security_options",
    "split_address",
]


class ExitCode(enum.IntEnum):
    """The exit status of ``rda`` (documented in docs/cli.md)."""

    OK = 0
    ERROR = 1  # any other rda error
    USAGE = 2  # bad option or argument, bad configuration (click uses 2 too)
    TIMEOUT = 3
    NO_SUCH_DEVICE = 4  # unknown device, property or admin command
    NOT_AUTHORIZED = 5
    DISCONNECTED = 6  # connection lost or server unreachable
    REMOTE_ERROR = 7  # the server's handler failed
    OVERLOAD = 8
    BAD_VALUE = 9  # a value that does not parse, or undecodable data


# Most specific first: the first isinstance match decides the code.
_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (TimeoutError, ExitCode.TIMEOUT),
    (NoSuchDeviceError, ExitCode.NO_SUCH_DEVICE),
    (NotAuthorizedError, ExitCode.NOT_AUTHORIZED),
    (DisconnectedError, ExitCode.DISCONNECTED),
    (TransportError, ExitCode.DISCONNECTED),
    (RemoteError, ExitCode.REMOTE_ERROR),
    (OverloadError, ExitCode.OVERLOAD),
    (DecodeError, ExitCode.BAD_VALUE),
    (BadValueError, ExitCode.BAD_VALUE),
    (ConfigError, ExitCode.USAGE),
    (DirectoryUnavailableError, ExitCode.DISCONNECTED),
    (ProtocolError, ExitCode.ERROR),
    (RdaError, ExitCode.ERROR),
)


class CliError(click.ClickException):
    """An expected failure: printed as ``rda: <message>`` with its exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code

    # click reads ``exit_code`` from the exception (a ClassVar there); per instance here.
    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return int(self.code)

    def show(self, file: Any = None) -> None:
        click.echo(f"rda: {self.format_message()}", err=True)


def exit_code_for(exc: BaseException) -> ExitCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.ERROR


def fail(message: str, code: ExitCode = ExitCode.ERROR) -> NoReturn:
    raise CliError(message, code)


@contextmanager
def reporting() -> Iterator[None]:
    """Turn rda errors raised inside into one-line CLI errors with their exit code."""
    try:
        yield
    except CliError:
        raise
    except RdaError as exc:
        raise cli_error(exc) from None


def cli_error(exc: RdaError, note: str = "") -> CliError:
    """The one-line CLI error for ``exc`` (``note`` appended in parentheses), with its code."""
    # One line, whatever the message: multi-line ones (ConfigError lists each problem)
    # are joined rather than cut.
    text = " ".join(line.strip() for line in str(exc).splitlines()) or type(exc).__name__
    if note:
        text += f" ({note})"
    return CliError(f"{_kind(exc)}: {text}", exit_code_for(exc))


def _kind(exc: BaseException) -> str:
    if isinstance(exc, RemoteError):
        return "server error"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return {
        NoSuchDeviceError: "not found",
        NotAuthorizedError: "not authorized",
        DisconnectedError: "disconnected",
        OverloadError: "overloaded",
        DecodeError: "bad data",
        BadValueError: "bad value",
        ConfigError: "configuration",
        DirectoryUnavailableError: "directory unavailable",
        NameTakenError: "name taken",
    }.get(type(exc), "configuration" if isinstance(exc, ConfigError) else "error")


@dataclass(frozen=True, slots=True)
class Options:
    """Global options, stored on the click context object."""

    endpoint: str | None = None
    config_file: Path | None = None

    def config(self) -> Config:
        # Config() reads the RDA_* environment: every setting can be overridden there.
        with reporting():
            if self.config_file is not None:
                return Config.from_file(self.config_file)
            return Config()


ENDPOINT_HELP = "Send every request to this endpoint (tcp://host:port), bypassing the directory."
CONFIG_HELP = "A TOML configuration file (RDA_* variables still win)."
_GLOBAL_MARK = "_rda_global_options"


def check_endpoint(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--endpoint``: ``tcp://host:port`` and the like, or a usage error."""
    if value is not None and "://" not in value:
        raise click.BadParameter(f"{value!r} is not an endpoint like tcp://host:port")
    return value


def _global_after(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """A global option given after the subcommand: it replaces the group's value."""
    if value is None:
        return
    if param.name == "endpoint":
        check_endpoint(ctx, param, value)
    options = ctx.obj if isinstance(ctx.obj, Options) else Options()
    ctx.obj = dataclasses.replace(options, **{str(param.name): value})


def add_global_options(command: click.Command) -> None:
    """Give ``command`` (and, for a group, each of its subcommands) ``--endpoint`` and
    ``--config``, so the global options work after the subcommand too and show in its help.
    Idempotent."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_global_options(sub)
        return  # a group's own options would have to come before its subcommand again
    if getattr(command, _GLOBAL_MARK, False):
        return
    setattr(command, _GLOBAL_MARK, True)
    taken = {opt for param in command.params for opt in param.opts}
    if "--endpoint" not in taken:
        flags = ["--endpoint"] if "-e" in taken else ["--endpoint", "-e"]
        command.params.append(
            click.Option(
                [*flags, "endpoint"],
                default=None,
                expose_value=False,
                callback=_global_after,
                help=ENDPOINT_HELP + " (global option)",
            )
        )
    if "--config" not in taken:
        command.params.append(
            click.Option(
                ["--config", "config_file"],
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                expose_value=False,
                callback=_global_after,
                help=CONFIG_HELP + " (global option)",
            )
        )


def security_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--key`` and ``--server-key``: CURVE for a client command (docs/security.md)."""
    command = click.option(
        "--server-key",
        default=None,
        metavar="KEY|FILE",
        help="The server's CURVE public key (Z85) or key file (default: RDA_SERVER_KEY, "
        "else the server's directory entry).",
    )(command)
    return click.option(
        "--key",
        "key_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Connect with CURVE using this key pair file (default: RDA_KEY_FILE).",
    )(command)


def client_security(
    config: Config, key_file: Path | None, server_key: str | None
) -> ClientSecurity | None:
    """The client's CURVE settings from the flags, else the configuration (RDA_KEY_FILE...)."""
    key_file = key_file if key_file is not None else config.key_file
    server_key = server_key if server_key is not None else config.server_key
    if key_file is None:
        if server_key is not None:
            raise click.UsageError("--server-key needs --key (this client's key pair)")
        return None
    return ClientSecurity(
        load_keypair(key_file), None if server_key is None else parse_server_key(server_key)
    )


@contextmanager
def open_client(
    options: Options, key_file: Path | None = None, server_key: str | None = None
) -> Iterator[ClientService]:
    """A ClientService on the configured directory, or on ``--endpoint`` for every device;
    with CURVE when a key file is given (flag or configuration)."""
    with reporting():
        config = options.config()
        if options.endpoint is not None:
            directory: Any = StaticDirectory({"*": options.endpoint})
        else:
            directory = default_directory(config)
        security = client_security(config, key_file, server_key)
        client = ClientService(directory=directory, config=config, security=security)
    try:
        with reporting():
            yield client
    finally:
        client.close()
        if isinstance(directory, ChainDirectory):
            directory.close()  # an etcd directory's watch thread


def split_address(address: str) -> tuple[str, str]:
    """``"DEV/PROP"`` -> ``("DEV", "PROP")``, or a usage error naming the expected form."""
    device, sep, prop = address.partition("/")
    if not sep or not device or not prop or "/" in prop:
        raise click.BadParameter(f"{address!r}: expected DEVICE/PROPERTY", param_hint="ADDRESS")
    return device, prop


def emit_json(value: Any) -> None:
    """One JSON document on one line on stdout, flushed (scripts read it line by line)."""
    sys.stdout.write(dumps(value) + "\n")
    sys.stdout.flush()
