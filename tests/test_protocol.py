"""Wire protocol v2: the golden corpus pins the bytes, property tests pin the failure modes.

The corpus lives in ``tests/golden/*.json`` (one message per file, frames as hex). Encoding the
message described in :data:`CASES` must give exactly those bytes and decoding those bytes must
give back the described event, so the format cannot drift silently. DATA and REQUEST_CONTEXT
frames hold fixed opaque bytes: the protocol layer never looks inside them.

To change the format on purpose, bump the protocol version, then rewrite the corpus with
``.venv/bin/python tests/test_protocol.py`` and update the hex examples in docs/protocol.md.
"""

from __future__ import annotations

import array
import contextlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rda.serialization.errors import DecodeError, ProtocolError
from rda.serialization.header import (
    HEADER_FIXED,
    PROTOCOL_VERSION,
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    decode_context,
    encode_context,
    encode_header,
)
from rda.serialization.message import BodyKind, Message, decode_exception, encode_exception
from rda.transport.protocol import (
    LARGE_BODY,
    Buffer,
    Connect,
    ConnectAck,
    Heartbeat,
    Incoming,
    Kind,
    ProtocolEvent,
    Reconnect,
    UnsupportedVersion,
    decode_frames,
    encode_connect,
    encode_connect_ack,
    encode_heartbeat,
    encode_message,
    encode_reconnect,
    encode_refusal,
    encode_routed,
    encode_tail,
    join_tail,
)
from rda.transport.state import state_diagram, update_document

GOLDEN = Path(__file__).parent / "golden"
DOC = Path(__file__).parent.parent / "docs" / "protocol.md"

ACQ_CONTEXT = DataContext("CPS.USER.SFT", 1_700_000_000_000_000_000, 1_700_000_000_123_456_789)
# Opaque stand-ins for binary-encoded Data frames (rda.serialization.binary).
OPAQUE_DATA = b"<binary Data>"
OPAQUE_REQUEST_CONTEXT = b"<binary Data: filters, timeout_ms>"


@dataclass(frozen=True)
class Case:
    """One corpus message: its frames as encoded, who sends it, and the event it decodes to."""

    description: str
    from_server: bool
    frames: Sequence[Buffer]
    event: ProtocolEvent


def _message(kind: Kind, header: Header, body: Sequence[tuple[BodyKind, bytes]]) -> Case:
    return Case(
        f"{kind.name} {header.request_type.name}",
        kind is Kind.REPLY,
        encode_message(kind, header, body),
        Incoming(Message(header, body)),
    )


def _cases() -> dict[str, Case]:
    client_info = {"application": "demo", "user": "op", "pid": 42}
    server_info = {"name": "DemoServer", "heartbeat_interval": 1.0, "heartbeat_timeout": 10.0}
    get = Header(RequestType.GET, 7, "PS1", "Acquisition", "CPS.USER.ALL")
    cases = {
        "connect": Case("CONNECT", False, encode_connect(client_info), Connect(client_info)),
        "connect_ack": Case(
            "CONNECT_ACK", True, encode_connect_ack(server_info), ConnectAck(server_info)
        ),
        "heartbeat_client": Case("HEARTBEAT (client)", False, encode_heartbeat(False), Heartbeat()),
        "heartbeat_server": Case("HEARTBEAT (server)", True, encode_heartbeat(True), Heartbeat()),
        "reconnect": Case("RECONNECT", True, encode_reconnect(), Reconnect()),
        "get_request": _message(
            Kind.REQUEST, get, [(BodyKind.REQUEST_CONTEXT, OPAQUE_REQUEST_CONTEXT)]
        ),
        "get_reply": _message(
            Kind.REPLY,
            Header(RequestType.REPLY, 7, "PS1", "Acquisition", "CPS.USER.ALL"),
            [(BodyKind.DATA, OPAQUE_DATA), (BodyKind.DATA_CONTEXT, encode_context(ACQ_CONTEXT))],
        ),
        "set_reply": _message(Kind.REPLY, Header(RequestType.REPLY, 8, "PS1", "Setting"), []),
        "exception_reply": _message(
            Kind.REPLY,
            Header(RequestType.EXCEPTION, 9, "PS9", "Acquisition"),
            [(BodyKind.EXCEPTION, encode_exception("NoSuchDeviceError", "PS9: no such device"))],
        ),
        "notification": _message(
            Kind.REPLY,
            Header(
                RequestType.NOTIFICATION_DATA,
                3,
                "PS1",
                "Acquisition",
                "CPS.USER.ALL",
                UpdateType.NORMAL,
                HeaderFlags.CONFLATABLE,
            ),
            [(BodyKind.DATA, OPAQUE_DATA), (BodyKind.DATA_CONTEXT, encode_context(ACQ_CONTEXT, 5))],
        ),
    }
    return cases


