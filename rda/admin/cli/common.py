"""What every ``rda`` sub-command shares: error reporting and the client factory.

The exit codes, ``CliError`` and the global options are in ``rda.admin.cli.options`` (the
group loads them for ``rda --help``, before any command) and are re-exported here.

Expected failures (timeout, unknown device, not authorized, remote error, lost connection, a
value that does not parse) end the program with one line on stderr and a documented exit code,
never a traceback: scripts branch on the code, humans read the line. Bugs still show their
traceback, because hiding those would hide the bug.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from rda.admin.cli.options import (
    CONFIG_HELP,
    ENDPOINT_HELP,
    TIMEOUT,
    CliError,
    ExitCode,
    Options,
    add_global_options,
    check_endpoint,
    fail,
    security_options,
    split_address,
)
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
    "TIMEOUT",
    "CliError",
    "ExitCode",
    "Options",
    "add_global_options",
    "check_endpoint",
    "cli_error",
    "did_you_mean",
    "emit_json",
    "fail",
    "open_client",
    "security_options",
    "split_address",
]


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


def exit_code_for(exc: BaseException) -> ExitCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.ERROR


@contextmanager
def reporting() -> Iterator[None]:
    """Turn rda errors raised inside into one-line CLI errors with their exit code."""
    try:
        yield
    except CliError:
        raise
    except RdaError as exc:
        raise cli_error(exc) from None


def cli_error(exc: RdaError, note: str = "", hint: str = "") -> CliError:
    """The one-line CLI error for ``exc`` (``note`` appended in parentheses, ``hint`` after a
    semicolon), with its code."""
    # One line, whatever the message: multi-line ones (ConfigError lists each problem)
    # are joined rather than cut.
    text = " ".join(line.strip() for line in str(exc).splitlines()) or type(exc).__name__
    if note:
        text += f" ({note})"
    if hint:
        text += f"; {hint}"
    return CliError(f"{_kind(exc)}: {text}", exit_code_for(exc))


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"did you mean 'PS1'?"`` for the names in ``known`` close to a mistyped ``name`` (a
    typo, a missing or extra character), else ``""``. Glob patterns are not names."""
    names = sorted({k for k in known if k != name and not any(c in k for c in "*?[")})
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if not close:
        return ""
    return f"did you mean {' or '.join(repr(c) for c in close)}?"


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


def emit_json(value: Any) -> None:
    """One JSON document on one line on stdout, flushed (scripts read it line by line)."""
    sys.stdout.write(dumps(value) + "\n")
    sys.stdout.flush()
