"""``rda gateway pva``: serve rda devices over pvAccess (added to the ``rda`` group by
``rda._cli`` when p4p imports)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from rda.admin.cli.common import Options, client_security, reporting, security_options
from rda.business.client.service import ClientService
from rda.business.directory import StaticDirectory, default_directory

__all__ = ["gateway", "pva"]


@click.group()
def gateway() -> None:
    """Serve rda devices to other control systems' tools (pva: EPICS pvAccess)."""


@gateway.command()
@click.option(
    "--devices",
    default="*",
    show_default=True,
    metavar="GLOB",
    help="Serve only the devices whose name matches GLOB.",
)
@click.option(
    "--allow-put",
    is_flag=True,
    help="Let pvAccess clients set properties, as --put-rules allows (each put logged).",
)
@click.option(
    "--put-rules",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="TOML file: which pvAccess peers (account, host) may put which PVs (docs/gateway.md).",
)
@click.option(
    "--refresh",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds between two looks at the directory and the servers' property lists.",
)
@security_options
@click.pass_context
def pva(
    ctx: click.Context,
    devices: str,
    allow_put: bool,
    put_rules: Path | None,
    refresh: float,
    key_file: Path | None,
    server_key: str | None,
) -> None:
    """Serve every property of the directory's devices as pvAccess PVs: DEV/PROP (the
    property as a structure), DEV/PROP.field (NTScalar, NTScalarArray, NTNDArray), and
    @SELECTOR suffixes for cycles. The EPICS_PVAS_* variables configure the server."""
    from rda.gateway.puts import PutRules, load_rules
    from rda.gateway.pva import PvaGateway

    if allow_put and put_rules is None:
        raise click.UsageError("--allow-put needs --put-rules FILE: who may put what")
    rules: PutRules | None = None
    if put_rules is not None:
        try:
            rules = load_rules(put_rules)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    options = ctx.obj if isinstance(ctx.obj, Options) else Options()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with reporting():
        config = options.config()
        directory: Any = (
            StaticDirectory({"*": options.endpoint})
            if options.endpoint is not None
            else default_directory(config)
        )
        security = client_security(config, key_file, server_key)
        client = ClientService(directory=directory, config=config, security=security)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Put back on the way out: a caller that runs this in its own process (a test, a script)
    # keeps its own Ctrl-C and SIGTERM.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    gw = PvaGateway(client, devices=devices, allow_put=allow_put, rules=rules, refresh=refresh)
    try:
        gw.start()
        port = gw.conf().get("EPICS_PVAS_SERVER_PORT", "?")
        puts = "puts allowed by the rules" if allow_put else "read-only"
        click.echo(
            f"rda gateway pva: serving {devices} on pvAccess port {port}, {puts} (Ctrl-C to stop)"
        )
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        gw.stop()
        client.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