CASES = _cases()


def _load(name: str) -> list[bytes]:
    doc = json.loads((GOLDEN / f"{name}.json").read_text())
    return [bytes.fromhex(h) for h in doc["frames"]]


def _same_event(got: ProtocolEvent, want: ProtocolEvent) -> bool:
    if isinstance(got, Incoming) and isinstance(want, Incoming):
        return got.message.header == want.message.header and [
            (k, bytes(f)) for k, f in got.message.body
        ] == [(k, bytes(f)) for k, f in want.message.body]
    return got == want


def test_corpus_has_a_file_per_case_and_nothing_else() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoding_gives_the_golden_bytes(name: str) -> None:
    assert [bytes(f) for f in CASES[name].frames] == _load(name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_bytes_decode_to_the_described_event(name: str) -> None:
    case = CASES[name]
    frames = _load(name)
    event = decode_frames(frames, from_server=case.from_server)
    assert _same_event(event, case.event), event
    # The receiving dispatcher hands memoryviews (copy=False); they must decode the same.
    event = decode_frames([memoryview(f) for f in frames], from_server=case.from_server)
    assert _same_event(event, case.event), event


def test_golden_bodies_decode_with_the_body_codecs() -> None:
    reply = decode_frames(_load("notification"), from_server=True)
    assert isinstance(reply, Incoming)
    assert reply.message.context == DataContext(
        "CPS.USER.SFT", ACQ_CONTEXT.cycle_stamp, ACQ_CONTEXT.acq_stamp, "CPS.USER.ALL"
    )
    assert reply.message.seq == 5
    assert reply.message.header.flags is HeaderFlags.CONFLATABLE
    exc = decode_frames(_load("exception_reply"), from_server=True)
    assert isinstance(exc, Incoming)
    assert exc.message.exception == ("NoSuchDeviceError", "PS9: no such device")


@pytest.mark.parametrize("name", sorted(CASES))
def test_docs_show_the_golden_hex(name: str) -> None:
    text = DOC.read_text()
    for frame in _load(name):
        assert frame.hex() in text, f"docs/protocol.md lacks frame {frame.hex()} of {name}"


def test_docs_state_diagram_is_the_generated_one() -> None:
    text = DOC.read_text()
    begin = text.index("<!-- state-diagram:begin -->")
    end = text.index("<!-- state-diagram:end -->")
    block = text[begin:end].split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block.strip() == state_diagram().strip()
    assert update_document(text) == text


# --- malformed input ---------------------------------------------------------------------------

GET_FRAME = bytes(CASES["get_request"].frames[0])  # == the golden file
GET_HEADER_END = 1 + HEADER_FIXED.size + len("PS1AcquisitionCPS.USER.ALL")
GET_HEADER = GET_FRAME[:GET_HEADER_END]  # kind byte + header, without the body table
V = bytes([PROTOCOL_VERSION])


def _request(table_and_bodies: bytes) -> list[bytes]:
    return [GET_HEADER + table_and_bodies]


def _table(kinds: Sequence[int], sizes: Sequence[int]) -> bytes:
    return struct.pack(f"<B{len(kinds)}B{len(sizes)}I", len(kinds), *kinds, *sizes)


@pytest.mark.parametrize(
    ("frames", "from_server", "error", "fragment"),
    [
        ([], False, DecodeError, "0 frames"),
        ([b"\x99"], False, DecodeError, "unknown kind byte"),
        ([b""], False, DecodeError, "unknown kind byte"),
        ([b"\x99" + V], False, DecodeError, "unknown kind byte"),
        ([b"\x22" + V, b""], False, DecodeError, "HEARTBEAT is 2 frame"),
        ([b"\x03" + V + b"x"], True, DecodeError, "HEARTBEAT is 1 frame"),
        ([b"\x02" + V], False, ProtocolError, "REPLY may not be sent by a client"),
        ([GET_FRAME], True, ProtocolError, "REQUEST may not be sent by a server"),
        ([b"\x22" + V], True, ProtocolError, "HEARTBEAT may not be sent by a server"),
        ([b"\x20" + V + b"{}", b""], False, DecodeError, "CONNECT has 2 frames"),
        ([b"\x20" + V], False, DecodeError, "not a JSON object"),
        ([b"\x20" + V + b"[1]"], False, DecodeError, "not an object"),
        ([b"\x20" + V + b"{nope"], False, DecodeError, "not a JSON object"),
        ([b"\x20" + V + b"\xff\xfe"], False, DecodeError, "not a JSON object"),
        ([b"\x20" + V + b"[" * 60000], False, DecodeError, "not a JSON object"),
        ([b"\x20" + V + b" " * 70000], False, DecodeError, "exceeds"),
        ([b"\x01" + V + b"{}", b"\x00"], True, DecodeError, "CONNECT_ACK has 2 frames"),
        ([b"\x21" + V + b"\x00"], False, DecodeError, "shorter than kind"),
        ([GET_HEADER], False, DecodeError, "run past"),
        ([GET_HEADER[:-1] + b"\x00"], False, DecodeError, "run past"),
        ([b"\x21" + V + b"\x63" + bytes(16) + b"\x00"], False, DecodeError, "request type 99"),
        (_request(b"\x02\x03\x01"), False, DecodeError, "body table of 2 entries runs past"),
        (_request(_table([3], [5]) + b"body"), False, DecodeError, "runs past the frame"),
        (_request(_table([3], [3]) + b"body"), False, DecodeError, "1 bytes after the last body"),
        (_request(b"\x00body"), False, DecodeError, "4 bytes after the last body"),
        (_request(_table([9], [1]) + b"a"), False, DecodeError, "unknown body kind 9"),
        (_request(_table([0], [1]) + b"a"), False, DecodeError, "unknown body kind 0"),
        (_request(_table([0x81], [1])), False, DecodeError, "own frame but it is missing"),
        ([*_request(_table([129], [2])), b"a"], False, DecodeError, "announced as 2 bytes"),
        ([*_request(b"\x00"), b"extra"], False, DecodeError, "body table announces 1"),
        ([*_request(_table([1], [1]) + b"a"), b"b"], False, DecodeError, "announces 1"),
    ],
)
def test_malformed_message_raises_a_typed_error(
    frames: list[bytes], from_server: bool, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        decode_frames(frames, from_server=from_server)


def test_a_lost_external_body_frame_is_an_error() -> None:
    body = [(BodyKind.DATA, bytes(LARGE_BODY)), (BodyKind.DATA_CONTEXT, b"ctx")]
    frames = encode_message(Kind.REPLY, Header(RequestType.REPLY, 1), body)
    assert len(frames) == 2
    with pytest.raises(DecodeError, match="missing"):
        decode_frames(frames[:1], from_server=True)


def test_over_max_size_is_refused_before_parsing() -> None:
    frames = _request(_table([1], [100]) + b"x" * 100)
    assert isinstance(decode_frames(frames, from_server=False, max_size=200), Incoming)
    with pytest.raises(DecodeError, match="exceeds the maximum of 99"):
        decode_frames(frames, from_server=False, max_size=99)
    # The size check comes first: even garbage over the limit reports the size.
    with pytest.raises(DecodeError, match="exceeds"):
        decode_frames([b"\x99" * 50], from_server=False, max_size=10)


def test_unknown_version_in_a_request_carries_the_request_id() -> None:
    other = GET_FRAME[:1] + bytes([PROTOCOL_VERSION + 1]) + GET_FRAME[2:]
    with pytest.raises(UnsupportedVersion) as info:
        decode_frames([other], from_server=False)
    assert info.value.version == PROTOCOL_VERSION + 1
    assert info.value.request_id == 7
    assert isinstance(info.value, ProtocolError)
    assert f"version {PROTOCOL_VERSION + 1}" in str(info.value)
    assert f"speaks {PROTOCOL_VERSION}" in str(info.value)


def test_unknown_version_in_a_handshake_has_no_request_id() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        decode_frames([b"\x20\x07{}"], from_server=False)
    assert (info.value.version, info.value.request_id) == (7, None)


# Version 1 sent the kind byte alone in frame 0 and the version first in frame 1.
V1_MESSAGES = {
    "connect": [b"\x20", b"\x01{}"],
    "heartbeat": [b"\x22"],
    "request": [b"\x21", b"\x01" + GET_HEADER[2:], b"", b"\x03"],
}


@pytest.mark.parametrize("name", sorted(V1_MESSAGES))
def test_version_1_framing_is_an_unsupported_version_naming_both(name: str) -> None:
    with pytest.raises(UnsupportedVersion) as info:
        decode_frames(V1_MESSAGES[name], from_server=False)
    assert info.value.version == 1
    assert "version 1" in str(info.value) and f"speaks {PROTOCOL_VERSION}" in str(info.value)


def test_a_version_1_peer_is_refused_in_its_own_framing() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        decode_frames(V1_MESSAGES["connect"], from_server=False)
    kind, handshake = encode_refusal(info.value)
    assert kind == bytes([Kind.CONNECT_ACK]) and handshake[0] == 1
    assert "version 1" in json.loads(handshake[1:])["error"]
    # A peer of a later version gets this version's framing, which it can parse.
    (frame,) = encode_refusal(UnsupportedVersion(PROTOCOL_VERSION + 1))
    event = decode_frames([frame], from_server=True)
    assert isinstance(event, ConnectAck) and "error" in event.info


def test_small_bodies_are_packed_and_stay_slices_of_the_received_frame() -> None:
    body = memoryview(bytearray(b"payload"))
    frames = encode_message(Kind.REPLY, Header(RequestType.REPLY, 1), [(BodyKind.DATA, body)])
    assert len(frames) == 1
    received = memoryview(bytes(frames[0]))
    event = decode_frames([received], from_server=True)
    assert isinstance(event, Incoming)
    ((kind, frame),) = event.message.body
    assert kind is BodyKind.DATA and bytes(frame) == b"payload"
    assert isinstance(frame, memoryview) and frame.obj is received.obj  # a slice, not a copy


def test_large_bodies_travel_as_their_own_frames_without_copy() -> None:
    big = memoryview(bytearray(LARGE_BODY))
    exactly_small = b"s" * (LARGE_BODY - 1)
    body: list[tuple[BodyKind, Buffer]] = [
        (BodyKind.DATA, big),
        (BodyKind.DATA_CONTEXT, exactly_small),
    ]
    frames = encode_message(Kind.REPLY, Header(RequestType.REPLY, 1), body)
    assert len(frames) == 2 and frames[1] is big
    event = decode_frames(frames, from_server=True)
    assert isinstance(event, Incoming)
    assert [(k, bytes(f)) for k, f in event.message.body] == [(k, bytes(f)) for k, f in body]
    assert event.message.body[0][1] is big


def test_a_float64_view_is_measured_in_bytes() -> None:
    import numpy as np

    arr = np.arange(10000, dtype=np.float64)  # 80,000 bytes, 10,000 items
    frames = encode_message(Kind.REPLY, Header(RequestType.REPLY, 1), [(BodyKind.DATA, arr.data)])
    assert len(frames) == 2
    event = decode_frames(frames, from_server=True)
    assert isinstance(event, Incoming)
    assert bytes(event.message.body[0][1]) == arr.tobytes()


def test_a_shared_tail_joined_to_a_header_is_the_encoded_message() -> None:
    header = Header(RequestType.NOTIFICATION_DATA, 3, "PS1", "Acquisition")
    # Two or three small bodies take encode_tail's fast paths; a float64 view is measured in bytes there
    # too; a large body takes the general one.
    floats = memoryview(array.array("d", [1.0, 2.0]))
    payloads: tuple[Buffer, ...] = (b"small", floats, bytes(LARGE_BODY))
    for payload in payloads:
        body = [(BodyKind.DATA, payload), (BodyKind.DATA_CONTEXT, b"ctx")]
        # and three: a value in alarm (its REPLY_CONTEXT last), the large body in each place
        bodies = [body, [*body, (BodyKind.REPLY_CONTEXT, b"alarm")]]
        bodies.append(
            [
                (BodyKind.DATA, b"d"),
                (BodyKind.DATA_CONTEXT, b"c"),
                (BodyKind.REPLY_CONTEXT, payload),
            ]
        )
        for each in bodies:
            joined = join_tail(encode_header(header), encode_tail(each))
            assert [bytes(f) for f in joined] == [
                bytes(f) for f in encode_message(Kind.REPLY, header, each)
            ]


# Every body shape encode_routed has a path for: none, one or two small ones (their own fast
# paths, a float64 view measured in bytes), a large one alone or beside a small one, three.
_BODY_SHAPES: list[list[tuple[BodyKind, Buffer]]] = [
    [],
    [(BodyKind.REQUEST_CONTEXT, b"ctx")],
    [(BodyKind.DATA, memoryview(array.array("d", [1.0, 2.0]))), (BodyKind.DATA_CONTEXT, b"c")],
    [(BodyKind.DATA, bytes(LARGE_BODY))],
    [(BodyKind.DATA, bytes(LARGE_BODY)), (BodyKind.DATA_CONTEXT, b"c")],
    [(BodyKind.DATA, b"a"), (BodyKind.DATA, b""), (BodyKind.EXCEPTION, b"e")],
]


@pytest.mark.parametrize("body", _BODY_SHAPES, ids=range(len(_BODY_SHAPES)))
@given(
    kind=st.sampled_from([Kind.REQUEST, Kind.REPLY]),
    request_type=st.sampled_from(list(RequestType)),
    rid=st.integers(0, 2**64 - 1),
    names=st.tuples(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8)),
)
@settings(max_examples=40)
def test_encode_routed_gives_the_bytes_of_encode_message(
    body: list[tuple[BodyKind, Buffer]],
    kind: Kind,
    request_type: RequestType,
    rid: int,
    names: tuple[str, str, str],
) -> None:
    routed = encode_routed(kind, request_type, rid, *names, body)
    expected = encode_message(kind, Header(request_type, rid, *names), body)
    assert [bytes(f) for f in routed] == [bytes(f) for f in expected]


def test_encode_routed_refuses_a_name_too_long_as_encode_header_does() -> None:
    with pytest.raises(ValueError, match="65535"):
        encode_routed(Kind.REQUEST, RequestType.GET, 1, "D" * 70000, "P", "")


# --- properties --------------------------------------------------------------------------------

frame_lists = st.lists(st.binary(max_size=40), max_size=6)
kind_bytes = st.sampled_from([bytes([k]) for k in Kind] + [b"\x00", b"\x99"])


@settings(max_examples=200)
@given(frame_lists, st.booleans())
def test_any_frames_give_an_event_or_a_typed_error(frames: list[bytes], from_server: bool) -> None:
    with contextlib.suppress(DecodeError, ProtocolError):
        decode_frames(frames, from_server=from_server)


@settings(max_examples=200)
@given(kind_bytes, frame_lists, st.booleans())
def test_any_frames_after_a_valid_kind_give_an_event_or_a_typed_error(
    kind: bytes, rest: list[bytes], from_server: bool
) -> None:
    with contextlib.suppress(DecodeError, ProtocolError):
        decode_frames([kind, *rest], from_server=from_server)


@settings(max_examples=100)
@given(
    st.sampled_from(sorted(n for n, c in CASES.items() if isinstance(c.event, Incoming))),
    st.data(),
)
def test_corrupting_one_byte_of_a_golden_message_never_crashes(
    name: str, data: st.DataObject
) -> None:
    frames = [bytearray(f) for f in _load(name)]
    index = data.draw(st.integers(0, len(frames) - 1))
    if frames[index]:
        pos = data.draw(st.integers(0, len(frames[index]) - 1))
        frames[index][pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError, ProtocolError):
        decode_frames([bytes(f) for f in frames], from_server=CASES[name].from_server)


@settings(max_examples=100)
@given(
    st.integers(0, 2**64 - 1),
    st.text(max_size=20),
    st.text(max_size=20),
    st.lists(st.tuples(st.sampled_from(list(BodyKind)), st.binary(max_size=30)), max_size=4),
)
def test_any_request_round_trips(
    ident: int, device: str, prop: str, body: list[tuple[BodyKind, bytes]]
) -> None:
    header = Header(RequestType.SET, ident, device, prop)
    event = decode_frames(encode_message(Kind.REQUEST, header, body), from_server=False)
    assert isinstance(event, Incoming)
    assert event.message.header == header
    assert [(k, bytes(f)) for k, f in event.message.body] == body


@settings(max_examples=50)
@given(st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=5))
def test_any_handshake_info_round_trips(info: dict[str, int | str]) -> None:
    assert decode_frames(encode_connect(info), from_server=False) == Connect(info)
    assert decode_frames(encode_connect_ack(info), from_server=True) == ConnectAck(info)


