"""``rda directory list``: where devices are, from every directory the configuration names
(the static mapping, etcd when ``RDA_DIRECTORY_URL`` is set, this machine's file).
"""

from __future__ import annotations

from typing import Any

import click

from rda.admin.cli.common import Options, emit_json
from rda.admin.format import format_table
from rda.business.directory import ChainDirectory, Directory, FileDirectory, default_directory
from rda.business.entries import ServerEntry
from rda.business.etcd.directory import EtcdDirectory

__all__ = ["directory"]

_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group()
def directory() -> None:
    """Where devices are: the static mapping, etcd (RDA_DIRECTORY_URL) and this machine's file."""


@directory.command("list")
@_JSON
@click.pass_obj
def directory_list(options: Options, as_json: bool) -> None:
    """List registered servers (with their devices: etcd and this machine's file) and static
    mappings."""
    config = options.config()
    servers: list[dict[str, Any]] = []
    static: dict[str, str] = {}
    chain = default_directory(config)
    try:
        for part in _parts(chain):
            if isinstance(part, FileDirectory | EtcdDirectory):
                servers.extend(_server_row(entry, repr(part)) for entry in part.servers())
            else:
                static.update(part.devices())
    finally:
        if isinstance(chain, ChainDirectory):
            chain.close()
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
    click.echo(f"directory file: {config.directory_file}")
    if servers:
        # The host column only when servers may be on other hosts (etcd).
        hosts = config.directory_url is not None
        rows = [
            {
                "server": s["name"],
                "endpoint": s["endpoint"],
                **({"host": s["host"]} if hosts else {}),
                "pid": s["pid"],
                "devices": _devices_cell(s["devices"]),
            }
            for s in servers
        ]
        click.echo(format_table(rows))
    else:
        click.echo("no servers registered")
    for pattern, endpoint in static.items():
        click.echo(f"static  {pattern} -> {endpoint}")


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
