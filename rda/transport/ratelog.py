"""Log lines a remote peer can cause, at most one per kind per second.

Anyone who can open a connection can make a server log: a malformed message, a protocol
error, a refused CURVE handshake, a HEARTBEAT from a peer it does not know, a denied request.
One line each let 50,000 bad messages write 50,000 lines (6.9 MB) in 2 s (issue 27): the log
filled the disk and the dispatcher spent its time in I/O. :class:`RateLimitedLog` logs the
first event of a kind at once and only counts the next ones within ``interval`` seconds; the
next line of that kind says how many were not logged (``(4999 more bad messages not
logged)``), and :meth:`flush` writes that summary for a kind that went quiet. Kinds are
chosen by the code (a few fixed strings), never by the peer, so the table stays small.

The counters of the transports and of the server (decode errors, protocol errors, auth
failures, denials) still count every event: the log says that something happens and what it
looks like; the figures are in the statistics. Safe from any thread (one small lock, taken only
when something is logged, i.e. never on the message path of a healthy peer).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LOG_INTERVAL", "RateLimitedLog"]

#: At most one line per kind per this many seconds.
LOG_INTERVAL = 1.0


@dataclass(slots=True)
class _Kind:
    next_at: float  # the first time the next event of this kind is logged again
    suppressed: int = 0  # events since the last line that were not logged


class RateLimitedLog:
    """A logger wrapper: ``log(kind, message, *args)`` writes at most one line per ``kind``
    per ``interval`` seconds of ``clock``; ``kind`` is a plural noun for the summary
    (``"bad messages"``, ``"denials"``)."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = LOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self.logger = logger
        self._interval = interval
        self._clock = clock
        self._level = level
        self._kinds: dict[str, _Kind] = {}
        self._lock = threading.Lock()
        #: Events not logged so far, per kind (never reset: for tests and curious readers).
        self.suppressed_total: dict[str, int] = {}

    def log(
        self,
        kind: str,
        message: str,
        *args: object,
        exc_info: bool = False,
        level: int | None = None,
    ) -> bool:
        """Log ``message % args`` unless a line of ``kind`` went out less than ``interval``
        ago; True when it was logged. The line carries the count of those not logged since.
        ``level`` overrides the instance's level for this kind (keep one level per kind)."""
        now = self._clock()
        with self._lock:
            state = self._kinds.get(kind)
            if state is not None and now < state.next_at:
                state.suppressed += 1
                self.suppressed_total[kind] = self.suppressed_total.get(kind, 0) + 1
                return False
            suppressed = 0 if state is None else state.suppressed
            self._kinds[kind] = _Kind(now + self._interval)
        level = self._level if level is None else level
        if not self.logger.isEnabledFor(level):
            return True
        if suppressed:
            message = f"{message} ({suppressed} more {kind} not logged)"
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def flush(self) -> None:
        """One summary line per kind whose interval is over with events not logged yet: what
        a flood that stopped left unsaid. Called periodically and at close by the owner."""
        now = self._clock()
        lines: list[tuple[str, int]] = []
        with self._lock:
            for kind, state in self._kinds.items():
                if state.suppressed and now >= state.next_at:
                    lines.append((kind, state.suppressed))
                    state.suppressed = 0
        for kind, count in lines:
            self.logger.log(self._level, "%d more %s not logged since the last line", count, kind)
