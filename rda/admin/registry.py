"""Admin commands: the registry, the ``@command`` decorator and the server-side dispatcher.

An admin command is a plain function ``fn(ctx: AdminContext, args: Model) -> Data | dict``
whose arguments are validated by a pydantic model (pydantic at the edges: admin arguments come
from outside). Commands travel as ``ADMIN`` requests on the ordinary channel (the RDA3 paper,
"Runtime diagnostics": the grouped scheduler keeps them apart from device traffic, so no second
socket pair is needed); the business server runs them in the scheduler group ``__admin__`` and
calls :func:`dispatch` (installed as its ``admin_handler`` by :func:`rda.admin.install`).

Third-party packages add commands through the entry-point group ``rda.admin``; each entry point
may name a module (its ``@command`` functions are registered when it is imported), a function
decorated with ``@command``, or a plain function (registered under the entry point's name).
Entry points are loaded once, on the first dispatch, so importing rda stays cheap.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pydantic

from rda.business.server.outcomes import register_client_error
from rda.business.server.statistics import ClientSnapshot, ServerStatistics, SourceSnapshot
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError, RdaError

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "AdminArgumentsError",
    "AdminContext",
    "AdminServer",
    "Command",
    "CommandRegistry",
    "NoArguments",
    "command",
    "dispatch",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rda.admin"

# The attribute a decorated function carries, so an entry point naming it can be registered
# into any registry (not only the default one its decorator used).
_SPEC_ATTRIBUTE = "rda_admin_command"


class AdminArgumentsError(RdaError):
    """An admin command's arguments were invalid (reaches the client as ``RemoteError``)."""


# Invalid arguments are the caller's mistake: counted as bad_request, not a server fault.
register_client_error(AdminArgumentsError, "bad_request")


