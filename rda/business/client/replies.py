"""Replies of the client: the future a request returns and the conversion of its reply.

The dispatcher completes a request's future with the *undecoded* reply message; converting it
(decoding the body, mapping an EXCEPTION frame to its rda error) happens when someone asks for
the result, in their thread (decode late: a reply nobody reads is never decoded).

Three kinds of completion: ``ReplyFuture`` (future.py: a ``concurrent.futures.Future``, what
``get_async`` returns), :class:`LaneCompletion` (a blocking call on the caller's lane) and
:class:`ReplyWaiter`, the blocking ``get``/``set``'s one-shot on the shared connection: the
caller waits on its thread's ``Wakeup`` (an eventfd) and the completing thread sets it. The client dispatcher sets the wake-up
through the transport's ``wake_later``: right before it polls again, with the GIL released
for the system call, so the woken caller does not have to wait for the GIL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Any

from rda.business.client.future import ReplyFuture
from rda.business.client.subscriptions import alarm_of, remote_error
from rda.business.common import AcquiredData, new_acquired
from rda.business.metadata import PropertyDescription
from rda.serialization.data import Data
from rda.serialization.errors import RemoteProtocolError
from rda.serialization.header import RequestType
from rda.serialization.message import BodyKind, Message
from rda.transport.mailbox import Wakeup

__all__ = [
    "LaneCompletion",
    "Pending",
    "ReplyWaiter",
    "admin_result",
    "complete",
    "describe_result",
    "get_result",
    "op_name",
    "set_result",
]


class ReplyWaiter:
    """Completion of a blocking request: ``result()`` waits, then converts in the caller.

    Completed at most once: the client hands an outcome only to the entry it popped from its
    pending table (reply, deadline, disconnection and close all pop), so exactly one thread
    completes it; a second call is ignored, as a Future would refuse it. ``result()`` needs no
    timeout of its own: every request has a deadline on the client's timer.
    """

    __slots__ = ("_convert", "_outcome", "_wake", "_wakeup")

    def __init__(
        self,
        convert: Callable[[Message], Any],
        wake: Callable[[Wakeup], None] | None = None,
    ) -> None:
        self._convert = convert
        # The creating thread's wake-up: only that thread calls result().
        self._wakeup = Wakeup.of_thread()
        self._outcome: Message | BaseException | None = None
        # How the completing thread wakes the caller: the transport's ``wake_later`` (on its
        # dispatcher, deferred to right before it polls again), else at once.
        self._wake = wake

    def set_result(self, message: Message) -> None:
        self._complete(message)

    def set_exception(self, error: BaseException) -> None:
        self._complete(error)

    def _complete(self, outcome: Message | BaseException) -> None:
        if self._outcome is None:
            self._outcome = outcome
            if self._wake is None:
                self._wakeup.set()
            else:
                self._wake(self._wakeup)

    def result(self) -> Any:
        wakeup = self._wakeup
        # A pending set left by an earlier request of this thread (one that was interrupted)
        # ends a wait early: wait again until our own outcome is there.
        while self._outcome is None:
            wakeup.wait()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return self._convert(outcome)


class LaneCompletion:
    """How a request on a lane is ended by someone else (disconnection, close) or by its
    caller at its deadline: the outcome is only recorded; the caller, waiting in its lane,
    looks at it every ``WAIT_SLICE``."""

    __slots__ = ("outcome",)

    def __init__(self) -> None:
        self.outcome: Message | BaseException | None = None

    def set_result(self, message: Message) -> None:
        if self.outcome is None:
            self.outcome = message

    def set_exception(self, error: BaseException) -> None:
        if self.outcome is None:
            self.outcome = error

    def ended(self) -> bool:
        return self.outcome is not None


Completion = ReplyFuture | ReplyWaiter | LaneCompletion


class Pending:
    __slots__ = ("connection", "device", "future", "op", "property", "sent_at", "timeout")

    def __init__(
        self,
        future: Completion,
        connection: int,
        op: str,
        device: str,
        prop: str,
        timeout: float,
        sent_at: float = 0.0,
    ) -> None:
        self.future = future
        self.sent_at = sent_at  # the service's clock when sent: the round trip's start
        self.connection = connection
        self.op = op
        self.device = device
        self.property = prop
        self.timeout = timeout


def complete(future: Completion, outcome: Message | BaseException) -> None:
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass  # cancelled by its owner meanwhile


# Enum ``.name`` is a Python-level property: looked up once per type, not per request.
_OP_NAMES = {t: t.name.lower() for t in RequestType}


def op_name(op: RequestType) -> str:
    return _OP_NAMES[op]


def _raise_if_exception(message: Message) -> None:
    header = message.header
    if header.request_type is RequestType.EXCEPTION:
        exc = message.exception
        if exc is None:
            raise RemoteProtocolError(
                f"{header.device}/{header.property}: EXCEPTION reply without an EXCEPTION frame"
            )
        raise remote_error(header.device, header.property, exc[0], exc[1])


def get_result(message: Message) -> AcquiredData:
    # Once per get: the exception test inline (a call less pays for the alarm test below).
    if message.header.request_type is _EXCEPTION:
        _raise_if_exception(message)
    data = message.data
    if data is None:
        header = message.header
        raise RemoteProtocolError(
            f"{header.device}/{header.property}: get reply without a DATA frame"
        )
    if message.frame(_REPLY_CONTEXT) is None:  # no alarm sent: the usual reply
        return new_acquired(data, message.context)
    return new_acquired(data, message.context, alarm_of(message))


_EXCEPTION = RequestType.EXCEPTION
_REPLY_CONTEXT = BodyKind.REPLY_CONTEXT


def describe_result(message: Message) -> PropertyDescription:
    """The description in a describe reply (docs/protocol.md, "Describe"); a server that
    answered with the property's value instead does not know the describe selector."""
    _raise_if_exception(message)
    header = message.header
    data = message.data
    text = None if data is None else data.get("rda_description")
    if not isinstance(text, str):
        raise RemoteProtocolError(
            f"{header.device}/{header.property}: the server answered describe with a value, "
            "not a description (a server from before property metadata, rda issue 33)"
        )
    try:
        return PropertyDescription.from_dict(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise RemoteProtocolError(
            f"{header.device}/{header.property}: malformed description: {exc}"
        ) from None


def set_result(message: Message) -> None:
    _raise_if_exception(message)


def admin_result(message: Message) -> Data:
    _raise_if_exception(message)
    data = message.data
    return data if data is not None else Data()
