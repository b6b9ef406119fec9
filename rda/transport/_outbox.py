"""The queue of a server-side peer whose pipe is full, and when to retry it.

No zmq here: the dispatchers (``zmq_server``, the in-memory server) do the sending; this module
decides what waits, what replaces what (conflation: latest wins) and what is dropped, so the
policy can be tested with plain lists. The peer record itself is ``server_session.Peer``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["Outbox", "PutResult", "RetryBackoff"]


class PutResult(enum.Enum):
    QUEUED = "queued"
    CONFLATED = "conflated"  # replaced an older queued message with the same key
    DROPPED = "dropped"  # the queue is at its limit


class Outbox:
    """Messages waiting for one peer's pipe to drain, in order, at most ``limit`` of them.

    A message with a key (a subscription id) replaces an older *queued* one with the same key,
    in that one's place: the peer gets the latest value without the queue growing.
    """

    __slots__ = ("_keyed", "_queue", "conflated", "conflated_by_key", "dropped", "dropped_by_key")

    def __init__(self) -> None:
        # Entries are [frames, key]; a list so that conflation can swap the frames in place.
        self._queue: deque[list[Any]] = deque()
        self._keyed: dict[int, list[Any]] = {}
        # What this peer lost, in total and per key (subscription id): the admin interface's
        # "why is my subscription blind?" view. Only touched when the pipe is full.
        self.conflated = 0
        self.dropped = 0
        self.conflated_by_key: dict[int, int] = {}
        self.dropped_by_key: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, frames: Sequence[Any], key: int | None, limit: int) -> PutResult:
        if key is not None:
            slot = self._keyed.get(key)
            if slot is not None:
                slot[0] = frames
                self.conflated += 1
                self.conflated_by_key[key] = self.conflated_by_key.get(key, 0) + 1
                return PutResult.CONFLATED
        if len(self._queue) >= limit:
            self.dropped += 1
            if key is not None:
                self.dropped_by_key[key] = self.dropped_by_key.get(key, 0) + 1
            return PutResult.DROPPED
        slot = [frames, key]
        self._queue.append(slot)
        if key is not None:
            self._keyed[key] = slot
        return PutResult.QUEUED

    def head(self) -> Sequence[Any]:
        frames: Sequence[Any] = self._queue[0][0]
        return frames

    def pop(self) -> None:
        _, key = self._queue.popleft()
        if key is not None:
            self._keyed.pop(key, None)

    def clear(self) -> int:
        """Forget everything; returns how many messages were waiting."""
        n = len(self._queue)
        self._queue.clear()
        self._keyed.clear()
        return n


class RetryBackoff:
    """When to retry blocked peers if the ROUTER's POLLOUT cannot be trusted.

    A ROUTER with ``ROUTER_MANDATORY`` reports POLLOUT when *any* peer's pipe has room, so with
    healthy peers around it is nearly always writable. A retry round that moved nothing waits
    ``first`` seconds, doubling up to ``cap``, instead of spinning; progress resets the wait.
    """

    __slots__ = ("_cap", "_first", "_next")

    def __init__(self, first: float = 0.001, cap: float = 0.05) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def reset(self) -> None:
        self._next = self._first

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._cap)
        return delay