class AdminServer(Protocol):
    """The server introspection API admin commands read (implemented by the business server)."""

    @property
    def name(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def started_at(self) -> float: ...

    def uptime(self) -> float: ...

    def settings(self) -> dict[str, object]: ...

    def devices(self) -> list[str]: ...

    def clients(self) -> list[ClientSnapshot]: ...

    def sources(self) -> list[SourceSnapshot]: ...

    def statistics(self) -> ServerStatistics: ...

    def disconnect_client(self, peer_hex: str) -> bool: ...


class NoArguments(pydantic.BaseModel):
    """The model of a command that takes no arguments: any given argument is an error."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class AdminContext:
    """What a command may look at: the server, the calling client and the registry."""

    server: AdminServer
    client: object
    command: str
    registry: CommandRegistry


CommandFunction = Callable[[AdminContext, Any], "Data | Mapping[str, Any]"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Command:
    """A registered command: its name, function, argument model and one-line help."""

    name: str
    function: CommandFunction
    args_model: type[pydantic.BaseModel]
    help: str

    @property
    def origin(self) -> str:
        fn = self.function
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    def parse(self, arguments: Mapping[str, Any]) -> pydantic.BaseModel:
        """Validate ``arguments``; a failure becomes one readable line, not a pydantic dump."""
        try:
            return self.args_model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise AdminArgumentsError(f"{self.name}: {problems}") from None


class CommandRegistry:
    """Named admin commands, with lazy one-time loading of an entry-point group."""

    def __init__(self, group: str | None = ENTRY_POINT_GROUP) -> None:
        self.group = group
        self._commands: dict[str, Command] = {}
        self._lock = threading.Lock()
        self._load_lock = threading.RLock()
        self._loaded = group is None
        # "entry point name: error" for plugins that failed to load (shown by `info`).
        self.load_errors: list[str] = []

    def command(
        self, name: str, args_model: type[pydantic.BaseModel] | None = None, help: str = ""
    ) -> Callable[[F], F]:
        """Decorator: register ``fn(ctx, args)`` under ``name`` (the function is unchanged)."""

        def decorate(fn: F) -> F:
            spec = Command(
                name=name,
                function=fn,
                args_model=args_model or NoArguments,
                help=help or _first_line(fn.__doc__),
            )
            self.register(spec)
            setattr(fn, _SPEC_ATTRIBUTE, spec)
            return fn

        return decorate

    def register(self, spec: Command) -> None:
        """Add a command; re-registering the same function is a no-op, a clash is an error."""
        if not spec.name or any(c.isspace() for c in spec.name):
            raise ValueError(f"invalid admin command name {spec.name!r}")
        with self._lock:
            existing = self._commands.get(spec.name)
            if existing is not None and existing.function is not spec.function:
                raise ValueError(
                    f"admin command {spec.name!r} is already registered by {existing.origin}"
                )
            self._commands[spec.name] = spec

    def get(self, name: str) -> Command:
        self.load_entry_points()
        with self._lock:
            spec = self._commands.get(name)
            known = sorted(self._commands)
        if spec is None:
            raise NoSuchDeviceError(
                f"unknown admin command {name!r}; available: {', '.join(known) or 'none'}"
            )
        return spec

    def knows(self, name: str) -> bool:
        """Whether command ``name`` exists (the server's bound on admin metric labels)."""
        self.load_entry_points()
        with self._lock:
            return name in self._commands

    def commands(self) -> list[Command]:
        self.load_entry_points()
        with self._lock:
            return [self._commands[n] for n in sorted(self._commands)]

    def load_entry_points(self) -> None:
        """Import the plugins of ``group`` once; a broken plugin is logged, never fatal."""
        if self._loaded:
            return
        # Held for the whole load so a concurrent first dispatch (two servers in one process)
        # waits for every plugin instead of seeing half of them; reentrant because a plugin's
        # import may itself look at the registry.
        with self._load_lock:
            if self._loaded:
                return
            assert self.group is not None
            # The built-in commands register themselves in REGISTRY when rda.admin.builtins
            # is first imported: on first use, so that importing rda.admin (which every `rda`
            # command does) stays cheap. Before the plugins, which may not take their names.
            import rda.admin.builtins  # noqa: F401

            for ep in importlib.metadata.entry_points(group=self.group):
                try:
                    self._register_entry_point(ep.name, ep.load())
                except Exception as exc:  # a plugin's bug must not take admin down
                    log.exception("admin plugin %s (%s) failed to load", ep.name, ep.value)
                    self.load_errors.append(f"{ep.name}: {type(exc).__name__}: {exc}")
            self._loaded = True

    def _register_entry_point(self, name: str, obj: object) -> None:
        if isinstance(obj, types.ModuleType):
            specs = [getattr(v, _SPEC_ATTRIBUTE, None) for v in vars(obj).values()]
            found = [s for s in specs if isinstance(s, Command)]
            if not found:
                raise ValueError(f"module {obj.__name__} defines no @command function")
            for spec in found:
                self.register(spec)
            return
        attached = getattr(obj, _SPEC_ATTRIBUTE, None)
        if isinstance(attached, Command):
            self.register(attached)
        elif callable(obj):
            self.register(Command(name, obj, NoArguments, _first_line(obj.__doc__)))
        else:
            raise TypeError(f"entry point {name!r} is neither a module nor a function")

    def dispatch(self, server: AdminServer, command: str, args: Data, client: object) -> Data:
        """Run one admin request: look up, validate, call, turn the result into Data.

        Matches the business ``admin_handler`` hook; exceptions become EXCEPTION replies.
        """
        spec = self.get(command)
        parsed = spec.parse(args.to_dict())
        ctx = AdminContext(server=server, client=client, command=command, registry=self)
        result = spec.function(ctx, parsed)
        if isinstance(result, Data):
            return result
        if isinstance(result, Mapping):
            return Data.from_dict(dict(result))
        raise TypeError(
            f"admin command {command!r} returned {type(result).__name__}, expected Data or dict"
        )


def _first_line(doc: str | None) -> str:
    """A command's help: its docstring's first paragraph on one line, as plain text (the
    reST markup of a docstring, ``code`` and :role:`name`, is for Sphinx, not for ``rda admin
    SRV commands``)."""
    paragraph = (doc or "").strip().split("\n\n", 1)[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    text = re.sub(r":[\w:]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


#: The process-wide registry the server uses; ``@rda.admin.command`` registers here.
REGISTRY = CommandRegistry()


def command(
    name: str, args_model: type[pydantic.BaseModel] | None = None, help: str = ""
) -> Callable[[F], F]:
    """Register an admin command in the default registry::

    class Args(pydantic.BaseModel):
        times: int = 1

    @rda.admin.command("echo", Args)
    def echo(ctx: AdminContext, args: Args) -> dict[str, object]:
        return {"server": ctx.server.name, "times": args.times}
    """
    return REGISTRY.command(name, args_model, help)


def dispatch(server: AdminServer, command: str, args: Data, client: object) -> Data:
    """The default registry's dispatcher (``rda.admin`` imports the built-in commands)."""
    return REGISTRY.dispatch(server, command, args, client)
