"""The GIL-keeping, non-blocking libzmq calls of the dispatchers (transport/_czmq.pyx, bound
by transport/_direct_zmq.py to the libzmq pyzmq loaded): the same outcomes as pyzmq's calls."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from rda.transport import _direct_zmq
from rda.transport import _zmq_common as common

pytestmark = pytest.mark.timeout(30)

BIG = 65536


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.ROUTING_ID, b"D1")
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield router, dealer
    finally:
        router.close()
        dealer.close()
        ctx.term()


def wait_readable(sock: zmq.Socket[bytes]) -> None:
    assert sock.poll(5000, zmq.POLLIN), "nothing arrived"


def test_bound_to_the_loaded_libzmq_on_this_machine() -> None:
    assert _direct_zmq.recv is not None and _direct_zmq.send is not None
    assert common.direct_recv is _direct_zmq.recv and common.direct_send is _direct_zmq.send


def test_binding_takes_only_a_file_already_loaded(tmp_path: Path) -> None:
    from rda.transport import _czmq

    assert not _czmq.bind(str(tmp_path / "not-loaded.so"))  # dlopen(RTLD_NOLOAD) refuses
    assert _direct_zmq.recv is not None  # the binding in use is untouched


def test_a_waiting_receive_releases_the_gil(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    """A lane's receive: it waits for the reply with the GIL released, so a Python thread of
    the same process can send it meanwhile (holding the GIL, the wait would end empty at
    RCVTIMEO, the sender never having run)."""
    router, dealer = pair
    recv = _direct_zmq.recv
    assert recv is not None
    dealer.setsockopt(zmq.RCVTIMEO, 20_000)
    dealer.send(b"ping")
    wait_readable(router)
    rid, _ = router.recv_multipart()
    go = threading.Event()

    def answer() -> None:
        go.wait(20)  # woken by the set() right before the receive, it still needs the GIL
        router.send_multipart([rid, b"pong", bytes(BIG)])

    thread = threading.Thread(target=answer)
    thread.start()
    go.set()
    frames = recv(dealer.underlying, BIG, True)
    thread.join()
    assert isinstance(frames, list) and frames[0] == b"pong" and len(frames[1]) == BIG


def test_a_polling_receive_takes_the_reply_without_sleeping_and_releases_the_gil(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    """``spin`` (Config.lane_spin): the receive polls for the reply with the GIL released.
    RCVTIMEO 0 leaves no sleeping wait after the polling, so the reply, sent by a Python
    thread that needs the GIL to send it, can only have been taken while polling."""
    router, dealer = pair
    recv = _direct_zmq.recv
    assert recv is not None
    dealer.setsockopt(zmq.RCVTIMEO, 0)
    dealer.send(b"ping")
    wait_readable(router)
    rid, _ = router.recv_multipart()
    go = threading.Event()

    def answer() -> None:
        go.wait(20)
        router.send_multipart([rid, b"pong"])

    thread = threading.Thread(target=answer)
    thread.start()
    go.set()
    frames = recv(dealer.underlying, BIG, True, 20.0)
    thread.join()
    assert frames == [b"pong"]


def test_polling_that_finds_nothing_then_waits_until_rcvtimeo(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    router, dealer = pair
    recv = _direct_zmq.recv
    assert recv is not None
    dealer.setsockopt(zmq.RCVTIMEO, 30)
    assert recv(dealer.underlying, BIG, True, 0.001) is None
    # And a reply already there is taken by the first poll.
    dealer.send(b"ping")
    wait_readable(router)
    rid, _ = router.recv_multipart()
    router.send_multipart([rid, b"pong"])
    wait_readable(dealer)
    assert recv(dealer.underlying, BIG, True, 0.001) == [b"pong"]


def test_a_waiting_receive_ends_empty_at_rcvtimeo(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    _, dealer = pair
    recv = _direct_zmq.recv
    assert recv is not None
    dealer.setsockopt(zmq.RCVTIMEO, 30)
    assert recv(dealer.underlying, BIG, True) is None


def test_recv_gives_none_then_the_whole_message(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    router, dealer = pair
    recv = _direct_zmq.recv
    assert recv is not None
    assert recv(router.underlying, BIG) is None  # nothing waiting: no wait, no error
    big = bytes(range(256)) * 512
    dealer.send_multipart([b"small", big])
    wait_readable(router)
    rid, small, large = recv(router.underlying, BIG)
    assert rid == b"D1" and small == b"small" and type(small) is bytes
    assert isinstance(large, memoryview) and large.readonly and bytes(large) == big


def test_a_big_frame_outlives_its_socket_and_context() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    b.bind("inproc://direct")
    a.connect("inproc://direct")
    big = os.urandom(3 * BIG)
    a.send(big)
    wait_readable(b)
    recv = _direct_zmq.recv
    assert recv is not None
    (frame,) = recv(b.underlying, BIG)
    a.close()
    b.close()
    ctx.term()
    assert bytes(frame[BIG:]) == big[BIG:]  # still libzmq's message, still valid


def test_send_routed_is_pyzmqs_send_with_its_errors(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    router, dealer = pair
    dealer.send(b"hello")  # the router learns the dealer's routing id
    wait_readable(router)
    router.recv_multipart()
    common.send_routed(router, b"D1", [b"one", memoryview(b"two")])
    wait_readable(dealer)
    assert dealer.recv_multipart() == [b"one", b"two"]
    with pytest.raises(zmq.ZMQError) as info:
        common.send_routed(router, b"nobody", [b"x"])  # ROUTER_MANDATORY: unroutable
    assert info.value.errno == zmq.EHOSTUNREACH
    big = os.urandom(BIG)
    send = _direct_zmq.send
    assert send is not None
    assert send(router.underlying, b"D1", [big], BIG) == -1  # too big to copy: not sent
    common.send_routed(router, b"D1", [big])  # ... pyzmq sends it, zero-copy
    wait_readable(dealer)
    assert dealer.recv() == big


def test_a_full_or_peerless_pipe_is_zmq_again() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    lonely = ctx.socket(zmq.DEALER)  # no peer: a DONTWAIT send has nowhere to go
    lonely.linger = 0
    try:
        send = _direct_zmq.send
        assert send is not None
        assert send(lonely.underlying, None, [b"x"], BIG) == errno.EAGAIN
        with pytest.raises(zmq.Again):
            common.send_frames(lonely, [b"x"])
    finally:
        lonely.close()
        ctx.term()


def test_an_unsupported_operation_is_pyzmqs_error() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.linger = 0
    try:
        recv = _direct_zmq.recv
        assert recv is not None
        assert recv(pub.underlying, BIG) == errno.ENOTSUP  # errno, for pyzmq to raise
        with pytest.raises(zmq.ZMQError):
            common.recv_frames(pub)
    finally:
        pub.close()
        ctx.term()


def test_rda_pure_python_turns_the_direct_calls_off() -> None:
    code = "from rda.transport import _direct_zmq as d; print(d.recv is None, d.send is None)"
    env = {**os.environ, "RDA_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=20
    )
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_messages_keep_their_order_across_direct_and_pyzmq_sends(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    router, dealer = pair
    big = os.urandom(BIG)
    for i in range(50):
        common.send_frames(dealer, [str(i).encode()] if i % 5 else [big, str(i).encode()])
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < 50 and time.monotonic() < deadline:
        frames = common.recv_frames(router)
        if frames is None:
            router.poll(100)
            continue
        got.append(int(frames[-1].bytes))
    assert got == list(range(50))
