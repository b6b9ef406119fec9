"""The inproc hand-off pipe: small messages as one packed frame, big ones as several frames."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from rda.transport import _zmq_common as common


@pytest.fixture
def pipe() -> Iterator[tuple[common.SendPipe, zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    address = common.pipe_address("test")
    pull = common.open_pipe_pull(context, address, 100)
    push = common.SendPipe(context, address, 100)
    try:
        yield push, pull
    finally:
        push.close()
        common.close_socket(pull)
        context.term()


def roundtrip(
    pipe: tuple[common.SendPipe, zmq.Socket[bytes]], head: bytes, frames: list[Any]
) -> tuple[bytes, list[bytes]]:
    push, pull = pipe
    assert push.send(head, frames)
    assert pull.poll(5000, zmq.POLLIN)
    message = common.recv_pipe(pull)
    assert message is not None
    got_head, got = message
    assert common.recv_pipe(pull) is None  # exactly one pipe message per hand-off
    return got_head, [bytes(f) for f in got]


@given(
    head=st.binary(max_size=40),
    frames=st.lists(st.binary(max_size=2000), max_size=8),
)
@settings(max_examples=100, deadline=None)
def test_small_messages_come_back_unchanged(head: bytes, frames: list[bytes]) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    address = common.pipe_address("test")
    pull = common.open_pipe_pull(context, address, 100)
    push = common.SendPipe(context, address, 100)
    try:
        assert roundtrip((push, pull), head, frames) == (head, frames)
    finally:
        push.close()
        common.close_socket(pull)
        context.term()


def test_small_message_is_one_frame_and_big_one_keeps_its_frames(
    pipe: tuple[common.SendPipe, zmq.Socket[bytes]],
) -> None:
    push, pull = pipe
    assert push.send(b"op", [b"a", b"bc", b""])
    assert pull.poll(5000, zmq.POLLIN)
    assert len(pull.recv_multipart()) == 1
    big = b"x" * common.PACK_LIMIT
    assert push.send(b"op", [b"a", big])
    assert pull.poll(5000, zmq.POLLIN)
    assert len(pull.recv_multipart()) == 3


def test_big_message_frames_arrive_whole(pipe: tuple[common.SendPipe, zmq.Socket[bytes]]) -> None:
    body = np.arange(common.PACK_LIMIT // 8 + 1, dtype=np.float64)
    head, frames = roundtrip(pipe, b"\x01head", [b"h", body.data, b"t"])
    assert head == b"\x01head"
    assert frames == [b"h", body.tobytes(), b"t"]


def test_typed_memoryview_is_packed_by_bytes_not_items(
    pipe: tuple[common.SendPipe, zmq.Socket[bytes]],
) -> None:
    body = np.arange(40, dtype=np.float64)  # len(memoryview) is 40, its size 320 bytes
    _, frames = roundtrip(pipe, b"h", [body.data, b"after"])
    assert frames == [body.tobytes(), b"after"]


def test_wake_is_a_message_without_frames(pipe: tuple[common.SendPipe, zmq.Socket[bytes]]) -> None:
    push, pull = pipe
    assert push.wake(b"wake", 1.0)
    assert pull.poll(5000, zmq.POLLIN)
    assert common.recv_pipe(pull) == (b"wake", [])


def test_send_after_close_sends_nothing(pipe: tuple[common.SendPipe, zmq.Socket[bytes]]) -> None:
    push, pull = pipe
    push.mark_closed()
    assert not push.send(b"op", [b"frame"])
    assert common.recv_pipe(pull) is None


def test_frame_count_beyond_sixteen_bits(pipe: tuple[common.SendPipe, zmq.Socket[bytes]]) -> None:
    # A publish carries one header frame per target: 70,000 subscribers must still fit, packed
    # (35,000 bytes in all) and not packed (140,000 bytes).
    small = [b"x" if i % 2 else b"" for i in range(70_000)]
    big = [b"xy" for _ in range(70_000)]
    for frames in (small, big):
        head, got = roundtrip(pipe, b"publish", frames)
        assert head == b"publish"
        assert got == frames
