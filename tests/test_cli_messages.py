"""What a new user of the ``rda`` command hit (issue 37, "What a new user hit"): an error in
their own server module, option placement, messages that named the wrong thing, not-found
errors that did not help, backfilled lines stamped with the receipt time.

Each test's docstring quotes the issue's evidence and says how it was checked to fail on main
(the test run against main's code, or before the fix in this branch).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rda.admin.cli.options import ExitCode


def run_rda(*args: str, cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``rda ARGS`` as a process (the exit code and stderr a user sees)."""
    return subprocess.run(
        [sys.executable, "-m", "rda._cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- 13: an error in the user's server module --------------------------------------------------

BAD_MODULES = {
    "bad_syntax": ("import rda\n\ndef build(:\n    pass\n", "SyntaxError: invalid syntax", 3),
    "bad_name": (
        "import rda\n\n\ndef helper():\n    return Missing()\n\n\ndef build():\n"
        "    return helper()\n",
        "NameError: name 'Missing' is not defined",
        5,
    ),
}


@pytest.mark.parametrize("module", sorted(BAD_MODULES))
def test_an_error_in_the_users_module_shows_their_frames_and_exits_2(
    tmp_path: Path, module: str
) -> None:
    """Issue 37, item 13: ``rda serve bad_server:build`` with a SyntaxError, or a NameError in
    ``build()``, printed a 38-45 line traceback through click, rda and importlib and exited 1
    (checked against main: PYTHONPATH=/work/main, exit 1, "Traceback" and importlib frames),
    while docs/cli.md promises exit 2 and never a traceback. Now: one ``rda:`` line naming the
    error, then the user's own frames (file, line, the code), exit 2."""
    source, error, line = BAD_MODULES[module]
    (tmp_path / f"{module}.py").write_text(source)
    done = run_rda("serve", f"{module}:build", cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("rda: error in your code (") and lines[0].endswith(error)
    assert f'File "{tmp_path / module}.py", line {line}' in done.stderr
    assert "Traceback" not in done.stderr and "importlib" not in done.stderr
    assert "/rda/" not in done.stderr.replace(str(tmp_path), "")  # none of rda's frames
    assert len(lines) <= 8, done.stderr


def test_a_missing_module_is_still_one_line(tmp_path: Path) -> None:
    done = run_rda("serve", "no_such_module_here:build", cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE
    assert (
        done.stderr == "rda: cannot import 'no_such_module_here': No module named "
        "'no_such_module_here'\n"
    )
