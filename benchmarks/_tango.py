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
  Tango has one path for both, so both 1 MiB passes measure the same call);
* subscriptions: change events of the attribute ``seq`` (a double), which the device marks
  as pushed by hand (``set_change_event("seq", True, False)``). The ``Publish`` command
  (``[first, count]``, the counterpart of rda's ``SCALAR/Publish`` set and raw's ``PUB``)
  starts a device thread that calls ``push_change_event("seq", v)`` for ``v`` = first ...
  first + count - 1: each value is its own sequence number. Tango change events work without
  a database: the client asks the admin device (``dserver/Bench/bench#dbase=no``) for the
  event channel (``ZmqEventSubscriptionChange``) and subscribes to its ZMQ PUB socket.

How the subscriptions are read, and how a loss is counted:

* ``subscription_1`` / ``subscription_10`` (compared with raw): Tango's *pull* model,
  ``subscribe_event(..., EventType.CHANGE_EVENT, ALL_EVENTS)`` and ``get_events(id)`` in a
  loop that sleeps 1 ms when every queue is empty. It is the fast documented pattern:
  Tango's event thread stores each event in its C++ queue, running no Python code, and
  Python collects them in batches (measured 2-3.5x the callback rate here); ``ALL_EVENTS`` makes the queue
  unbounded, as rda's ``queue_size=100_000`` and raw's ``rcvhwm=0`` are for a burst. The
  same measure with the *push* model (a callback per event, on Tango's event thread; the
  first example of PyTango's docs) is nested as ``callback``.
* Tango drops events when a ZMQ high-water mark of its event sockets is reached (the
  server's PUB socket, the client's SUB socket): both are set to ``HWM`` = 100,000
  (``TANGO_DS_EVENT_BUFFER_HWM``, ``TANGO_EVENT_BUFFER_HWM``, read by cppTango), as raw's
  and rda's queues are sized for a burst. ``RDA_BENCH_TANGO_HWM`` in the environment of
  ``rpc.py`` sets another value, ``default`` leaves Tango's own.
* Tango numbers the events of a stream; a jump in that number reaches the subscriber as an
  error event (reason ``API_MissedEvents``) just before the next event, without saying how
  many were lost. The receive side counts the sequence numbers it saw: ``received``; the
  numbers missing in a hole that Tango flagged are ``gaps``; every other missing number
  (a hole not flagged, the end of the burst never received) is an ``uncounted_loss``.
* ``subscribe_event`` returns before the server's PUB socket has the new subscription (the
  first value comes from a CORBA read, not through the event channel), so events pushed at
  once can be lost with no notice at all (ZMQ's slow joiner: seen as the first 852 and 1477
  numbers of 2 of 60 bursts missing, on a loaded machine). Before each burst a marker is
  pushed, again every 0.2 s, until every subscription has one (``ready_markers``: how many
  it took): the counterpart of rda waiting for the FIRST update and raw for its HELLOs.
* A burst ends when every subscriber has seen its last number, after ``QUIET_S`` without
  any event, or after ``TIMEOUT_S``; ``updates_per_s`` is received / the time from the
  ``Publish`` command to the last update received. ``silent_holes`` lists where uncounted
  losses were (offset in the burst, length), the first five.
* Ten subscriptions in one process share one event stream: Tango's client subscribes to an
  event once per process and calls each of its subscribers (its ``query_event_system()``
  reads ``callback_count`` 10 for one channel), so its server sends one copy of each update
  where raw and rda send ten.

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
# ZMQ high-water mark of Tango's event sockets, both sides (rda's burst: queue_size=100_000);
# RDA_BENCH_TANGO_HWM=default leaves Tango's own settings.
HWM = os.environ.get("RDA_BENCH_TANGO_HWM", "100000")
QUIET_S = 2.0  # a burst ends this long after its last event, if events were lost
TIMEOUT_S = 60.0  # and in any case this long after it started


def available() -> bool:
    return importlib.util.find_spec("tango") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _set_hwm(variable: str) -> None:
    if HWM != "default":
        os.environ[variable] = str(int(HWM))


def serve() -> None:
    """Child process: serve ``test/bench/1`` without a database, print its address (a
    ``tango://`` name) once it listens, exit when stdin closes."""
    _set_hwm("TANGO_DS_EVENT_BUFFER_HWM")  # read when the server starts
    import numpy as np
    from tango import AttrWriteType
    from tango.server import Device, attribute, command, run

    # pytango has no type information: its command decorator, typed as what it does.
    tango_command: Callable[..., Callable[[Callable[..., None]], Callable[..., None]]] = command

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
        seq = attribute(dtype=float)  # pushed by Publish; reads the last value pushed

        def init_device(self) -> None:
            super().init_device()
            self._current = 1.5
            self._seq = 0.0
            self.set_change_event("seq", True, False)  # pushed by hand, not checked

        @tango_command(dtype_in=(int,))
        def Publish(self, first_count: Any) -> None:
            first, count = int(first_count[0]), int(first_count[1])
            threading.Thread(target=self._publish, args=(first, count), daemon=True).start()

        def _publish(self, first: int, count: int) -> None:
            push = self.push_change_event
            for v in range(first, first + count):
                self._seq = float(v)
                push("seq", self._seq)

        def read_seq(self) -> float:
            return self._seq

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

    subscriptions = True

    def __init__(self, address: str) -> None:
        # Read when this process subscribes to its first event (Tango's event consumer).
        _set_hwm("TANGO_EVENT_BUFFER_HWM")
        import tango

        self.name = "tango"
        self._proxy = tango.DeviceProxy(address)
        self._proxy.set_timeout_millis(10_000)
        # Every burst pushes numbers above the last one pushed (the value read at subscription).
        self._next = int(self._proxy.read_attribute("seq").value) + 1

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

    def subscribers(self, count: int, updates: int) -> dict[str, Any]:
        """``count`` subscriptions receive a burst of ``updates`` change events each, read
        through event queues (the pull model); the same with callbacks nested as
        ``callback``."""
        result = self._burst(count, updates, pull=True)
        result["callback"] = self._burst(count, updates, pull=False)
        return result

    def _burst(self, count: int, updates: int, pull: bool) -> dict[str, Any]:
        import tango

        proxy = self._proxy
        # Replaced by the readiness markers' and then the burst's; the callbacks look them up
        # (the first is called during subscribe_event, with the value read: ignored).
        views = [BurstView(self._next, 1) for _ in range(count)]
        change = tango.EventType.CHANGE_EVENT
        if pull:
            queued = tango.constants.ALL_EVENTS  # an unbounded queue per subscription
            ids = [proxy.subscribe_event("seq", change, queued) for _ in range(count)]
        else:
            ids = [
                proxy.subscribe_event("seq", change, lambda e, i=i: views[i].on_event(e))
                for i in range(count)
            ]

        def drain() -> bool:
            got = False
            for event_id, view in zip(ids, views, strict=True):
                for event in proxy.get_events(event_id):
                    view.on_event(event)
                    got = True
            return got

        try:
            markers = self._ready(views, count, drain if pull else None)
            first, self._next = self._next, self._next + updates
            views[:] = [BurstView(first, updates) for _ in range(count)]
            t0 = time.perf_counter()
            proxy.command_inout("Publish", [first, updates])
            wait_for_burst(views, drain if pull else None, t0, QUIET_S)
        finally:
            for event_id in ids:
                proxy.unsubscribe_event(event_id)
        for view in views:
            view.finish()
        received = sum(v.received for v in views)
        gaps = sum(v.gaps for v in views)
        last = max((v.last_at for v in views), default=0.0)
        elapsed = (last if received else time.perf_counter()) - t0
        return {
            "model": "pull (event queue, get_events)" if pull else "push (callback)",
            "sent": updates * count,
            "received": received,
            "gaps": gaps,
            "missed_event_notices": sum(v.notices for v in views),
            "other_errors": sum(v.errors for v in views),
            "uncounted_losses": updates * count - received - gaps,
            # where the silent holes were (offset in the burst, length), the first few
            "silent_holes": [h for v in views for h in v.silent_holes][:5],
            "ready_markers": markers,
            "updates_per_s": received / elapsed,
        }

    def _ready(self, views: list[BurstView], count: int, drain: Callable[[], bool] | None) -> int:
        """Push one marker after another until every subscription received one; how many
        were pushed. ``subscribe_event`` returns before the server's PUB socket knows the
        new subscriber (its first value is read through CORBA, not the event channel), so
        events pushed at once can be lost without a notice (ZMQ's slow joiner): the
        counterpart of rda waiting for the FIRST update and raw for its HELLOs."""
        deadline = time.perf_counter() + 10
        pushed = 0
        while time.perf_counter() < deadline:
            marker, self._next = self._next, self._next + 1
            views[:] = [BurstView(marker, 1) for _ in range(count)]
            self._proxy.command_inout("Publish", [marker, 1])
            pushed += 1
            if wait_for_burst(views, drain, time.perf_counter(), 0.2):
                return pushed
        raise RuntimeError("no Tango change event reached the subscriptions within 10 s")

    def close(self) -> None:
        self._proxy = None


class BurstView:
    """One subscriber's view of a burst of the numbers ``first`` ... ``first + updates - 1``:
    what it received, the numbers missing in holes Tango flagged (``gaps``) and in holes it
    did not (``silent``), counted from the numbers themselves."""

    def __init__(self, first: int, updates: int) -> None:
        self.first, self.last = first, first + updates - 1
        self.next = first  # the number expected next
        self.received = self.gaps = self.silent = 0
        self.notices = 0  # API_MissedEvents error events
        self.errors = 0  # any other error event
        self.flagged = False  # Tango said it missed events since the last number received
        self.last_at = 0.0
        self.done = threading.Event()
        self.silent_holes: list[tuple[int, int]] = []  # (first number missing, how many)

    def on_event(self, event: Any) -> None:
        if event.err:
            if event.errors[0].reason == "API_MissedEvents":
                self.notices += 1
                self.flagged = True
            else:
                self.errors += 1
            return
        value = int(event.attr_value.value)
        if value < self.next:  # the value read at subscription (or a repeat): not this burst's
            return
        self._missing(value - self.next)
        self.received += 1
        self.next = value + 1
        self.last_at = time.perf_counter()
        if value >= self.last:
            self.done.set()

    def _missing(self, n: int) -> None:
        if n and self.flagged:
            self.gaps += n
        elif n:
            self.silent += n
            self.silent_holes.append((self.next - self.first, n))
        self.flagged = False

    def finish(self) -> None:
        """The end of the burst never received is a hole too (Tango flags a jump only when a
        later event arrives, so it is silent unless a notice came after the last number)."""
        self._missing(self.last + 1 - self.next)
        self.next = self.last + 1


def wait_for_burst(
    views: list[BurstView], drain: Callable[[], bool] | None, t0: float, quiet: float
) -> bool:
    """Until every view has its last number (True), ``quiet`` seconds pass without an
    event or ``TIMEOUT_S`` since ``t0`` (False); ``drain`` pulls queued events (pull
    model), else the views are fed by Tango's event thread and this only watches."""
    progress, quiet_since = -1, t0
    while not all(v.done.is_set() for v in views):
        got = drain() if drain is not None else False
        now = time.perf_counter()
        seen = sum(v.received + v.notices + v.errors for v in views)
        if seen != progress:
            progress, quiet_since = seen, now
        if now - quiet_since > quiet or now - t0 > TIMEOUT_S:
            return False
        if not got:
            time.sleep(0.001)
    return True
