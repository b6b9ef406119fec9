"""Who runs the business layer's background work: its own threads, or a simulation's driver.

The background parts of the business layer (:class:`~rda.business.scheduler.GroupTaskScheduler`'s
workers, the client's ``timer.Timer``, the server's ``requests.DeadlineWatcher``) each start
threads of their own. A deterministic simulation (``rda.testing.simulation``) must itself
decide when each piece of background work runs, on one thread, in an order drawn from a
seed, so that a failing run replays exactly. This module is that one seam, and nothing more:

* while a :class:`Driver` is installed (``with driven_by(driver):``, a context variable, so
  only the installing thread is affected), a part made in that context starts no thread: it
  hands itself to the driver (:meth:`Driver.adopt`) as a :class:`Background` and does its
  work only when the driver calls its ``step()``; ``close()`` hands it back
  (:meth:`Driver.release`);
* without a driver (always, in production) nothing changes: the threads start as before and
  the hot paths (``submit``, ``call_at``, ``add``) are the same code.

It is no second runtime: the work a step does is exactly what one loop turn of the part's
own thread does (one task, or the timers that are due), called from the driver's thread.

The wall clock is the seam's second half. Every promise of the business layer (timeouts,
heartbeats, reconnection, deadlines) runs on the monotonic clock a part is given; the wall
clock only stamps: values (``acq_stamp``), "since" and "last heard" times, the window of a
backfill. The business layer reads it as ``driver.wall_time()`` / ``driver.wall_time_ns()``
(module attributes, ``time.time`` and ``time.time_ns`` themselves in production: the same
cost as calling those), so that a simulation can step it (``with wall_clock(...)``, fault
``clock-step``) while the monotonic clock runs on, and check that no promise reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

__all__ = [
    "Background",
    "Driver",
    "current_driver",
    "driven_by",
    "wall_clock",
    "wall_time",
    "wall_time_ns",
]


class Background(Protocol):
    """Background work a driver runs one step at a time, in its own thread."""

    @property
    def name(self) -> str: ...

    def ready(self) -> bool:
        """True when :meth:`step` has something to do now."""
        ...

    def step(self) -> None:
        """Do one unit of work (one task, or the timers due), in the calling thread."""
        ...

    def next_deadline(self) -> float | None:
        """The clock time at which this part will next be ready by itself (None: never)."""
        ...


class Driver(Protocol):
    """Runs adopted background work instead of threads (a deterministic simulation)."""

    def adopt(self, work: Background) -> None: ...

    def release(self, work: Background) -> None: ...


_driver: ContextVar[Driver | None] = ContextVar("rda_business_driver", default=None)


def current_driver() -> Driver | None:
    """The driver installed in this context, or None (production: threads)."""
    return _driver.get()


@contextmanager
def driven_by(driver: Driver) -> Iterator[Driver]:
    """Parts made inside this block are adopted by ``driver`` instead of starting threads."""
    token = _driver.set(driver)
    try:
        yield driver
    finally:
        _driver.reset(token)


#: The wall clock (seconds since the epoch, UTC) the business layer stamps with; called as
#: ``driver.wall_time()`` (never imported by name, so that ``wall_clock`` reaches every caller).
wall_time: Callable[[], float] = time.time
#: The same in nanoseconds (``acq_stamp``).
wall_time_ns: Callable[[], int] = time.time_ns


@contextmanager
def wall_clock(seconds: Callable[[], float], nanoseconds: Callable[[], int]) -> Iterator[None]:
    """Inside the block, the business layer's wall clock is ``seconds``/``nanoseconds``.

    Process-wide, unlike :func:`driven_by`: the wall clock is read on threads a driver does
    not own (a server's dispatcher). A simulation runs one at a time in its process."""
    global wall_time, wall_time_ns
    before = wall_time, wall_time_ns
    wall_time, wall_time_ns = seconds, nanoseconds
    try:
        yield
    finally:
        wall_time, wall_time_ns = before
