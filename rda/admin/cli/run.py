"""``rda serve`` (run a server until Ctrl-C/SIGTERM) and ``rda bench`` (run the benchmarks).

``rda serve --policy FILE`` authorizes requests by a policy (SIGHUP re-reads it).
``rda serve MODULE:OBJECT`` accepts what a user naturally has at hand: a ``ServerBuilder``, a
built ``Server``, a ``Device`` subclass or instance, or a callable returning one of those
(``rda serve myapp:make_server``). ``rda serve demo`` runs ``rda.demo``'s server. The current
directory is importable, as with ``python -m``. ``--metrics-port`` serves ``/metrics`` for any
of them; admin commands need the builder route (``rda.admin.install``), which a built Server
decided for itself. ``--key``/``--clients`` (and ``--secure DIR`` for the demo) add CURVE
encryption and client authentication to a builder (docs/security.md).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from rda.admin.cli.common import TIMEOUT, CliError, ExitCode, Options, emit_json
from rda.admin.format import format_duration
from rda.admin.metrics import metrics_endpoint, start_metrics, stop_metrics
from rda.business.policy import PolicyError
from rda.business.security import ServerSecurity, load_keypair
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.serialization.errors import RdaError

__all__ = ["bench", "load_server", "serve"]


@click.command()
@click.argument("target", metavar="demo|MODULE:OBJECT")
@click.option("--bind", default=None, help="Endpoint to bind, e.g. tcp://127.0.0.1:5555.")
@click.option("--name", default=None, help="Server name (default: the device name).")
@click.option("--device", "device_name", default=None, help="Device name for a Device class.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus /metrics on 127.0.0.1:PORT (0: any free port).",
)
@click.option("--duration", type=float, default=None, help="Stop after S seconds.")
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Authorization policy (TOML); re-read on SIGHUP and by `rda admin reload-policy`.",
)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Accept a --policy (at start and on SIGHUP) that would lock everyone out: no rules, "
    "or nobody left who may reload it (docs/security.md).",
)
@click.option(
    "--trust-declared-principals",
    is_flag=True,
    help="Believe the principal a client declares (RDA_PRINCIPAL). Test stands only.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the endpoint as JSON.")
@click.option(
    "--replace",
    is_flag=True,
    help="Take over the directory entries of a live server with the same name or devices "
    "(its log is told); without it, such a start fails and names the owner.",
)
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="CURVE: this server's key pair file (needs --clients).",
)
@click.option(
    "--clients",
    "clients_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="CURVE: the directory of NAME.key files of the clients allowed to connect.",
)
@click.option(
    "--secure",
    "secure_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="demo only: CURVE with the keys in DIR, created on first use (docs/security.md).",
)
@click.pass_obj
def serve(
    options: Options,
    target: str,
    bind: str | None,
    name: str | None,
    device_name: str | None,
    metrics_port: int | None,
    duration: float | None,
    policy_file: Path | None,
    allow_empty: bool,
    trust_declared_principals: bool,
    as_json: bool,
    replace: bool,
    key_file: Path | None,
    clients_dir: Path | None,
    secure_dir: Path | None,
) -> None:
    """Run a server until Ctrl-C or SIGTERM, printing where it listens."""
    security = _security(target, key_file, clients_dir, secure_dir)
    if target == "demo":
        server: ServerBuilder | Server = _demo(bind, name, options)
    else:
        server = load_server(target, bind=bind, name=name, device_name=device_name, options=options)
    if security is not None:
        if not isinstance(server, ServerBuilder):
            raise CliError(
                f"{target} is an already built Server: --key/--clients cannot secure it",
                ExitCode.USAGE,
            )
        server.security(security)
    if isinstance(server, ServerBuilder):
        server.replace(replace)
        if metrics_port is not None:
            server.metrics_port(metrics_port)
        _authorization(server, policy_file, trust_declared_principals, allow_empty)
        server = server.build()
    elif replace:
        raise CliError(
            f"{target} is an already built Server: --replace needs a builder", ExitCode.USAGE
        )
    elif policy_file is not None or trust_declared_principals or allow_empty:
        raise CliError(
            "an already built Server decided its own authorization: --policy, --allow-empty "
            "and --trust-declared-principals need a ServerBuilder, a Device or demo",
            ExitCode.USAGE,
        )
    stop = threading.Event()
    previous = _install_signal_handlers(stop, server, allow_empty)
    try:
        server.start()
        if metrics_port is not None:
            # Idempotent: a builder's hook already started it; a built Server gets it here.
            start_metrics(server, metrics_port)
        _announce(server, as_json)
        deadline = None if duration is None else time.monotonic() + duration
        while not stop.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            stop.wait(0.5 if remaining is None else min(0.5, remaining))
    finally:
        server.stop()
        stop_metrics(server)
        _restore_signal_handlers(previous)
    click.echo(f"{server.name}: stopped", err=True)


def load_server(
    spec: str,
    *,
    bind: str | None = None,
    name: str | None = None,
    device_name: str | None = None,
    options: Options | None = None,
) -> ServerBuilder | Server:
    """Import ``MODULE:OBJECT`` and turn it into a ServerBuilder (with admin) or a Server."""
    obj = _import(spec)
    if callable(obj) and not isinstance(obj, type | ServerBuilder | Server | Device):
        with _users_code(f"{spec}()"):
            obj = obj()
    if isinstance(obj, type) and issubclass(obj, Device):
        device_name = device_name or obj.__name__
        with _users_code(f"{spec}()"):
            obj = obj()
    if isinstance(obj, Device):
        device_name = device_name or type(obj).__name__
        obj = ServerBuilder(name or device_name).device(device_name, obj)
    if isinstance(obj, ServerBuilder):
        # Imported here: rda.admin's __init__ imports the commands, which the CLI does not
        # need until it serves.
        from rda.admin import install

        if options is not None and options.config_file is not None:
            obj.config(options.config())
        if bind is not None:
            obj.endpoint(bind)
        if name is not None:  # --name renames a builder as it names a bare device's server
            obj.name = name
        return install(obj)
    if isinstance(obj, Server):
        if bind is not None or name is not None:
            raise CliError(
                f"{spec} is an already built Server: --bind/--name cannot change it",
                ExitCode.USAGE,
            )
        return obj
    raise CliError(
        f"{spec} is a {type(obj).__name__}; expected a ServerBuilder, a Server, a Device "
        "class or instance, or a callable returning one",
        ExitCode.USAGE,
    )


def _security(
    target: str, key_file: Path | None, clients_dir: Path | None, secure_dir: Path | None
) -> ServerSecurity | None:
    if secure_dir is not None:
        if target != "demo":
            raise click.UsageError("--secure is for `rda serve demo`; use --key and --clients")
        if key_file is not None or clients_dir is not None:
            raise click.UsageError("--secure chooses the key files: no --key/--clients with it")
        from rda.demo import demo_security

        return demo_security(secure_dir)
    if (key_file is None) != (clients_dir is None):
        # A key without clients would refuse everyone; clients without a key cannot be checked.
        raise click.UsageError("--key and --clients go together")
    if key_file is None or clients_dir is None:
        return None
    return ServerSecurity(load_keypair(key_file), clients=clients_dir)


def _demo(bind: str | None, name: str | None, options: Options) -> ServerBuilder:
    """``rda.demo``'s server with the admin commands, on ``bind`` (default: a free port)."""
    # Imported here: the demo's simulated devices are only needed by `rda serve demo`.
    from rda.admin import install
    from rda.demo import demo_builder

    builder = demo_builder(
        bind or "tcp://127.0.0.1:0",
        name=name or "RdaDemoServer",
        config=options.config() if options.config_file is not None else None,
    )
    return install(builder)


