"""Big read-only arrays travel out of band: the codec's ``arrays`` list, the ARRAY body of
protocol version 3, and a get, a set and a notification carrying one end to end.

The codec half runs against both implementations and checks that they agree byte for byte
and error for error; the wire half looks at the frames a raw DEALER receives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.errors import DecodeError
from rda.serialization.header import RequestType
from rda.serialization.message import BodyKind
from rda.testing import MemoryNetwork, OneServerDirectory
from rda.transport.api import ClientHandler, ServerHandler, TransportSettings
from rda.transport.protocol import (
    EXTERNAL,
    Heartbeat,
    Incoming,
    Kind,
    decode_frames,
    encode_connect,
    encode_routed,
)

WAIT = 10.0


def codecs() -> tuple[binary.Codec, binary.Codec]:
    """Both implementations; `make test` builds the compiled one, so its absence fails."""
    if binary.COMPILED is None:
        pytest.fail("the compiled codec (rda.serialization._cbinary) was not built")
    return binary.PYTHON, binary.COMPILED


@pytest.fixture(params=["python", "compiled"])
def codec(request: pytest.FixtureRequest) -> binary.Codec:
    return codecs()[request.param == "compiled"]


pytestmark = pytest.mark.timeout(60)


def frozen(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    arr.flags.writeable = False
    return arr


def big(n: int = 20_000, dtype: str = "<f8") -> np.ndarray[Any, Any]:
    return frozen(np.arange(n).astype(dtype))


def sample() -> Data:
    """Out of band at the top, in a nested Data and in a Data array; in band beside them."""
    return Data(
        wave=big(),
        image=frozen(np.arange(3 * 30_000, dtype=np.int16).reshape(3, 30_000)),
        nested=Data(inner=big(10_000, "<i8")),
        items=[Data(a=big(17_000, "<f4")), Data(b=1)],
        writable=np.arange(20_000, dtype=np.float64),  # may change after encode: copied in
        small=frozen(np.arange(10.0)),  # below 64 KiB: copied in
        flags=frozen(np.zeros(70_000, dtype=bool)),  # bool never goes out of band
        strided=frozen(np.arange(40_000.0)[::2]),  # not C-contiguous: copied in
        x=1.5,
    )


# -- the codec ---------------------------------------------------------------------------------


def test_big_read_only_arrays_leave_the_body_and_come_back_as_views(codec: binary.Codec) -> None:
    data = sample()
    arrays: list[Any] = []
    body = codec.encode(data, arrays)
    assert [a.nbytes for a in arrays] == [160_000, 180_000, 80_000, 68_000]
    # Each out-of-band entry keeps its dims and gives its elements up for a 4-byte index.
    in_band = codec.encode(data)
    assert len(body) == len(in_band) - sum(a.nbytes for a in arrays) + 4 * len(arrays)
    decoded = codec.decode(body, None, arrays)
    assert decoded == data
    for name, source in (("wave", arrays[0]), ("image", arrays[1])):
        assert np.shares_memory(decoded[name], np.frombuffer(source, np.uint8))
        assert not decoded[name].flags.writeable
    assert decoded["image"].shape == (3, 30_000)


def test_without_a_list_or_for_writable_arrays_the_bytes_are_the_old_ones(
    codec: binary.Codec,
) -> None:
    data = sample()
    assert codec.encode(data, None) == codec.encode(data) == binary.PYTHON.encode(data)
    writable = Data(wave=np.arange(20_000.0))
    arrays: list[Any] = []
    assert codec.encode(writable, arrays) == codec.encode(writable) and arrays == []


def test_both_implementations_make_the_same_bytes_and_arrays() -> None:
    python, compiled = codecs()
    data = sample()
    py: list[Any] = []
    c: list[Any] = []
    assert python.encode(data, py) == compiled.encode(data, c)
    assert [bytes(a) for a in py] == [bytes(a) for a in c]


def _errors(body: bytes, arrays: list[Any]) -> list[str]:
    out = []
    for codec in codecs():
        try:
            codec.decode(body, None, arrays)
            out.append("ok")
        except DecodeError as exc:
            out.append(str(exc))
    return out


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("none", "refers to out-of-band array 0; 0 came with the Data"),
        ("too_few", "refers to out-of-band array 1; 1 came"),
        ("too_many", "3 out-of-band arrays came with the Data, it refers to 2"),
        ("swapped", "dims (3, 40000) need 240000 bytes, the out-of-band array has 160000"),
        ("ragged", "not a whole number of 8-byte elements"),
    ],
)
def test_arrays_that_do_not_match_the_body_are_a_decode_error(case: str, fragment: str) -> None:
    data = Data(a=big(), m=frozen(np.zeros((3, 40_000), dtype=np.int16)))
    arrays: list[Any] = []
    body = binary.PYTHON.encode(data, arrays)
    given_arrays = {
        "none": [],
        "too_few": arrays[:1],
        "too_many": [*arrays, b"12345678"],
        "swapped": [arrays[1], arrays[0]],
        "ragged": [bytes(12), arrays[1]],
    }[case]
    errors = _errors(body, given_arrays)
    assert all(fragment in e for e in errors), errors
    assert len(set(errors)) == 1  # both implementations say the same thing


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        (bytes([0x88, 1, 1, 0, 4, 0, 0, 0]) + b"s" + bytes(4), "only numeric arrays"),
        (bytes([0x81, 1, 1, 0, 4, 0, 0, 0]) + b"b" + bytes(4), "only numeric arrays"),
        (bytes([0x87, 0, 1, 0, 4, 0, 0, 0]) + b"x" + bytes(4), "only numeric arrays"),
        (bytes([0x87, 1, 1, 0, 8, 0, 0, 0]) + b"x" + bytes(8), "is 4 bytes, not 8"),
        (bytes([0x87, 33, 1, 0, 4, 0, 0, 0]) + b"x" + bytes(4), "ndim 33 exceeds 32"),
    ],
)
def test_malformed_out_of_band_entries_are_a_decode_error(entry: bytes, fragment: str) -> None:
    body = (1).to_bytes(4, "little") + entry
    errors = _errors(body, [bytes(8)])
    assert all(fragment in e for e in errors), errors
    assert len(set(errors)) == 1


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 200), value=st.integers(0, 255), cut=st.integers(-8, 8))
def test_corrupted_bodies_with_arrays_never_crash_and_both_agree(
    position: int, value: int, cut: int
) -> None:
    data = Data(a=big(9_000), m=frozen(np.ones((2, 10_000), dtype=np.int32)), x=1)
    arrays: list[Any] = []
    body = bytearray(binary.PYTHON.encode(data, arrays))
    body[position % len(body)] = value
    given_arrays = [bytes(arrays[0])[: len(arrays[0]) + cut], arrays[1]]
    outcomes = []
    for codec in codecs():
        try:
            outcomes.append(repr(codec.decode(bytes(body), None, given_arrays).to_dict()))
        except DecodeError as exc:
            outcomes.append(str(exc))
    assert len(set(outcomes)) == 1, outcomes


def test_a_small_array_body_in_the_packed_frame_is_found_as_well() -> None:
    # The encoder sends ARRAY bodies as frames of their own; the decoder takes either
    # placement. A 1-D float64 reference with 32 bytes of array is four zeros.
    arrays: list[Any] = []
    body = binary.encode(Data(a=big()), arrays)
    frames = encode_routed(
        Kind.REPLY,
        RequestType.REPLY,
        1,
        "D",
        "P",
        "",
        [
            (BodyKind.DATA, body),
            (BodyKind.DATA_CONTEXT, bytes(26)),
            (BodyKind.ARRAY, bytes(32)),
        ],
    )
    assert len(frames) == 1  # all three bodies inside the packed frame
    event = decode_frames(frames, from_server=True)
    assert isinstance(event, Incoming)
    message = event.message
    assert message.frame(BodyKind.EXCEPTION) is None
    assert bytes(message.frame(BodyKind.ARRAY) or b"") == bytes(32)
    assert [bytes(a) for a in message.arrays()] == [bytes(32)]
    assert message.data == Data(a=np.zeros(4))


# -- on the wire and end to end ---------------------------------------------------------------


class Values(RequestReplyCallback):
    """GET answers the array named by the property; SET keeps what it was given."""

    def __init__(self) -> None:
        self.wave = big(131_072)  # 1 MiB, read-only
        self.kept = np.arange(131_072.0)  # 1 MiB, writable, and the device keeps it
        self.sets: list[Data] = []
        self.got_set = threading.Event()

    def get(self, request: GetRequest) -> None:
        if request.property == "Writable":
            request.complete(Data(wave=self.kept))
        elif request.property == "Fresh":  # nobody but the reply holds it once get returns
            request.complete(Data(wave=np.arange(131_072.0)))
        else:
            request.complete(Data(wave=self.wave, n=1))

    def set(self, request: SetRequest) -> None:
        self.sets.append(request.data)
        request.complete()
        self.got_set.set()


@pytest.fixture
def server() -> Iterator[tuple[Server, Values]]:
    handler = Values()
    srv = ServerBuilder("Oob").request_reply(handler).devices("D").directory(None).build()
    srv.start()
    try:
        yield srv, handler
    finally:
        srv.stop()


def _raw_get(endpoint: str, prop: str) -> list[bytes]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(endpoint)
        dealer.send_multipart(encode_connect({"application": "raw"}))
        assert dealer.poll(int(WAIT * 1000))
        dealer.recv_multipart()  # CONNECT_ACK
        dealer.send_multipart(encode_routed(Kind.REQUEST, RequestType.GET, 5, "D", prop, ""))
        for _ in range(100):  # a heartbeat may come first on a loaded machine: skipped
            assert dealer.poll(int(WAIT * 1000))
            frames = dealer.recv_multipart()
            if not isinstance(decode_frames(frames, from_server=True), Heartbeat):
                return frames
        raise AssertionError("only heartbeats came")
    finally:
        dealer.close()
        ctx.term()


def test_a_read_only_or_fresh_array_is_an_array_frame_and_a_kept_writable_one_is_in_the_data(
    server: tuple[Server, Values],
) -> None:
    srv, handler = server
    frames = _raw_get(srv.endpoint, "Frozen")
    assert len(frames) == 2 and frames[1] == handler.wave.tobytes()
    assert frames[0][:2] == bytes([Kind.REPLY, 3])  # protocol version 3
    event = decode_frames(frames, from_server=True)
    assert isinstance(event, Incoming)
    kinds = [kind for kind, _ in event.message.body]
    assert kinds == [BodyKind.DATA, BodyKind.DATA_CONTEXT, BodyKind.ARRAY]
    assert len(event.message.frame(BodyKind.DATA) or b"") < 100  # the array is not in it
    data = event.message.data
    assert data is not None and np.array_equal(data["wave"], handler.wave) and data["n"] == 1
    # The pure-Python frame parser (it takes any sequence; the compiled one lists) agrees.
    python_event = decode_frames(tuple(frames), from_server=True)
    assert isinstance(python_event, Incoming)
    assert [kind for kind, _ in python_event.message.body] == kinds
    assert python_event.message.data == data

    writable = _raw_get(srv.endpoint, "Writable")
    event = decode_frames(writable, from_server=True)
    assert isinstance(event, Incoming)
    assert [kind for kind, _ in event.message.body] == [BodyKind.DATA, BodyKind.DATA_CONTEXT]
    table = 1 + 18 + len("DWritable")  # kind byte, fixed header, names: the body count
    assert writable[0][table : table + 2] == bytes([2, BodyKind.DATA | EXTERNAL])

    # A writable array the handler built and let go of: handed over, as a read-only one is.
    fresh = _raw_get(srv.endpoint, "Fresh")
    assert len(fresh) == 2 and fresh[1] == np.arange(131_072.0).tobytes()
    event = decode_frames(fresh, from_server=True)
    assert isinstance(event, Incoming)
    assert [kind for kind, _ in event.message.body] == kinds


def test_get_set_and_notify_carry_read_only_arrays_end_to_end(
    server: tuple[Server, Values],
) -> None:
    srv, handler = server
    with ClientService(StaticDirectory({"*": srv.endpoint}), Config(workers=1)) as client:
        ap = client.access_point("D", "Frozen")
        got = ap.get().data["wave"]
        assert np.array_equal(got, handler.wave) and not got.flags.writeable

        # A set of a read-only array (one the client decoded: the proxy case) arrives whole.
        ap.set(Data(wave=got, note="echo"))
        assert handler.got_set.wait(WAIT)
        assert np.array_equal(handler.sets[0]["wave"], handler.wave)
        assert handler.sets[0]["note"] == "echo"

        subs = [client.access_point("D", "Live").subscribe() for _ in range(2)]
        for sub in subs:
            first = sub.poll(WAIT)
            assert first is not None
        (source,) = srv.subscriptions()
        source.notify(Data(wave=handler.wave))
        for sub in subs:
            note = sub.poll(WAIT)
            assert note is not None and note.data is not None
            assert np.array_equal(note.data["wave"], handler.wave)
            sub.close()


def test_the_in_memory_network_carries_array_bodies_too() -> None:
    network = MemoryNetwork()
    handler = Values()

    def server_transport(
        h: ServerHandler, settings: TransportSettings, info: dict[str, Any]
    ) -> Any:
        return network.server("srv", h, settings, info)

    def client_transport(
        h: ClientHandler, settings: TransportSettings, info: dict[str, Any]
    ) -> Any:
        return network.client(h, settings, info)

    srv = (
        ServerBuilder("Mem")
        .request_reply(handler)
        .devices("D")
        .directory(None)
        .transport(server_transport)
        .build()
        .start()
    )
    try:
        with ClientService(
            OneServerDirectory(srv.endpoint), Config(workers=1), transport_factory=client_transport
        ) as c:
            got = c.access_point("D", "Frozen").get(timeout=WAIT).data["wave"]
            assert np.array_equal(got, handler.wave) and not got.flags.writeable
    finally:
        srv.stop()
        network.close()
