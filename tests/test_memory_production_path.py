"""A business layer on ``rda.testing.MemoryNetwork`` takes the path it takes in production.

Before the session core (issue 32) the in-memory transports had no lanes and could not hand
over, so every test on a ``MemoryNetwork`` ran the dispatcher -> worker -> dispatcher path
while production ran blocking calls on the caller's lane and handlers inline on the server's
dispatcher. These tests pin the production path down on the in-memory transports.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import rda
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.testing import FakeClock, MemoryNetwork
from rda.testing._memory import OneServerDirectory
from rda.transport.api import ClientHandler, ServerHandler, TransportSettings


class Supply(rda.Device):
    def __init__(self) -> None:
        self.threads: list[str] = []
        self.release = threading.Event()
        self.current = 0.0

    @rda.prop("Current")
    def current_prop(self, request: rda.GetRequest) -> rda.Data:
        self.threads.append(threading.current_thread().name)
        return rda.Data(value=self.current)

    @current_prop.setter  # type: ignore[no-redef]
    def current_prop(self, data: rda.Data, request: rda.SetRequest) -> None:
        self.threads.append(threading.current_thread().name)
        self.current = data.get_float("value")

    @rda.prop("Slow")
    def slow(self, request: rda.GetRequest) -> rda.Data:
        self.release.wait(10.0)
        return rda.Data(value=1.0)


@pytest.fixture
def stand() -> Iterator[tuple[MemoryNetwork, Supply, rda.Server, ClientService]]:
    clock = FakeClock()
    network = MemoryNetwork(clock=clock)
    supply = Supply()

    def server_transport(h: ServerHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.server("srv", h, s, info)

    server = (
        rda.ServerBuilder("Srv")
        .device("PS1", supply)
        .device("PS2", Supply())
        .directory(None)
        .transport(server_transport)
        .clock(clock)
        .build()
        .start()
    )

    def client_transport(h: ClientHandler, s: TransportSettings, info: dict[str, Any]) -> Any:
        return network.client(h, s, info)

    client = ClientService(
        directory=OneServerDirectory(server.endpoint),
        config=Config(),
        transport_factory=client_transport,
        clock=clock,
    )
    try:
        yield network, supply, server, client
    finally:
        supply.release.set()
        client.close()
        server.stop()
        network.close()


def test_blocking_calls_take_a_lane_and_handlers_run_inline(
    stand: tuple[MemoryNetwork, Supply, rda.Server, ClientService],
) -> None:
    _, supply, server, client = stand
    ap = client.access_point("PS1", "Current")
    ap.get(timeout=10.0)  # the first call connects through the dispatcher
    ap.set(rda.Data(value=2.5), timeout=10.0)
    assert ap.get(timeout=10.0).data["value"] == 2.5
    transport = client.statistics().transport
    assert transport.lanes == 1, "blocking calls did not take a lane"
    assert server.statistics().transport.lanes == 1
    # Every handler ran on the server's dispatcher (inline), none on a worker.
    assert supply.threads and all(n.startswith("rda-memory-server") for n in supply.threads), (
        supply.threads
    )


def test_a_long_handler_is_handed_over_and_the_server_keeps_serving(
    stand: tuple[MemoryNetwork, Supply, rda.Server, ClientService],
) -> None:
    _, supply, server, client = stand
    slow = client.access_point("PS1", "Slow").get_async(timeout=10.0)
    # Another device's request, answered while the slow handler still blocks the thread it
    # started on (one device's requests run in order, so it must be another device).
    assert client.access_point("PS2", "Current").get(timeout=10.0).data["value"] == 0.0
    assert not slow.done()
    assert server.statistics().transport.handovers >= 1
    supply.release.set()
    assert slow.result(timeout=10.0).data["value"] == 1.0
