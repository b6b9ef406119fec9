"""The grouped task scheduler: FIFO per group, groups in parallel (RDA3 paper, Fig. 4).

The server groups tasks by device, the client by subscription, admin tasks have their own
group: so one flooded device cannot delay another, and admin still answers under a flood.

``submit`` sits on the dispatcher's hot path, so it takes one lock, appends to a deque and
wakes at most one worker. The bookkeeping is four structures guarded by that lock:

- ``_groups``: key -> :class:`_Group` for every group that has waiting tasks or a running one;
  a group leaves the dict as soon as it is idle and empty, so memory does not grow with the
  number of distinct keys ever seen;
- ``_ready``: groups that have waiting tasks and no running task, in the order they became
  ready. A group is in ``_ready`` exactly when it is in ``_groups``, not running, and has
  tasks; a worker that finishes a task puts its group back at the end (round-robin), which
  keeps one busy group from starving the others;
- per-group deques of ``(task, on_drop)`` pairs;
- ``_sleepers``: the wake locks of idle workers, a stack. Each worker owns one ``Lock`` that
  it holds while awake; to sleep it pushes the lock and blocks acquiring it again, and
  ``submit`` wakes it with one ``release`` (a C call). A ``Condition`` would cost a Python-level
  ``notify`` and a fresh lock per ``wait`` on both sides of every hand-off. The stack wakes the
  worker that slept last (its memory is the warmest), and a worker that finishes a task takes
  the next ready one without sleeping, so a busy scheduler makes no wake-ups at all.

Overflow (a group already holds ``queue_limit`` waiting tasks) follows the policy: ``reject``
refuses the new task, ``drop_newest`` discards it (calling its ``on_drop``), ``drop_oldest``
evicts the oldest waiting one (calling *its* ``on_drop``) and queues the new one. Tasks that are
dropped never run, so a request's body is never decoded (``Message.data`` is lazy).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from types import TracebackType
from typing import Literal, get_args

from rda.business.driver import current_driver

__all__ = [
    "BUSIEST_GROUPS",
    "GroupTaskScheduler",
    "InlineRule",
    "OverflowPolicy",
    "SchedulerStatistics",
]

log = logging.getLogger(__name__)

OverflowPolicy = Literal["reject", "drop_oldest", "drop_newest"]
OVERFLOW_POLICIES: tuple[str, ...] = get_args(OverflowPolicy)

Task = Callable[[], None]
DropCallback = Callable[[], None] | None


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot of the scheduler's counters (read by the metrics collector).

    ``queued`` and ``running`` are current values, ``groups`` the number of groups with work;
    the rest count since creation. ``rejected`` also counts submissions after ``close``.
    ``max_queue_depth`` is the highest number of waiting tasks any single group ever held;
    ``busiest`` the (group, waiting tasks) of the :data:`BUSIEST_GROUPS` groups with the most
    waiting now, busiest first (groups with nothing waiting left out).
    """

    queued: int
    running: int
    executed: int
    failed: int
    rejected: int
    dropped_oldest: int
    dropped_newest: int
    groups: int
    max_queue_depth: int
    busiest: tuple[tuple[str, int], ...] = ()


#: How many groups ``SchedulerStatistics.busiest`` lists (a bound for the metrics' labels).
BUSIEST_GROUPS = 10


class _Group:
    __slots__ = ("key", "running", "tasks")

    def __init__(self, key: str) -> None:
        self.key = key
        self.tasks: deque[tuple[Task, DropCallback]] = deque()
        self.running = False