def test_fixed_header_layout_matches_the_docs() -> None:
    # docs/protocol.md: 18 fixed bytes = 4 x u8, u64 id, 3 x u16 lengths, little-endian.
    frame = encode_header(Header(RequestType.GET, 0x0102030405060708, "ab", "c", ""))
    fixed = (PROTOCOL_VERSION, 0, 0, 0, 0x0102030405060708, 2, 1, 0)
    assert struct.unpack_from("<BBBBQHHH", frame) == fixed
    assert frame[18:] == b"abc"
    assert decode_context(encode_context(ACQ_CONTEXT, 9))[1] == 9
    assert decode_exception(encode_exception("T", "m")) == ("T", "m")


def _write_corpus() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, case in CASES.items():
        doc = {
            "description": case.description,
            "sender": "server" if case.from_server else "client",
            "frames": [bytes(f).hex() for f in case.frames],
        }
        (GOLDEN / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    _write_corpus()


def test_reconnect_is_two_bytes_from_a_server_only() -> None:
    """Issue 27 (3): RECONNECT is a bare server kind, like the heartbeats."""
    assert isinstance(decode_frames([b"\x04\x03"], from_server=True), Reconnect)
    with pytest.raises(DecodeError, match="RECONNECT is 1 frame"):
        decode_frames([b"\x04\x03\x00"], from_server=True)
    with pytest.raises(ProtocolError, match="RECONNECT may not be sent by a client"):
        decode_frames([b"\x04\x03"], from_server=False)
