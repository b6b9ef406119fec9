"""The asyncio flavour of the client: the same names, as coroutines and async iterators.

A thin layer over the blocking client's core (as pyzmq's ``_future.py`` is): requests
are the core's ``concurrent.futures`` futures wrapped with ``asyncio.wrap_future`` (their
result is decoded in the event loop's thread, not on the dispatcher), and subscriptions are
the core's queues, with the dispatcher waking the loop through ``call_soon_threadsafe`` when a
notification lands in an empty queue. Cancelling an awaiting task abandons its request.

```python
async with rda.aio.ClientService() as client:
    ap = client.access_point("PS1", "Acquisition")
    acq = await ap.get()
    await ap.set(rda.Data(current=2.5))
    async for n in ap.subscribe():
        print(n.data)
```
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator, Mapping
from typing import Any

from rda.business.client import service as core
from rda.business.client.history import TABLE_CHUNK_ROWS, TimeLike
from rda.business.client.statistics import ClientStatistics
from rda.business.client.subscriptions import Notification
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import Directory
from rda.business.metadata import PropertyDescription
from rda.serialization.data import Data

__all__ = ["AccessPoint", "ClientService", "Subscription"]


class ClientService:
    """``rda.ClientService`` for asyncio code; same arguments, same names, awaitable."""

    def __init__(
        self,
        directory: Directory | None = None,
        config: Config | None = None,
        **hooks: Any,
    ) -> None:
        self.core = core.ClientService(directory, config, **hooks)

    def __repr__(self) -> str:
        return f"<rda.aio.ClientService over {self.core!r}>"

    async def __aenter__(self) -> ClientService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def access_point(self, device: str, prop: str) -> AccessPoint:
        return AccessPoint(self.core.access_point(device, prop))

    async def admin(
        self, target: str, command: str, timeout: float | None = None, **args: Any
    ) -> Data:
        result: Data = await asyncio.wrap_future(
            self.core.admin_async(target, command, timeout, **args)
        )
        return result

    async def history(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> list[Notification]:
        """``ClientService.history`` in a worker thread (its chunks are blocking gets, asked
        one after the other: docs/client.md, "History")."""
        return await asyncio.to_thread(
            self.core.history, device, prop, start, end, selector, limit, timeout
        )

    async def history_table(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``ClientService.history_table`` (a ``pyarrow.Table``) in a worker thread."""
        return await asyncio.to_thread(
            self.core.history_table, device, prop, start, end, selector, limit, timeout
        )

    async def history_batches(
        self,
        device: str,
        prop: str,
        start: TimeLike,
        end: TimeLike = None,
        selector: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
        chunk_rows: int = TABLE_CHUNK_ROWS,
    ) -> AsyncIterator[Any]:
        """``ClientService.history_batches`` as an async iterator of ``pyarrow.RecordBatch``
        es: each chunk is fetched in a worker thread when the batches before it have been
        consumed (the same flow control); leaving the loop early stops asking."""
        batches = self.core.history_batches(
            device, prop, start, end, selector, limit, timeout, chunk_rows
        )
        done = object()
        while True:
            batch = await asyncio.to_thread(next, batches, done)
            if batch is done:
                return
            yield batch

    def statistics(self) -> ClientStatistics:
        return self.core.statistics()

    def close(self, timeout: float = 2.0) -> None:
        """Bounded (joins the client's threads, normally in milliseconds); idempotent."""
        self.core.close(timeout)


class AccessPoint:
    """``get``/``set`` are coroutines; ``subscribe`` returns an async iterator."""

    __slots__ = ("core",)

    def __init__(self, access_point: core.AccessPoint) -> None:
        self.core = access_point

    def __repr__(self) -> str:
        return f"<rda.aio.AccessPoint {self.device}/{self.property}>"

    @property
    def device(self) -> str:
        return self.core.device

    @property
    def property(self) -> str:
        return self.core.property

    async def get(
        self,
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> AcquiredData:
        result: AcquiredData = await asyncio.wrap_future(
            self.core.get_async(selector, filters, timeout)
        )
        return result

    async def describe(self, timeout: float | None = None) -> PropertyDescription:
        """The property's declared metadata (``rda.AccessPoint.describe``)."""
        result: PropertyDescription = await asyncio.wrap_future(self.core.describe_async(timeout))
        return result

    async def set(
        self,
        data: Data | Mapping[str, Any],
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        await asyncio.wrap_future(self.core.set_async(data, selector, filters, timeout))

    def subscribe(
        self,
        selector: str | None = None,
        filters: Data | Mapping[str, Any] | None = None,
        queue_size: int = 1000,
        backfill: float | datetime.timedelta | None = None,
        backfill_columnar: bool = False,
    ) -> Subscription:
        """Subscribe from a running event loop; iterate with ``async for``. ``backfill`` and
        ``backfill_columnar``: as the blocking ``AccessPoint.subscribe`` (the recorded past
        first, marked HISTORY; columnar: as ``rda.HistoryChunk`` s)."""
        loop = asyncio.get_running_loop()
        core_sub = self.core.subscribe(
            selector, filters, None, queue_size, backfill, backfill_columnar
        )
        return Subscription(core_sub, loop)


class Subscription:
    """An async iterator over a core subscription's notifications."""

    def __init__(self, subscription: core.Subscription, loop: asyncio.AbstractEventLoop) -> None:
        self.core = subscription
        self._loop = loop
        self._event = asyncio.Event()
        subscription.set_wakeup(self._wake_from_dispatcher)

    def __repr__(self) -> str:
        return f"<rda.aio.Subscription over {self.core!r}>"

    @property
    def closed(self) -> bool:
        return self.core.closed

    def _wake_from_dispatcher(self) -> None:
        # A closed loop raises RuntimeError: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._event.set)

    async def poll(self, timeout: float | None = None) -> Notification | None:
        """The next notification, or None after ``timeout`` seconds or once ended."""
        try:
            async with asyncio.timeout(timeout):
                return await self._next()
        except TimeoutError:
            return None

    async def _next(self) -> Notification | None:
        while True:
            # Clear before looking: a wake-up arriving after the look sets it again.
            self._event.clear()
            notification = self.core.poll_nowait()
            if notification is not None or self.core.closed:
                return notification
            await self._event.wait()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Notification:
        notification = await self._next()
        if notification is None:
            raise StopAsyncIteration
        return notification

    def close(self) -> None:
        """Unsubscribe; idempotent. A pending ``async for`` ends."""
        self.core.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
