"""A Message decodes its DATA body on first access only, once, in the thread that asks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rda.serialization import (
    BodyKind,
    Data,
    DecodeError,
    Header,
    Message,
    RequestType,
    binary,
    encode,
)


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Count calls to the binary decoder that Message uses."""
    calls: list[Any] = []
    real = binary.decode

    def counting(buffer: Any, limits: Any = None) -> Data:
        calls.append(buffer)
        return real(buffer, limits)

    monkeypatch.setattr(binary, "decode", counting)
    return calls


def _message(body: bytes) -> Message:
    header = Header(RequestType.SET, 7, "PS1", "Acquisition")
    return Message(header, [(BodyKind.DATA, memoryview(body))])


def test_unread_body_is_never_decoded(decode_calls: list[Any]) -> None:
    message = _message(encode(Data(current=1.5)))
    assert message.header.device == "PS1"
    assert message.frame(BodyKind.DATA) is not None
    repr(message)
    assert decode_calls == []


def test_body_read_twice_is_decoded_once(decode_calls: list[Any]) -> None:
    original = Data(current=1.5, wave=np.arange(1000, dtype=np.float64))
    frame = encode(original)
    message = _message(frame)
    first = message.data
    second = message.data
    assert first is second and first == original
    assert len(decode_calls) == 1
    # zero-copy through the message too: the array views the received frame
    assert first is not None
    assert np.shares_memory(first["wave"], np.frombuffer(frame, np.uint8))


def test_a_bad_body_fails_only_when_read(decode_calls: list[Any]) -> None:
    message = _message(b"\x05\x00\x00\x00")
    assert message.header.id == 7  # routing still works
    with pytest.raises(DecodeError, match="Data declares 5 entries"):
        _ = message.data
    assert len(decode_calls) == 1


def test_message_without_data_body(decode_calls: list[Any]) -> None:
    message = Message(Header(RequestType.GET, 1, "PS1", "Acquisition"))
    assert message.data is None
    assert decode_calls == []
