"""Every direct lane of one client transport, whatever carries them.

A lane (``rda.transport.api.DirectLane``) is a blocking caller's own connection to one
server; its rules are ``client_session.LaneSession``'s, its I/O the transport's
(``zmq_lane.Lane`` over a DEALER, the in-memory transport's over a link). What every
transport does with its lanes is here, once: one lane per (thread, server), made on demand and
replaced when the shared connection it was opened under is; at most ``limit`` of them; those
of ended threads closed; their counters summed for ``statistics()`` so that they never go
backwards; all closed with the transport.
"""

from __future__ import annotations

import abc
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

from rda.serialization.errors import TransportError
from rda.serialization.message import Message
from rda.transport.api import Buffer
from rda.transport.client_session import LaneSession

__all__ = ["LANE_LIMIT", "REFRESH_SHARE", "WAIT_SLICE", "Lane", "LanePool", "PooledLane"]

log = logging.getLogger("rda.transport.lane")

# How often a waiting caller checks whether its request was ended by someone else. A reply
# that comes in time never waits for it; a deadline or a disconnection is noticed this late.
WAIT_SLICE = 0.05
# A server forgets a silent lane after its heartbeat timeout: a lane idle for this share of it
# introduces itself again (a CONNECT just before the request, so no extra round trip).
REFRESH_SHARE = 0.5
LANE_LIMIT = 64


class PooledLane(Protocol):
    """What the pool needs of a lane (it is also an ``api.DirectLane``)."""

    session: LaneSession
    connection: int  # the shared connection this lane was opened under
    thread: weakref.ref[threading.Thread]  # its owner

    @property
    def closed(self) -> bool: ...

    def call(
        self, frames: Sequence[Buffer], request_id: int, ended: Callable[[], bool], now: float
    ) -> Message | None: ...

    def close(self, timeout: float) -> bool:
        """Close once no call uses it (any thread); False if it stayed in use."""
        ...


class Lane:
    """One thread's own connection to one server: what every transport's lane shares.

    Only the thread that made it calls :meth:`call`, which holds the lane's lock for the whole
    call: the CONNECT first when the session says so, the request, then the wait for its
    reply. :meth:`close` (any thread) takes the same lock, so a lane is never closed under a
    call; a close that finds it in use leaves the closing to the owner, on its way out. A
    transport supplies the I/O: ``_send``, ``_wait``, ``_release`` and ``closed``.

    Not an ``abc.ABC``: the compiled build makes this an extension type, which cannot take
    ABCMeta. The I/O methods are still ``abc.abstractmethod`` s, which is what mypy reads (a
    subclass that misses one cannot be instantiated: mypy's "abstract" error); at run time
    they raise NotImplementedError, as ``closed`` does.
    """

    __slots__ = ("__weakref__", "_lock", "_orphaned", "connection", "session", "thread")

    def __init__(self, connection: int, session: LaneSession) -> None:
        # Held by the owner for a whole call, and by whoever closes the lane.
        self._lock = threading.Lock()
        # Set by a close that found the lane in use: the owner closes it on its way out.
        self._orphaned = False
        self.connection = connection  # the shared connection this lane was opened under
        self.session = session
        self.thread = weakref.ref(threading.current_thread())

    @property
    def closed(self) -> bool:
        """Whether the I/O is closed (the subclass's; a compiled property cannot also be an
        ``abc.abstractmethod``, so a subclass without it fails here, at its first call)."""
        raise NotImplementedError

    def call(
        self,
        frames: Sequence[Buffer],
        request_id: int,
        ended: Callable[[], bool],
        now: float,
    ) -> Message | None:
        """Send one request and wait on this thread for its reply.

        Returns None when ``ended()`` became true first (the owner decided the request's fate)
        and raises ``TransportError`` when the lane is closed or the send fails; the caller
        then fails the request as it would a lost connection.
        """
        session = self.session
        lock = self._lock
        # acquire/release rather than ``with``: compiled, ``with`` makes two bound methods and
        # an ``__exit__`` call with three arguments per call.
        lock.acquire()
        try:
            if self.closed:
                raise TransportError(f"the lane to {session.address} is closed")
            hello = session.needs_hello(now)
            self._send(frames, hello)
            session.sent(frames, now, hello)
            try:
                return self._wait(request_id, ended)
            finally:
                if self._orphaned:
                    self._release()
        finally:
            lock.release()

    def close(self, timeout: float) -> bool:
        """Close once no call uses it (any thread); False if it stayed in use."""
        if not self._lock.acquire(timeout=timeout):
            self._orphaned = True
            return False
        try:
            self._release()
        finally:
            self._lock.release()
        return True

    @abc.abstractmethod
    def _send(self, frames: Sequence[Buffer], hello: bool) -> None:
        """Send the request, after the session's CONNECT when ``hello``; raise
        ``TransportError`` when that fails."""
        raise NotImplementedError

    @abc.abstractmethod
    def _wait(self, request_id: int, ended: Callable[[], bool]) -> Message | None:
        """The reply to ``request_id`` (through ``session.received``), or None once
        ``ended()``; wake at least every ``WAIT_SLICE`` to ask."""
        raise NotImplementedError

    @abc.abstractmethod
    def _release(self) -> None:
        """Close the I/O (idempotent; under the lane's lock)."""
        raise NotImplementedError


