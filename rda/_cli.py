"""The ``rda`` console script: the admin commands plus, with the ``pipeline`` extra, the history.

``rda.admin`` must not import ``rda.pipeline`` (layer direction), so this facade module, which
may import both, builds the full command: the admin group (``rda.admin.cli.main.cli``) gains
``record`` and ``compact`` (``rda.pipeline.recorder.cli``) and the ``history`` group
(``rda.pipeline.history.cli``) when pyarrow is installed, and ``panel`` (``rda.panel.cli``)
when starlette, uvicorn and websockets are (extra ``[panel]``), and ``gateway``
(``rda.gateway.cli``) when p4p is (extra ``[pva]``); without an extra its commands
are absent. Like the admin commands, they are imported only when used: ``rda --help`` finds
the extras (``importlib.util.find_spec`` imports nothing) and lists the one-line helps given
here.
"""

from __future__ import annotations

import importlib.util

import click

from rda.admin.cli.main import cli

__all__ = ["build", "main"]


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _record() -> click.Command:
    from rda.pipeline.recorder.cli import record

    return record


def _compact() -> click.Command:
    from rda.pipeline.recorder.cli import compact

    return compact


def _history() -> click.Command:
    from rda.pipeline.history.cli import history

    return history


def _panel() -> click.Command:
    from rda.panel.cli import panel

    return panel


def _gateway() -> click.Command:
    from rda.gateway.cli import gateway

    return gateway


def build() -> click.Group:
    """The ``rda`` group with every command this installation can run."""
    if _installed("pyarrow"):
        cli.add_lazy_command(
            "record",
            _record,
            "Record subscriptions into ROOT (journal, then Parquet) until Ctrl-C or --duration.",
        )
        cli.add_lazy_command(
            "compact",
            _compact,
            "Rewrite a closed day of one property into one file per recorder and schema version.",
        )
        cli.add_lazy_command(
            "history",
            _history,
            "Search and pull recorded values from a history store (ROOT of `rda record`).",
        )
    if _installed("starlette", "uvicorn", "websockets"):
        cli.add_lazy_command(
            "panel",
            _panel,
            "A live web panel: servers, devices and properties learnt from the directory and "
            "the servers; values, strip charts and (with --allow-set) sets, in the browser.",
        )
    if _installed("p4p"):
        cli.add_lazy_command(
            "gateway",
            _gateway,
            "Serve rda devices to other control systems' tools (pva: EPICS pvAccess).",
        )
    return cli


def main() -> None:
    """Console-script entry point (``rda``)."""
    build().main(prog_name="rda")


if __name__ == "__main__":  # pragma: no cover
    main()
