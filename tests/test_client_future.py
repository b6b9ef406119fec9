"""``ReplyFuture`` (business/client/future.py), what ``get_async``/``set_async`` return: the
``concurrent.futures.Future`` contract, kept without a ``Condition``.

Each property is checked on the future alone (completed from other threads as the dispatcher
and the timer do) and the main ones once more through a client on real ZeroMQ sockets. Runs on
both paths (tests/test_pure_python.py): the compiled build and the ``.py``. No sleeps: a
thread "waiting" is proved by the gate it made (``_gate``), a completion by its outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rda.business.client.future import ReplyFuture
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization.data import Data
from rda.testing import wait_until

WAIT = 10.0


class Converter:
    """A reply conversion that records each call and the thread it ran in."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[int] = []
        self.fail = fail

    def __call__(self, message: Any) -> Any:
        self.calls.append(threading.get_ident())
        if self.fail is not None:
            raise self.fail
        return ("converted", message)


def waiting(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``target`` in a thread; its result or exception lands in the returned list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def blocked(fut: ReplyFuture) -> None:
    """Until a caller waits in ``fut`` (it made the gate), or fail."""
    assert wait_until(lambda: fut._gate is not None, "a caller to wait", timeout=WAIT)


def test_it_is_a_concurrent_futures_future_and_converts_once_in_the_caller() -> None:
    convert = Converter()
    fut = ReplyFuture(convert)
    assert isinstance(fut, cf.Future)
    assert not fut.done() and not fut.running() and not fut.cancelled()
    completer = threading.Thread(target=fut.set_result, args=("message",))
    completer.start()
    completer.join(WAIT)
    assert fut.done() and not convert.calls  # the completing thread decoded nothing
    assert fut.result() == ("converted", "message")
    assert fut.result(timeout=0) == ("converted", "message")
    assert fut.exception() is None
    assert convert.calls == [threading.get_ident()]


def test_result_times_out_while_pending_then_returns_once_completed() -> None:
    fut = ReplyFuture(Converter())
    with pytest.raises(cf.TimeoutError):
        fut.result(timeout=0)
    with pytest.raises(cf.TimeoutError):
        fut.exception(timeout=0.01)
    # The timed-out waits left the gate closed: a later completion still opens it.
    fut.set_result("m")
    assert fut.result(timeout=0) == ("converted", "m")


def test_every_waiting_thread_is_woken_by_the_completion() -> None:
    fut = ReplyFuture(Converter())
    waiters = [waiting(lambda: fut.result(timeout=WAIT)) for _ in range(4)]
    blocked(fut)
    fut.set_result("m")
    for thread, out in waiters:
        thread.join(WAIT)
        assert out == [("converted", "m")]


def test_an_exception_completion_is_raised_and_returned() -> None:
    fut = ReplyFuture(Converter())
    thread, out = waiting(lambda: fut.result(timeout=WAIT))
    blocked(fut)
    error = TimeoutError("get PS1/Acquisition: no reply within 1 s")
    fut.set_exception(error)
    thread.join(WAIT)
    assert out == [error]
    assert fut.exception() is error
    with pytest.raises(TimeoutError):
        fut.result()


def test_a_failing_conversion_is_the_result_and_the_exception() -> None:
    error = ValueError("bad reply")
    convert = Converter(fail=error)
    fut = ReplyFuture(convert)
    fut.set_result("m")
    with pytest.raises(ValueError):
        fut.result()
    assert fut.exception() is error
    assert len(convert.calls) == 1  # converted once, its failure kept


def test_a_second_completion_is_refused() -> None:
    fut = ReplyFuture(Converter())
    fut.set_result("m")
    with pytest.raises(cf.InvalidStateError):
        fut.set_result("again")
    with pytest.raises(cf.InvalidStateError):
        fut.set_exception(RuntimeError("late"))
    assert fut.result() == ("converted", "m")


def test_cancel_of_a_pending_future_abandons_its_request_once() -> None:
    fut = ReplyFuture(Converter())
    abandoned: list[int] = []
    fut.on_cancel = abandoned.append
    fut.key = 7
    thread, out = waiting(lambda: fut.result(timeout=WAIT))
    blocked(fut)
    assert fut.cancel()
    assert fut.cancel()  # already cancelled: True, nothing abandoned twice
    thread.join(WAIT)
    assert len(out) == 1 and isinstance(out[0], cf.CancelledError)
    assert abandoned == [7]
    assert fut.cancelled() and fut.done()
    with pytest.raises(cf.CancelledError):
        fut.exception()
    with pytest.raises(cf.InvalidStateError):
        fut.set_result("m")  # the reply that comes anyway (the table dropped it: late)


def test_a_done_future_cannot_be_cancelled() -> None:
    fut = ReplyFuture(Converter())
    abandoned: list[int] = []
    fut.on_cancel = abandoned.append
    fut.set_result("m")
    assert not fut.cancel()
    assert not fut.cancelled() and abandoned == []


def test_set_running_or_notify_cancel_as_a_future() -> None:
    running = ReplyFuture(Converter())
    assert running.set_running_or_notify_cancel()
    assert running.running() and not running.cancel()
    cancelled = ReplyFuture(Converter())
    assert cancelled.cancel()
    assert not cancelled.set_running_or_notify_cancel()
    done = ReplyFuture(Converter())
    done.set_result("m")
    with pytest.raises(RuntimeError):
        done.set_running_or_notify_cancel()


def test_done_callbacks_run_once_with_the_future_and_a_failing_one_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fut = ReplyFuture(Converter())
    seen: list[tuple[str, Any]] = []

    def broken(f: cf.Future[Any]) -> None:
        raise RuntimeError("callback bug")

    fut.add_done_callback(lambda f: seen.append(("before", f)))
    fut.add_done_callback(broken)
    fut.add_done_callback(lambda f: seen.append(("after-broken", f)))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        fut.set_result("m")
    assert seen == [("before", fut), ("after-broken", fut)]
    assert "exception calling callback" in caplog.text
    fut.add_done_callback(lambda f: seen.append(("late", f)))  # done: runs at once
    assert seen[-1] == ("late", fut)


def test_concurrent_futures_wait_and_as_completed() -> None:
    futs = [ReplyFuture(Converter()) for _ in range(3)]
    # FIRST_COMPLETED wakes on one completion made from another thread while it waits.
    thread, out = waiting(lambda: cf.wait(futs, timeout=WAIT, return_when=cf.FIRST_COMPLETED))
    assert wait_until(lambda: all(f._waiters for f in futs), timeout=WAIT)
    futs[1].set_result("b")
    thread.join(WAIT)
    [(done, not_done)] = out
    assert done == {futs[1]} and not_done == {futs[0], futs[2]}
    # A cancelled future is done for wait() at once (no executor tells it later).
    assert futs[2].cancel()
    done, not_done = cf.wait(futs, timeout=0)
    assert done == {futs[1], futs[2]} and not_done == {futs[0]}
    # as_completed: the done ones first, then the others as they complete.
    thread, out = waiting(lambda: list(cf.as_completed(futs, timeout=WAIT)))
    assert wait_until(lambda: bool(futs[0]._waiters), timeout=WAIT)
    futs[0].set_exception(RuntimeError("lost"))
    thread.join(WAIT)
    [order] = out
    assert set(order[:2]) == {futs[1], futs[2]} and order[2] is futs[0]
    assert all(not f._waiters for f in futs)  # every waiter removed itself


def test_asyncio_wrap_future_gets_the_result_and_passes_on_cancellation() -> None:
    async def main() -> tuple[Any, list[int]]:
        fut = ReplyFuture(Converter())
        loop = asyncio.get_running_loop()
        loop.call_soon(threading.Thread(target=fut.set_result, args=("m",)).start)
        value = await asyncio.wrap_future(fut)
        pending = ReplyFuture(Converter())
        abandoned: list[int] = []
        pending.on_cancel = abandoned.append
        pending.key = 3

        async def awaiting() -> Any:  # as rda.aio awaits a get
            return await asyncio.wrap_future(pending)

        task = asyncio.create_task(awaiting())
        await asyncio.sleep(0)  # let the task start awaiting
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pending.cancelled()
        return value, abandoned

    value, abandoned = asyncio.run(main())
    assert value == ("converted", "m")
    assert abandoned == [3]


# -- through a client on real ZeroMQ sockets ---------------------------------------------------


class Held(RequestReplyCallback):
    """Answers gets of HELD only when the test says so (``release``); others at once."""

    def __init__(self) -> None:
        self.held: list[GetRequest] = []
        self.lock = threading.Lock()

    def get(self, request: GetRequest) -> None:
        if request.device == "HELD":
            with self.lock:
                self.held.append(request)
            return
        request.complete(Data(value=request.device))

    def set(self, request: SetRequest) -> None:
        request.complete()

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, []
        for request in held:
            request.complete(Data(value="late"))


@pytest.fixture
def stand(no_thread_leak: None) -> Iterator[tuple[ClientService, Held]]:
    handler = Held()
    server: Server = (
        ServerBuilder("FUTURES")
        .endpoint("tcp://127.0.0.1:0")
        .request_reply(handler)
        .devices("*")
        .directory(None)
        .build()
    )
    server.start()
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(request_timeout=WAIT))
    try:
        yield client, handler
    finally:
        client.close()
        handler.release()
        server.stop()


def test_a_window_of_get_async_futures_on_real_sockets(
    stand: tuple[ClientService, Held],
) -> None:
    client, _ = stand
    ap = client.access_point("PS1", "Acquisition")
    futures = [ap.get_async() for _ in range(64)]
    assert all(isinstance(f, ReplyFuture) for f in futures)
    assert [f.result(timeout=WAIT).data["value"] for f in futures] == ["PS1"] * 64
    done, not_done = cf.wait([ap.get_async() for _ in range(8)], timeout=WAIT)
    assert len(done) == 8 and not not_done
    assert client.statistics().replies == 72


def test_a_cancelled_get_async_is_abandoned_and_its_reply_counted_late(
    stand: tuple[ClientService, Held],
) -> None:
    client, handler = stand
    fut = client.access_point("HELD", "Acquisition").get_async()
    assert wait_until(lambda: len(handler.held) == 1, timeout=WAIT)
    assert fut.cancel()
    assert client.statistics().pending == 0
    handler.release()
    assert wait_until(lambda: client.statistics().late_replies == 1, timeout=WAIT)
    assert fut.cancelled()
