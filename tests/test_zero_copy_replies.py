"""A get reply's big writable array goes out of band without a copy when nothing but the reply
can reach it once the handler returned (rda.business.server.replies), and is copied as it is
at ``complete()`` whenever the device can still reach it.

The server tests record the frames the server hands its transport (the in-memory network,
whose dispatcher thread reads them later, as libzmq does): a zero-copy ARRAY frame is the
handler's own memory (same address); a copied reply has no ARRAY frame, and what it carries
stays what it was at ``complete()`` after the device writes to every array it kept."""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rda import implementation
from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.server import runner
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device as DeclaredDevice
from rda.business.server.replies import (
    Hidden,
    hand_over,
    references_a_completion_hides,
    references_not_in_frames,
)
from rda.business.server.requests import GetRequest, RequestReplyCallback, completed_with
from rda.serialization import binary
from rda.serialization import errors as rda_errors
from rda.serialization.data import Data
from rda.serialization.header import DataContext
from rda.serialization.message import BodyKind, Message
from rda.testing import FakeClock, MemoryNetwork, OneServerDirectory
from rda.transport.api import Buffer, ClientHandler, ServerHandler, TransportSettings
from rda.transport.protocol import Incoming, decode_frames

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
N = 131_072  # float64 elements: 1 MiB
MODULE_WAVE = np.arange(N, dtype=np.float64)  # a writable module constant

Array = np.ndarray[Any, Any]


def full(value: float) -> Array:
    return np.full(N, value)


