"""Imports cost only what is used: ``import rda``, ``rda --help`` and ``rda get`` load only
what they need (the figures are in docs/performance.md).

Each check runs in a fresh interpreter, since this process has long imported everything.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

import rda
import rda.admin
from rda._cli import build
from rda.admin.cli.main import LazyGroup
from rda.business.server.builder import Server
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest
from rda.serialization.data import Data

ROOT = Path(__file__).resolve().parent.parent
# What no command-line or client use should pay for unless it needs it.
SERVER_SIDE = ("prometheus_client", "rda.admin.metrics", "rda.admin.builtins", "httpx")
EXTRAS = (
    "rda.pipeline",
    "pyarrow",
    "pyspark",
    "starlette",
    "uvicorn",
    "rda.panel",
    "rda.gateway",
    "p4p",
)


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _python(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; its stdout's lines."""
    result = _run(["-c", code])
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _imported(args: list[str]) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules a fresh ``python -X importtime ARGS`` imported, and its result."""
    result = _run(["-X", "importtime", *args])
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "rda" in names  # the parse found the imports, not an empty list
    return names, result


def _loaded(names: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == r or n.startswith(r + ".") for r in roots))


def test_import_rda_loads_no_dependency() -> None:
    (line,) = _python(
        "import sys, rda; "
        "print(sorted(m for m in ('zmq', 'pydantic', 'prometheus_client', 'numpy', 'httpx',"
        " 'click', 'rda.business', 'rda.transport', 'rda.serialization') if m in sys.modules))"
    )
    assert line == "[]"


def test_names_work_after_lazy_loading() -> None:
    lines = _python(
        "import sys, rda\n"
        "d = rda.Data(x=1.5)\n"
        "print(d['x'], type(d) is sys.modules['rda.serialization.data'].Data)\n"
        # The codec alone: the client's transport and its settings are not loaded with it.
        "print(sorted(m for m in ('zmq', 'pydantic', 'prometheus_client') if m in sys.modules))\n"
        "from rda import ClientService\n"
        "from rda.business.client.service import ClientService as Defining\n"
        "print(ClientService is Defining, rda.ClientService is Defining)\n"
        "print('prometheus_client' in sys.modules)\n"
        "print(rda.admin.REGISTRY.knows('ping'), 'prometheus_client' in sys.modules)\n"
    )
    assert lines == ["1.5 True", "[]", "True True", "False", "True True"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        rda.Nope  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rda.admin.nope  # noqa: B018
    assert not hasattr(rda, "_EXPORTS_typo")


@pytest.mark.parametrize("module", [rda, rda.admin], ids=["rda", "rda.admin"])
def test_the_lazy_table_is_what_type_checkers_see(module: object) -> None:
    """``_EXPORTS`` (what runs) and the TYPE_CHECKING imports (what mypy reads) name the same
    defining module for every public name, and every public name is in both."""
    path = Path(module.__file__)  # type: ignore[attr-defined]
    tree = ast.parse(path.read_text())
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.Import):
                    typed.update({a.asname or a.name: a.name for a in stmt.names})
                elif isinstance(stmt, ast.ImportFrom):
                    assert stmt.module is not None
                    typed.update({a.asname or a.name: stmt.module for a in stmt.names})
    exports: dict[str, str] = module._EXPORTS  # type: ignore[attr-defined]
    assert typed == exports
    public = set(module.__all__) - {"__version__", "install"}  # type: ignore[attr-defined]
    assert public == set(exports)
    assert set(module.__all__) <= set(dir(module))  # type: ignore[attr-defined]


def test_rda_help_loads_neither_the_commands_nor_the_extras() -> None:
    names, result = _imported(["-m", "rda._cli", "--help"])
    assert result.returncode == 0, result.stderr
    assert _loaded(names, EXTRAS) == []
    assert _loaded(names, ("zmq", "numpy", "pydantic", *SERVER_SIDE)) == []
    assert _loaded(names, ("rda.business", "rda.transport", "rda.serialization")) == []
    # ...and still lists every command with its one-line help.
    group = build()
    listed = [
        line.split()[0] for line in result.stdout.split("Commands:")[1].splitlines() if line.strip()
    ]
    assert listed == group.list_commands(click.Context(group))
    assert {"get", "set", "serve", "keys", "directory"} <= set(listed)


def test_the_one_line_helps_are_the_commands_own() -> None:
    group = build()
    assert isinstance(group, LazyGroup)
    assert len(group.lazy) >= 8
    for name, lazy in group.lazy.items():
        command = lazy.load()
        assert command.get_short_help_str(limit=10**6) == lazy.help, name
        assert group.get_command(click.Context(group), name) is command


class _Meter(Device):
    @Device.property("Reading")
    def reading(self, request: GetRequest) -> Data:
        return Data(value=42.5)


@pytest.fixture
def server() -> Iterator[Server]:
    srv = rda.ServerBuilder("ImportsServer").device("IMPORTS1", _Meter()).build().start()
    yield srv
    srv.stop()


def test_rda_get_loads_the_client_only(server: Server) -> None:
    names, result = _imported(
        ["-m", "rda._cli", "get", "IMPORTS1/Reading", "--endpoint", server.endpoint, "--json"]
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["data"] == {"value": 42.5}
    assert "zmq" in names and "rda.business.client.service" in names
    assert _loaded(names, EXTRAS) == []
    assert _loaded(names, SERVER_SIDE) == []
    assert _loaded(names, ("rda.admin.cli.run", "rda.admin.cli.directory", "rda.demo")) == []


def test_a_client_and_server_on_the_memory_network_never_load_zmq() -> None:
    """zmq comes with a ZeroMQ transport only: ``rda.transport`` loads its ZeroMQ transports
    on first use, so tests on the in-memory transport run without it."""
    code = (
        "import sys, rda\n"
        "from rda.testing import MemoryNetwork\n"
        "from rda.testing._memory import OneServerDirectory\n"
        "class D(rda.Device):\n"
        "    @rda.prop('V')\n"
        "    def v(self, r): return rda.Data(value=1.0)\n"
        "net = MemoryNetwork()\n"
        "srv = (rda.ServerBuilder('S').device('D1', D()).directory(None)\n"
        "       .transport(lambda h, s, i: net.server('s', h, s, i)).build().start())\n"
        "c = rda.ClientService(directory=OneServerDirectory(srv.endpoint),\n"
        "                      transport_factory=lambda h, s, i: net.client(h, s, i))\n"
        "print(c.access_point('D1', 'V').get(timeout=10).data['value'])\n"
        "c.close(); srv.stop(); net.close()\n"
        "print(sorted(m for m in sys.modules if m == 'zmq' or m.startswith('zmq.')))\n"
    )
    assert _python(code) == ["1.0", "[]"]
