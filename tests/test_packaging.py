"""``python -m build`` from a fresh clone: the sdist, then the wheel built from that sdist;
then that wheel installed into a fresh venv and used where no compiler can be found.

The sdist must carry the Cython sources (the wheel step compiles them) and no generated C;
the wheel must carry the compiled extensions, ``py.typed`` and every module of ``rda``, and no
generated C either. The build runs on a copy of the files git knows (tracked, and new ones not
ignored), so build products in the working tree (``*.so``, ``*.c``, ``build/``) cannot leak
in. It runs without build isolation: the installed setuptools, Cython and numpy build it, so
the test needs no network.

The install (what a user without a C toolchain does, issue 38): a new venv, the wheel
installed into it with pip (no index, no dependencies: rda's dependencies are read from this
venv's site-packages through a ``.pth`` line, which adds the folder but runs none of its own
``.pth`` files, so the checkout's editable install stays out). Then, with a ``PATH`` that holds
only ``bash`` and the new venv's ``bin`` (no ``cc``, ``gcc`` or ``clang``) and no
``PYTHONPATH``, ``rda`` imports from the new venv and runs compiled, and the tutorial's test
(``tests/test_tutorial.py``: the walkthrough and the offline tests) passes against it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from rda import _compiled_python

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = ("rda/serialization/_cbinary", "rda/transport/_cframe", "rda/transport/_czmq")
# The request path's modules compiled from their .py, typed by the .pxd beside each
# (rda/_compiled_python.py): the wheel needs the .pxd too, the build's name is its digest.
TYPED_MODULES = tuple(name.replace(".", "/") for name in _compiled_python.MODULES)

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
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The fresh copy of the project, and the sdist and the wheel ``python -m build`` made
    from it."""
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
    return project, sdist, wheel


@pytest.fixture(scope="module")
def archives(built: tuple[Path, Path, Path]) -> tuple[list[str], list[str]]:
    """The member names of the sdist and of the wheel."""
    _, sdist, wheel = built
    with tarfile.open(sdist) as tar:
        # Names without the leading "rda-<version>/" folder, as in the repository.
        sdist_names = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
    with zipfile.ZipFile(wheel) as whl:
        wheel_names = whl.namelist()
    return sdist_names, wheel_names


COMPILERS = ("cc", "gcc", "clang", "c++", "g++")


@pytest.fixture(scope="module")
def installed(
    built: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """A new venv with the wheel installed, and the environment to run it in: no
    ``PYTHONPATH``, and a ``PATH`` of the venv's ``bin`` and a folder holding only ``bash``."""
    _, _, wheel = built
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RDA_PURE_PYTHON")}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--no-compile", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    ).stdout.strip()
    # rda's dependencies, from this venv (appended after the new venv's own site-packages).
    Path(purelib, "rda_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # The tutorial's section 8 runs `pytest`: a launcher in the new venv, as pip would make.
    launcher = venv / "bin" / "pytest"
    launcher.write_text(f"#!{python}\nimport sys\n\nimport pytest\n\nsys.exit(pytest.main())\n")
    launcher.chmod(0o755)
    tools = tmp_path_factory.mktemp("tools")
    bash = shutil.which("bash")
    assert bash is not None
    (tools / "bash").symlink_to(bash)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{tools}"
    return venv, env


@pytest.mark.timeout(600)
def test_sdist_carries_the_cython_sources_and_no_generated_c(
    archives: tuple[list[str], list[str]],
) -> None:
    sdist, _ = archives
    for ext in EXTENSIONS:
        assert f"{ext}.pyx" in sdist
    for module in TYPED_MODULES:
        assert f"{module}.py" in sdist and f"{module}.pxd" in sdist
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
    for module in TYPED_MODULES:
        compiled = [n for n in wheel if n.startswith(module + ".compiled-") and n.endswith(".so")]
        assert len(compiled) == 1, (module, compiled)
        assert f"{module}.pxd" in wheel
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


@pytest.mark.timeout(600)
def test_the_wheel_runs_compiled_where_no_compiler_is_found(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = installed
    assert [c for c in COMPILERS if shutil.which(c, path=env["PATH"])] == []
    code = "import rda; print(rda.__file__); print(rda.implementation().name)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-P", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    location, implementation = out.stdout.split()
    assert Path(location).is_relative_to(venv) and implementation == "compiled"


@pytest.mark.timeout(600)
def test_the_tutorial_runs_against_the_installed_wheel(
    built: tuple[Path, Path, Path], installed: tuple[Path, dict[str, str]]
) -> None:
    project, _, _ = built
    venv, env = installed
    # -P: the copy's own rda/ (the current folder) is never on the path, only the venv's.
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_tutorial.py", "-k", "walkthrough or offline"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout
