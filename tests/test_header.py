"""The fixed header and data-context frames: round trips, golden bytes, and bad input."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rda.serialization.errors import DecodeError
from rda.serialization.header import (
    PROTOCOL_VERSION,
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    decode_context,
    decode_header,
    encode_context,
    encode_header,
)

names = st.text(max_size=40)


@given(
    st.sampled_from(list(RequestType)),
    st.integers(0, 2**64 - 1),
    names,
    names,
    names,
    st.sampled_from(list(UpdateType)),
    st.sampled_from([HeaderFlags.NONE, HeaderFlags.CONFLATABLE]),
)
def test_header_round_trip(
    rtype: RequestType,
    ident: int,
    device: str,
    prop: str,
    selector: str,
    utype: UpdateType,
    flags: HeaderFlags,
) -> None:
    header = Header(rtype, ident, device, prop, selector, utype, flags)
    assert decode_header(encode_header(header)) == header
    assert decode_header(memoryview(encode_header(header))) == header


def test_header_golden_bytes() -> None:
    frame = encode_header(Header(RequestType.GET, 7, "PS1", "Acq", "", UpdateType.NORMAL))
    assert (
        frame.hex() == "03000000" + "0700000000000000" + "0300" + "0300" + "0000" + b"PS1Acq".hex()
    )


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (b"", "shorter than"),
        (b"\x01\x00", "shorter than"),
        (bytes([1]) + bytes(17), "unsupported protocol version 1"),
        (bytes([PROTOCOL_VERSION, 99]) + bytes(16), "unknown request type 99"),
        (bytes([PROTOCOL_VERSION, 0, 7]) + bytes(15), "unknown update type 7"),
        (
            bytes([PROTOCOL_VERSION, 0, 0, 0]) + bytes(8) + b"\xff\xff\x00\x00\x00\x00",
            "declares 65535 bytes",
        ),
        (
            bytes([PROTOCOL_VERSION, 0, 0, 0])
            + bytes(8)
            + b"\x02\x00\x00\x00\x00\x00"
            + b"\xff\xfe",
            "UTF-8",
        ),
    ],
)
def test_bad_header_raises_decode_error(frame: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError, match=fragment):
        decode_header(frame)


@given(st.binary(max_size=64))
def test_any_bytes_give_header_or_decode_error(frame: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_header(frame)


@given(st.text(max_size=30), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**64 - 1))
def test_context_round_trip(name: str, stamp: int, seq: int) -> None:
    ctx = DataContext(name, stamp, -stamp if stamp > -(2**63) else 0, "SEL")
    assert decode_context(encode_context(ctx, seq), "SEL") == (ctx, seq)


def test_context_length_mismatch() -> None:
    frame = encode_context(DataContext("CPS"), 1)
    with pytest.raises(DecodeError, match="cycle name"):
        decode_context(frame[:-1])