class LanePool:
    """The lanes of one client transport. ``open(address, connection, refresh_after)`` makes a
    lane for the calling thread (None when it cannot)."""

    def __init__(
        self,
        open_lane: Callable[[str, int, float], PooledLane | None],
        limit: int = LANE_LIMIT,
    ) -> None:
        self._open_lane = open_lane
        self._limit = limit
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[PooledLane] = []
        self._closed = False
        # Counts of lanes already closed, so statistics never go backwards.
        self._retired = [0, 0, 0, 0, 0, 0]

    def of_thread(self, address: str, connection: int, refresh_after: float) -> PooledLane | None:
        """The calling thread's lane to ``address`` under the shared ``connection``; None
        when there can be none (transport closing, too many lanes, connection refused)."""
        mine: dict[str, PooledLane] | None = getattr(self._local, "lanes", None)
        if mine is None:
            mine = self._local.lanes = {}
        lane = mine.get(address)
        if lane is not None and lane.connection == connection and not lane.closed:
            return lane
        if lane is not None:
            # The shared connection was replaced (server restarted, moved): so is the lane.
            del mine[address]
            self._retire(lane)
        lane = self._open(address, connection, refresh_after)
        if lane is not None:
            mine[address] = lane
        return lane

    def _open(self, address: str, connection: int, refresh_after: float) -> PooledLane | None:
        with self._lock:
            if self._closed:
                return None
            self._prune_locked()
            if len(self._all) >= self._limit:
                return None
            lane = self._open_lane(address, connection, refresh_after)
            if lane is not None:
                self._all.append(lane)
            return lane

    def _prune_locked(self) -> None:
        """Close the lanes of threads that have ended (their connections are idle for good)."""
        dead = [lane for lane in self._all if not _alive(lane)]
        for lane in dead:
            self._all.remove(lane)
            self._count_retired(lane)
            lane.close(0.0)

    def _retire(self, lane: PooledLane) -> None:
        with self._lock:
            if lane in self._all:
                self._all.remove(lane)
                self._count_retired(lane)
        lane.close(0.0)  # the owner (this thread) is not in a call

    def _count_retired(self, lane: PooledLane) -> None:
        for i, value in enumerate(lane.session.counts()):
            self._retired[i] += value

    def counts(self) -> tuple[int, list[int]]:
        """(open lanes, [messages in, out, bytes in, out, decode errors, stale replies])."""
        with self._lock:
            totals = list(self._retired)
            for lane in self._all:
                for i, value in enumerate(lane.session.counts()):
                    totals[i] += value
            return len(self._all), totals

    def close(self, timeout: float) -> None:
        """Close every lane; a caller still waiting gives its lane up within WAIT_SLICE."""
        with self._lock:
            self._closed = True
            lanes, self._all = self._all, []
        for lane in lanes:
            if not lane.close(timeout):
                log.warning("a lane was still in use at close")


def _alive(lane: PooledLane) -> bool:
    thread = lane.thread()
    return thread is not None and thread.is_alive()
