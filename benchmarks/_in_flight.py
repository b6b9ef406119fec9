"""Gets kept 64 in flight through an rda access point: the throughput loop that
``benchmarks/rpc.py`` and its ``--secure`` arrangement (``_secure.py``) share; and raw pyzmq's
counterpart by count, for the structural passes (``_structure``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

IN_FLIGHT = 64


def gets_in_flight(ap: Any, seconds: float) -> float:
    """Gets per second with ``IN_FLIGHT`` outstanding: each completion sends the next one."""
    done = 0
    lock = threading.Lock()
    finished = threading.Event()
    end = time.perf_counter() + seconds

    def again(fut: Any) -> None:
        nonlocal done
        fut.result()  # decode in the completing thread, as a caller would
        with lock:
            done += 1
        if time.perf_counter() < end:
            ap.get_async().add_done_callback(again)
        else:
            finished.set()

    t0 = time.perf_counter()
    for _ in range(IN_FLIGHT):
        ap.get_async().add_done_callback(again)
    finished.wait(seconds + 30)
    elapsed = time.perf_counter() - t0
    time.sleep(0.2)  # let the other 63 land before anything else is measured
    return done / elapsed


def raw_window(dealer: zmq.Socket[bytes], count: int) -> None:
    """Raw pyzmq: ``count`` requests, ``IN_FLIGHT`` outstanding on one DEALER."""
    outstanding = min(IN_FLIGHT, count)
    for i in range(outstanding):
        dealer.send_multipart([b"SCALAR", str(i).encode()])
    for i in range(count - outstanding):
        dealer.recv_multipart(copy=False)
        dealer.send_multipart([b"SCALAR", str(i).encode()])
    for _ in range(outstanding):
        dealer.recv_multipart(copy=False)
