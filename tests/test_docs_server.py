"""docs/server.md's example of publishing a cycle-specific value runs and prints what it says.

A new user guessed ``publish(..., selector="")`` for subscribers who gave no selector (issue 26,
item 10): the docs now say so, with an example this test runs as written.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

SERVER_MD = Path(__file__).resolve().parent.parent / "docs" / "server.md"
SECTION = "### Cycle-specific values: subscribers with and without a selector"


def test_no_selector_publishing_example_runs_as_written(no_thread_leak: None) -> None:
    text = SERVER_MD.read_text()
    assert SECTION in text, "docs/server.md does not explain publishing without a selector"
    section = text[text.index(SECTION) :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), str(SERVER_MD), "exec"), {"__name__": "server_md"})
    assert out.getvalue().splitlines() == [
        "[('CPS.USER.SFT', 1.5), ('CPS.USER.MD', 2.5)]",
        "1.5 None",
    ]
    # The text after the block states the same output.
    assert "prints `[('CPS.USER.SFT', 1.5), ('CPS.USER.MD', 2.5)]` then `1.5 None`" in section
