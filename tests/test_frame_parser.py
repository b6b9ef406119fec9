"""The compiled REQUEST/REPLY frame parser (``rda.transport._cframe``) beside the Python one.

``decode_frames`` tries the compiled parser first and parses again in Python whatever it
leaves (None): so the two must agree on every message the compiled one accepts, and the
compiled one must leave every message the Python one refuses. A short run of
``benchmarks/fuzz_frames.py`` (child processes: a crash fails the test instead of pytest)
checks that on fuzzed input; the golden corpus checks it on the documented bytes.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rda.serialization import BodyKind, Header, RequestType
from rda.serialization import header as header_codec
from rda.serialization.errors import DecodeError
from rda.transport import protocol
from rda.transport.protocol import LARGE_BODY, Incoming, Kind, decode_frames, encode_message

pytestmark = pytest.mark.timeout(120)

GOLDEN = Path(__file__).parent / "golden"
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz_frames.py"


def golden_messages() -> list[tuple[str, list[bytes], bool]]:
    out = []
    for path in sorted(GOLDEN.glob("*.json")):
        case = json.loads(path.read_text())
        frames = [bytes.fromhex(f) for f in case["frames"]]
        if frames[0][0] in (Kind.REQUEST, Kind.REPLY):
            out.append((path.stem, frames, case["sender"] == "server"))
    return out


def test_the_compiled_parser_is_built_and_in_use() -> None:
    from rda.transport._cframe import parse_message

    assert protocol.frame_parser == "compiled"
    assert protocol._parse_compiled is parse_message


@pytest.mark.parametrize(("name", "frames", "from_server"), golden_messages())
def test_golden_messages_parse_the_same_compiled_and_in_python(
    name: str, frames: list[bytes], from_server: bool
) -> None:
    kind = Kind.REPLY if from_server else Kind.REQUEST
    views = [memoryview(f) for f in frames]
    assert protocol._parse_compiled is not None
    fast = protocol._parse_compiled(views, int(kind), protocol.DEFAULT_MAX_MESSAGE_SIZE)
    slow = protocol._decode_message(frames)
    assert fast is not None, name
    assert fast.header == slow.header
    assert [(k, bytes(f)) for k, f in fast.body] == [(k, bytes(f)) for k, f in slow.body]
    # Small bodies stay slices of the received frame, as in Python.
    assert all(isinstance(f, memoryview) and f.obj is views[0].obj for _, f in fast.body)


def test_the_compiled_parser_leaves_the_other_sides_kind_and_errors_to_python() -> None:
    frames = encode_message(Kind.REQUEST, Header(RequestType.GET, 3, "PS1", "Acquisition"))
    parse = protocol._parse_compiled
    assert parse is not None
    assert parse(list(frames), int(Kind.REPLY), 1 << 20) is None  # not this side's kind
    assert parse(list(frames), int(Kind.REQUEST), 10) is None  # over max_size
    assert parse([frames[0][:-1]], int(Kind.REQUEST), 1 << 20) is None  # truncated
    assert parse([frames[0], b"extra"], int(Kind.REQUEST), 1 << 20) is None  # a frame too many
    # ... and decode_frames then raises the Python parser's precise error.
    with pytest.raises(DecodeError, match="frames but its body table announces"):
        decode_frames([frames[0], b"extra"], from_server=False)


def test_large_bodies_are_the_received_frames_and_names_are_decoded_once() -> None:
    big = memoryview(bytearray(LARGE_BODY))
    header = Header(RequestType.REPLY, 2**64 - 1, "DÉV", "Prop", "CPS.USER.ALL")
    frames = encode_message(Kind.REPLY, header, [(BodyKind.DATA, big), (BodyKind.DATA, b"x")])
    header_codec._NAMES.clear()  # a cache: other tests may have filled it to its bound
    event = decode_frames(list(frames), from_server=True)
    assert isinstance(event, Incoming)
    assert event.message.header == header
    assert event.message.body[0][1] is big
    again = decode_frames(list(frames), from_server=True)
    assert isinstance(again, Incoming)
    # The names come from the cache the Python header decoder shares: the same str objects.
    assert again.message.header.device is event.message.header.device


def test_compiled_parser_survives_and_agrees_with_python_on_40k_fuzzed_messages() -> None:
    cmd = [sys.executable, str(SCRIPT), "--count", "40000", "--chunk", "20000", "--seed", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    report = json.loads(proc.stdout)
    counts = report["counts"]
    assert report["crashes"] == [], report["crashes"]
    assert counts["inputs"] == 40000
    assert counts["disagreements"] == 0 and counts["other"] == 0, report["examples"]
    # The inputs reach both outcomes: messages accepted compiled and messages left to Python.
    assert counts["accepted"] > 4000 and counts["left_to_python"] > 20000
    assert proc.returncode == 0, proc.stderr


def test_rda_pure_python_parses_every_message_in_python() -> None:
    code = (
        "from rda.transport import protocol as p\n"
        "from rda.serialization import Header, RequestType\n"
        "frames = p.encode_message(p.Kind.REPLY, Header(RequestType.REPLY, 5, 'D', 'P'))\n"
        "event = p.decode_frames(list(frames), from_server=True)\n"
        "print(p.frame_parser, p._parse_compiled, event.message.header.id)\n"
    )
    env = {**os.environ, "RDA_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.stdout.split() == ["python", "None", "5"], out.stderr


def _notification(sub_id: int, seq: int) -> list[bytes]:
    header = Header(RequestType.NOTIFICATION_DATA, sub_id, "PS1", "Acquisition")
    context = seq.to_bytes(8, "little") + bytes(18)
    frames = encode_message(
        Kind.REPLY, header, [(BodyKind.DATA, b"\x01data"), (BodyKind.DATA_CONTEXT, context)]
    )
    return [bytes(f) for f in frames]


def test_a_subscriptions_notifications_share_one_header_and_replies_do_not() -> None:
    first = decode_frames(_notification(7, 1), from_server=True)
    second = decode_frames(_notification(7, 2), from_server=True)
    other = decode_frames(_notification(8, 1), from_server=True)
    assert isinstance(first, Incoming) and isinstance(second, Incoming)
    assert isinstance(other, Incoming)
    assert second.message.header is first.message.header
    assert other.message.header is not first.message.header and other.message.header.id == 8
    reply = Header(RequestType.REPLY, 5, "PS1", "Acquisition")
    frames = [bytes(f) for f in encode_message(Kind.REPLY, reply, [(BodyKind.DATA, b"x")])]
    a, b = decode_frames(frames, from_server=True), decode_frames(list(frames), from_server=True)
    assert isinstance(a, Incoming) and isinstance(b, Incoming)
    assert a.message.header == b.message.header and a.message.header is not b.message.header


def test_bodies_are_sliced_when_read_and_frame_does_not_keep_them() -> None:
    frames = _notification(9, 42)
    event = decode_frames(frames, from_server=True)
    assert isinstance(event, Incoming)
    message = event.message
    context = message.frame(BodyKind.DATA_CONTEXT)
    assert isinstance(context, memoryview) and context.obj is frames[0]
    assert message.seq == 42
    assert message._body is None  # frame() and seq built no body tuple
    ((k0, data), (k1, _)) = message.body
    assert (k0, k1) == (BodyKind.DATA, BodyKind.DATA_CONTEXT)
    assert bytes(data) == b"\x01data" and isinstance(data, memoryview) and data.obj is frames[0]
    assert message.body is message.body  # made once


def test_a_queued_notification_is_at_most_two_objects_for_the_garbage_collector() -> None:
    # The collector walks every tracked object that survives; a burst of notifications waits
    # in a queue (docs/client.md, "Performance"). Ten per message made its passes 3.5 us of
    # the client's ~8 us per notification.
    batch = [_notification(11, seq) for seq in range(1, 1001)]
    decode_frames(batch[0], from_server=True)  # the shared header is cached now
    gc.disable()
    try:
        before = len(gc.get_objects())
        kept = [decode_frames(frames, from_server=True) for frames in batch]
        per_message = (len(gc.get_objects()) - before - 1) / len(kept)  # -1: the list
    finally:
        gc.enable()
    # The Incoming event and the Message (the spans tuple holds only ints and kinds: the
    # collector untracks it on its first pass).
    assert per_message <= 3.0, per_message


@pytest.mark.parametrize(
    "context", [None, b"", b"\x01\x02\x03", (7).to_bytes(8, "little") + bytes(18)]
)
def test_peek_seq_agrees_compiled_and_in_python(context: bytes | None) -> None:
    header = Header(RequestType.NOTIFICATION_DATA, 3, "PS1", "Acquisition")
    body = [(BodyKind.DATA, b"\x01data")]
    if context is not None:
        body.append((BodyKind.DATA_CONTEXT, context))
    frames = [bytes(f) for f in encode_message(Kind.REPLY, header, body)]
    fast = decode_frames(frames, from_server=True)
    assert isinstance(fast, Incoming)
    slow = protocol._decode_message(frames)
    want = 7 if context is not None and len(context) >= 8 else 0
    assert fast.message.peek_seq() == slow.peek_seq() == want
