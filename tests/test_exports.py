"""The public face is curated (the layer rules are checked in tests/test_layout.py)."""

from __future__ import annotations

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


def test_core_never_imports_pyarrow_or_pyspark() -> None:
    checked = 0
    for layer in ("serialization", "transport", "business", "admin"):
        for path in (ROOT / "rda" / layer).rglob("*.py"):
            checked += 1
            text = path.read_text()
            assert "import pyarrow" not in text, path
            assert "import pyspark" not in text, path
    assert checked > 50  # the layers were found where they are


def test_recording_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import sys, rda.pipeline; assert 'pyspark' not in sys.modules; rda.pipeline.History"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
