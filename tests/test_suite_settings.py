"""The test suite's own settings (issue 26): nothing may depend on wall-clock speed; one
bounded wait for everything (issue 32); tests/README.md's index names every test file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st


def test_property_tests_have_no_deadline() -> None:
    # Hypothesis' default 200 ms per example failed make test on a loaded 2-core machine.
    default = settings.default
    assert default is not None and default.deadline is None


@settings(max_examples=5)
@given(st.integers())
def test_a_test_with_its_own_settings_keeps_the_suite_deadline(value: int) -> None:
    # @settings(...) without a deadline inherits the profile's: none.
    assert settings().deadline is None


TESTS = Path(__file__).resolve().parent
# What a test file's own wait helper was called before rda.testing.wait_until replaced them.
OWN_WAIT = re.compile(r"_?(wait|wait_for|wait_until|until|eventually|poll_until)")


def test_the_index_names_every_test_file() -> None:
    listed = set(re.findall(r"`(test_\w+\.py)`", (TESTS / "README.md").read_text()))
    files = {path.name for path in TESTS.glob("test_*.py")}
    assert not files - listed, f"tests/README.md's index does not name {sorted(files - listed)}"
    assert not listed - files, f"tests/README.md names missing files {sorted(listed - files)}"


def test_waits_are_rda_testing_wait_until_not_loops_of_their_own() -> None:
    own: list[str] = []
    for path in sorted(TESTS.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and OWN_WAIT.fullmatch(node.name):
                own.append(f"{path.name}:{node.lineno} def {node.name}")
        for loop in ast.walk(tree):
            # A deadline polled with sleeps: `while ...: ... monotonic() ... sleep(...)`.
            if isinstance(loop, ast.While):
                names = {n.attr for n in ast.walk(loop) if isinstance(n, ast.Attribute)}
                if {"monotonic", "sleep"} <= names:
                    own.append(f"{path.name}:{loop.lineno} a sleep loop on a deadline")
    assert not own, f"use rda.testing.wait_until instead: {own}"
