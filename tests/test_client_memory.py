"""The client runtime over ``rda.testing.MemoryNetwork`` with a small protocol-speaking server.

Real dispatcher threads, real frames (encoded and decoded by ``rda.transport.protocol``), no
sockets: concurrency, timeouts, subscriptions, restarts and shutdown of the whole client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import rda.serialization.errors as errors
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import (
    DataContext,
    Header,
    RequestType,
    UpdateType,
    encode_context,
)
from rda.serialization.message import BodyKind, Message, encode_exception
from rda.testing import wait_until
from rda.testing._clock import FakeClock
from rda.testing._memory import MemoryNetwork
from rda.transport.api import ClientHandler, ServerTransport, TransportSettings
from rda.transport.protocol import Kind, encode_message

SERVER = "mem://ps-server"


class MemDirectory:
    """Every device lives on the one memory server (StaticDirectory wants tcp/ipc/inproc)."""

    def resolve(self, device: str) -> str:
        if device.startswith("NOPE"):
            raise errors.NoSuchDeviceError(f"{device}: no such device in the test directory")
        return SERVER

    def devices(self) -> dict[str, str]:
        return {}


class FakeServer:
    """A ServerHandler answering GET/SET/SUBSCRIBE/ADMIN the way docs/protocol.md says.

    Device "SILENT" never answers; "BROKEN" answers with an exception; a batch of GETs to
    "BATCH" is held until ``batch`` of them arrived, then answered in reverse order.
    """

    def __init__(self, batch: int = 0) -> None:
        self.transport: ServerTransport | None = None
        self.lock = threading.Lock()
        self.values: dict[str, Data] = {}
        self.subs: dict[tuple[bytes, int], list[Any]] = {}  # -> [header, seq]
        self.batch = batch
        self.held: list[tuple[bytes, Header]] = []
        self.subscribed = threading.Event()
        self.late: list[tuple[bytes, Header]] = []

    def release_late(self) -> None:
        with self.lock:
            late, self.late = self.late, []
        for peer, h in late:
            self.reply(peer, h, RequestType.REPLY, self.value_body(Data(late=True)))

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        pass

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        with self.lock:
            for key in [k for k in self.subs if k[0] == peer]:
                del self.subs[key]

    def reply(self, peer: bytes, header: Header, rtype: RequestType, body: list[Any]) -> None:
        assert self.transport is not None
        out = Header(rtype, header.id, header.device, header.property, header.selector)
        self.transport.send(peer, encode_message(Kind.REPLY, out, body))

    def on_message(self, peer: bytes, message: Message) -> None:
        h = message.header
        rt = h.request_type
        if rt is RequestType.GET:
            if h.device == "SILENT":
                return
            if h.device == "LATE":
                with self.lock:
                    self.late.append((peer, h))
                return
            if h.device == "BROKEN":
                exc = encode_exception("ZeroDivisionError", "division by zero")
                self.reply(peer, h, RequestType.EXCEPTION, [(BodyKind.EXCEPTION, exc)])
                return
            if h.device == "BATCH":
                with self.lock:
                    self.held.append((peer, h))
                    if len(self.held) < self.batch:
                        return
                    held, self.held = self.held, []
                for p, hh in reversed(held):
                    self.reply(p, hh, RequestType.REPLY, self.value_body(Data(id=hh.id)))
                return
            value = self.values.get(h.device, Data(current=0.0))
            self.reply(peer, h, RequestType.REPLY, self.value_body(value))
        elif rt is RequestType.SET:
            assert message.data is not None
            self.values[h.device] = message.data
            self.reply(peer, h, RequestType.REPLY, [])
        elif rt is RequestType.SUBSCRIBE:
            with self.lock:
                entry = self.subs[(peer, h.id)] = [h, 0]
            self.notify_one(peer, entry, Data(first=True), UpdateType.FIRST)
            self.subscribed.set()
        elif rt is RequestType.UNSUBSCRIBE:
            with self.lock:
                self.subs.pop((peer, h.id), None)
        elif rt is RequestType.ADMIN:
            self.reply(peer, h, RequestType.REPLY, [(BodyKind.DATA, binary.encode(Data(ok=1)))])

    @staticmethod
    def value_body(value: Data, seq: int = 0) -> list[tuple[BodyKind, bytes]]:
        return [
            (BodyKind.DATA, binary.encode(value)),
            (BodyKind.DATA_CONTEXT, encode_context(DataContext("CYCLE", 5, 6), seq)),
        ]

    def notify_one(self, peer: bytes, entry: list[Any], value: Data, update: UpdateType) -> None:
        assert self.transport is not None
        header: Header = entry[0]
        entry[1] += 1
        out = Header(
            RequestType.NOTIFICATION_DATA, header.id, header.device, header.property, "", update
        )
        self.transport.send(peer, encode_message(Kind.REPLY, out, self.value_body(value, entry[1])))

    def publish(self, value: Data, skip: int = 0) -> None:
        """Notify every subscriber; ``skip`` sequence numbers are burnt first (a server gap)."""
        with self.lock:
            entries = list(self.subs.items())
        for (peer, _), entry in entries:
            entry[1] += skip
            self.notify_one(peer, entry, value, UpdateType.NORMAL)


Env = tuple[MemoryNetwork, FakeServer, ClientService]


def make_env(
    batch: int = 0, clock: FakeClock | None = None, **config: Any
) -> tuple[MemoryNetwork, FakeServer, ClientService]:
    network = MemoryNetwork(clock)
    fake = FakeServer(batch)
    server = network.server(SERVER, fake)
    fake.transport = server
    server.start()

    def factory(h: ClientHandler, s: TransportSettings, i: dict[str, Any]) -> Any:
        return network.client(h, s, i)

    cfg = Config(**{"request_timeout": 5.0, "reconnect_initial": 0.02, **config})
    client = ClientService(MemDirectory(), cfg, transport_factory=factory, clock=clock)
    return network, fake, client


@pytest.fixture
def env(no_thread_leak: None) -> Iterator[Env]:
    network, fake, client = make_env(batch=1000)
    try:
        yield network, fake, client
    finally:
        client.close()
        network.close()


def test_get_set_round_trip(env: Env) -> None:
    _, _, client = env
    ap = client.access_point("PS1", "Setting")
    ap.set(Data(current=2.5))
    acq = ap.get(timeout=5.0)
    assert acq.data == Data(current=2.5)
    assert acq.context.cycle_name == "CYCLE"
    assert client.admin(SERVER, "ping") == Data(ok=1)


def test_thousand_concurrent_gets_answered_in_reverse_are_matched(env: Env) -> None:
    _, _, client = env
    ap = client.access_point("BATCH", "Acquisition")
    futures = [ap.get_async() for _ in range(1000)]
    ids = [f.result(timeout=10).data["id"] for f in futures]
    assert len(set(ids)) == 1000 and ids == sorted(ids)
    stats = client.statistics()
    assert (stats.replies, stats.pending, stats.late_replies) == (1000, 0, 0)


def test_remote_error_and_unknown_device(env: Env) -> None:
    _, _, client = env
    with pytest.raises(errors.RemoteError, match=r"BROKEN/Acquisition.*division by zero") as info:
        client.access_point("BROKEN", "Acquisition").get()
    assert info.value.type == "ZeroDivisionError"
    with pytest.raises(errors.NoSuchDeviceError, match="NOPE1"):
        client.access_point("NOPE1", "Acquisition").get()


def test_real_clock_timeout_then_late_reply_is_not_delivered(env: Env) -> None:
    _, _, client = env
    started = time.monotonic()
    with pytest.raises(errors.TimeoutError, match="SILENT/Acquisition"):
        client.access_point("SILENT", "Acquisition").get(timeout=0.05)
    assert time.monotonic() - started < 5.0
    assert client.statistics().timeouts == 1


def test_subscription_first_normal_and_server_gap(env: Env) -> None:
    _, fake, client = env
    sub = client.access_point("PS1", "Acquisition").subscribe()
    first = sub.poll(10)
    assert first is not None and first.update_type is UpdateType.FIRST
    assert first.data == Data(first=True)
    fake.publish(Data(v=1))
    fake.publish(Data(v=2), skip=3)
    one, two = sub.poll(10), sub.poll(10)
    assert one is not None and two is not None
    assert (one.data["v"], one.gap, two.data["v"], two.gap) == (1, 0, 2, 3)
    sub.close()
    wait_until(lambda: not fake.subs)  # the server got UNSUBSCRIBE


def test_server_restart_resubscribes_with_a_first_update(env: Env) -> None:
    network, fake, client = env
    received: list[Any] = []
    sub = client.access_point("PS1", "Acquisition").subscribe(listener=received.append)
    wait_until(lambda: len(received) == 1)
    pending = client.access_point("SILENT", "Acquisition").get_async(timeout=30)
    wait_until(lambda: client.statistics().pending == 1)
    new = network.restart_server(SERVER)
    fake.transport = new
    restarted = time.monotonic()
    with pytest.raises(errors.DisconnectedError, match=r"SILENT/Acquisition.*mem://ps-server"):
        pending.result(timeout=10)
    wait_until(lambda: len(received) >= 3)
    resumed = time.monotonic() - restarted
    assert isinstance(received[1].error, errors.DisconnectedError)
    assert received[2].update_type is UpdateType.FIRST and received[2].gap == 0
    fake.publish(Data(v=7))
    wait_until(lambda: len(received) >= 4)
    assert received[3].data == Data(v=7) and received[3].gap == 0
    assert client.statistics().reconnects == 1
    print(f"memory-network resume after restart: {resumed * 1000:.1f} ms")
    sub.close()


def test_close_is_bounded_and_leaves_no_threads(no_thread_leak: None) -> None:
    network, fake, client = make_env()
    try:
        sub = client.access_point("PS1", "Acquisition").subscribe(listener=lambda n: None)
        wait_until(fake.subscribed.is_set)
        silent = client.access_point("SILENT", "Acquisition").get_async()
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < 3.0
        with pytest.raises(errors.DisconnectedError, match="client closed"):
            silent.result(timeout=1)
        assert sub.closed
    finally:
        client.close()
        network.close()


def test_fake_clock_timeout_and_late_reply_over_the_memory_network(no_thread_leak: None) -> None:
    clock = FakeClock()
    network, fake, client = make_env(clock=clock)
    try:
        ap = client.access_point("LATE", "Acquisition")
        late = ap.get_async(timeout=2.0)
        on_time = client.access_point("PS1", "Acquisition").get_async(timeout=2.0)
        assert on_time.result(timeout=10).data == Data(current=0.0)
        wait_until(lambda: len(fake.late) == 1)
        clock.advance(1.9)
        assert not late.done()
        clock.advance(0.2)
        with pytest.raises(errors.TimeoutError, match="LATE/Acquisition"):
            late.result(timeout=10)
        fake.release_late()
        wait_until(lambda: client.statistics().late_replies == 1)
        stats = client.statistics()
        assert (stats.timeouts, stats.pending, stats.replies) == (1, 0, 1)
    finally:
        client.close()
        network.close()
