"""The ``rda`` console script: the admin commands plus, with the ``pipeline`` extra, the history.

``rda.admin`` must not import ``rda.pipeline`` (layer direction), so this facade module, which
may import both, builds the full command: the admin group (``rda.admin.cli.main.cli``) gains
``record`` and ``compact`` (``rda.pipeline.recorder.cli``) and the ``history`` group
(``rda.pipeline.history.cli``) when pyarrow is importable, and ``panel`` (``rda.panel.cli``)
when starlette, uvicorn and websockets are (extra ``[panel]``); without an extra its commands
are absent.
"""

from __future__ import annotations

import importlib.util

import click

from rda.admin.cli.main import cli

__all__ = ["build", "main"]


def build() -> click.Group:
    """The ``rda`` group with every command this installation can run."""
    if importlib.util.find_spec("pyarrow") is not None and "history" not in cli.commands:
        from rda.pipeline.history.cli import history
        from rda.pipeline.recorder.cli import compact, record

        cli.add_command(record)
        cli.add_command(compact)
        cli.add_command(history)
    panel_deps = ("starlette", "uvicorn", "websockets")
    if all(importlib.util.find_spec(m) is not None for m in panel_deps) and (
        "panel" not in cli.commands
    ):
        from rda.panel.cli import panel

        cli.add_command(panel)
    return cli


def main() -> None:
    """Console-script entry point (``rda``)."""
    build().main(prog_name="rda")


if __name__ == "__main__":  # pragma: no cover
    main()
