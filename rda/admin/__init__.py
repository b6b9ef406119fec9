"""rda.admin: admin commands, the `rda` command-line tool and the Prometheus endpoint.

``install(builder)`` wires a ``ServerBuilder``: the admin dispatcher as its ``admin_handler``
and, when ``builder.metrics_port(...)`` was set, a ``/metrics`` endpoint started and stopped
with the server. The ``rda`` facade calls it; the business layer never imports rda.admin.

Importing this package is cheap, because ``rda`` (the command-line tool, in ``rda.admin.cli``)
imports it for every command: the registry's names and the metrics functions are loaded on
first use (PEP 562 ``__getattr__``), and with them the built-in commands
(``rda.admin.builtins`` registers them in ``REGISTRY`` when imported), pydantic, numpy and
prometheus_client.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
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

# Public name -> defining module (the TYPE_CHECKING imports above name the same ones).
_EXPORTS: dict[str, str] = {
    "REGISTRY": "rda.admin.registry",
    "AdminArgumentsError": "rda.admin.registry",
    "AdminContext": "rda.admin.registry",
    "AdminServer": "rda.admin.registry",
    "Command": "rda.admin.registry",
    "CommandRegistry": "rda.admin.registry",
    "NoArguments": "rda.admin.registry",
    "command": "rda.admin.registry",
    "dispatch": "rda.admin.registry",
    "metrics_endpoint": "rda.admin.metrics",
    "start_metrics": "rda.admin.metrics",
    "stop_metrics": "rda.admin.metrics",
}


def __getattr__(name: str) -> object:
    """Load a public name on first use, the built-in commands first: a plugin registering
    ``@rda.admin.command("ping")`` must meet the built-in ``ping`` (a clash), not precede it."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    importlib.import_module("rda.admin.builtins")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    import rda.admin.builtins  # noqa: F401 - the built-in commands, registered in REGISTRY
    from rda.admin.metrics import start_metrics, stop_metrics
    from rda.admin.registry import REGISTRY

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
