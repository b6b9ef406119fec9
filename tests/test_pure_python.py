"""Both implementations of the hot path: ``rda.implementation()`` says which one runs, and the
conformance suite and the golden corpus pass against the pure-Python one too
(``RDA_PURE_PYTHON=1``, in a child pytest: each part chooses when its module is imported).
The compiled one is what the rest of the suite runs against, when the extensions are built."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rda
from rda import _compiled_python

ROOT = Path(__file__).resolve().parent.parent
# The specification, run again without the extensions: the transports' conformance suite
# (in-memory and ZeroMQ), the session cores, the golden corpus, the codec's cases and the
# client's request-table races.
SPECIFICATION = (
    "tests/test_zmq_conformance.py",
    "tests/test_memory_transport.py",
    "tests/test_session_core.py",
    "tests/test_protocol.py",
    "tests/test_binary_codec.py",
    # Its races are provoked by tracing the client's Python opcode by opcode: a typed build
    # (rda/_compiled_python.py: the request table, the lane caller) cannot be traced, so
    # the .py is where they are forced.
    "tests/test_client_requests.py",
    # get_async's future: the concurrent.futures contract, kept by the .py and its build.
    "tests/test_client_future.py",
    # The zero-copy hand-over counts references through the runner's frames when it runs as
    # Python and measures what its compiled build hides: both must send and copy the same.
    "tests/test_zero_copy_replies.py",
)
EXTENSIONS = (
    "rda/serialization/_cbinary",
    "rda/transport/_cframe",
    "rda/transport/_czmq",
)
# The request path's modules compiled from their own .py (rda/_compiled_python.py).
COMPILED_MODULES = tuple(name.replace(".", "/") for name in _compiled_python.MODULES)


def _pure_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RDA_PURE_PYTHON"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _built() -> bool:
    stems = (*EXTENSIONS, *(stem + ".compiled-*" for stem in COMPILED_MODULES))
    return all(any((ROOT / stem).parent.glob(Path(stem).name + ".*.so")) for stem in stems)


def test_the_environment_variable_selects_pure_python() -> None:
    code = (
        "import rda, importlib; i = rda.implementation(); print(i.name, i.pure_python_requested,"
        f" i.python_modules, *(importlib.import_module(m).__file__ for m in {_compiled_python.MODULES!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_pure_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    name, requested, modules, *files = out.stdout.split()
    assert [name, requested, modules] == ["python", "True", "python"]
    # The .py itself ran, not a build of it.
    assert files == [str(ROOT / (stem + ".py")) for stem in COMPILED_MODULES]


@pytest.mark.skipif(not _built(), reason="the extensions are not built in this tree")
def test_the_compiled_path_is_the_default_when_built() -> None:
    if os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("this run asked for pure Python")
    found = rda.implementation()
    expected = ("compiled", "compiled", "compiled", "compiled", False, "compiled")
    assert found == rda.Implementation(*expected)
    for name in _compiled_python.MODULES:
        assert ".compiled-" in str(sys.modules[name].__file__)


def test_a_build_runs_only_while_its_sources_match(tmp_path: Path) -> None:
    """A module edited (or its .pxd) after its build runs from its .py: the build's name
    carries the digest of the sources it was made from, and the finder asks for that name."""
    (tmp_path / "protocol.py").write_bytes(b"X = 1\n")
    (tmp_path / "protocol.pxd").write_bytes(b"cdef int X\n")
    finder = _compiled_python.Finder()
    name = "rda.transport.protocol"
    assert finder.find_spec(name, [str(tmp_path)]) is None  # never built
    digest = _compiled_python.digest_of(str(tmp_path), "protocol")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / f"protocol.compiled-{digest}{suffix}").write_bytes(b"")
    spec = finder.find_spec(name, [str(tmp_path)])
    assert spec is not None and spec.name == name
    assert isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    assert finder.loaded == {name}
    (tmp_path / "protocol.pxd").write_bytes(b"cdef long X\n")  # edited after the build
    assert _compiled_python.Finder().find_spec(name, [str(tmp_path)]) is None
    (tmp_path / "protocol.pxd").write_bytes(b"cdef int X\n")
    (tmp_path / "protocol.py").write_bytes(b"X = 2\n")
    assert _compiled_python.Finder().find_spec(name, [str(tmp_path)]) is None
    # Only the modules it was given: any other module is left to Python's import.
    assert _compiled_python.Finder().find_spec("rda.transport.state", [str(tmp_path)]) is None


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
