"""``rda.transport.ratelog.RateLimitedLog``: one line per kind per interval (issue 27, 2)."""

from __future__ import annotations

import logging

import pytest

from rda.testing import FakeClock
from rda.transport.ratelog import RateLimitedLog


def test_rate_limited_log_one_line_per_kind_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limited = RateLimitedLog(logging.getLogger("rda.test.ratelog"), 1.0, clock)
    with caplog.at_level(logging.WARNING, logger="rda.test.ratelog"):
        assert limited.log("bad messages", "bad %d", 1)
        assert not any(limited.log("bad messages", "bad %d", n) for n in range(2, 1001))
        assert limited.log("denials", "denied %s", "x")  # another kind has its own budget
        limited.flush()  # the interval is not over: nothing to summarise yet
        clock.advance(1.0)
        assert limited.log("bad messages", "bad %d", 1001)
        limited.log("bad messages", "bad %d", 1002)
        clock.advance(1.0)
        limited.flush()  # the flood stopped: its count is said once
        limited.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "bad 1",
        "denied x",
        "bad 1001 (999 more bad messages not logged)",
        "1 more bad messages not logged since the last line",
    ]
    assert limited.suppressed_total == {"bad messages": 1000}