class GroupTaskScheduler:
    """Run tasks one at a time and in order per group, groups in parallel on ``workers`` threads.

    ``submit`` returns True when the task was queued, False when it was not (rejected, dropped
    as the newest, or the scheduler is closed). Use it as a context manager or call ``close``.
    """

    def __init__(
        self,
        workers: int = 4,
        queue_limit: int = 1000,
        policy: OverflowPolicy = "reject",
        name: str = "rda-scheduler",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if queue_limit < 1:
            raise ValueError(f"queue_limit must be at least 1, got {queue_limit}")
        if policy not in OVERFLOW_POLICIES:
            raise ValueError(
                f"unknown overflow policy {policy!r}; expected one of {', '.join(OVERFLOW_POLICIES)}"
            )
        self.name = name
        self.queue_limit = queue_limit
        self.policy: OverflowPolicy = policy
        self._lock = threading.Lock()
        # Wake locks of idle workers (see the module docstring); released at most once each.
        self._sleepers: list[threading.Lock] = []
        self._groups: dict[str, _Group] = {}
        self._ready: deque[_Group] = deque()
        self._closed = False
        # Counters, guarded by the lock.
        self._queued = 0
        self._running = 0
        self._executed = 0
        self._failed = 0
        self._rejected = 0
        self._dropped_oldest = 0
        self._dropped_newest = 0
        self._max_depth = 0
        self._places = workers
        # A simulation's driver runs the tasks itself, one ``step`` at a time (driver.py).
        self._driver = current_driver()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers if self._driver is None else 0)
        ]
        for thread in self._threads:
            thread.start()
        if self._driver is not None:
            self._driver.adopt(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<GroupTaskScheduler {self.name!r} {state} workers={len(self._threads)} "
            f"queue_limit={self.queue_limit} policy={self.policy}>"
        )

    # -- the hot path ------------------------------------------------------------------------

    def submit(self, group: str, task: Task, on_drop: DropCallback = None) -> bool:
        """Queue ``task`` in ``group``; see the module docstring for what happens on overflow.

        ``on_drop`` is called (in this thread, after the lock is released) if this task, or the
        oldest task it evicts, is discarded; it is also called for tasks still waiting at
        ``close``. It must not block.
        """
        dropped: DropCallback = None
        with self._lock:
            if self._closed:
                self._rejected += 1
                return False
            entry = self._groups.get(group)
            if entry is None:
                # A group absent from the dict is idle and empty: it becomes ready now.
                entry = _Group(group)
                self._groups[group] = entry
                entry.tasks.append((task, on_drop))
                self._ready.append(entry)
                self._queued += 1
                if self._max_depth == 0:
                    self._max_depth = 1
                # Wake one idle worker; when all are busy, one of them finds the group next.
                if self._sleepers:
                    self._sleepers.pop().release()
                return True
            tasks = entry.tasks
            if len(tasks) < self.queue_limit:
                tasks.append((task, on_drop))
                self._queued += 1
                if len(tasks) > self._max_depth:
                    self._max_depth = len(tasks)
                # The group is already either in ``_ready`` or running: no wake-up needed.
                return True
            if self.policy == "reject":
                self._rejected += 1
                return False
            if self.policy == "drop_newest":
                self._dropped_newest += 1
                accepted = False
                dropped = on_drop
            else:
                _, dropped = tasks.popleft()
                tasks.append((task, on_drop))
                self._dropped_oldest += 1
                accepted = True
        if dropped is not None:
            _call_on_drop(dropped, group)
        return accepted

    def run_inline(self, group: str, task: Task) -> bool:
        """Run ``task`` now, in the calling thread, if ``group`` is idle; False (nothing run)
        when the group has a task queued or running, when ``workers`` tasks run already, or
        when the scheduler is closed.

        The dispatcher's fast path: no worker wake-up and no hand-off back. While the task
        runs the group counts as running, so a task submitted meanwhile queues behind it
        (per-group FIFO holds) and is taken by a worker after it; and it takes one of the
        ``workers`` places, so that no more than ``workers`` tasks ever run at once (a long
        inline task keeps its place until it returns, while a standby thread dispatches).
        """
        with self._lock:
            if self._closed or group in self._groups or self._running >= self._places:
                return False
            entry = _Group(group)
            entry.running = True
            self._groups[group] = entry
            self._running += 1
        ok = False
        try:
            task()
            ok = True
        except Exception:
            log.exception("%s: inline task in group %r raised", self.name, group)
        finally:
            with self._lock:
                self._finish(entry, ok)
                # Tasks that arrived while it ran made the group ready, or a worker waited
                # for its place: a worker must run them.
                if self._ready and self._sleepers:
                    self._sleepers.pop().release()
        return True

    # -- workers -----------------------------------------------------------------------------

    def _work(self) -> None:
        lock = self._lock
        wake = threading.Lock()
        wake.acquire()  # held while awake; sleeping = blocking on acquiring it again
        group: _Group | None = None
        ok = True
        while True:
            with lock:
                if group is not None:
                    # Finishing one task and taking the next share one lock acquisition.
                    self._finish(group, ok)
                # Waits also while every place is taken (inline tasks count: run_inline).
                while not self._ready or self._running >= self._places:
                    if self._closed:
                        return
                    self._sleepers.append(wake)
                    lock.release()
                    try:
                        # Whoever popped our lock released it (submit or close): returns at once
                        # if that happened before we got here.
                        wake.acquire()
                    finally:
                        lock.acquire()
                group = self._ready.popleft()
                task, _ = group.tasks.popleft()
                group.running = True
                self._queued -= 1
                self._running += 1
            try:
                task()
                ok = True
            except Exception:
                log.exception("%s: task in group %r raised", self.name, group.key)
                ok = False
            except BaseException:
                # SystemExit/KeyboardInterrupt end this worker; keep the group usable.
                with lock:
                    self._finish(group, False)
                raise

    # -- driven (rda.business.driver): what one worker turn does, in the driver's thread --------

    def ready(self) -> bool:
        """A task waits and a worker's place is free."""
        with self._lock:
            return bool(self._ready) and self._running < self._places and not self._closed

    def step(self) -> None:
        """Run the next ready task in the calling thread, as one worker would."""
        with self._lock:
            if not self._ready or self._running >= self._places or self._closed:
                return
            group = self._ready.popleft()
            task, _ = group.tasks.popleft()
            group.running = True
            self._queued -= 1
            self._running += 1
        ok = True
        try:
            task()
        except Exception:
            log.exception("%s: task in group %r raised", self.name, group.key)
            ok = False
        finally:
            with self._lock:
                self._finish(group, ok)

    def next_deadline(self) -> float | None:
        return None  # ready only when a task is submitted

    def _finish(self, group: _Group, ok: bool) -> None:
        """Bookkeeping after a task ran; the caller holds the lock."""
        self._running -= 1
        if ok:
            self._executed += 1
        else:
            self._failed += 1
        group.running = False
        if group.tasks:
            self._ready.append(group)
        else:
            del self._groups[group.key]

    # -- inspection and shutdown -------------------------------------------------------------

    def statistics(self) -> SchedulerStatistics:
        with self._lock:
            return SchedulerStatistics(
                queued=self._queued,
                running=self._running,
                executed=self._executed,
                failed=self._failed,
                rejected=self._rejected,
                dropped_oldest=self._dropped_oldest,
                dropped_newest=self._dropped_newest,
                groups=len(self._groups),
                max_queue_depth=self._max_depth,
                busiest=tuple(
                    heapq.nlargest(
                        BUSIEST_GROUPS,
                        ((g.key, len(g.tasks)) for g in self._groups.values() if g.tasks),
                        key=lambda item: item[1],
                    )
                ),
            )

    def queue_depth(self, group: str) -> int:
        """Number of tasks of ``group`` waiting to run (not counting a running one)."""
        with self._lock:
            entry = self._groups.get(group)
            return 0 if entry is None else len(entry.tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting tasks, discard waiting ones, let running ones finish, join workers.

        Idempotent. Waiting tasks never run; their ``on_drop`` is called here. Waits at most
        ``timeout`` seconds in total for the workers; a task still running after that is left
        to finish on its (daemon) thread and logged.
        """
        with self._lock:
            self._closed = True
            discarded: list[tuple[str, DropCallback]] = []
            for group in self._groups.values():
                discarded.extend((group.key, on_drop) for _, on_drop in group.tasks)
                group.tasks.clear()
            self._ready.clear()
            # Running groups stay until their worker finishes them; the rest are gone.
            self._groups = {k: g for k, g in self._groups.items() if g.running}
            self._queued = 0
            # Every sleeping worker wakes, sees ``_closed`` and ends.
            while self._sleepers:
                self._sleepers.pop().release()
        for key, on_drop in discarded:
            if on_drop is not None:
                _call_on_drop(on_drop, key)
        if self._driver is not None:
            self._driver.release(self)
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        for thread in self._threads:
            if thread is current:
                # close() called from one of our own tasks: that worker exits after the task.
                continue
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive() and t is not current]
        if alive:
            log.warning(
                "%s: close() gave up after %.1f s; still running a task: %s",
                self.name,
                timeout,
                ", ".join(alive),
            )

    def __enter__(self) -> GroupTaskScheduler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _call_on_drop(on_drop: Callable[[], None], group: str) -> None:
    # on_drop runs on the submitter's thread (often the dispatcher): it must never take it down.
    try:
        on_drop()
    except Exception:
        log.exception("on_drop callback of a task in group %r raised", group)


class InlineRule:
    """Which gets and sets a server runs on its dispatcher when their device group is idle
    (``GroupTaskScheduler.run_inline``): by default all of them (optimistic: a handler that
    takes long is left to finish on its thread while a standby thread takes over the
    dispatching, ``rda.transport.relay``), none with ``everything=False`` except those whose
    ``device/property`` matches one of ``patterns`` (glob), and never those that match one of
    ``blocking`` (``ServerBuilder.blocking_properties``, ``Device`` properties declared
    ``blocking=True``): those always run on a worker.
    """

    __slots__ = ("_blocking", "_cache", "_patterns", "everything")

    # Verdicts remembered per (device, property): a bounded cache, since clients choose names.
    CACHE_LIMIT = 4096

    def __init__(
        self, everything: bool = True, patterns: Iterable[str] = (), blocking: Iterable[str] = ()
    ) -> None:
        self.everything = everything
        self._patterns: tuple[tuple[str, str], ...] = tuple(
            _split_pattern(pattern) for pattern in patterns
        )
        self._blocking: tuple[tuple[str, str], ...] = tuple(
            _split_pattern(pattern) for pattern in blocking
        )
        self._cache: dict[tuple[str, str], bool] = {}

    def __bool__(self) -> bool:
        return self.everything or bool(self._patterns)

    def allows(self, device: str, prop: str) -> bool:
        if self.everything and not self._blocking:
            return True
        key = (device, prop)
        verdict = self._cache.get(key)
        if verdict is None:
            verdict = not _matches(self._blocking, device, prop) and (
                self.everything or _matches(self._patterns, device, prop)
            )
            if len(self._cache) < self.CACHE_LIMIT:
                self._cache[key] = verdict
        return verdict

    def declared_only(self) -> InlineRule:
        """This rule without the optimism: only the properties named non-blocking (for a
        transport that cannot hand a long handler over)."""
        rule = InlineRule(False)
        rule._patterns, rule._blocking = self._patterns, self._blocking
        return rule

    def describe(self) -> bool | list[str]:
        """For the server's settings: True/False, or the patterns."""
        if self.everything or not self._patterns:
            return self.everything
        return [f"{d}/{p}" for d, p in self._patterns]

    def describe_blocking(self) -> list[str]:
        """For the server's settings: the patterns that always run on a worker."""
        return [f"{d}/{p}" for d, p in self._blocking]


def _matches(patterns: tuple[tuple[str, str], ...], device: str, prop: str) -> bool:
    return any(fnmatchcase(device, d) and fnmatchcase(prop, p) for d, p in patterns)


def _split_pattern(pattern: str) -> tuple[str, str]:
    device, sep, prop = pattern.partition("/")
    if not sep or not device or not prop:
        raise ValueError(
            f"inline property pattern {pattern!r} is not DEVICE/PROPERTY (globs allowed, "
            "e.g. 'PS*/Acquisition')"
        )
    return device, prop
