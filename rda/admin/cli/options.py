"""What the ``rda`` group needs before any command runs: the global options, the exit codes
and the error type, the shared option decorators.

Only click is imported here, because ``rda --help`` loads this module and should load nothing
else; what the commands themselves share (error reporting, the client factory) is in
``rda.admin.cli.common``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from rda.business.config import Config

__all__ = [
    "CONFIG_HELP",
    "ENDPOINT_HELP",
    "PER_COMMAND_GLOBALS",
    "TIMEOUT",
    "CliError",
    "ExitCode",
    "Options",
    "add_global_options",
    "check_endpoint",
    "fail",
    "global_defaults",
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


def fail(message: str, code: ExitCode = ExitCode.ERROR) -> NoReturn:
    raise CliError(message, code)


@dataclass(frozen=True, slots=True)
class Options:
    """Global options, stored on the click context object."""

    endpoint: str | None = None
    config_file: Path | None = None

    def config(self) -> Config:
        # Imported here: pydantic and the layers below are for the commands that run.
        from rda.admin.cli.common import reporting
        from rda.business.config import Config

        # Config() reads the RDA_* environment: every setting can be overridden there.
        with reporting():
            if self.config_file is not None:
                return Config.from_file(self.config_file)
            return Config()


class _Seconds(click.FloatRange):
    """A finite number of seconds, more than 0 (0 would time out at once; nan and inf are
    no durations)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


#: ``--timeout`` everywhere.
TIMEOUT = _Seconds(min=0.0, min_open=True)

#: The global options that are the subcommands' own (``rda get --json``, ``rda admin
#: --timeout``): given before the subcommand (``rda --json get``), they become its defaults
#: (``global_defaults``); given after it, they win. A subcommand without the option refuses it.
PER_COMMAND_GLOBALS = ("--json", "--timeout", "--key", "--server-key")
_GIVEN = "rda.global_options_given"

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


def _own_option(command: click.Command, flag: str) -> click.Parameter | None:
    """``command``'s parameter for the global ``flag``, if it has one that means the same
    (``rda set --json`` takes a JSON value, not the ``--json`` switch: it has none)."""
    for param in command.params:
        if flag in param.opts:
            if flag == "--json" and not (isinstance(param, click.Option) and param.is_flag):
                return None
            return param
    return None


def global_defaults(
    ctx: click.Context, command: click.Command, given: dict[str, Any]
) -> dict[str, Any]:
    """The ``default_map`` that makes the per-command global options given before
    ``command`` (``given``: flag -> value) its own defaults, and its subcommands' for a group.
    Remembers them on the root context, so a subcommand without the option refuses it."""
    ctx.find_root().meta[_GIVEN] = given
    if isinstance(command, click.Group):
        return {
            name: global_defaults(ctx, sub, given)
            for name in command.list_commands(ctx)
            if (sub := command.get_command(ctx, name)) is not None
        }
    return {
        str(param.name): value
        for flag, value in given.items()
        if (param := _own_option(command, flag)) is not None
    }


def _refuse_foreign_globals(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """A global option given before a subcommand that has no use for it is an error, not
    silently ignored (``rda --timeout 2 subscribe``)."""
    for flag in ctx.find_root().meta.get(_GIVEN, {}):
        if _own_option(ctx.command, flag) is None:
            raise click.UsageError(f"{flag} does not apply to `{ctx.command_path}`", ctx)


def add_global_options(command: click.Command) -> None:
    """Give ``command`` (and, for a group, each of its subcommands) ``--endpoint`` and
    ``--config``, so the global options work after the subcommand too and show in its help,
    and the check that refuses a per-command global option it does not have. Idempotent."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_global_options(sub)
        return  # a group's own options would have to come before its subcommand again
    if getattr(command, _GLOBAL_MARK, False):
        return
    setattr(command, _GLOBAL_MARK, True)
    taken = {opt for param in command.params for opt in param.opts}
    # Hidden and never given: its callback runs for every invocation of the command.
    command.params.append(
        click.Option(
            ["--rda-global-options-check"],
            hidden=True,
            expose_value=False,
            callback=_refuse_foreign_globals,
        )
    )
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


def split_address(address: str) -> tuple[str, str]:
    """``"DEV/PROP"`` -> ``("DEV", "PROP")``, or a usage error naming the expected form."""
    device, sep, prop = address.partition("/")
    if not sep or not device or not prop or "/" in prop:
        raise click.BadParameter(f"{address!r}: expected DEVICE/PROPERTY", param_hint="ADDRESS")
    return device, prop
