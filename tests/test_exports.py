"""The public face is curated, and the layers only ever import downwards (DESIGN.md §1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rda

ROOT = Path(__file__).resolve().parent.parent

# Each layer and the rda.* packages it may import (besides itself).
ALLOWED = {
    "serialization": {"serialization"},
    "transport": {"transport", "serialization"},
    "business": {"business", "transport", "serialization"},
    "admin": {"admin", "business", "transport", "serialization", "demo"},
    "pipeline": {"pipeline", "business", "transport", "serialization", "admin"},
}


def test_every_public_name_exists_and_is_listed_once() -> None:
    assert len(rda.__all__) == len(set(rda.__all__)), "a name is listed twice in rda.__all__"
    missing = [name for name in rda.__all__ if not hasattr(rda, name)]
    assert not missing


def test_public_classes_are_the_layer_classes_not_copies() -> None:
    from rda.business.client import ClientService
    from rda.business.server import ServerBuilder as BusinessBuilder
    from rda.serialization._data import Data

    assert rda.ClientService is ClientService
    assert rda.Data is Data
    assert issubclass(rda.ServerBuilder, BusinessBuilder)


def test_timeout_error_is_also_the_builtin() -> None:
    assert issubclass(rda.TimeoutError, TimeoutError)
    assert issubclass(rda.TimeoutError, rda.RdaError)


def _rda_imports(path: Path) -> set[str]:
    """The rda.<x> packages a module imports (x = the second dotted component)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "rda":
                found.add(parts[1] if len(parts) > 1 else "rda")
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_downwards(layer: str) -> None:
    bad = {}
    for path in sorted((ROOT / layer).glob("*.py")):
        wrong = _rda_imports(path) - ALLOWED[layer]
        if wrong:
            bad[path.name] = sorted(wrong)
    assert not bad, f"{layer} imports upwards or through the facade: {bad}"


def test_core_never_imports_pyarrow_or_pyspark() -> None:
    for layer in ("serialization", "transport", "business", "admin"):
        for path in (ROOT / layer).glob("*.py"):
            text = path.read_text()
            assert "import pyarrow" not in text, path
            assert "import pyspark" not in text, path


def test_recording_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import sys, rda.pipeline; assert 'pyspark' not in sys.modules; rda.pipeline.History"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
