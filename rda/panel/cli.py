"""``rda panel``: serve the web panel (added to the ``rda`` group by ``rda._cli`` when
starlette and uvicorn import)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from rda.admin.cli.common import (
    ExitCode,
    Options,
    client_security,
    fail,
    reporting,
    security_options,
)
from rda.business.client.service import ClientService
from rda.business.directory import StaticDirectory, default_directory
from rda.panel.app import create_app, serve
from rda.panel.history import HistoryReader, Past, ServiceHistory
from rda.panel.hosts import panel_names
from rda.panel.layout import Layout, LayoutError, load_layout
from rda.panel.source import PanelSource

__all__ = ["panel"]


@click.command()
@click.option("--port", type=int, default=8080, show_default=True, help="HTTP port (0: free).")
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="HTTP address; wider than loopback only behind an authenticating proxy (docs/panel.md).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for NAME (repeatable): the machine's name, a proxy's. Besides "
    "it, only IP addresses, localhost and the --bind name are answered (DNS rebinding).",
)
@security_options
@click.option("--allow-set", is_flag=True, help="Let the browser set properties (logged).")
@click.option(
    "--history",
    "history_store",
    default=None,
    metavar="STORE",
    help="A recorder store (path or URI) to read the charts' past from; without it the past "
    "is asked of a recorder serving history (rda record --serve).",
)
@click.option(
    "--layout",
    "layout_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="A saved layout (JSON) every new tab opens with, unless its link carries one.",
)
@click.option(
    "--kiosk",
    is_flag=True,
    help="Read-only wall display: no sets (whatever --allow-set), no tree, no editing controls.",
)
@click.pass_context
def panel(
    ctx: click.Context,
    port: int,
    bind: str,
    allowed_hosts: tuple[str, ...],
    key_file: Path | None,
    server_key: str | None,
    allow_set: bool,
    history_store: str | None,
    layout_file: Path | None,
    kiosk: bool,
) -> None:
    """A live web panel: servers, devices and properties learnt from the directory and the
    servers; values, strip charts and (with --allow-set) sets, in the browser."""
    options = ctx.obj if isinstance(ctx.obj, Options) else Options()
    layout: Layout | None = None
    if layout_file is not None:  # checked before anything starts: a bad file is exit 2
        try:
            layout = load_layout(layout_file)
        except LayoutError as exc:
            raise click.BadParameter(str(exc), param_hint="--layout") from None
    history: Past | None = None
    if history_store is not None:
        try:
            history = HistoryReader(history_store)
        except ImportError as exc:
            raise click.UsageError(f"--history needs the [pipeline] extra ({exc})") from None
    with reporting():
        config = options.config()
        directory: Any = (
            StaticDirectory({"*": options.endpoint})
            if options.endpoint is not None
            else default_directory(config)
        )
        security = client_security(config, key_file, server_key)
        client = ClientService(directory=directory, config=config, security=security)
    if security is not None:
        principal = f"curve:{security.keypair.public}"
    else:
        principal = config.principal or "anonymous"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # httpx logs each request at INFO: with etcd as the directory, a line per lease refresh.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    source = PanelSource(client, principal)
    if history is None:  # the recorders that serve history over rda, found by the directory
        history = ServiceHistory(client)
    app = create_app(
        source,
        allow_set=allow_set,
        history=history,
        heartbeat_timeout=config.heartbeat_timeout,
        hosts=panel_names(bind, allowed_hosts),
        layout=layout,
        kiosk=kiosk,
    )

    def announce(url: str) -> None:
        click.echo(f"rda panel: {url} (Ctrl-C to stop)", nl=True)
        sys.stdout.flush()

    try:
        serve(app, bind, port, announce)
    except OSError as exc:  # exit 6, as `rda serve` when it cannot bind (docs/cli.md)
        fail(f"cannot bind {bind}:{port}: {exc.strerror or exc}", ExitCode.DISCONNECTED)
    finally:
        client.close()
