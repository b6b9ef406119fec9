"""``rda.aio``: the asyncio client over the same core, against the real server over tcp."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import rda.aio
import rda.serialization.errors as errors
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.business.server.subscriptions import SubscriptionCallback
from rda.serialization.data import Data
from rda.serialization.header import UpdateType


class Handler(RequestReplyCallback):
    def __init__(self) -> None:
        self.current = 1.0

    def get(self, request: GetRequest) -> None:
        if request.device == "SILENT":
            return
        request.complete(Data(current=self.current))

    def set(self, request: SetRequest) -> None:
        self.current = float(request.data["current"])
        request.complete()


@pytest.fixture
def server(no_thread_leak: None) -> Iterator[Server]:
    srv = (
        ServerBuilder("AIO")
        .request_reply(Handler())
        .subscription(SubscriptionCallback())
        .devices("*")
        .directory(None)
        .build()
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def client_for(server: Server) -> rda.aio.ClientService:
    return rda.aio.ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))


def test_get_and_set_are_coroutines(server: Server) -> None:
    async def main() -> tuple[float, float]:
        async with client_for(server) as client:
            ap = client.access_point("PS1", "Setting")
            before = (await ap.get()).data["current"]
            await ap.set({"current": 4.0})
            after = (await ap.get(timeout=5.0)).data["current"]
            results = await asyncio.gather(*(ap.get() for _ in range(50)))
            assert all(r.data["current"] == 4.0 for r in results)
            return before, after

    assert asyncio.run(main()) == (1.0, 4.0)


def test_admin_without_hook_fails_with_a_typed_error(server: Server) -> None:
    async def main() -> None:
        async with client_for(server) as client:
            with pytest.raises(errors.NoSuchDeviceError):
                await client.admin(server.endpoint, "ping")

    asyncio.run(main())


def test_async_iteration_of_a_subscription(server: Server) -> None:
    def publish() -> None:
        for i in range(3):
            for source in server.subscriptions():
                source.notify(Data(current=float(i)))

    async def main() -> list[UpdateType]:
        async with client_for(server) as client:
            ap = client.access_point("PS1", "Acquisition")
            sub = ap.subscribe()
            seen: list[UpdateType] = []
            async for n in sub:
                seen.append(n.update_type)
                if n.update_type is UpdateType.FIRST:
                    # Publish from another thread, as equipment code would.
                    threading.Thread(target=publish, name="publisher").start()
                if len(seen) == 4:
                    sub.close()  # ends the loop
            assert sub.closed
            return seen

    seen = asyncio.run(main())
    assert seen[0] is UpdateType.FIRST and seen[1:] == [UpdateType.NORMAL] * 3


def test_poll_times_out_with_none_and_cancellation_abandons_the_request(server: Server) -> None:
    async def main() -> None:
        async with client_for(server) as client:
            sub = client.access_point("PS1", "Acquisition").subscribe()
            first = await sub.poll(10)
            assert first is not None and first.update_type is UpdateType.FIRST
            assert await sub.poll(0.05) is None
            sub.close()
            assert await sub.poll(5) is None  # ended: at once
            task = asyncio.create_task(client.access_point("SILENT", "P").get(timeout=30))
            while client.statistics().pending == 0:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client.statistics().pending == 0
            with pytest.raises(errors.TimeoutError, match="SILENT/P"):
                await client.access_point("SILENT", "P").get(timeout=0.05)

    asyncio.run(main())
