"""PyTango as a contestant of ``benchmarks/rpc.py``: the system an rda user would pick instead.

Optional: PyPI's ``pytango`` wheels bundle the C++ Tango and omniORB libraries (``pip install
rda[bench]``); without it ``rpc.py`` reports the contestant as absent and runs the rest. No
Tango database: the child serves one device directly (``-nodb -dlist``) and the client names
it with ``#dbase=no``.

The same access points as rda's and raw's, on one device ``test/bench/1``:

* ``get_scalar``: ``read_attribute("current")`` (a double); ``set``: ``write_attribute``;
* ``get_object``: the RDA3 benchmark object, as Tango has no structured values: one
  ``read_attributes`` call for three spectrum attributes (int32[40], float64[40], string[40]);
* 64 in flight: ``read_attribute_asynch`` requests kept 64 outstanding, each reply collected
  with ``read_attribute_reply`` in order (Tango's polling-model asynchronous call);
* 1 MiB: ``read_attribute("mib")``, a spectrum of 131072 float64 (no read-only variant:
  Tango has one path for both, so both 1 MiB passes measure the same call).

Subscriptions are not measured for Tango (change events need a published attribute and a
polling or a pushing thread set up in a way that has no counterpart in the other servers).

The server (``rpc.py --serve tango``) calls its handlers on omniORB's receiving thread: the
arrangement rda's default now copies (docs/server.md, "Threads and order").
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

DEVICE = "test/bench/1"


def available() -> bool:
    return importlib.util.find_spec("tango") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve() -> None:
    """Child process: serve ``test/bench/1`` without a database, print its address (a
    ``tango://`` name) once it listens, exit when stdin closes."""
    import numpy as np
    from tango import AttrWriteType
    from tango.server import Device, attribute, run

    ints = np.arange(40, dtype=np.int32)
    doubles = np.linspace(0.0, 1.0, 40)
    strings = [f"element-{i:02d}" for i in range(40)]
    mib = np.zeros(131072, dtype=np.float64)

    class Bench(Device):  # type: ignore[misc]
        current = attribute(dtype=float, access=AttrWriteType.READ_WRITE)
        ints_40 = attribute(dtype=(np.int32,), max_dim_x=40)
        doubles_40 = attribute(dtype=(float,), max_dim_x=40)
        strings_40 = attribute(dtype=(str,), max_dim_x=40)
        mib_values = attribute(dtype=(float,), max_dim_x=131072)

        def init_device(self) -> None:
            super().init_device()
            self._current = 1.5

        def read_current(self) -> float:
            return self._current

        def write_current(self, value: float) -> None:
            self._current = value

        def read_ints_40(self) -> Any:
            return ints

        def read_doubles_40(self) -> Any:
            return doubles

        def read_strings_40(self) -> Any:
            return strings

        def read_mib_values(self) -> Any:
            return mib

    port = _free_port()
    address = f"tango://127.0.0.1:{port}/{DEVICE}#dbase=no"

    def ready() -> None:
        print(address, flush=True)

        def wait_for_eof() -> None:
            for _ in sys.stdin:
                pass
            os._exit(0)  # the Tango server loop has no stop call from another thread

        threading.Thread(target=wait_for_eof, daemon=True).start()

    args = ["Bench", "bench", "-ORBendPoint", f"giop:tcp:127.0.0.1:{port}", "-nodb"]
    run((Bench,), args=[*args, "-dlist", DEVICE], post_init_callback=ready, raises=True)


class Tango:
    """A ``DeviceProxy`` to the ``--serve tango`` child, with rpc.py's contestant interface."""

    subscriptions = False

    def __init__(self, address: str) -> None:
        import tango

        self.name = "tango"
        self._proxy = tango.DeviceProxy(address)
        self._proxy.set_timeout_millis(10_000)

    def round_trip(self, what: str) -> Callable[[], object]:
        proxy = self._proxy
        if what == "set":
            return lambda: proxy.write_attribute("current", 1.5)
        if what == "get_object":
            names = ["ints_40", "doubles_40", "strings_40"]
            return lambda: proxy.read_attributes(names)[1].value
        return lambda: proxy.read_attribute("current").value

    def in_flight(self, seconds: float) -> float:
        proxy = self._proxy
        window = deque(proxy.read_attribute_asynch("current") for _ in range(64))
        done = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            proxy.read_attribute_reply(window.popleft(), 10_000)
            done += 1
            window.append(proxy.read_attribute_asynch("current"))
        elapsed = time.perf_counter() - t0
        for request in window:
            proxy.read_attribute_reply(request, 10_000)
        return done / elapsed

    def mib(self, n: int, read_only: bool) -> float:
        proxy = self._proxy
        t0 = time.perf_counter()
        for _ in range(n):
            assert len(proxy.read_attribute("mib_values").value) == 131072
        return time.perf_counter() - t0

    def close(self) -> None:
        self._proxy = None
