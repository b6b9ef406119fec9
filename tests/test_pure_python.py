"""Both implementations of the hot path: ``rda.implementation()`` says which one runs, and the
conformance suite and the golden corpus pass against the pure-Python one too
(``RDA_PURE_PYTHON=1``, in a child pytest: each part chooses when its module is imported).
The compiled one is what the rest of the suite runs against, when the extensions are built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rda

ROOT = Path(__file__).resolve().parent.parent
# The specification, run again without the extensions: the transports' conformance suite
# (in-memory and ZeroMQ), the session cores, the golden corpus and the codec's cases.
SPECIFICATION = (
    "tests/test_zmq_conformance.py",
    "tests/test_memory_transport.py",
    "tests/test_session_core.py",
    "tests/test_protocol.py",
    "tests/test_binary_codec.py",
)
EXTENSIONS = (
    "rda/serialization/_cbinary",
    "rda/transport/_cframe",
    "rda/transport/_czmq",
)


def _pure_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RDA_PURE_PYTHON"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _built() -> bool:
    return all(any((ROOT / stem).parent.glob(Path(stem).name + ".*.so")) for stem in EXTENSIONS)


def test_the_environment_variable_selects_pure_python() -> None:
    code = "import rda; i = rda.implementation(); print(i.name, i.pure_python_requested)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_pure_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["python", "True"]


@pytest.mark.skipif(not _built(), reason="the extensions are not built in this tree")
def test_the_compiled_path_is_the_default_when_built() -> None:
    if os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("this run asked for pure Python")
    found = rda.implementation()
    assert found == rda.Implementation("compiled", "compiled", "compiled", "compiled", False)


@pytest.mark.timeout(300)
def test_the_specification_passes_on_the_pure_python_path() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SPECIFICATION],
        cwd=ROOT,
        env=_pure_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout
