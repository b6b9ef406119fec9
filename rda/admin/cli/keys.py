"""``rda keys``: CURVE key pairs for servers and clients (docs/security.md).

``rda keys generate NAME`` writes ``NAME.key_secret`` (the pair, mode 0600) and ``NAME.key``
(the public half, to hand out: a server's clients directory holds one per client, the file
stem being the principal). ``rda keys show FILE`` prints the public key of either file, e.g.
for ``--server-key`` or a static directory entry.
"""

from __future__ import annotations

from pathlib import Path

import click

from rda.admin.cli.common import CliError, ExitCode, emit_json, reporting
from rda.business.security import (
    PUBLIC_SUFFIX,
    SECRET_SUFFIX,
    generate_keypair,
    load_public_key,
    save_keypair,
)

__all__ = ["keys"]


@click.group()
def keys() -> None:
    """CURVE key pairs: generate them, show their public half."""


@keys.command()
@click.argument("name")
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    help="Where to write the two files (default: the current directory).",
)
@click.option("--force", is_flag=True, help="Replace existing key files.")
@click.option("--json", "as_json", is_flag=True, help="Print the paths and public key as JSON.")
def generate(name: str, folder: Path, force: bool, as_json: bool) -> None:
    """Write NAME.key_secret (key pair, mode 0600) and NAME.key (public key).

    NAME is the principal a server knows this client as when NAME.key sits in its
    --clients directory.
    """
    if not name or "/" in name or name.startswith("."):
        raise click.BadParameter(f"{name!r}: a plain file name is expected", param_hint="NAME")
    secret_path = folder / f"{name}{SECRET_SUFFIX}"
    public_path = folder / f"{name}{PUBLIC_SUFFIX}"
    if not force:
        for path in (secret_path, public_path):
            if path.exists():
                # Overwriting a secret key locks its owner out of every server that knew it.
                raise CliError(f"{path} exists (--force replaces it)", ExitCode.USAGE)
    with reporting():
        folder.mkdir(parents=True, exist_ok=True)
        pair = generate_keypair()
        save_keypair(pair, secret_path)
    if as_json:
        emit_json(
            {
                "secret_file": str(secret_path),
                "public_file": str(public_path),
                "public": pair.public,
            }
        )
        return
    click.echo(f"{secret_path}: key pair (keep it secret; mode 0600)")
    click.echo(f"{public_path}: public key {pair.public}")


@keys.command()
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def show(path: Path) -> None:
    """Print the public key in PATH (a .key or .key_secret file)."""
    with reporting():
        click.echo(load_public_key(path))
