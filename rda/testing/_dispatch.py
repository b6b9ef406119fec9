"""The in-memory transports' plumbing: an inbox, a dispatcher thread, and the link records.

Each in-memory transport copies the real one's threading contract (``rda.transport.api``):
ONE dispatcher at a time calls every handler; other threads reach it only through its
:class:`Inbox` (user commands bounded by ``send_hwm`` so a flooding sender blocks, network
deliveries unbounded); a call made on the dispatcher thread itself (from a handler) is queued
locally and run right after the current item, never re-entrantly and never blocking. A server
dispatcher hands over as the ZeroMQ one does (``rda.transport.relay``: leader/followers):
when a handler runs longer than ``handover_after``, a standby thread takes the lead and the
handler finishes on its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rda.business.driver import current_driver
from rda.testing._clock import FakeClock
from rda.transport.api import Buffer
from rda.transport.relay import Relay

__all__ = ["Barrier", "ClientEnd", "Dispatcher", "Inbox", "Link", "frames_size", "wire_copy"]

log = logging.getLogger("rda.testing")

# Items handled per wake-up before timers are checked again (a real dispatcher batches too).
_BATCH = 1000


def wire_copy(frames: Sequence[Buffer]) -> list[memoryview]:
    """What the receiving side of a real socket gets: a copy, as ``memoryview`` (copy=False)."""
    return [memoryview(bytes(f)) for f in frames]


def frames_size(frames: Sequence[Buffer]) -> int:
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)


class ClientEnd(Protocol):
    """The client side of a :class:`Link`: a client transport or a raw test peer."""

    def link_receive(self, conn: int, frames: list[memoryview], stamp: float) -> None: ...

    def link_gone(self, conn: int) -> None: ...


class ServerEnd(Protocol):
    """The server side of a :class:`Link`: a ``MemoryServerTransport``. A protocol, so that
    this module does not import _memory_server.py, which imports it."""

    def link_arrival(self, link: Link, frames: list[memoryview], stamp: float) -> None: ...

    def link_closed(self, peer: bytes) -> None: ...

    def link_writable(self, peer: bytes) -> None: ...


@dataclass(slots=True, eq=False)
class Link:
    """One client connection to one server endpoint (a DEALER's TCP connection)."""

    endpoint: str
    peer: bytes  # the routing id the server sees
    client: ClientEnd
    conn: int  # the client's connection id
    server: ServerEnd | None = None
    closed: bool = False
    # Frames sent before any server bound the endpoint (ZeroMQ queues them in the DEALER).
    waiting: list[list[memoryview]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Barrier:
    """Set once the dispatcher has handled everything queued before it, timers included."""

    event: threading.Event = field(default_factory=threading.Event)


class Inbox:
    """One FIFO feeding one dispatcher; commands count against ``hwm`` (back-pressure)."""

    def __init__(self, hwm: int, on_put: Callable[[], None]) -> None:
        self._cond = threading.Condition()
        self._items: deque[tuple[bool, object]] = deque()
        self._commands = 0
        self._hwm = max(1, hwm)
        self._on_put = on_put
        self._woken = False
        # Back-pressure (``pause_commands``): while set, only network items are taken.
        self._paused = False
        self.closed = False

    def put_command(self, item: object, wait: bool = True) -> bool:
        """Queue a user command; blocks while ``hwm`` commands wait (``wait=False``: goes in
        over ``hwm``, see ``mailbox.Mailbox.put``). False once closed."""
        with self._cond:
            if wait:
                self._wait_for_room_locked()
            if self.closed:
                return False
            self._items.append((True, item))
            self._commands += 1
            self._cond.notify_all()
        self._on_put()
        return True

    def wait_for_room(self) -> bool:
        """Block while ``hwm`` commands wait, queueing nothing; False once closed."""
        with self._cond:
            self._wait_for_room_locked()
            return not self.closed

    def _wait_for_room_locked(self) -> None:
        while self._commands >= self._hwm and not self.closed:
            self._cond.wait()

    def put_network(self, item: object) -> bool:
        with self._cond:
            if self.closed:
                return False
            self._items.append((False, item))
            self._cond.notify_all()
        self._on_put()
        return True

    def put_barrier(self, barrier: Barrier) -> bool:
        with self._cond:
            if self.closed:
                return False
            self._items.append((False, barrier))
            self._cond.notify_all()
        return True

    def pause_commands(self, paused: bool) -> None:
        """Stop (or resume) taking user commands; senders block once ``hwm`` of them wait,
        as on a ZeroMQ transport whose dispatcher stopped reading its mailbox."""
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def wake(self) -> None:
        """Make the dispatcher re-check its timers (the fake clock moved)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self, discard: bool) -> None:
        with self._cond:
            self.closed = True
            if discard:
                for _, item in self._items:
                    if isinstance(item, Barrier):
                        item.event.set()  # nothing left to wait for
                self._items.clear()
                self._commands = 0
            self._cond.notify_all()

    def take(self, timeout: float | None, limit: int = _BATCH) -> list[tuple[bool, object]]:
        with self._cond:
            if not (self._ready_locked() or self._woken or self.closed):
                self._cond.wait(timeout)
            self._woken = False
            batch: list[tuple[bool, object]] = []
            if self._paused and not self.closed:
                # Network items only; the commands keep their order for later.
                kept: deque[tuple[bool, object]] = deque()
                while self._items and len(batch) < limit:
                    entry = self._items.popleft()
                    (kept if entry[0] else batch).append(entry)
                kept.extend(self._items)
                self._items = kept
                return batch
            while self._items and len(batch) < limit:
                entry = self._items.popleft()
                if entry[0]:
                    self._commands -= 1
                batch.append(entry)
            if batch:
                self._cond.notify_all()  # senders blocked at the high-water mark
            return batch

    def ready(self) -> bool:
        """Something can be taken now (commands only while not paused). Asked by a
        simulation's driver before every step, from the one thread that also puts: no lock."""
        if not self._items:
            return False
        return not self._paused or self._ready_locked()

    def _ready_locked(self) -> bool:
        if not self._paused:
            return bool(self._items)
        return any(not is_command for is_command, _ in self._items)

    def empty(self) -> bool:
        with self._cond:
            return not self._items


class Dispatcher(ABC):
    """A named dispatcher that owns one transport's state; subclasses supply the handling.

    With ``handover_after`` > 0 the dispatcher is a pool of threads (``Relay``): whichever
    leads runs the loop, and a handler that runs long (between ``_begin_handler`` and
    ``_end_handler``) is left to finish on its thread while a standby takes the lead.
    """

    def __init__(
        self,
        name: str,
        clock: Callable[[], float],
        hwm: int,
        on_put: Callable[[], None],
        handover_after: float = 0.0,
    ):
        self._name = name
        self._clock = clock
        self._inbox = Inbox(hwm, on_put)
        self._local: deque[object] = deque()
        self._thread: threading.Thread | None = None
        self._close_lock = threading.Lock()
        self._closed = False
        self._killed = False
        self._stop_clock: Callable[[], None] | None = None
        # Under a simulation's driver (rda.business.driver) no thread runs the loop: the
        # driver calls ``step``, one item at a time, and a handler runs to its end (so no
        # hand-over is needed, and ``hands_over`` still tells the server to run inline).
        self._driver = current_driver()
        self._stepping = False
        self._released = False
        self._relay = (
            Relay(self._lead, name, handover_after)
            if handover_after > 0 and self._driver is None
            else None
        )

    # --- lifecycle (any thread) ---

    def _start_thread(self) -> None:
        with self._close_lock:
            if self._thread is not None or self._closed:
                raise RuntimeError(f"{self._name}: a transport can be started once")
            if self._driver is not None:
                self._thread = threading.current_thread()  # started, run by the driver
                self._driver.adopt(self)
                return
            if isinstance(self._clock, FakeClock):
                self._stop_clock = self._clock.on_advance(self._inbox.wake)
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _on_dispatcher(self) -> bool:
        if self._driver is not None:
            return self._stepping
        relay = self._relay
        if relay is not None:
            return threading.get_ident() == relay.leader
        return threading.current_thread() is self._thread

    def _stop(self, timeout: float, kill: bool) -> None:
        with self._close_lock:
            first = not self._closed
            self._closed = True
            if first:
                self._killed = kill
            thread = self._thread
        if first:
            self._inbox.close(discard=kill)
        if self._driver is not None:
            if not self._stepping:
                self._finish_driven()
            return  # a step that closed its own transport finishes it on its way out
        if thread is None:
            if first:
                self._shutdown()
            return
        if self._on_dispatcher():
            return  # it cannot join itself; it cleans up on its way out
        if self._relay is not None:
            stopped = self._relay.join(time.monotonic() + timeout)
        else:
            thread.join(timeout)
            stopped = not thread.is_alive()
        if not stopped:
            log.warning("%s did not stop within %.1f s (a handler blocks?)", self._name, timeout)

    def _post(self, item: object, wait: bool = True) -> None:
        if self._on_dispatcher():
            relay = self._relay
            if relay is None:
                self._local.append(item)
                return
            # A handler on the dispatcher: a standby may take the lead at any moment.
            with relay.lock:
                if self._on_dispatcher():
                    self._local.append(item)
                    return
        # Driven, nothing may block the one thread: the inbox goes over its mark instead.
        self._inbox.put_command(item, wait and self._driver is None)

    def wait_for_room(self) -> None:
        """As ``ZmqServerTransport.wait_for_room``: block while the inbox is full."""
        if not self._on_dispatcher() and self._driver is None:
            self._inbox.wait_for_room()

    def barrier(self) -> Barrier | None:
        """A marker set once everything queued before it was handled (``MemoryNetwork.settle``)."""
        barrier = Barrier()
        return barrier if self._inbox.put_barrier(barrier) else None

    @property
    def handovers(self) -> int:
        """How often a standby took the lead from a long handler."""
        return 0 if self._relay is None else self._relay.handovers

    def _begin_handler(self) -> None:
        """The dispatcher enters the business layer (a handler may run long)."""
        if self._relay is not None:
            self._relay.begin()

    def _end_handler(self) -> bool:
        """Back from the business layer; False when this thread lost the lead meanwhile."""
        return self._relay is None or self._relay.end()

    # --- the loop (whichever thread leads) ---

    def _run(self) -> None:
        if self._relay is not None:
            self._relay.serve_first()
        else:
            self._lead()

    def _lead(self) -> bool:
        """The dispatcher loop: True once the transport closed (after the shutdown), False
        when a standby took the lead while this thread ran a handler."""
        relay = self._relay
        me = threading.get_ident()
        # A leader takes one item at a time: what it took is its own to finish, so a lead
        # lost in a handler leaves nothing taken behind (as messages stay in a socket).
        limit = 1 if relay is not None else _BATCH
        try:
            while True:
                self._run_local()  # what a previous leader's handler queued
                batch = self._inbox.take(self._wait_timeout(), limit)
                barriers = [item for _, item in batch if isinstance(item, Barrier)]
                for is_command, item in batch:
                    if self._killed:
                        break  # a dead process sends nothing more
                    # After close(), queued commands (replies) still go out; arrivals do not.
                    if not isinstance(item, Barrier) and (is_command or not self._inbox.closed):
                        self._handle(item)
                        if relay is not None and relay.leader != me:
                            return False
                        self._run_local()
                self._end_batch()
                self._run_local()
                if not self._inbox.closed:
                    self._check_timers(self._clock())
                    self._run_local()
                self._after_batch()
                for barrier in barriers:
                    barrier.event.set()
                if self._inbox.closed and self._inbox.empty():
                    break
        except Exception:  # a bug here must not leave a zombie transport behind silently
            if relay is not None and relay.leader != me:
                return False
            log.exception("%s crashed", self._name)
        # Refuse further work, so that no sender blocks forever on a dead dispatcher.
        self._inbox.close(discard=True)
        self._shutdown()
        return True

    # --- driven (rda.business.driver): one loop turn per step, on the driver's thread ---

    @property
    def name(self) -> str:
        return self._name

    def ready(self) -> bool:
        if self._released:
            return False
        if self._local or self._inbox.ready():
            return True
        deadline = self._next_deadline()
        return deadline is not None and deadline <= self._clock()

    def next_deadline(self) -> float | None:
        return None if self._released or self._inbox.closed else self._next_deadline()

    def step(self) -> None:
        """One item from the inbox (or none), then the timers, as one turn of ``_lead``."""
        if self._released:
            return
        self._stepping = True
        try:
            self._run_local()
            for is_command, item in self._inbox.take(0.0, 1):
                if self._killed or isinstance(item, Barrier):
                    continue
                if is_command or not self._inbox.closed:
                    self._handle(item)
                    self._run_local()
            self._end_batch()
            self._run_local()
            if not self._inbox.closed:
                self._check_timers(self._clock())
                self._run_local()
            self._after_batch()
        finally:
            self._stepping = False
        if self._inbox.closed:
            self._finish_driven()

    def _finish_driven(self) -> None:
        """Closed under a driver: send what is queued (unless killed), then shut down."""
        if self._released:
            return
        self._stepping = True
        try:
            while not self._killed and (self._local or not self._inbox.empty()):
                self._run_local()
                for is_command, item in self._inbox.take(0.0, _BATCH):
                    if is_command and not isinstance(item, Barrier):
                        self._handle(item)
            self._inbox.close(discard=True)
            self._released = True
            self._shutdown()
        finally:
            self._stepping = False
        assert self._driver is not None
        self._driver.release(self)

    def _run_local(self) -> None:
        while self._local:
            self._handle(self._local.popleft())

    def _wait_timeout(self) -> float | None:
        if isinstance(self._clock, FakeClock):
            return None  # advance() wakes us
        deadline = self._next_deadline()
        if deadline is None:
            return None
        return max(0.0, deadline - self._clock())

    def _shutdown(self) -> None:
        if self._stop_clock is not None:
            self._stop_clock()
            self._stop_clock = None
        self._teardown(report=not self._killed)

    # --- supplied by the transports ---

    @abstractmethod
    def _handle(self, item: object) -> None: ...

    def _end_batch(self) -> None:
        """Every item of the batch taken from the inbox was handled (a client delivers the
        replies it held back for a batch-taking handler here)."""
        return

    def _after_batch(self) -> None:
        """The dispatcher is about to wait for more (a client sets deferred wake-ups here)."""
        return

    @abstractmethod
    def _check_timers(self, now: float) -> None: ...

    @abstractmethod
    def _next_deadline(self) -> float | None: ...

    @abstractmethod
    def _teardown(self, report: bool) -> None: ...
