"""The test suite's own settings (issue 26): nothing may depend on wall-clock speed."""

from __future__ import annotations

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
