"""The public face is curated (the layer rules are checked in tests/test_layout.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import rda

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_exists_and_is_listed_once() -> None:
    assert len(rda.__all__) == len(set(rda.__all__)), "a name is listed twice in rda.__all__"
    missing = [name for name in rda.__all__ if not hasattr(rda, name)]
    assert not missing
    # The names load on first use (tests/test_imports.py); dir() lists them all the same.
    assert set(rda.__all__) <= set(dir(rda))


def test_public_classes_are_the_layer_classes_not_copies() -> None:
    from rda.business.client.service import ClientService
    from rda.business.server.builder import ServerBuilder as BusinessBuilder
    from rda.serialization.data import Data

    assert rda.ClientService is ClientService
    assert rda.Data is Data
    assert issubclass(rda.ServerBuilder, BusinessBuilder)


def test_timeout_error_is_also_the_builtin() -> None:
    assert issubclass(rda.TimeoutError, TimeoutError)
    assert issubclass(rda.TimeoutError, rda.RdaError)


def test_whose_fault_errors_are_caught_by_their_base_classes() -> None:
    assert issubclass(rda.LocalDecodeError, rda.DecodeError)
    assert issubclass(rda.RemoteDecodeError, rda.DecodeError)
    assert issubclass(rda.LocalProtocolError, rda.ProtocolError)
    assert issubclass(rda.RemoteProtocolError, rda.ProtocolError)
    assert rda.RemoteDecodeError.origin == rda.RemoteProtocolError.origin == "remote"
    assert rda.LocalDecodeError.origin == rda.LocalProtocolError.origin == "local"


# The client's columnar history (issue 35: ``client.history_table`` returns a pyarrow.Table
# decoded zero-copy from the chunk's Arrow IPC stream) needs pyarrow in the client, and only
# there: history.py imports it inside the functions that read chunks, and arrow_rows.py (the
# rows -> Data conversion) is imported only by those functions. tests/test_imports.py checks
# that ``import rda`` and the CLI's client commands still never load it.
ARROW_USERS = {"business/client/history.py", "business/client/arrow_rows.py"}


def _run_time_imports(tree: ast.Module) -> Iterator[str]:
    """The modules a file imports when it runs (imports under ``if TYPE_CHECKING:`` are for
    the type checker only)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            skip.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_core_never_imports_pyarrow_or_pyspark() -> None:
    checked = 0
    for layer in ("serialization", "transport", "business", "admin"):
        for path in (ROOT / "rda" / layer).rglob("*.py"):
            checked += 1
            text = path.read_text()
            names = list(_run_time_imports(ast.parse(text)))
            if str(path.relative_to(ROOT / "rda")) not in ARROW_USERS:
                assert not [n for n in names if n.split(".")[0] == "pyarrow"], path
                assert not [n for n in names if "arrow_rows" in n], path
            assert "import pyspark" not in text, path
    assert checked > 50  # the layers were found where they are


def test_the_client_loads_pyarrow_only_when_it_reads_history() -> None:
    history = ROOT / "rda" / "business" / "client" / "history.py"
    for node in ast.parse(history.read_text()).body:  # module level
        if isinstance(node, ast.Import | ast.ImportFrom):
            named = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not any("pyarrow" in n or "arrow_rows" in n for n in named), ast.unparse(node)


def test_recording_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import sys, rda.pipeline; assert 'pyspark' not in sys.modules; rda.pipeline.History"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
