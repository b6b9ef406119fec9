"""The hand-off from user and worker threads to a transport's dispatcher: a mailbox.

As libzmq's own pipes (lock-free, a signal only when the reader sleeps): a producer appends a
Python object to a ``deque`` and writes one byte-sized signal on an ``eventfd`` (a pipe where
there is none) ONLY when the dispatcher said it is about to sleep. The dispatcher's poll set
watches that descriptor beside its ZeroMQ sockets. Compared with the inproc PUSH/PULL pipe this
replaces, a hand-off under load costs no ZeroMQ message, no GIL-releasing pyzmq call and no
system call at all; an idle dispatcher costs one ``write`` to wake.

Back-pressure is the pipe's: the mailbox holds at most ``capacity`` messages (the transports
pass ``2 * send_hwm``, what a PUSH and a PULL with that high-water mark held together) and a
producer blocks while it is full, waking every ``PUT_TIMEOUT`` to notice a close.

Ordering argument for the sleep flag (all under the GIL, so each step is atomic and seen in
program order by the other thread): the dispatcher sets ``sleeping`` and THEN looks at the
queue; a producer appends and THEN looks at ``sleeping``. Either the dispatcher sees the new
item (and does not sleep) or the producer sees the flag (and signals): no lost wake-up.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import Any

__all__ = ["PUT_TIMEOUT", "Mailbox", "Wakeup"]

# A producer blocked on a full mailbox wakes this often to notice that the transport was closed.
PUT_TIMEOUT = 0.05

_ONE = (1).to_bytes(8, "little")


def _signal_fds(blocking: bool = False) -> tuple[int, int]:
    """(read end, write end): one eventfd for both where the platform has it."""
    eventfd = getattr(os, "eventfd", None)
    if eventfd is not None:
        fd: int = eventfd(0, os.EFD_CLOEXEC if blocking else os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    r, w = os.pipe()
    if not blocking:
        os.set_blocking(r, False)
        os.set_blocking(w, False)
    return r, w


class Mailbox:
    """A bounded multi-producer, single-consumer queue of Python objects with a wake-up fd.

    Producers (any thread): :meth:`put`, :meth:`wake`, :meth:`mark_closed`. The consumer (the
    dispatcher, the only thread that may): ``items.popleft()``, then :meth:`taken` after a
    batch; ``sleeping`` around its poll, :meth:`clear_signal` when ``fd`` fired; :meth:`close`
    on its way out. Items are handed over as they are: a producer must not modify a buffer
    after handing it over.
    """

    def __init__(self, capacity: int) -> None:
        self.items: deque[Any] = deque()
        self.capacity = max(1, capacity)
        # True while the dispatcher is in (or about to enter) its poll: only then is a put
        # worth a system call.
        self.sleeping = False
        self.signals = 0  # wake-ups written, for the structural counts of the benchmarks
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._waiting = 0  # producers blocked on a full mailbox
        self._closed = False  # no more puts
        self._fds_closed = False
        self._rfd, self._wfd = _signal_fds()

    @property
    def fd(self) -> int:
        """The descriptor that becomes readable when a sleeping dispatcher must wake."""
        return self._rfd

    def put(self, item: Any, wait: bool = True) -> bool:
        """Hand ``item`` over; blocks while the mailbox is full. False once it is closed.

        With ``wait=False`` the item goes in even over ``capacity``: for a producer that holds
        a lock the dispatcher may need (a notification's ordering lock), which paced itself
        with :meth:`wait_for_room` before taking it."""
        with self._lock:
            if self._closed:
                return False
            items = self.items
            if wait and len(items) >= self.capacity and not self._wait_for_room_locked():
                return False
            items.append(item)
            if self.sleeping:
                # Under the lock: ``close`` takes it too, so the fd cannot be closed (and its
                # number reused by another file) between this check and the write.
                self.sleeping = False
                self._write_signal()
        return True

    def wait_for_room(self) -> bool:
        """Block while the mailbox is full, without handing anything over; False once closed."""
        if len(self.items) < self.capacity:
            return not self._closed
        with self._lock:
            return self._wait_for_room_locked()

    def _wait_for_room_locked(self) -> bool:
        items = self.items
        self._waiting += 1
        try:
            while len(items) >= self.capacity:
                self._not_full.wait(PUT_TIMEOUT)
                if self._closed:
                    return False
        finally:
            self._waiting -= 1
        return not self._closed

    def taken(self) -> None:
        """The dispatcher took items: release producers blocked on a full mailbox.

        A producer counts itself in ``_waiting`` under the lock before it checks the length,
        so a count of 0 read here means it will see the room when it looks.
        """
        if self._waiting:
            with self._lock:
                self._not_full.notify_all()

    def wake(self, timeout: float) -> bool:
        """Wake the dispatcher whether it sleeps or not (close); waits at most ``timeout``."""
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            return False
        try:
            if self._fds_closed:
                return False
            self._write_signal()
            return True
        finally:
            self._lock.release()

    def clear_signal(self) -> None:
        """Consume the pending wake-up (the dispatcher, after ``fd`` fired)."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self._rfd, 4096)

    def mark_closed(self) -> None:
        """Make blocked and future ``put`` calls return False (lock-free: a flag)."""
        self._closed = True

    def close(self) -> None:
        """Refuse further puts and close the descriptors (the dispatcher, last)."""
        self._closed = True
        with self._lock:
            if self._fds_closed:
                return
            self._fds_closed = True
            self._not_full.notify_all()
            os.close(self._rfd)
            if self._wfd != self._rfd:
                os.close(self._wfd)
        self.items.clear()

    def _write_signal(self) -> None:
        self.signals += 1
        # Full (a pipe) or counter at its maximum (an eventfd): a wake-up is pending anyway.
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.write(self._wfd, _ONE)


class Wakeup:
    """A thread's reusable wake-up: :meth:`wait` blocks until some thread calls :meth:`set`.

    A blocking ``get`` waits on its own thread's wake-up (:meth:`of_thread`: one eventfd, or a
    pipe, per thread that ever waited, closed when that thread ends). The point is *how* it
    is set: ``os.write`` releases the GIL before it makes the system call that wakes the
    waiter, so the woken thread finds the GIL free. A ``Lock.release`` wakes it while the
    setter still holds the GIL, and a waiter woken on the setter's CPU, or faster than the
    setter gets to its next blocking call, has to sleep again until the GIL is free (about
    one context switch more per get in each thread, measured by benchmarks/rpc.py).

    A set that finds no waiter stays pending and ends the next wait early, so a waiter loops
    until what it waits for is there (``ReplyWaiter.result``).
    """

    __slots__ = ("__weakref__", "_r", "_w")

    _local = threading.local()

    def __init__(self) -> None:
        self._r, self._w = _signal_fds(blocking=True)

    @classmethod
    def of_thread(cls) -> Wakeup:
        """The calling thread's wake-up (made on first use)."""
        wakeup: Wakeup | None = getattr(cls._local, "wakeup", None)
        if wakeup is None:
            wakeup = cls._local.wakeup = cls()
        return wakeup

    def set(self) -> None:
        """Wake the waiter (or end its next wait at once). Any thread."""
        with contextlib.suppress(OSError):  # closed by a fork, or counter full: nothing to do
            os.write(self._w, _ONE)

    def wait(self) -> None:
        """Block until :meth:`set` (the owning thread only)."""
        os.read(self._r, 4096)

    def close(self) -> None:
        r, w = self._r, self._w
        self._r = self._w = -1
        if r >= 0:
            with contextlib.suppress(OSError):
                os.close(r)
        if w >= 0 and w != r:
            with contextlib.suppress(OSError):
                os.close(w)

    def __del__(self) -> None:
        self.close()

    @classmethod
    def forget_all(cls) -> None:
        """Every thread gets a new wake-up on its next wait (run in a forked child: it must
        not share its parent's descriptors, where a set in one process could be consumed by a
        wait in the other; the child's copies close with the old objects)."""
        cls._local = threading.local()


os.register_at_fork(after_in_child=Wakeup.forget_all)
