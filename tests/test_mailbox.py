"""The mailbox hand-off to a dispatcher: bounded, signalled only while the reader sleeps."""

from __future__ import annotations

import os
import select
import sys
import threading
from typing import Any

import numpy as np
import zmq

from rda.serialization.message import Message
from rda.testing import wait_until
from rda.transport import _zmq_common as common
from rda.transport.mailbox import Mailbox
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

WAIT = 10.0


class _Server:
    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        pass

    def on_message(self, peer: bytes, message: Message) -> None:
        pass

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        pass


class _Client:
    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        pass

    def on_message(self, connection: int, message: Message) -> None:
        pass

    def on_disconnected(self, connection: int, reason: str) -> None:
        pass


def waiting_in(thread: threading.Thread, method: str) -> bool:
    """Whether ``thread`` is blocked in a ``threading`` wait somewhere inside ``method``.

    Read from the thread's own stack: the positive sign that a producer waits for room,
    where "it has not finished after 0.2 s" would only guess (and pass, vacuously, when the
    producer had simply not been scheduled yet).
    """
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_filename != threading.__file__:
        return False
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return "wait" in names and method in names


def readable(fd: int, timeout_ms: int = 0) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(timeout_ms))


def test_items_arrive_whole_and_in_order_without_a_copy() -> None:
    box = Mailbox(10)
    try:
        body = np.arange(100_000, dtype=np.float64)
        frames = [b"h", body.data]
        assert box.put(("op", frames))
        assert box.put(("op2", None))
        first = box.items.popleft()
        assert first[1] is frames and frames[1].obj is body  # the object, not a copy
        assert box.items.popleft() == ("op2", None)
        assert not box.items
    finally:
        box.close()


def test_no_signal_unless_the_reader_sleeps() -> None:
    box = Mailbox(10)
    try:
        for i in range(5):
            assert box.put(i)
        assert box.signals == 0
        assert not readable(box.fd)
        box.sleeping = True
        assert box.put(5)
        assert box.put(6)  # the first put cleared the flag: one signal for both
        assert box.signals == 1
        assert readable(box.fd)
        box.clear_signal()
        assert not readable(box.fd)
    finally:
        box.close()


def test_a_full_mailbox_blocks_the_producer_until_the_reader_takes() -> None:
    box = Mailbox(3)
    done = threading.Event()

    def produce() -> None:
        for i in range(6):
            box.put(i)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_until(lambda: waiting_in(producer, "put"), "the producer to block on the fourth put")
        assert list(box.items) == [0, 1, 2]  # it cannot add a fourth
        assert not done.is_set()
        got: list[int] = []

        def take() -> bool:
            while box.items:
                got.append(box.items.popleft())
            box.taken()
            return len(got) == 6

        wait_until(take, "the reader to take all six", probe=lambda: got)
        assert got == list(range(6))
        assert done.wait(WAIT)
    finally:
        box.mark_closed()
        producer.join(WAIT)
        box.close()


def test_mark_closed_releases_a_blocked_producer_and_refuses_puts() -> None:
    box = Mailbox(1)
    assert box.put("a")
    result: list[bool] = []
    producer = threading.Thread(target=lambda: result.append(box.put("b")))
    producer.start()
    wait_until(lambda: waiting_in(producer, "put"), "the producer to block on the full mailbox")
    box.mark_closed()
    producer.join(WAIT)
    assert result == [False]
    assert not box.put("c")
    assert list(box.items) == ["a"]
    box.close()


def test_a_put_that_may_not_wait_goes_in_over_the_bound_and_wait_for_room_paces() -> None:
    # A notifier holds its source's ordering lock while it publishes, so that put must not
    # block (ServerTransport.publish); it paced itself with wait_for_room before the lock.
    box = Mailbox(2)
    assert box.put("a") and box.put("b")
    assert box.put("c", wait=False)  # over the bound, at once
    assert list(box.items) == ["a", "b", "c"]
    waited = threading.Event()
    answer: list[bool] = []

    def pace() -> None:
        answer.append(box.wait_for_room())
        waited.set()

    pacer = threading.Thread(target=pace)
    pacer.start()
    try:
        wait_until(lambda: waiting_in(pacer, "wait_for_room"), "the pacer to wait for room")
        assert not waited.is_set()  # still full: it waits, and put nothing
        assert list(box.items) == ["a", "b", "c"]
        box.items.popleft()
        box.items.popleft()
        box.taken()
        assert waited.wait(WAIT)
        assert answer == [True]
        assert list(box.items) == ["c"]
        # Closing releases a pacer too, with False.
        assert box.put("d")
        answer.clear()
        waited.clear()
        pacer2 = threading.Thread(target=pace)
        pacer2.start()
        wait_until(lambda: waiting_in(pacer2, "wait_for_room"), "the second pacer to wait")
        assert not waited.is_set()
        box.mark_closed()
        pacer2.join(WAIT)
        assert answer == [False]
        assert not box.put("e", wait=False)
    finally:
        box.mark_closed()
        pacer.join(WAIT)
        box.close()


def test_wake_signals_even_when_not_sleeping_and_close_frees_the_fds() -> None:
    box = Mailbox(4)
    fd = box.fd
    assert box.wake(1.0)
    assert readable(fd)
    box.close()
    assert not box.wake(1.0)  # closed: nothing written to a reused descriptor
    assert not box.put("x")


def test_transports_close_their_mailbox_descriptors() -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    for _ in range(20):
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        srv = ZmqServerTransport("inproc://mailbox-fds", _Server(), context=ctx)
        srv.start()
        cl = ZmqClientTransport(_Client(), context=ctx)
        cl.start()
        cl.connect(srv.endpoint)
        cl.close()
        srv.close()
        ctx.term()
    # One leaked eventfd per transport would be 40; a stray descriptor of the runtime is not.
    assert open_fds() - before < 5


def test_selector_reports_the_mailbox_and_sleeps_only_when_it_is_empty() -> None:
    box = Mailbox(8)
    sel = common.Selector()
    sel.attach(box)
    try:
        assert sel.poll(0) == []
        assert box.put("x")  # the selector is not sleeping: no signal
        assert box.signals == 0
        assert sel.poll(-1) == [(box, zmq.POLLIN)]  # returns at once: items waiting
        box.items.clear()

        def late_put() -> None:
            # Once the selector is about to sleep (it sets the flag before its poll): the put
            # must then signal, whenever this thread gets to run.
            wait_until(lambda: box.sleeping, "the selector to sleep")
            box.put("y")

        t = threading.Thread(target=late_put)
        t.start()
        assert sel.poll(int(WAIT * 1000)) == [(box, zmq.POLLIN)]  # woken by the signal
        t.join()
        assert box.signals == 1
        assert not box.sleeping
        box.items.clear()
        sel.watch_mailbox(False)
        box.put("z")
        assert sel.poll(0) == []  # paused: items wait, the producers block when it fills
        sel.watch_mailbox(True)
        assert sel.poll(0) == [(box, zmq.POLLIN)]
    finally:
        box.close()