def _import(spec: str) -> Any:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"{spec!r}: expected MODULE:OBJECT (or 'demo')", ExitCode.USAGE)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with _users_code(f"importing {module_name!r}"):
            obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}", ExitCode.USAGE) from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"{module_name!r} has no attribute {attribute!r}", ExitCode.USAGE
            ) from None
    return obj


# Frames of these files are rda's (or the import machinery's), not the user's: an error in the
# user's module is shown with the user's frames only.
_NOT_USERS = tuple(
    str(folder) + os.sep
    for folder in (Path(__file__).resolve().parents[2], Path(importlib.__file__).parent)
)


@contextmanager
def _users_code(doing: str) -> Iterator[None]:
    """Run the user's code (import their module, call their factory): an error there is theirs
    to fix, so it ends the command with exit 2 and their own frames (file, line, the error),
    not a traceback through rda and importlib. A missing module (ModuleNotFoundError for it)
    and rda's own errors pass through: the caller and ``reporting()`` word those."""
    try:
        yield
    except (RdaError, click.ClickException):
        raise
    except ModuleNotFoundError as exc:
        if exc.__traceback__ is not None and not _users_frames(exc):
            raise  # the module itself is missing, not an import inside it
        raise _users_error(doing, exc) from None
    except Exception as exc:
        raise _users_error(doing, exc) from None


def _users_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    frames = traceback.extract_tb(exc.__traceback__)
    return [f for f in frames if not f.filename.startswith(_NOT_USERS) and f.filename[:1] != "<"]


def _users_error(doing: str, exc: BaseException) -> CliError:
    where = "".join(traceback.format_list(_users_frames(exc)))
    # For a SyntaxError this is its file, line and caret, then the message; else the message.
    only = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n").splitlines()
    lines = [f"error in your code ({doing}): {only[-1]}", where.rstrip("\n"), *only[:-1]]
    return CliError("\n".join(line for line in lines if line), ExitCode.USAGE)


