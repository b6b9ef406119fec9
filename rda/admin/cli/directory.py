"""``rda directory list``: where devices are, from every directory the configuration names
(the static mapping, then etcd when ``RDA_DIRECTORY_URL`` is set, else this machine's file; a
configured fallback too), and with
``--check`` whether each registered server answers now (an entry outlives a killed server until
its lease's ttl runs out).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import click

from rda.admin.cli.common import Options, emit_json, open_client
from rda.admin.format import format_table
from rda.business.directory import (
    ChainDirectory,
    Directory,
    DirectoryUnavailableError,
    FileDirectory,
    default_directory,
)
from rda.business.entries import ServerEntry
from rda.business.etcd.directory import EtcdDirectory
from rda.serialization.errors import DisconnectedError, RdaError, TimeoutError, TransportError

__all__ = ["directory"]

_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
# How long --check waits for each server's admin ping (all are asked at once).
_CHECK_TIMEOUT = 2.0
# What means "no reply came" (as opposed to an error reply, which proves the server is up).
_NO_REPLY = (TimeoutError, DisconnectedError, TransportError, DirectoryUnavailableError)


@click.group()
def directory() -> None:
    """Where devices are: the static mapping, then etcd (RDA_DIRECTORY_URL) or this machine's
    file."""


@directory.command("list")
@_JSON
@click.option(
    "--check",
    is_flag=True,
    help=f"Ping each registered server (admin ping, {_CHECK_TIMEOUT:g} s, all at once) and show "
    "whether it answers: an entry outlives a killed server until its ttl runs out.",
)
@click.pass_obj
def directory_list(options: Options, as_json: bool, check: bool) -> None:
    """List registered servers (with their devices: etcd, or this machine's file) and static
    mappings."""
    config = options.config()
    servers: list[dict[str, Any]] = []
    static: dict[str, str] = {}
    chain = default_directory(config)
    parts = _parts(chain)
    # The file is named only when it is one of the directories asked (without etcd, or as
    # etcd's configured fallback): under etcd alone it has nothing to do with the answer.
    uses_file = any(isinstance(part, FileDirectory) for part in parts)
    try:
        for part in parts:
            if isinstance(part, FileDirectory | EtcdDirectory):
                servers.extend(_server_row(entry, repr(part)) for entry in part.servers())
            else:
                static.update(part.devices())
    finally:
        if isinstance(chain, ChainDirectory):
            chain.close()
    if check and servers:
        _check(options, servers)
    if as_json:
        emit_json(
            {
                "servers": servers,
                "static": static,
                "file": str(config.directory_file),
                "etcd": config.directory_url,
            }
        )
        return
    if config.directory_url is not None:
        click.echo(f"etcd: {config.directory_url} (prefix {config.directory_prefix})")
    if uses_file:
        fallback = " (fallback)" if config.directory_url is not None else ""
        click.echo(f"directory file{fallback}: {config.directory_file}")
    if servers:
        # The host column only when servers may be on other hosts (etcd).
        hosts = config.directory_url is not None
        rows = [
            {
                "server": s["name"],
                "endpoint": s["endpoint"],
                **({"host": s["host"]} if hosts else {}),
                "pid": s["pid"],
                **({"answers": s["check"]} if check else {}),
                "devices": _devices_cell(s["devices"]),
            }
            for s in servers
        ]
        click.echo(format_table(rows))
    else:
        click.echo("no servers registered")
    for pattern, endpoint in static.items():
        click.echo(f"static  {pattern} -> {endpoint}")


def _check(options: Options, servers: list[dict[str, Any]]) -> None:
    """Add ``alive`` (bool) and ``check`` (``yes (3 ms)``, ``no (TimeoutError)``) to each row:
    an admin ping, every server at once. Any reply proves the server alive, an error reply too
    (a server without the admin commands, a ping not authorized: ``yes (3 ms,
    NotAuthorizedError)``); no reply (timeout, connection refused or lost) does not."""
    answered: dict[int, float] = {}  # row index -> when its ping completed

    def stamp(index: int) -> Callable[[Future[Any]], None]:
        return lambda _: answered.__setitem__(index, time.monotonic())

    with open_client(options) as client:
        started = time.monotonic()
        pings: list[Future[Any]] = []
        for index, server in enumerate(servers):
            ping = client.admin_async(server["endpoint"], "ping", timeout=_CHECK_TIMEOUT)
            ping.add_done_callback(stamp(index))
            pings.append(ping)
        for index, (row, ping) in enumerate(zip(servers, pings, strict=True)):
            replied = ""
            try:
                ping.result()
            except _NO_REPLY as exc:
                row["alive"], row["check"] = False, f"no ({type(exc).__name__})"
                continue
            except RdaError as exc:
                replied = f", {type(exc).__name__}"
            took = (answered.get(index, time.monotonic()) - started) * 1000
            row["alive"], row["check"] = True, f"yes ({took:.0f} ms{replied})"


def _server_row(entry: ServerEntry, where: str) -> dict[str, Any]:
    return {
        "name": entry.name,
        "endpoint": entry.endpoint,
        "devices": list(entry.devices),
        "pid": entry.pid,
        "host": entry.host,
        "registered_at": entry.registered_at,
        "directory": where,
    }


def _devices_cell(devices: list[str], shown: int = 8) -> str:
    """A server with thousands of devices: the first few and how many more."""
    more = len(devices) - shown
    return ", ".join(devices[:shown]) + (f", ... (+{more})" if more > 0 else "")


def _parts(directory: Directory) -> list[Directory]:
    if isinstance(directory, ChainDirectory):
        fallback = () if directory.fallback is None else (directory.fallback,)
        return [p for inner in (*directory.directories, *fallback) for p in _parts(inner)]
    return [directory]
