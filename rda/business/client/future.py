"""``ReplyFuture``: what ``get_async``/``set_async`` return, a ``concurrent.futures.Future``
made for one reply.

It keeps ``Future``'s whole contract (``result(timeout)``, ``exception(timeout)``, ``done()``,
``cancelled()``, ``running()``, ``cancel()``, ``add_done_callback``; ``InvalidStateError`` on
a second completion; ``concurrent.futures.wait`` and ``as_completed``; ``asyncio.wrap_future``,
which wants a ``Future`` instance) without the machinery a ``Future`` carries for executors,
which the request path paid for on every request:

- no ``threading.Condition`` (a Python object around an ``RLock``, with a Python-level
  ``notify_all`` on every completion): the state lock is a plain ``Lock``, and a caller that
  has to wait makes a *gate* (a second ``Lock``, made held) that the completion releases; a
  result asked for after the reply came (the usual case in a window of requests) takes no lock;
- nothing stored that the request does not change: the fields' defaults are the class's.

The completion is the undecoded reply message; ``result()`` converts it in the caller's
thread (decode late: a reply nobody reads is never decoded, and the dispatcher never decodes).

``cancel()`` of a pending future succeeds and tells ``concurrent.futures.wait``'s waiters at
once (state ``CANCELLED_AND_NOTIFIED``): no executor will ever run an rda request, so there is
no later point at which a ``Future`` would tell them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from rda.serialization.message import Message

__all__ = ["ReplyFuture"]

# concurrent.futures's state names: ``wait`` and ``as_completed`` read a future's ``_state``
# and compare it with these strings.
_PENDING = "PENDING"
_RUNNING = "RUNNING"
_CANCELLED = "CANCELLED"
_NOTIFIED = "CANCELLED_AND_NOTIFIED"
_FINISHED = "FINISHED"

# concurrent.futures logs a failing done-callback on its own logger: so does this future.
_log = logging.getLogger("concurrent.futures")
_new_lock = threading.Lock


class ReplyFuture(Future[Any]):
    """A future completed with the undecoded reply; ``result()`` converts it in the caller.

    ``concurrent.futures.wait``/``as_completed`` use a future's ``_condition`` (as a lock),
    ``_state`` and ``_waiters``; this class keeps those three with their meanings.
    """

    # Defaults on the class: an instance stores a field only when the request changes it.
    _state = _PENDING
    _result: Any = None
    _exception: BaseException | None = None
    # Made by the first caller that has to wait, held until the future is done.
    _gate: Any = None
    _done_callbacks: list[Callable[[Future[Any]], object]] | None = None
    _converted = False
    _value: Any = None
    _error: BaseException | None = None
    # Called with ``key`` when cancel() succeeds (the service abandons request ``key``).
    on_cancel: Callable[[int], None] | None = None
    key = 0

    def __init__(self, convert: Callable[[Message], Any]) -> None:
        # Not Future.__init__: its Condition and lists are what this class does without.
        self._convert = convert
        # The state lock (concurrent.futures.wait holds it while it looks at ``_state``).
        self._condition = _new_lock()  # type: ignore[assignment]
        self._waiters = []

    def __repr__(self) -> str:
        return f"<ReplyFuture at {id(self):#x} state={self._state.lower()}>"

    # -- the caller's side ---------------------------------------------------------------

    def done(self) -> bool:
        state = self._state
        return state is _FINISHED or state is _NOTIFIED or state is _CANCELLED

    def cancelled(self) -> bool:
        state = self._state
        return state is _NOTIFIED or state is _CANCELLED

    def running(self) -> bool:
        return self._state is _RUNNING

    def result(self, timeout: float | None = None) -> Any:
        # The completion stores the message before the state (one attribute write each, in
        # that order, under the GIL): FINISHED seen here means the message is there.
        if self._state is not _FINISHED:
            self._wait(timeout)
        return self._conversion()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state is not _FINISHED:
            self._wait(timeout)
        if self._exception is not None:
            return self._exception
        try:
            self._conversion()
        except Exception as exc:
            return exc
        return None

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        with self._condition:
            if not self.done():
                if self._done_callbacks is None:
                    self._done_callbacks = [fn]
                else:
                    self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            _log.exception("exception calling callback for %r", self)

    def cancel(self) -> bool:
        with self._condition:
            state = self._state
            if state is _FINISHED or state is _RUNNING:
                return False
            if state is _NOTIFIED or state is _CANCELLED:
                return True
            self._state = _NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            gate = self._gate
        self._ended(gate)
        if self.on_cancel is not None:
            self.on_cancel(self.key)
        return True

    def _wait(self, timeout: float | None) -> None:
        """Until done (or ``timeout`` seconds): then FINISHED, else CancelledError or
        TimeoutError, as ``Future.result`` raises them."""
        with self._condition:
            state = self._state
            if state is _PENDING or state is _RUNNING:
                gate = self._gate
                if gate is None:
                    gate = self._gate = _new_lock()
                    gate.acquire()
            else:
                gate = None
        if gate is not None:
            if not gate.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
                raise FutureTimeoutError()
            gate.release()  # open for the next caller waiting on it
        if self._state is not _FINISHED:
            raise CancelledError()

    def _conversion(self) -> Any:
        if self._exception is not None:
            raise self._exception
        if not self._converted:
            try:
                self._value = self._convert(self._result)
            except Exception as exc:
                self._error = exc
            self._converted = True
        if self._error is not None:
            raise self._error
        return self._value

    # -- the completing side (the request table, once) -----------------------------------

    def set_result(self, result: Any) -> None:
        # acquire/release, not ``with``: compiled, ``with`` makes two bound methods and calls
        # ``__exit__`` with three arguments, once per reply.
        lock = self._condition
        lock.acquire()
        try:
            state = self._state
            if state is not _PENDING and state is not _RUNNING:
                raise InvalidStateError(f"{state}: {self!r}")
            self._result = result
            self._state = _FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            gate = self._gate
        finally:
            lock.release()
        if gate is not None or self._done_callbacks is not None:
            self._ended(gate)

    def set_exception(self, exception: BaseException | None) -> None:
        with self._condition:
            state = self._state
            if state is not _PENDING and state is not _RUNNING:
                raise InvalidStateError(f"{state}: {self!r}")
            self._exception = exception
            self._state = _FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
            gate = self._gate
        if gate is not None or self._done_callbacks is not None:
            self._ended(gate)

    def set_running_or_notify_cancel(self) -> bool:
        with self._condition:
            state = self._state
            if state is _PENDING:
                self._state = _RUNNING
                return True
            if state is _NOTIFIED or state is _CANCELLED:
                return False
        raise RuntimeError(f"Future in unexpected state: {state}")

    def _ended(self, gate: Any) -> None:
        # After the state lock: the waiters re-read the state, then the callbacks run.
        if gate is not None:
            gate.release()
        callbacks = self._done_callbacks
        if callbacks is not None:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    _log.exception("exception calling callback for %r", self)
