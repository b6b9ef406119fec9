"""One timer thread with a heap: request deadlines and reconnection attempts of a client.

Every request a client sends gets a deadline (a timed-out request must be abandoned cleanly,
not wait forever). One thread per client service serves all of them from a heap,
rather than one ``threading.Timer`` thread per request.

Cancelling is O(1): the entry is only marked, and skipped when it reaches the top. Replies
usually arrive long before their deadline, so most entries are cancelled ones; when they
outnumber the live ones the heap is rebuilt, which keeps memory proportional to the requests
actually in flight.

Request deadlines take a cheaper road (:meth:`Timer.deadline`): no handle, no callback object
and no cancel. The heap holds the request's key; when the key comes up, ``expire(key)`` runs
if ``live(key)`` still says the request waits, and a reply needs only remove the request from
the client's table. Dead keys are dropped when the heap outgrows twice its live entries. With
64 gets in flight the handle, its ``partial`` and the two locked calls were a tenth of the
client dispatcher's time (py-spy); this is one locked push per request.

The clock is injected. The thread cannot sleep until a fake clock's deadline, so with a clock
that offers ``on_advance`` (``rda.testing.FakeClock``) the due callbacks run right in the
thread that advances it: after ``clock.advance(11)`` a test sees its 10 s timeouts already
fired, with no sleep and no race. ``max_wait`` (None: off) makes the thread re-read the clock
at least that often, for other clocks.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable

from rda.business.driver import current_driver

__all__ = ["Timer", "TimerHandle"]

log = logging.getLogger(__name__)

# The heap is rebuilt from its live entries when it grows past this, or past twice the live
# entries it kept last time.
_PRUNE_MIN = 1024
_heappush = heapq.heappush  # once per request (deadline): a global, not a module attribute


class TimerHandle:
    """A scheduled call; ``cancel()`` is idempotent and thread-safe."""

    __slots__ = ("_timer", "callback", "cancelled", "deadline")

    def __init__(self, timer: Timer, deadline: float, callback: Callable[[], None]) -> None:
        self._timer = timer
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self._timer.cancel(self)


class Timer:
    """Run callbacks at deadlines of ``clock``, on one named daemon thread.

    Callbacks must be short: they run one after another on the timer thread (the client's
    callbacks only fail a future or call ``transport.connect``).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        name: str = "rda-client-timer",
        max_wait: float | None = None,
        expire: Callable[[int], None] | None = None,
        live: Callable[[int], bool] | None = None,
    ) -> None:
        self._clock = clock
        # For deadline(): what to call for a key that is due, and whether a key still waits.
        self._expire = expire
        self._live = live
        self._prune_at = _PRUNE_MIN
        self._max_wait = max_wait
        # call_at and cancel run once per request (user thread and dispatcher): they enter the
        # bare lock, a C-level ``with``, not the Condition's Python-level ``__enter__``.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Entries are (deadline, order, TimerHandle) or (deadline, order, key) (``deadline``).
        self._heap: list[tuple[float, int, TimerHandle | int]] = []
        self._order = itertools.count()
        self._cancelled = 0
        self._closed = False
        self.name = name
        # A simulation's driver runs the due callbacks itself (rda.business.driver).
        self._driver = current_driver()
        self._thread: threading.Thread | None = None
        self._unhook: Callable[[], None] | None = None
        if self._driver is not None:
            self._driver.adopt(self)
            return
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        on_advance = getattr(clock, "on_advance", None)
        if callable(on_advance):
            self._unhook = on_advance(self.run_due)

    def call_at(self, deadline: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(self, deadline, callback)
        with self._lock:
            if self._closed:
                handle.cancelled = True
                return handle
            heap = self._heap
            heapq.heappush(heap, (deadline, next(self._order), handle))
            # Only an entry that became the earliest changes how long the thread sleeps; the
            # usual case (same timeout for every request) never wakes it.
            if heap[0][2] is handle:
                self._cond.notify()
        return handle

    def deadline(self, at: float, key: int) -> None:
        """Call ``expire(key)`` at ``at`` unless ``live(key)`` is False by then (a request
        answered meanwhile): nothing to cancel. Needs ``expire`` and ``live``."""
        # acquire/release, not ``with``: compiled, ``with`` makes two bound methods and calls
        # ``__exit__`` with three arguments, once per request.
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                return
            heap = self._heap
            order = next(self._order)
            _heappush(heap, (at, order, key))
            if heap[0][1] == order:
                self._cond.notify()
            if len(heap) > self._prune_at:
                self._prune()
        finally:
            lock.release()

    def _prune(self) -> None:
        """Rebuild the heap from its live entries (lock held)."""
        self._heap = [entry for entry in self._heap if not self._dead(entry[2])]
        heapq.heapify(self._heap)
        self._cancelled = 0
        self._prune_at = max(_PRUNE_MIN, 2 * len(self._heap))

    def _dead(self, item: TimerHandle | int) -> bool:
        if isinstance(item, TimerHandle):
            return item.cancelled
        live = self._live
        return live is None or not live(item)

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self._clock() + delay, callback)

    def pending(self) -> int:
        """Scheduled calls not yet run nor cancelled."""
        with self._lock:
            return sum(1 for entry in self._heap if not self._dead(entry[2]))

    def cancel(self, handle: TimerHandle) -> None:
        """Cancel ``handle`` (what ``TimerHandle.cancel`` does); idempotent."""
        with self._lock:
            # Under the lock: the thread may be popping this very entry as due.
            if handle.cancelled or self._closed:
                return
            handle.cancelled = True
            self._cancelled += 1
            if self._cancelled > 1024 and self._cancelled * 2 > len(self._heap):
                self._prune()

    def _pop_due(self) -> list[TimerHandle | int]:
        """Remove and return the handles and keys whose deadline has passed (lock held)."""
        heap = self._heap
        now = self._clock()
        due: list[TimerHandle | int] = []
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)[2]
            if not isinstance(item, TimerHandle):
                if not self._dead(item):
                    due.append(item)
            elif item.cancelled:
                self._cancelled -= 1
            else:
                # Marked so that a late cancel() does not count it.
                item.cancelled = True
                due.append(item)
        return due

    def run_due(self) -> None:
        """Run the callbacks that are due now, in this thread (a fake clock's advance)."""
        with self._cond:
            due = [] if self._closed else self._pop_due()
        self._run_all(due)

    def _due(self) -> list[TimerHandle | int] | None:
        """Wait for the earliest deadline; return the due handles and keys, None once closed."""
        with self._cond:
            while not self._closed:
                heap = self._heap
                while heap and self._dead(heap[0][2]):
                    if isinstance(heapq.heappop(heap)[2], TimerHandle):
                        self._cancelled -= 1
                due = self._pop_due()
                if due:
                    return due
                now = self._clock()
                wait = None if not heap else heap[0][0] - now
                if self._max_wait is not None:
                    wait = self._max_wait if wait is None else min(wait, self._max_wait)
                self._cond.wait(wait)
            return None

    def _run(self) -> None:
        while (due := self._due()) is not None:
            self._run_all(due)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread; scheduled calls never run. Idempotent."""
        if self._unhook is not None:
            self._unhook()
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify_all()
        if self._driver is not None:
            self._driver.release(self)
        elif self._thread is not threading.current_thread() and self._thread is not None:
            self._thread.join(timeout)

    # -- driven (rda.business.driver) -------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest live deadline (dead entries on top are dropped first)."""
        with self._lock:
            heap = self._heap
            while heap and self._dead(heap[0][2]):
                if isinstance(heapq.heappop(heap)[2], TimerHandle):
                    self._cancelled -= 1
            return heap[0][0] if heap and not self._closed else None

    def ready(self) -> bool:
        # Read without the lock (a driver's one thread; asked before every step): a dead
        # entry on top may say True, and the step then only drops it.
        heap = self._heap
        return bool(heap) and heap[0][0] <= self._clock() and not self._closed

    def step(self) -> None:
        self.run_due()

    def _run_all(self, due: list[TimerHandle | int]) -> None:
        for item in due:
            try:
                if isinstance(item, TimerHandle):
                    item.callback()
                else:
                    assert self._expire is not None  # _dead() says a key is dead without it
                    self._expire(item)
            except Exception:
                log.exception("timer callback for %r raised", item)
