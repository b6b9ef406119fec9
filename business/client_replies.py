"""Replies of the client: the future a request returns and the conversion of its reply.

The dispatcher completes a request's future with the *undecoded* reply message; converting it
(decoding the body, mapping an EXCEPTION frame to its rda error) happens when someone asks for
the result, in their thread (STYLE.md 6).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from rda.business.client_subscription import remote_error
from rda.business.client_timer import TimerHandle
from rda.business.common import AcquiredData
from rda.serialization._data import Data
from rda.serialization._header import RequestType
from rda.serialization._message import Message
from rda.serialization.errors import ProtocolError

__all__ = [
    "Pending",
    "ReplyFuture",
    "admin_result",
    "complete",
    "get_result",
    "op_name",
    "set_result",
]


class ReplyFuture(Future[Any]):
    """A future completed with the undecoded reply; ``result()`` converts it in the caller.

    ``concurrent.futures`` and ``asyncio.wrap_future`` read a future only through ``result()``
    and ``exception()``, so converting there keeps decoding off the dispatcher.
    """

    def __init__(self, convert: Callable[[Message], Any]) -> None:
        super().__init__()
        self._convert = convert
        self._converted = False
        self._value: Any = None
        self._error: BaseException | None = None
        self.on_cancel: Callable[[], None] | None = None

    def _conversion(self, message: Message) -> Any:
        if not self._converted:
            try:
                self._value = self._convert(message)
            except Exception as exc:
                self._error = exc
            self._converted = True
        if self._error is not None:
            raise self._error
        return self._value

    def result(self, timeout: float | None = None) -> Any:
        return self._conversion(super().result(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = super().exception(timeout)
        if error is not None:
            return error
        try:
            self._conversion(super().result(0))
        except Exception as exc:
            return exc
        return None

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled and self.on_cancel is not None:
            self.on_cancel()
        return cancelled


class Pending:
    __slots__ = ("connection", "device", "future", "op", "property", "timeout", "timer")

    def __init__(
        self, future: ReplyFuture, connection: int, op: str, device: str, prop: str, timeout: float
    ) -> None:
        self.future = future
        self.connection = connection
        self.op = op
        self.device = device
        self.property = prop
        self.timeout = timeout
        self.timer: TimerHandle | None = None


def complete(future: ReplyFuture, outcome: Message | BaseException) -> None:
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass  # cancelled by its owner meanwhile


def op_name(op: RequestType) -> str:
    return op.name.lower()


def _raise_if_exception(message: Message) -> None:
    header = message.header
    if header.request_type is RequestType.EXCEPTION:
        exc = message.exception
        if exc is None:
            raise ProtocolError(
                f"{header.device}/{header.property}: EXCEPTION reply without an EXCEPTION frame"
            )
        raise remote_error(header.device, header.property, exc[0], exc[1])


def get_result(message: Message) -> AcquiredData:
    _raise_if_exception(message)
    data = message.data
    if data is None:
        header = message.header
        raise ProtocolError(f"{header.device}/{header.property}: get reply without a DATA frame")
    return AcquiredData(data, message.context)


def set_result(message: Message) -> None:
    _raise_if_exception(message)


def admin_result(message: Message) -> Data:
    _raise_if_exception(message)
    data = message.data
    return data if data is not None else Data()