def _announce(server: Server, as_json: bool) -> None:
    endpoint = metrics_endpoint(server)
    info: dict[str, Any] = {
        "name": server.name,
        "endpoint": server.endpoint,
        "devices": server.devices(),
        "pid": os.getpid(),
    }
    if endpoint is not None:
        info["metrics_url"] = endpoint.url
    if server.server_key is not None:
        info["server_key"] = server.server_key
    if as_json:
        emit_json(info)
        return
    click.echo(f"{server.name} serving {', '.join(server.devices()) or '(no devices)'}")
    click.echo(f"endpoint {server.endpoint}")
    if server.server_key is not None:
        click.echo(f"CURVE    server key {server.server_key}")
    if endpoint is not None:
        click.echo(f"metrics  {endpoint.url}")
    sys.stdout.flush()
    click.echo("Ctrl-C to stop", err=True)


_Handler = Any


def _authorization(
    builder: ServerBuilder, policy_file: Path | None, trust: bool, allow_empty: bool
) -> None:
    if trust:
        builder.trust_declared_principals()
    if policy_file is None:
        return
    try:
        builder.policy(policy_file, allow_empty=allow_empty)
    except PolicyError as exc:
        # The server does not start with a broken policy: one line naming file and fault.
        raise CliError(str(exc), ExitCode.USAGE) from None


def _install_signal_handlers(
    stop: threading.Event, server: Server, allow_empty: bool = False
) -> dict[int, _Handler]:
    """SIGINT/SIGTERM set ``stop``; SIGHUP re-reads the policy file of a server that has one
    (only possible from the main thread; else Ctrl-C only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    if server.policy_file is not None:
        previous[signal.SIGHUP] = signal.signal(
            signal.SIGHUP, lambda signum, frame: _reload(server, allow_empty)
        )
    return previous


def _reload(server: Server, allow_empty: bool) -> None:
    """SIGHUP: reload atomically; a broken file is reported and the old policy stays."""
    try:
        policy = server.reload_policy(allow_empty=allow_empty)
    except PolicyError as exc:
        click.echo(f"{server.name}: policy NOT reloaded, the old one stays: {exc}", err=True)
        return
    click.echo(
        f"{server.name}: policy reloaded from {policy.source} ({len(policy.rules)} rules)", err=True
    )


def _restore_signal_handlers(previous: dict[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@click.command()
@click.argument("names", nargs=-1)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Benchmarks folder (default: ./benchmarks, else the one beside the rda sources).",
)
@click.option("--timeout", type=TIMEOUT, default=600.0, help="Seconds allowed per benchmark.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: name -> result.")
def bench(names: tuple[str, ...], directory: Path | None, timeout: float, as_json: bool) -> None:
    """Run the scripts in benchmarks/ (all, or those NAMES) and print their JSON results."""
    folder = directory if directory is not None else _bench_folder()
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if names:
        scripts = [p for p in scripts if p.stem in names]
        missing = set(names) - {p.stem for p in scripts}
        if missing:
            raise CliError(
                f"no benchmark named {', '.join(sorted(missing))} in {folder}",
                ExitCode.NO_SUCH_DEVICE,
            )
    if not scripts:
        raise CliError(f"no benchmarks in {folder}", ExitCode.NO_SUCH_DEVICE)
    results: dict[str, Any] = {}
    failures = []
    for script in scripts:
        click.echo(f"running {script.stem} ...", err=True)
        started = time.monotonic()
        outcome = _run_benchmark(script, timeout)
        took = format_duration(time.monotonic() - started)
        if isinstance(outcome, str):
            failures.append(script.stem)
            click.echo(f"  {script.stem} failed after {took}: {outcome}", err=True)
            continue
        results[script.stem] = outcome
        if not as_json:
            click.echo(f"{script.stem} ({took}):")
            click.echo(json.dumps(outcome, indent=2))
    if as_json:
        emit_json(results)
    if failures:
        raise CliError(f"benchmark(s) failed: {', '.join(failures)}", ExitCode.ERROR)


def _bench_folder() -> Path:
    local = Path.cwd() / "benchmarks"
    if local.is_dir():
        return local
    # A source checkout: rda/admin/cli/run.py is three folders below the root.
    return Path(__file__).resolve().parents[3] / "benchmarks"


def _run_benchmark(script: Path, timeout: float) -> Any:
    """The script's JSON output (the last JSON document it printed), or an error string."""
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {format_duration(timeout)}"
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"exit code {done.returncode}: {tail[0]}"
    return _last_json(done.stdout) or "printed no JSON"


def _last_json(text: str) -> Any:
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    for line in reversed(stripped.splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None
