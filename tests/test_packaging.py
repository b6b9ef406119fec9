"""``python -m build`` from a fresh clone: the sdist, then the wheel built from that sdist.

The sdist must carry the Cython sources (the wheel step compiles them) and no generated C;
the wheel must carry the compiled extensions, ``py.typed`` and every module of ``rda``, and no
generated C either. The build runs on a copy of the files git knows (tracked, and new ones not
ignored), so build products in the working tree (``*.so``, ``*.c``, ``build/``) cannot leak
in. It runs without build isolation: the installed setuptools, Cython and numpy build it, so
the test needs no network.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = ("rda/serialization/_cbinary", "rda/transport/_cframe", "rda/transport/_czmq")

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs a git checkout to copy the project's files",
)


def _fresh_copy(dest: Path) -> Path:
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, listing.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not part of it
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    """The member names of the sdist and of the wheel that ``python -m build`` made."""
    project = _fresh_copy(tmp_path_factory.mktemp("clone"))
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (sdist,) = out.glob("rda-*.tar.gz")
    (wheel,) = out.glob("rda-*.whl")
    with tarfile.open(sdist) as tar:
        # Names without the leading "rda-<version>/" folder, as in the repository.
        sdist_names = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
    with zipfile.ZipFile(wheel) as whl:
        wheel_names = whl.namelist()
    return sdist_names, wheel_names


@pytest.mark.timeout(600)
def test_sdist_carries_the_cython_sources_and_no_generated_c(
    archives: tuple[list[str], list[str]],
) -> None:
    sdist, _ = archives
    for ext in EXTENSIONS:
        assert f"{ext}.pyx" in sdist
    assert [n for n in sdist if n.endswith((".c", ".so"))] == []
    assert "setup.py" in sdist and "pyproject.toml" in sdist and "MANIFEST.in" in sdist


@pytest.mark.timeout(600)
def test_wheel_carries_the_extensions_and_every_module_and_no_c(
    archives: tuple[list[str], list[str]],
) -> None:
    _, wheel = archives
    assert [n for n in wheel if n.endswith((".c", ".pyx"))] == []
    for ext in EXTENSIONS:
        compiled = [n for n in wheel if n.startswith(ext + ".") and n.endswith(".so")]
        assert len(compiled) == 1, (ext, compiled)
        assert f"{ext}.pyi" in wheel
    assert "rda/py.typed" in wheel
    modules = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "rda").rglob("*.py")
        if "__pycache__" not in path.parts
    )
    assert len(modules) > 50  # the walk found the package, not an empty folder
    assert [m for m in modules if m not in wheel] == []
    assert "rda/panel/static/index.html" in wheel
    # Nothing outside the package: no tests, benchmarks or examples in site-packages.
    tops = {n.split("/", 1)[0] for n in wheel}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"rda"}
