"""The ``rda`` command-line tool: the click group, whose commands are imported when used.

Human output by default (tables, summarised arrays, times with units), ``--json`` for
scripts; expected failures print one line and exit with a code from
:class:`~rda.admin.cli.options.ExitCode`. Shell completion is click's:
``eval "$(_RDA_COMPLETE=bash_source rda)"``.

The group knows each command by where it is defined and by its one-line help, and imports
the defining module only when the command runs (or its own help is asked for): ``rda --help``
loads click and this module's options, ``rda get`` the client but not the server, the
metrics or etcd's client (``tests/test_imports.py`` checks both; the figures are in
docs/performance.md). The one-line helps written here are checked against the commands'
docstrings by ``tests/test_imports.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import click

from rda.admin.cli.options import (
    CONFIG_HELP,
    ENDPOINT_HELP,
    TIMEOUT,
    Options,
    add_global_options,
    check_endpoint,
    global_defaults,
)

__all__ = ["LazyCommand", "LazyGroup", "cli", "main"]


class LazyCommand(NamedTuple):
    """A command known by name before it is imported."""

    # Imports the command's module and returns the command: a function with an import
    # statement, so that mypy and tests/test_layout.py see what it imports.
    load: Callable[[], click.Command]
    help: str  # its one-line help, as `rda --help` lists it


class LazyGroup(click.Group):
    """A click group whose commands may be imported on first use (``add_lazy_command``).

    It also turns rda errors escaping a command into a one-line message and an exit code, and
    gives every subcommand the global options, so they work after it too
    (``rda get X/Y -e EP``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, LazyCommand] = {}

    def add_lazy_command(self, name: str, load: Callable[[], click.Command], help: str) -> None:
        """Make ``name`` the command that ``load()`` imports and returns, called when the
        command is first looked up; ``help`` is what ``rda --help`` shows for it."""
        self.lazy[name] = LazyCommand(load, help)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(self.lazy[cmd_name].load(), cmd_name)
        # Global options at lookup rather than at add_command: nested groups (directory,
        # keys, history) get their subcommands after they were added here.
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            add_global_options(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``rda --help``, as click writes it, without importing the
        commands not yet loaded (their one-line help is the one given to add_lazy_command)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows: list[tuple[str, str]] = []
        for name in names:
            command = self.commands.get(name)
            if command is None:
                # Cut to the width as click cuts a command's own help.
                stand_in = click.Command(name, help=self.lazy[name].help)
                rows.append((name, stand_in.get_short_help_str(limit)))
            elif not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # Imported here: the error classes come with the codec (numpy), which `rda --help`
        # does not need.
        from rda.admin.cli.common import reporting

        with reporting():
            return super().invoke(ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--endpoint",
    "-e",
    envvar="RDA_ENDPOINT",
    default=None,
    callback=check_endpoint,
    help=ENDPOINT_HELP,
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=CONFIG_HELP,
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--timeout", type=TIMEOUT, default=None, help="Seconds to wait for a reply.")
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="CURVE key pair file (a client's; for `rda serve`, the server's).",
)
@click.option("--server-key", default=None, metavar="KEY|FILE", help="The server's CURVE key.")
@click.version_option(package_name="rda", prog_name="rda")
@click.pass_context
def cli(
    ctx: click.Context,
    endpoint: str | None,
    config_file: Path | None,
    as_json: bool,
    timeout: float | None,
    key_file: Path | None,
    server_key: str | None,
) -> None:
    """rda: get, set and subscribe to device properties; run and inspect servers.

    The global options may also follow the subcommand (rda get X --json, rda --json get X).
    """
    # A subcommand's own --endpoint/--config (parsed after this) replace these.
    ctx.obj = Options(endpoint=endpoint, config_file=config_file)
    # --json, --timeout, --key, --server-key are the subcommands' own options: given here,
    # they become the subcommand's defaults (given after it too, that one wins).
    given = {
        flag: value
        for flag, value in (
            ("--json", True if as_json else None),
            ("--timeout", timeout),
            ("--key", key_file),
            ("--server-key", server_key),
        )
        if value is not None
    }
    if given and ctx.invoked_subcommand is not None and isinstance(ctx.command, click.Group):
        command = ctx.command.get_command(ctx, ctx.invoked_subcommand)
        if command is not None:
            ctx.default_map = {ctx.invoked_subcommand: global_defaults(ctx, command, given)}


# The access-point commands (access.py), the directory (directory.py), serve and bench
# (run.py), keys (keys.py); rda/_cli.py adds the history's and the panel's the same way.


def _get() -> click.Command:
    from rda.admin.cli.access import get

    return get


def _describe() -> click.Command:
    from rda.admin.cli.access import describe

    return describe


def _set() -> click.Command:
    from rda.admin.cli.access import set_

    return set_


def _subscribe() -> click.Command:
    from rda.admin.cli.access import subscribe

    return subscribe


def _admin() -> click.Command:
    from rda.admin.cli.access import admin

    return admin


def _directory() -> click.Command:
    from rda.admin.cli.directory import directory

    return directory


def _serve() -> click.Command:
    from rda.admin.cli.run import serve

    return serve


def _bench() -> click.Command:
    from rda.admin.cli.run import bench

    return bench


def _keys() -> click.Command:
    from rda.admin.cli.keys import keys

    return keys


cli.add_lazy_command("get", _get, "Read a property once and print its value.")
cli.add_lazy_command("set", _set, "Write a property.")
cli.add_lazy_command(
    "describe",
    _describe,
    "Print a property's declared metadata: units, precision, limits, alarm limits.",
)
cli.add_lazy_command(
    "subscribe",
    _subscribe,
    "Print a line per update until --count/--duration or Ctrl-C, then a summary.",
)
cli.add_lazy_command(
    "admin", _admin, "Run an admin COMMAND on TARGET (server name, device name or endpoint)."
)
cli.add_lazy_command(
    "directory",
    _directory,
    "Where devices are: the static mapping, then etcd (RDA_DIRECTORY_URL) or this machine's file.",
)
cli.add_lazy_command(
    "serve", _serve, "Run a server until Ctrl-C or SIGTERM, printing where it listens."
)
cli.add_lazy_command(
    "bench",
    _bench,
    "Run the scripts in benchmarks/ (all, or those NAMES) and print their JSON results.",
)
cli.add_lazy_command("keys", _keys, "CURVE key pairs: generate them, show their public half.")


def main() -> None:
    """Console-script entry point (``rda``)."""
    cli.main(prog_name="rda")


if __name__ == "__main__":  # pragma: no cover
    main()
