"""``rda.ServerBuilder``: the business-layer builder with the admin interface installed.

The business layer must not import ``rda.admin`` (dependencies point down), so the facade is
where the two meet: every server built through ``rda.ServerBuilder`` answers the built-in admin
commands and plugins, and serves ``/metrics`` when ``metrics_port`` (or ``RDA_METRICS_PORT``)
is set.
"""

from __future__ import annotations

from rda.admin import install
from rda.business.server.builder import ServerBuilder as _BusinessServerBuilder

__all__ = ["ServerBuilder"]


class ServerBuilder(_BusinessServerBuilder):
    """Build an rda server: ``rda.ServerBuilder("Name").endpoint(...).device(...).build()``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        install(self)
