"""Seam waits of the history server, off the device's queue.

A backfill's first chunk asks the history server to wait (bounded) until the recorder has
acknowledged a row of the signal stamped at or after the seam (``until``). Waiting on the
server worker that runs the request would hold every other request of that ``history:DEV``
device behind it (one device group runs one request at a time): a reader waiting 10 s at a
seam made every other reader of the device wait as long (issue 37, item 3). So the handler
only parks such a request here and returns; one thread answers it once the recorder's
acknowledged stamp reaches the seam (the recorder calls :meth:`SeamWaits.acked` after each
durable segment), once its wait runs out (answered as incomplete, as before), once its client
has gone (dropped), or when the server stops.

Bounded: at most :data:`MAX_WAITS` parked requests; beyond that a request is answered at once,
marked incomplete, as a wait that ran out would be.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_WAITS", "SeamWait", "SeamWaits"]

log = logging.getLogger("rda.pipeline.recorder.seams")

MAX_WAITS = 1000  # parked seam waits at most (each holds one request, a few hundred bytes)


@dataclass(frozen=True, slots=True)
class SeamWait:
    device: str
    prop: str
    until: int  # the seam: wait for an acknowledged stamp >= until
    deadline: float  # monotonic
    peer: bytes  # the requesting connection (a gone client's wait is dropped)
    query: Any  # what ``answer`` needs to read and complete the request


class SeamWaits:
    """Parked seam waits and the one thread that answers them (module docstring).

    ``acked_stamp(device, prop)``: the recorder's highest durable stamp of the signal;
    ``answer(query, complete)``: read and complete the request (on this class's thread);
    ``drop(query)``: its client is gone; ``connected(peer)``: whether it still is."""

    def __init__(
        self,
        name: str,
        acked_stamp: Callable[[str, str], int],
        answer: Callable[[Any, bool], None],
        drop: Callable[[Any], None],
        connected: Callable[[bytes], bool],
    ) -> None:
        self._acked_stamp = acked_stamp
        self._answer = answer
        self._drop = drop
        self._connected = connected
        self._cond = threading.Condition()
        self._pending: list[SeamWait] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"rda-seams-{name}", daemon=True)
        self._thread.start()

    def park(self, wait: SeamWait) -> bool:
        """Answer ``wait`` later; False (the caller answers now) when full or closed."""
        with self._cond:
            if self._closed or len(self._pending) >= MAX_WAITS:
                return False
            self._pending.append(wait)
            self._cond.notify()
        return True

    def parked(self) -> int:
        with self._cond:
            return len(self._pending)

    def acked(self) -> None:
        """The recorder made rows durable: parked waits re-check their seam."""
        with self._cond:
            if self._pending:
                self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Answer every parked wait now (incomplete) and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _due(self) -> tuple[list[tuple[SeamWait, bool | None]], bool]:
        """Under the lock: the waits to act on now (True: seam reached, False: ran out or
        closing, None: client gone), and whether the thread should end."""
        while True:
            now = time.monotonic()
            due: list[tuple[SeamWait, bool | None]] = []
            keep: list[SeamWait] = []
            for wait in self._pending:
                if self._closed:
                    due.append((wait, False))
                elif not self._connected(wait.peer):
                    due.append((wait, None))
                elif self._acked_stamp(wait.device, wait.prop) >= wait.until:
                    due.append((wait, True))
                elif now >= wait.deadline:
                    due.append((wait, False))
                else:
                    keep.append(wait)
            self._pending = keep
            if due or self._closed:
                return due, self._closed
            if keep:
                # Woken by an acknowledgement, a new wait, or the nearest deadline.
                self._cond.wait(min(w.deadline for w in keep) - now)
            else:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                due, closing = self._due()
            for wait, reached in due:
                try:
                    if reached is None:
                        self._drop(wait.query)
                    else:
                        self._answer(wait.query, reached)
                except Exception:  # one bad answer must not end the others' waits
                    log.exception("seam wait of %s/%s: answer failed", wait.device, wait.prop)
            if closing:
                return