class Device(RequestReplyCallback):
    """One property per way a handler can build or keep what it answers with."""

    def __init__(self) -> None:
        self.kept = np.arange(N, dtype=np.float64)
        self.buffer = np.arange(2 * N, dtype=np.float64)
        self.cache = Data(wave=np.arange(N, dtype=np.float64) * 2)
        self.last: AcquiredData | None = None
        self.stored: Array | None = None
        self.refs: list[weakref.ref[Array]] = []
        self.addresses: dict[str, int] = {}
        self.pending: list[GetRequest] = []
        self.requests: list[GetRequest] = []
        self.unstamped: AcquiredData | None = None
        self.written = Data(wave=np.arange(N, dtype=np.float64) * 4)
        self.unstamped_written: AcquiredData | None = None
        self.stamped_written: AcquiredData | None = None
        self.waiting = threading.Event()
        wave = np.arange(N, dtype=np.float64) * 3
        self.closure: Callable[[], Array] = lambda: wave
        self.getter: Callable[[], Array] | None = None

    def fresh(self, prop: str, value: float) -> Array:
        """A new writable 1 MiB array; only its address is remembered (no reference)."""
        arr = np.empty(N)
        arr.fill(value)
        self.addresses[prop] = arr.ctypes.data
        return arr

    def get(self, request: GetRequest) -> None:
        p = request.property
        # Nothing but the reply holds these once get returns: zero-copy.
        if p == "Fresh":
            arr = self.fresh(p, 1.0)
            data = Data(wave=arr, n=1)
            request.complete(data)
        elif p == "Inline":
            request.complete(Data(wave=self.fresh(p, 2.0)))
        elif p == "Reshaped":  # a view whose base only the view holds
            request.complete(Data(image=self.fresh(p, 3.0).reshape(2, N // 2)))
        elif p == "Nested":
            request.complete(Data(inner=Data(wave=self.fresh(p, 4.0)), x=1.5))
        elif p == "Items":
            request.complete(Data(items=[Data(wave=self.fresh(p, 5.0)), Data(x=1)]))
        elif p == "KeepsRequest":  # the request reaches nothing of the reply once sent
            self.requests.append(request)
            request.complete(Data(wave=self.fresh(p, 11.0)))
        elif p == "Acquired":  # docs/server.md's way: stamped() copies the AcquiredData
            data = Data(wave=self.fresh(p, 14.0))
            request.complete(AcquiredData(data))
        elif p == "AcquiredLocal":  # the handler's AcquiredData in a local of its own
            acquired = AcquiredData(Data(wave=self.fresh(p, 15.0)))
            request.complete(acquired)
        elif p == "Stamped":  # the handler's own stamp: complete() sends this AcquiredData
            request.complete(AcquiredData(Data(wave=self.fresh(p, 16.0)), DataContext(acq_stamp=1)))
        elif p == "Raises":
            request.complete(Data(wave=self.fresh(p, 8.0)))
            raise RuntimeError("the handler fails after completing")
        # The device can still reach these: copied, as they are at complete().
        elif p == "Kept":
            request.complete(Data(wave=self.kept))
            self.kept[:] = -1.0  # right after complete(): the client must not see it
        elif p == "KeptLocal":
            arr = self.kept
            request.complete(Data(wave=arr))
            arr += 100.0
        elif p == "Constant":
            request.complete(Data(wave=MODULE_WAVE))
        elif p == "Closure":
            request.complete(Data(wave=self.closure()))
        elif p == "CellKept":
            self.cell_kept(request)
        elif p == "Cached":
            request.complete(self.cache)
        elif p == "SharedCopy":  # Data.copy() shares the values
            request.complete(self.cache.copy())
        elif p == "View":  # a view of a buffer the device keeps
            request.complete(Data(wave=self.buffer[:N]))
            self.buffer[:] = -2.0
        elif p == "Weak":
            arr = self.fresh(p, 6.0)
            self.refs.append(weakref.ref(arr))
            request.complete(Data(wave=arr))
        elif p == "KeptAcquired":
            self.last = AcquiredData(Data(wave=self.fresh(p, 7.0)), DataContext(acq_stamp=1))
            request.complete(self.last)
        elif p == "KeptUnstamped":  # stamped() makes a new AcquiredData sharing the Data
            self.unstamped = AcquiredData(Data(wave=self.fresh(p, 12.0)))
            request.complete(self.unstamped)
        # The device keeps the Data, the AcquiredData it passes, or the one complete() sends,
        # and writes after complete(): the client must not see it.
        elif p == "CachedWritten":
            request.complete(self.written)
            self.written["wave"][:] = -4.0
        elif p == "KeptUnstampedWritten":
            self.unstamped_written = AcquiredData(Data(wave=self.fresh(p, 17.0)))
            request.complete(self.unstamped_written)
            self.unstamped_written.data["wave"][:] = -4.0
        elif p == "KeptAcquiredWritten":
            self.stamped_written = AcquiredData(
                Data(wave=self.fresh(p, 18.0)), DataContext(acq_stamp=1)
            )
            request.complete(self.stamped_written)
            self.stamped_written.data["wave"][:] = -4.0
        elif p == "Bytearray":  # memory a bytearray owns, not the array
            request.complete(Data(wave=np.frombuffer(bytearray(N * 8), dtype=np.float64)))
        elif p == "StoredAfter":  # kept only after complete(): copied when the handler returns
            arr = self.fresh(p, 9.0)
            request.complete(Data(wave=arr))
            self.stored = arr
        elif p == "OtherThread":  # completed by another thread while get still runs

            def complete_elsewhere() -> None:
                arr = self.fresh(p, 13.0)
                request.complete(Data(wave=arr))
                arr[:] = -13.0  # right after complete(): the client must not see it

            worker = threading.Thread(target=complete_elsewhere)
            worker.start()
            worker.join(WAIT)
        elif p == "Later":  # completed from another thread, after get returned
            self.pending.append(request)
            self.waiting.set()
        else:
            raise AssertionError(p)

    def cell_kept(self, request: GetRequest) -> None:
        """A local that a closure the device keeps captured (a cell: in its own function, as a
        captured name is a cell in the whole function, and get's ``arr`` must stay plain)."""
        arr = np.arange(N, dtype=np.float64)
        self.getter = lambda: arr
        request.complete(Data(wave=arr))
        arr[:] = -3.0

    def scribble(self) -> None:
        """Write to every array the device can still reach."""
        for arr in (self.kept, self.buffer, self.cache["wave"], self.closure(), self.stored):
            if arr is not None:
                arr[:] = -7.0
        if self.getter is not None:
            self.getter()[:] = -7.0
        for acquired in (self.last, self.unstamped):
            if acquired is not None:
                acquired.data["wave"][:] = -7.0
        for ref in self.refs:
            target = ref()
            if target is not None:
                target[:] = -7.0


ZERO_COPY = {
    "Fresh": ("wave", full(1.0)),
    "Inline": ("wave", full(2.0)),
    "Reshaped": ("image", full(3.0).reshape(2, N // 2)),
    "Raises": ("wave", full(8.0)),
    "KeepsRequest": ("wave", full(11.0)),
    "Acquired": ("wave", full(14.0)),
    "AcquiredLocal": ("wave", full(15.0)),
    "Stamped": ("wave", full(16.0)),
}


def copied_cases() -> dict[str, Array]:
    """What each copied property must deliver: the values at complete()."""
    base = np.arange(N, dtype=np.float64)
    return {
        "Kept": base,
        "KeptLocal": base,
        "Constant": base,
        "Closure": base * 3,
        "CellKept": base,
        "Cached": base * 2,
        "SharedCopy": base * 2,
        "View": base,
        "Weak": full(6.0),
        "KeptAcquired": full(7.0),
        "KeptUnstamped": full(12.0),
        "Bytearray": np.zeros(N),
        "StoredAfter": full(9.0),
        "CachedWritten": base * 4,
        "KeptUnstampedWritten": full(17.0),
        "KeptAcquiredWritten": full(18.0),
    }


class Stand:
    """A server on an in-memory network whose transport records every frame list it sends.
    Its handlers run on workers (without a transport that hands dispatching over, only
    declared properties run inline); test_inline_and_worker_handlers_over_zeromq covers the
    dispatcher."""

    def __init__(self) -> None:
        self.network = MemoryNetwork()
        self.device = Device()
        self.sent: list[list[Buffer]] = []
        network = self.network

        def server_transport(
            h: ServerHandler, settings: TransportSettings, info: dict[str, Any]
        ) -> Any:
            transport = network.server("zc", h, settings, info)
            send = transport.send

            def recording(
                peer: bytes, frames: Sequence[Buffer], conflate_key: int | None = None
            ) -> None:
                self.sent.append(list(frames))
                send(peer, frames, conflate_key)

            transport.send = recording  # type: ignore[method-assign]
            return transport

        self.server: Server = (
            ServerBuilder("ZeroCopy")
            .request_reply(self.device)
            .devices("D")
            .directory(None)
            .transport(server_transport)
            .build()
            .start()
        )

        def client_transport(
            h: ClientHandler, settings: TransportSettings, info: dict[str, Any]
        ) -> Any:
            return network.client(h, settings, info)

        self.client = ClientService(
            OneServerDirectory(self.server.endpoint),
            Config(workers=1),
            transport_factory=client_transport,
        )

    def get(self, prop: str) -> Data:
        return self.client.access_point("D", prop).get(timeout=WAIT).data

    def reply(self, prop: str) -> list[Buffer]:
        """The frames of the last reply to a get of ``prop``."""
        for frames in reversed(self.sent):
            event = decode_frames(frames, from_server=True)
            if isinstance(event, Incoming) and event.message.header.property == prop:
                return frames
        raise AssertionError(f"no reply to {prop} was sent")

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.network.close()


@pytest.fixture
def stand() -> Iterator[Stand]:
    s = Stand()
    try:
        yield s
    finally:
        s.close()


def message_of(frames: list[Buffer]) -> Message:
    event = decode_frames(frames, from_server=True)
    assert isinstance(event, Incoming)
    return event.message


def array_frames(frames: list[Buffer]) -> list[Buffer]:
    return [frame for kind, frame in message_of(frames).body if kind is BodyKind.ARRAY]


def address(frame: Buffer) -> int:
    return int(np.frombuffer(frame, dtype=np.uint8).ctypes.data)


def first_array(data: Data) -> Array:
    for value in data.values():
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, Data):
            return first_array(value)
        if isinstance(value, list) and value and isinstance(value[0], Data):
            return first_array(value[0])
    raise AssertionError(f"no array in {data!r}")


# -- zero-copy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("prop", [*ZERO_COPY, "Nested", "Items"])
def test_an_array_the_handler_built_and_let_go_is_sent_without_a_copy(
    stand: Stand, prop: str
) -> None:
    values = {"Nested": full(4.0), "Items": full(5.0)}
    expected = ZERO_COPY[prop][1] if prop in ZERO_COPY else values[prop]
    got = first_array(stand.get(prop))
    assert np.array_equal(got, expected) and not got.flags.writeable
    (frame,) = array_frames(stand.reply(prop))
    # The frame handed to the transport is the handler's own array: no memcpy happened.
    assert address(frame) == stand.device.addresses[prop]
    stats = stand.server.statistics()
    assert (stats.zero_copy_replies, stats.copied_replies) == (1, 0)
    if prop == "Raises":
        assert stats.handler_errors == 1 and stats.requests[("get", "ok")] == 1


# -- copied ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prop", list(copied_cases()))
def test_an_array_the_device_can_reach_is_copied_as_it_was_at_complete(
    stand: Stand, prop: str
) -> None:
    expected = copied_cases()[prop]
    constant = MODULE_WAVE.copy()
    try:
        got = first_array(stand.get(prop))
        assert np.array_equal(got, expected)
        frames = stand.reply(prop)
        assert array_frames(frames) == []  # in the DATA body: copied at encode time
        # Whatever the device writes now, the frames it was sent in keep the old values
        # (they would change, or the device's write would fail, had the array been handed
        # over zero-copy).
        stand.device.scribble()
        MODULE_WAVE[:] = -7.0
        data = message_of(frames).data
        assert data is not None and np.array_equal(first_array(data), expected)
    finally:
        MODULE_WAVE[:] = constant
    # The device's own arrays are left writable.
    assert stand.device.kept.flags.writeable and stand.device.buffer.flags.writeable
    assert MODULE_WAVE.flags.writeable and stand.device.cache["wave"].flags.writeable
    if stand.device.stored is not None:
        assert stand.device.stored.flags.writeable
    stats = stand.server.statistics()
    assert (stats.zero_copy_replies, stats.copied_replies) == (0, 1)


def test_a_get_completed_from_another_thread_is_copied(stand: Stand) -> None:
    results: list[Data] = []
    getter = threading.Thread(target=lambda: results.append(stand.get("Later")))
    getter.start()
    try:
        assert stand.device.waiting.wait(WAIT)
        wave = full(10.0)
        (request,) = stand.device.pending
        request.complete(Data(wave=wave))
        wave[:] = -7.0  # right after complete(): the client must not see it
    finally:
        getter.join(WAIT)
    assert np.array_equal(results[0]["wave"], full(10.0))
    assert array_frames(stand.reply("Later")) == []
    assert wave.flags.writeable
    assert stand.server.statistics().copied_replies == 1


def test_a_get_completed_by_another_thread_while_its_handler_runs_is_copied(
    stand: Stand,
) -> None:
    """The runner's frame is on the handler's thread only: a completion elsewhere finds no
    frames it could wait for, so the reply leaves at once, copied."""
    data = stand.get("OtherThread")
    assert np.array_equal(data["wave"], full(13.0))
    assert array_frames(stand.reply("OtherThread")) == []
    stats = stand.server.statistics()
    assert (stats.zero_copy_replies, stats.copied_replies) == (0, 1)


def test_a_reply_mixing_a_fresh_and_a_kept_array_is_copied_at_complete() -> None:
    class Mixed(RequestReplyCallback):
        def __init__(self) -> None:
            self.kept = full(1.0)

        def get(self, request: GetRequest) -> None:
            request.complete(Data(fresh=full(2.0), kept=self.kept))
            self.kept[:] = -1.0

    mixed = Mixed()
    srv = ServerBuilder("Mixed").request_reply(mixed).devices("D").directory(None).build()
    srv.start()
    try:
        with ClientService(OneServerDirectory(srv.endpoint), Config(workers=1)) as client:
            data = client.access_point("D", "P").get(timeout=WAIT).data
        assert np.array_equal(data["fresh"], full(2.0))
        assert np.array_equal(data["kept"], full(1.0))
        assert srv.statistics().copied_replies == 1
    finally:
        srv.stop()


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "worker"])
def test_inline_and_worker_handlers_over_zeromq(inline: bool) -> None:
    device = Device()
    names: list[str] = []

    class Watched(RequestReplyCallback):
        def get(self, request: GetRequest) -> None:
            names.append(threading.current_thread().name)
            device.get(request)

    srv = (
        ServerBuilder("ZeroCopyZmq")
        .request_reply(Watched())
        .devices("D")
        .directory(None)
        .inline_handlers(inline)
        .build()
        .start()
    )
    try:
        with ClientService(OneServerDirectory(srv.endpoint), Config(workers=1)) as client:
            fresh = client.access_point("D", "Fresh").get(timeout=WAIT).data
            kept = client.access_point("D", "Kept").get(timeout=WAIT).data
            raised = client.access_point("D", "Raises").get(timeout=WAIT).data
        assert np.array_equal(fresh["wave"], full(1.0)) and fresh["n"] == 1
        assert np.array_equal(kept["wave"], np.arange(N, dtype=np.float64))
        assert np.array_equal(raised["wave"], full(8.0))
        stats = srv.statistics()
        assert (stats.zero_copy_replies, stats.copied_replies) == (2, 1)
        assert (names[0] == "rda-server-dispatcher") is inline
    finally:
        srv.stop()


# -- the ownership rule, without a server ------------------------------------------------------


def offer(make: Callable[[], Any]) -> tuple[int, int]:
    """hand_over of a reply built by ``make``; this frame's local is its one holder."""
    acquired = AcquiredData(Data(wave=make()))
    return hand_over(acquired)


def test_hand_over_takes_arrays_that_own_their_memory_or_whose_bases_nobody_holds() -> None:
    assert offer(lambda: np.empty(N)) == (1, 0)
    assert offer(lambda: np.empty(2 * N)[:N]) == (1, 0)  # its base: held by the view alone
    assert offer(lambda: np.empty((4, N))[1]) == (1, 0)


def test_hand_over_leaves_arrays_over_memory_someone_else_owns(tmp_path: Path) -> None:
    kept = np.empty(2 * N)
    assert offer(lambda: kept[:N]) == (0, 1)
    assert offer(lambda: np.frombuffer(bytearray(N * 8), dtype=np.float64)) == (0, 1)
    memmap = np.memmap(tmp_path / "m", dtype=np.float64, mode="w+", shape=(N,))
    assert offer(lambda: np.asarray(memmap)) == (0, 1)
    cbuf = (ctypes.c_double * N)()
    assert offer(lambda: np.ctypeslib.as_array(cbuf)) == (0, 1)
    refs: list[weakref.ref[Array]] = []

    def weakly_watched() -> Array:
        arr = np.empty(N)
        refs.append(weakref.ref(arr))
        return arr

    assert offer(weakly_watched) == (0, 1)
    assert kept.flags.writeable and refs[0]() is None  # copied, then let go


def test_hand_over_leaves_a_reply_someone_can_reach_through_its_containers() -> None:
    data = Data(wave=np.empty(N))
    assert hand_over(AcquiredData(data)) == (0, 1)  # ``data`` is held here
    assert data["wave"].flags.writeable
    keep: list[Any] = []

    def items_view_kept() -> AcquiredData:
        d = Data(wave=np.empty(N))
        keep.append(d.items())  # the view holds the Data
        return AcquiredData(d)

    def table_iterator_kept() -> AcquiredData:
        d = Data(wave=np.empty(N))
        keep.append(iter(d._values.values()))  # the iterator holds the value table
        return AcquiredData(d)

    def shared_nested() -> AcquiredData:
        inner = Data(wave=np.empty(N))
        keep.append(inner)
        return AcquiredData(Data(inner=inner))

    def shared_item() -> AcquiredData:
        item = Data(wave=np.empty(N))
        keep.append(item)
        return AcquiredData(Data(items=[item, Data(x=1)]))

    for build in (items_view_kept, table_iterator_kept, shared_nested, shared_item):
        acquired = build()
        assert hand_over(acquired) == (0, 1), build.__name__
    acquired = AcquiredData(Data(a=np.empty(N)))
    twice = acquired  # a second holder of the AcquiredData
    assert hand_over(acquired) == (0, 1) and twice is acquired
    same = np.empty(N)
    acquired = AcquiredData(Data(a=same, b=same))
    del same
    assert hand_over(acquired) == (0, 2)  # one array in two entries: held twice


def test_only_big_writable_contiguous_numeric_arrays_count() -> None:
    assert offer(lambda: np.empty(100)) == (0, 0)  # below 64 KiB: in the body anyway
    assert offer(lambda: np.zeros(N, dtype=bool)) == (0, 0)  # bool never goes out of band
    assert offer(lambda: np.empty(2 * N)[::2]) == (0, 0)  # strided: copied by numpy anyway
    frozen = np.empty(N)
    frozen.flags.writeable = False
    assert offer(lambda: frozen) == (0, 0)  # read-only: out of band already


def test_both_codecs_count_the_same_writable_arrays() -> None:
    data = Data(
        a=np.empty(N),
        inner=Data(b=np.empty(N // 2), small=np.empty(10)),
        items=[Data(c=np.empty(N)), Data(d=1)],
        flags=np.zeros(N, dtype=bool),
        strings=[["a", "b"], ["c", "d"]],
        strided=np.empty(2 * N)[::2],
    )
    counts = {codec.name: codec.writable_arrays(data) for codec in (binary.PYTHON,)}
    if binary.COMPILED is None:
        pytest.fail("the compiled codec (rda.serialization._cbinary) was not built")
    counts["compiled"] = binary.COMPILED.writable_arrays(data)
    assert counts == {"python": 3, "compiled": 3}


def test_a_held_reply_whose_handler_runs_past_the_deadline_is_late() -> None:
    """The held reply leaves when the handler returns: past the client's deadline it is an
    answer after the deadline (counted ``timeout`` and in ``late_completions``, not sent), as
    any synchronous handler that overruns."""
    clock = FakeClock()

    class Overrun(RequestReplyCallback):
        def get(self, request: GetRequest) -> None:
            request.complete(Data(wave=np.empty(N)))
            clock.advance(60.0)  # the handler goes on working past the deadline

    srv = (
        ServerBuilder("Late")
        .request_reply(Overrun())
        .devices("D")
        .directory(None)
        .clock(clock)
        .build()
        .start()
    )
    try:
        with (
            ClientService(OneServerDirectory(srv.endpoint), Config(workers=1)) as client,
            pytest.raises(rda_errors.TimeoutError),
        ):
            client.access_point("D", "P").get(timeout=0.5)
        stats = srv.statistics()
        assert stats.requests[("get", "timeout")] == 1 and stats.late_completions == 1
        assert stats.requests[("get", "ok")] == 0
        assert (stats.zero_copy_replies, stats.copied_replies) == (0, 0)  # nothing was sent
    finally:
        srv.stop()


class Scope(DeclaredDevice):
    """A declarative device: the getter returns the value, rda's router completes the get."""

    def __init__(self) -> None:
        super().__init__()
        self.trace = np.arange(N, dtype=np.float64)

    @DeclaredDevice.property("Fresh")
    def fresh(self, request: GetRequest) -> Data:
        wave = np.empty(N)
        wave.fill(5.0)
        return Data(wave=wave)

    @DeclaredDevice.property("Kept")
    def kept(self, request: GetRequest) -> Data:
        return Data(wave=self.trace)


def test_a_declarative_getter_returning_a_fresh_array_is_sent_without_a_copy() -> None:
    scope = Scope()
    srv = ServerBuilder("Scope").device("S", scope).directory(None).build().start()
    try:
        with ClientService(OneServerDirectory(srv.endpoint), Config(workers=1)) as client:
            fresh = client.access_point("S", "Fresh").get(timeout=WAIT).data
            kept = client.access_point("S", "Kept").get(timeout=WAIT).data
        assert np.array_equal(fresh["wave"], full(5.0))
        assert np.array_equal(kept["wave"], np.arange(N, dtype=np.float64))
        stats = srv.statistics()
        assert (stats.zero_copy_replies, stats.copied_replies) == (1, 1)
        assert scope.trace.flags.writeable
    finally:
        srv.stop()


# -- what the calls from complete() to respond hide ---------------------------------------------


class _Responder:
    """As the runner's ``respond`` asks about its result and what the handler passed
    ``complete``; ``keep`` holds the result elsewhere too."""

    def __init__(self, keep: list[object] | None = None) -> None:
        self.keep = keep

    def respond(self, request: GetRequest, result: object, error: object) -> None:
        if self.keep is not None:
            self.keep.append(result)
        references_not_in_frames(result, completed_with(request))


def test_python_calls_hide_only_the_requests_own_hold_on_the_argument() -> None:
    """Run as Python, every call's locals hold its arguments and the frames show them; what
    is left is the request's note of what complete() was given (completed_with). Compiled,
    complete and settle have no frame: more is hidden (measured, see below)."""
    hidden = references_a_completion_hides(_Responder().respond)
    if implementation().python_modules == "python":
        assert hidden == Hidden(result=0, same=1, argument=1)
    else:
        assert hidden.result >= 0 and hidden.same >= 1 and hidden.argument >= 1


def test_a_reference_held_outside_the_frames_is_counted_as_hidden() -> None:
    """What the probe reports is what no frame shows: one more holder is one more, so the
    compiled calls' hidden references are measured, never taken as zero."""
    kept: list[object] = []
    plain = references_a_completion_hides(_Responder().respond)
    assert references_a_completion_hides(_Responder(kept).respond) == Hidden(
        plain.result + 1, plain.same + 1, plain.argument
    )
    assert len(kept) == 3


def test_the_server_measured_what_its_own_calls_hide() -> None:
    """The runner's count is its probe's, built like its respond (compiled or not with it)."""
    assert references_a_completion_hides(runner._ResponderProbe().respond) == runner._HIDDEN
    assert min(runner._HIDDEN) >= 0


# For each count: a property answered zero-copy only when the count is not too low, and one
# whose write after complete() reaches the client when the count is too high.
BOUNDARIES = {
    "argument (a Data)": ("argument", "Fresh", "CachedWritten"),
    "argument (an AcquiredData stamped anew)": ("argument", "Acquired", "KeptUnstampedWritten"),
    "same (the AcquiredData sent)": ("same", "Stamped", "KeptAcquiredWritten"),
    "result (only the calls can hold it)": ("result", "Fresh", None),
}


@pytest.mark.parametrize("case", BOUNDARIES)
def test_the_hidden_counts_are_exact_both_ways(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """With the measured counts a fresh array goes zero-copy and a kept one is copied as it was
    at complete(); one less and the fresh one is copied, one more and the kept one waits for
    the handler's return, the device's later write with it: the tests above fail if the count
    were wrong either way."""
    field, fresh, kept = BOUNDARIES[case]
    measured = runner._HIDDEN

    def run(hidden: Hidden) -> tuple[bool, bool | None]:
        monkeypatch.setattr(runner, "_HIDDEN", hidden)
        s = Stand()
        try:
            got = first_array(s.get(fresh))
            zero_copy = bool(array_frames(s.reply(fresh))) and not got.flags.writeable
            as_at_complete = None
            if kept is not None:
                as_at_complete = bool(np.array_equal(s.get(kept)["wave"], copied_cases()[kept]))
            return zero_copy, as_at_complete
        finally:
            s.close()

    assert run(measured) == (True, None if kept is None else True)
    fewer = measured._replace(**{field: getattr(measured, field) - 1})
    assert run(fewer)[0] is False
    if kept is not None:
        more = measured._replace(**{field: getattr(measured, field) + 1})
        assert run(more)[1] is False
