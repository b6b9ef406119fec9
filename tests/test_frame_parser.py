"""The compiled REQUEST/REPLY frame parser (``rda.transport._cframe``) beside the Python one.

``decode_frames`` tries the compiled parser first and parses again in Python whatever it
leaves (None): so the two must agree on every message the compiled one accepts, and the
compiled one must leave every message the Python one refuses. A short run of
``benchmarks/fuzz_frames.py`` (child processes: a crash fails the test instead of pytest)
checks that on fuzzed input; the golden corpus checks it on the documented bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rda.serialization import BodyKind, Header, RequestType, _header
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
    _header._NAMES.clear()  # a cache: other tests may have filled it to its bound
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
