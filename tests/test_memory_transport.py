"""The in-memory transports: the conformance suite, plus what needs a fake clock or faults."""

from __future__ import annotations

import pytest

from rda.testing import CONFORMANCE_CHECKS, check_transport, memory_pair


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS)
def test_conformance(check: str) -> None:
    check_transport(memory_pair, only=[check])
