"""rda.admin: admin commands, the `rda` command-line tool and the Prometheus endpoint.

``install(builder)`` wires a ``ServerBuilder``: the admin dispatcher as its ``admin_handler``
and, when ``builder.metrics_port(...)`` was set, a ``/metrics`` endpoint started and stopped
with the server. The ``rda`` facade calls it; the business layer never imports rda.admin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

# Importing builtins registers the built-in commands in the default registry.
import rda.admin.builtins  # noqa: F401
from rda.admin.metrics import metrics_endpoint, start_metrics, stop_metrics
from rda.admin.registry import (
    REGISTRY,
    AdminArgumentsError,
    AdminContext,
    AdminServer,
    Command,
    CommandRegistry,
    NoArguments,
    command,
    dispatch,
)

__all__ = [
    "REGISTRY",
    "AdminArgumentsError",
    "AdminContext",
    "AdminServer",
    "Command",
    "CommandRegistry",
    "NoArguments",
    "command",
    "dispatch",
    "install",
    "metrics_endpoint",
    "start_metrics",
    "stop_metrics",
]


class _Builder(Protocol):
    """The part of ``rda.business.server.builder.ServerBuilder`` that ``install`` uses."""

    metrics_port_value: int | None

    def admin_handler(
        self, fn: Callable[[Any, str, Any, Any], Any], commands: Callable[[str], bool]
    ) -> Any: ...

    def on_start(self, fn: Callable[[Any], None]) -> Any: ...

    def on_stop(self, fn: Callable[[Any], None]) -> Any: ...


B = TypeVar("B", bound=_Builder)


def install(builder: B, registry: CommandRegistry | None = None) -> B:
    """Give ``builder`` the admin commands and, if it has a metrics port, the endpoint.

    The port is read when the server starts, so ``metrics_port`` may be set after this call.
    ``registry`` defaults to the process-wide one (built-ins plus ``rda.admin`` plugins).
    """
    # Idempotent: a facade builder (already installed) may pass through `rda serve` again,
    # and a second set of hooks would start a second metrics endpoint.
    if getattr(builder, "_rda_admin_installed", False):
        return builder
    commands = REGISTRY if registry is None else registry
    builder.admin_handler(commands.dispatch, commands.knows)
    setattr(builder, "_rda_admin_installed", True)  # noqa: B010 - not declared on the Protocol

    def start(server: Any) -> None:
        port = builder.metrics_port_value
        if port is not None:
            start_metrics(server, port)

    builder.on_start(start)
    builder.on_stop(stop_metrics)
    return builder
