"""Leader/followers for the server's dispatcher: one dispatcher at a time, never stuck in a handler.

The server runs a get or set handler on the thread that received the request (no hand-off to
a worker: the cheapest path, as PyTango's omniORB does). A handler may block, though, and
then the server would stop receiving, heartbeats and admin requests included. So a *standby*
thread watches: when the dispatcher has been inside the business layer (``begin`` ..
``end``) for longer than ``handover_after``, the standby takes the lead, that is becomes the
thread that owns the ROUTER, its monitor and the mailbox, and runs the dispatcher loop. The
thread that ran the long handler finishes it, notices at ``end`` that it lost the lead, leaves
the dispatcher loop without touching any socket, and becomes the standby (or ends, when there
is one already).

Ownership stays single: ``leader`` (a thread id) names the one thread that may touch the
transport's sockets; it changes only under ``lock``, and only while the leader is inside the
business layer (``busy``), where every socket operation it makes (``send``, ``publish``,
``disconnect`` from a handler) takes ``lock`` and checks that it still leads. The lock also
orders the hand-over in memory, as ZeroMQ requires for a socket that changes threads.

The standby costs nothing while the server is idle: it ticks every ``handover_after / 2``
while requests arrive and parks on an event after ``_PARK_TICKS`` quiet ticks; the next
``begin`` wakes it (one system call after an idle period, none under load).

Threads: at most one leader and one standby, plus the threads still finishing long handlers;
those are bounded by the scheduler, which runs a handler inline only while fewer than
``workers`` handlers run (``GroupTaskScheduler.run_inline``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Relay"]

log = logging.getLogger("rda.transport.server")

# Quiet ticks (no request began) before the standby parks until the next request.
_PARK_TICKS = 200


class Relay:
    """The pool of dispatcher threads of one server transport.

    ``lead()`` runs the dispatcher loop on the calling thread until the transport is closed
    (then it returns True, after its shutdown) or until another thread took the lead (False).
    ``name`` names the threads: the first ``name``, the next ones ``name-1``, ``name-2`` ...
    ``handover_after`` <= 0 disables the standby (the dispatcher then blocks with a handler).
    """

    def __init__(self, lead: Callable[[], bool], name: str, handover_after: float) -> None:
        self._lead = lead
        self._name = name
        self._tick = handover_after / 2.0
        # Re-entrant: a send from a handler holds it while a failed write reports the peer
        # gone to the business layer, which may send or disconnect again on this thread.
        self.lock = threading.RLock()
        # The thread id that owns the sockets; None before start.
        self.leader: int | None = None
        # Non-zero while the leader is inside the business layer: the number of that entry.
        self.busy = 0
        self._entries = 0
        self._parked = False
        self._wake = threading.Event()
        self._standbys = 0
        self._spawned = 0
        self._threads: dict[int, threading.Thread] = {}
        # Threads that lost the lead while inside a handler, until the handler returns.
        self._lent: set[int] = set()
        self.handovers = 0
        self.finished = threading.Event()

    # ------------------------------------------------------------------ the leading thread

    def serve_first(self) -> None:
        """Body of the transport's first dispatcher thread: leads, starts the standby."""
        me = threading.get_ident()
        with self.lock:
            self.leader = me
            self._threads[me] = threading.current_thread()
        if self._tick > 0:
            self._spawn()
        self._serve(me, leading=True)

    def begin(self) -> None:
        """The leader enters the business layer (a handler may run from here to ``end``)."""
        self._entries += 1
        self.busy = self._entries
        if self._parked:
            self._parked = False
            self._wake.set()

    def end(self) -> bool:
        """The leader is back from the business layer; False when it lost the lead meanwhile
        (it must then return to :meth:`_serve` without touching any socket)."""
        # acquire/release, not ``with``: compiled, ``with`` makes two bound methods and calls
        # ``__exit__`` with three arguments, once per request the dispatcher runs.
        lock = self.lock
        lock.acquire()
        try:
            self.busy = 0
            me = threading.get_ident()
            if self.leader == me:
                return True
            self._lent.discard(me)
            return False
        finally:
            lock.release()

    # -------------------------------------------------------------------------- every thread

    def _serve(self, me: int, leading: bool) -> None:
        try:
            while True:
                if leading:
                    if self._lead():
                        self._finish()
                        return
                    with self.lock:
                        # Lost the lead in a handler: stand by, unless another thread does.
                        if self._standbys or self.finished.is_set():
                            return
                        self._standbys += 1
                leading = self._stand_by(me)
                if not leading:
                    return
        finally:
            with self.lock:
                self._threads.pop(me, None)
                self._lent.discard(me)

    def _finish(self) -> None:
        self.finished.set()
        self._wake.set()

    def _stand_by(self, me: int) -> bool:
        """Watch the leader; True when this thread took the lead, False when the transport
        finished (the standby count is given back either way)."""
        seen = 0
        last_entries = self._entries
        quiet = 0
        while True:
            if quiet >= _PARK_TICKS:
                self._wake.clear()
                self._parked = True
                # Flag first, then look (as the mailbox's sleep flag): begin() sets busy and
                # THEN reads the flag, so either we see its entry or it sees us parked.
                if self._entries == last_entries and not self.busy:
                    self._wake.wait()
                self._parked = False
                quiet = 0
                seen = 0
            else:
                time.sleep(self._tick)
            with self.lock:
                if self.finished.is_set():
                    self._standbys -= 1
                    return False
                busy = self.busy
                if busy and busy == seen:
                    # The same entry on two ticks: the leader is stuck in a handler.
                    previous = self.leader
                    if previous is not None:
                        self._lent.add(previous)
                    self.leader = me
                    self.busy = 0
                    self._standbys -= 1
                    self.handovers += 1
                    took = True
                else:
                    took = False
            if took:
                log.debug("%s: a handler ran long; the standby took the lead", self._name)
                self._spawn()
                return True
            seen = busy
            if self._entries == last_entries:
                quiet += 1
            else:
                quiet = 0
                last_entries = self._entries

    def _spawn(self) -> None:
        """Start a new standby (the old one just took the lead, or this is the start)."""
        with self.lock:
            if self.finished.is_set() or self._standbys:
                return
            self._standbys += 1
            self._spawned += 1
            name = f"{self._name}-{self._spawned}"
        thread = threading.Thread(target=self._standby_main, name=name, daemon=True)
        thread.start()

    def _standby_main(self) -> None:
        me = threading.get_ident()
        with self.lock:
            self._threads[me] = threading.current_thread()
        # _spawn counted this thread as a standby already.
        self._serve(me, leading=False)

    # ------------------------------------------------------------------------------ closing

    def join(self, deadline: float) -> bool:
        """Wait (until the ``time.monotonic`` ``deadline``) for the shutdown and for every
        thread except those still inside a long handler; False when the shutdown has not
        happened by then."""
        if not self.finished.wait(max(0.0, deadline - time.monotonic())):
            return False
        self._wake.set()
        with self.lock:
            waiting = [t for i, t in self._threads.items() if i not in self._lent]
            lent = [t.name for i, t in self._threads.items() if i in self._lent]
        current = threading.current_thread()
        for thread in waiting:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        if lent:
            log.warning(
                "%s: closed; a handler still runs on %s (it ends when the handler returns)",
                self._name,
                ", ".join(lent),
            )
        return True

    def threads(self) -> list[threading.Thread]:
        """The pool's live threads (for tests and diagnostics)."""
        with self.lock:
            return list(self._threads.values())
