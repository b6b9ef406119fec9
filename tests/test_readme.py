"""The README's Python example runs as written (against this machine's per-test directory)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs_and_prints_what_it_says(no_thread_leak: None) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README has no python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme"})
    assert out.getvalue().splitlines() == ["Data(current: float64 = 2.5)", "FIRST"]
