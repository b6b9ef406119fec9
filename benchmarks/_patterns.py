"""Structural counts of the patterns docs/client.md shows, beside raw pyzmq's and rpc.py's own.

Issue 28 asked why a user's code got about half of rpc.py's throughput: these counts (see
``_structure``: pyzmq calls, context switches and, under strace, system calls, per operation
and per process) put the documented patterns beside the ones rpc.py's ``rda`` contestant uses,
against the same ``rpc.py --serve rda`` child:

* 64 gets in flight: ``in_flight_futures``, a window of ``get_async()`` futures each waited
  on with ``result()`` (docs/client.md), and ``in_flight_callbacks``, each completion's
  ``add_done_callback`` sending the next get (``_in_flight.gets_in_flight``); raw pyzmq keeps
  64 requests outstanding on its DEALER (``_structure.raw_structure``'s ``in_flight``);
* notifications: ``notification_listener``, a ``subscribe(listener=...)`` callback, beside
  ``_structure.rda_structure``'s ``notification`` (``poll()`` on a subscription).

Counts are per operation: one get, or one notification received.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from _in_flight import IN_FLIGHT
from _structure import Child, measure

from rda.business.client.access import AccessPoint
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.serialization.data import Data
from rda.serialization.header import UpdateType

WAIT = 60.0


def futures_window(ap: AccessPoint, count: int) -> None:
    """``count`` gets, ``IN_FLIGHT`` outstanding: the oldest future waited on, then replaced."""
    window = deque(ap.get_async() for _ in range(min(IN_FLIGHT, count)))
    for _ in range(count - len(window)):
        window.popleft().result(WAIT)
        window.append(ap.get_async())
    for future in window:
        future.result(WAIT)


def callback_chain(ap: AccessPoint, count: int) -> None:
    """``count`` gets, ``IN_FLIGHT`` outstanding: each completion's callback sends the next."""
    lock = threading.Lock()
    finished = threading.Event()
    state = {"sent": 0, "done": 0}

    def send() -> None:
        state["sent"] += 1  # under ``lock``, or before any callback can run
        ap.get_async().add_done_callback(again)

    def again(future: Future[Any]) -> None:
        future.result()  # decoded in the completing thread, as a caller would
        with lock:
            state["done"] += 1
            more = state["sent"] < count
            if more:
                send()
            elif state["done"] == count:
                finished.set()

    with lock:
        for _ in range(min(IN_FLIGHT, count)):
            send()
    if not finished.wait(WAIT):
        raise TimeoutError(f"{state['done']} of {count} gets completed in {WAIT} s")


class _Listener:
    """Counts what a ``subscribe(listener=...)`` callback receives; ``reached`` is set once
    the update with sequence number ``target`` (or a later one) arrived."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.gaps = 0
        self.target = 0
        self.first = threading.Event()
        self.reached = threading.Event()

    def __call__(self, update: Any) -> None:
        if update.update_type is UpdateType.FIRST:
            self.last_seq = update.seq
            self.first.set()
            return
        self.gaps += update.gap
        self.last_seq = update.seq
        if update.seq >= self.target:
            self.reached.set()


def rda_patterns(make_child: Callable[[str], Child], n: int) -> dict[str, Any]:
    """Per get of the two in-flight patterns and per notification of a listener, against a
    ``--serve rda`` child."""
    child = make_child("rda")
    client = ClientService(StaticDirectory({"*": child.endpoint}), Config(workers=2))
    try:
        scalar = client.access_point("SCALAR", "Acquisition")
        futures_window(scalar, 200)  # warm up, and connected
        out = {
            "in_flight_futures": measure(child, lambda c: futures_window(scalar, c), n),
            "in_flight_callbacks": measure(child, lambda c: callback_chain(scalar, c), n),
        }
        listener = _Listener()
        sub = scalar.subscribe(listener=listener, queue_size=100_000)
        if not listener.first.wait(WAIT):
            raise TimeoutError("no FIRST update")
        publisher = client.access_point("SCALAR", "Publish")

        def notifications(count: int) -> None:
            listener.reached.clear()
            listener.target = listener.last_seq + count
            publisher.set(Data(n=count))
            if not listener.reached.wait(WAIT):
                raise TimeoutError(f"update {listener.target} not received in {WAIT} s")

        out["notification_listener"] = measure(child, notifications, n)
        # Conflated by the server when the listener fell behind (strace slows it): counted.
        out["notification_listener"]["conflated"] = listener.gaps
        sub.close()
        return out
    finally:
        client.close()
        child.close()
