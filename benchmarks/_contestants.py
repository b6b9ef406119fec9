"""The contestants of ``benchmarks/rpc.py``: raw pyzmq and rda, each behind one interface.

A contestant is a client connected to its server (a thread of this process or a child
process, ``rpc.py --serve raw|rda|rda_workers``) that can run every measure of the benchmark:
``round_trip(what)`` (one get or set, for the latency series), ``in_flight``, ``mib``,
``mib_fresh`` (not PyTango) and ``subscribers``. ``rpc.py`` keeps every contestant of an arrangement connected for the whole
run and alternates them measure by measure, and the latency series block by block, so that
each ratio compares passes made within seconds of each other on this shared machine.

* :class:`Raw`: a DEALER against :class:`RawServer` (a ROUTER answering pre-encoded bytes);
* :class:`Rda`: a ``ClientService`` against an rda ``Server`` (:func:`rda_server`), whose
  handlers start on the dispatcher (the default, handed over when long) or run on workers
  (``inline_handlers(False)``); 64 in flight through ``get_async`` with completion callbacks,
  subscriptions read by one consumer thread woken through ``set_wakeup`` (the one named
  ``rda`` takes :data:`LANE_SPIN` as its ``Config.lane_spin``: off, the default);
* :class:`RdaUser`: the same client written the way docs/client.md shows a user: 64 in flight
  as a window of ``get_async()`` futures waited on with ``result()``, subscriptions through
  ``subscribe(listener=...)`` (the harness of issue 28, kept measured here);
* :class:`RdaDocumented`: the user's whole program, server and client, as docs/server.md
  ("Raw callbacks") and docs/client.md show them first (issue 38's independent harness): an
  RDA3-style server (``ServerBuilder(...).request_reply(cb).subscription(cb)``, its defaults
  kept) whose get handler builds a ``Data`` per request and calls
  ``request.complete(AcquiredData(d))``, a publisher thread iterating ``server.subscriptions()``
  and calling ``notify``; a client reading ``ap.get(timeout=5.0).data["value"]``, a window of
  64 ``get_async()`` futures each waited with ``.result(timeout=10)``, and
  ``subscribe(listener=...)``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from _in_flight import IN_FLIGHT, gets_in_flight

from rda.business.client.service import ClientService
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback, SetRequest
from rda.business.server.subscriptions import SubscriptionCallback
from rda.serialization import binary
from rda.serialization.data import Data, DataType
from rda.serialization.header import UpdateType

SCALAR = Data(current=1.5)
OBJECT = Data()
OBJECT.append("ints", np.arange(40, dtype=np.int32), DataType.INT32_ARRAY)
OBJECT.append("doubles", np.linspace(0.0, 1.0, 40))
OBJECT.append("strings", [f"element-{i:02d}" for i in range(40)])
MIB = Data(values=np.zeros(131072, dtype=np.float64))  # 1 MiB of float64
# The same 1 MiB made read-only: rda sends it as a frame of its own instead of copying it into
# the DATA body (docs/serialization.md, "Out of band"); its raw baseline is MIB's.
_FROZEN = np.zeros(131072, dtype=np.float64)
_FROZEN.flags.writeable = False
MIB_READ_ONLY = Data(values=_FROZEN)

# The ``rda`` contestant's Config.lane_spin, seconds: 0, the default (off). 100 us paid nothing
# in this benchmark's get p50 (docs/performance.md, "A blocking get's latency, issue 38, fifth
# session"); figures/2026-11-28/issue38_s5_rpc_ab.py sets it for that A/B.
LANE_SPIN = 0.0

PAYLOADS = {"SCALAR": SCALAR, "OBJECT": OBJECT, "MIB": MIB, "MIBRO": MIB_READ_ONLY}
RAW_PAYLOADS = {name: binary.encode(d) for name, d in PAYLOADS.items()}
MIB_BYTES = len(RAW_PAYLOADS["MIB"])  # what a 1 MiB get moves, for MB/s


def fresh_mib(i: int) -> np.ndarray[Any, Any]:
    """A new writable 1 MiB float64 array per get (``mib_fresh``): what a device that
    acquires into a new buffer answers. rda sends it zero-copy once the handler returned
    (docs/server.md, "Big arrays without a copy"); raw sends it with ``copy=False``."""
    values = np.empty(131072, dtype=np.float64)
    values.fill(float(i))
    return values


def pct(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_us": s[len(s) // 2] * 1e6, "p99_us": s[int(len(s) * 0.99)] * 1e6}


# ----------------------------------------------------------------------------- raw pyzmq


class RawServer:
    """ROUTER thread: a request ``[name]`` gets the pre-encoded payload ``name``; a request
    ``[b"SET", value, id]`` gets ``[id, b"OK"]`` (a set's round trip); a request
    ``[b"PUB", n]`` makes it send n notifications to every DEALER that said hello."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.sock.sndhwm = 0  # unbounded: measure delivery, not zmq's silent ROUTER drops
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="raw-server", daemon=True)
        self.thread.start()

    def run(self) -> None:
        sock = self.sock
        subscribers: list[bytes] = []
        while not self.stop.is_set():
            if not sock.poll(50):
                continue
            peer, *frames = sock.recv_multipart(copy=False)
            head = frames[0].bytes
            if head == b"HELLO":
                subscribers.append(peer.bytes)
            elif head == b"RESET":  # a new burst: forget the subscribers of the last one
                subscribers.clear()
                sock.send_multipart([peer, b"OK"])
            elif head == b"PUB":
                n = int(frames[1].bytes)
                payload = RAW_PAYLOADS["SCALAR"]
                for i in range(n):
                    seq = str(i).encode()
                    for sub in subscribers:
                        sock.send_multipart([sub, seq, payload])
            elif head == b"SET":  # a set: the value in, a short acknowledgement out
                sock.send_multipart([peer, frames[-1], b"OK"])
            elif head == b"MIBFRESH":  # the work rda's handler does, sent at raw's best
                sock.send_multipart(
                    [peer, frames[-1], fresh_mib(int(frames[-1].bytes)).data], copy=False
                )
            else:
                sock.send_multipart([peer, frames[-1], RAW_PAYLOADS[head.decode()]], copy=False)
        sock.close()


def raw_in_flight(dealer: zmq.Socket[bytes], seconds: float) -> float:
    done = 0
    for i in range(64):
        dealer.send_multipart([b"SCALAR", str(i).encode()])
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        dealer.recv_multipart(copy=False)
        done += 1
        dealer.send_multipart([b"SCALAR", b"x"])
    elapsed = time.perf_counter() - t0
    for _ in range(64):
        dealer.recv_multipart(copy=False)
    return done / elapsed


def raw_subscribers(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, count: int, updates: int
) -> dict[str, Any]:
    control = ctx.socket(zmq.DEALER)
    control.linger = 0
    control.connect(endpoint)
    control.send(b"RESET")  # answered: the closed subscribers of an earlier round are gone
    assert control.poll(10_000), "the raw server did not answer RESET"
    control.recv()
    socks = []
    poller = zmq.Poller()
    for _ in range(count):
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        s.rcvhwm = 0
        s.connect(endpoint)
        s.send(b"HELLO")
        poller.register(s, zmq.POLLIN)
        socks.append(s)
    time.sleep(0.2)  # HELLOs arrive before PUB (same pipe order per DEALER)
    control.send_multipart([b"PUB", str(updates).encode()])
    expected = updates * count
    received = 0
    t0 = time.perf_counter()
    deadline = t0 + 60
    while received < expected and time.perf_counter() < deadline:
        for s, _ in poller.poll(1000):
            while True:
                try:
                    s.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                received += 1
    elapsed = time.perf_counter() - t0
    for s in [*socks, control]:
        s.close()
    return {"sent": expected, "received": received, "updates_per_s": received / elapsed}


class Raw:
    """Raw pyzmq: one DEALER for the round trips, fresh ones per subscription burst."""

    name = "raw"
    subscriptions = True

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.ctx, self.endpoint = ctx, endpoint
        self.dealer = ctx.socket(zmq.DEALER)
        self.dealer.linger = 0
        self.dealer.connect(endpoint)
        self._i = 0

    def round_trip(self, what: str) -> Callable[[], object]:
        dealer = self.dealer
        if what == "set":
            # A set's round trip: the encoded value out (what rda's set carries), an
            # acknowledgement back.
            value = RAW_PAYLOADS["SCALAR"]

            def set_call() -> object:
                self._i += 1
                dealer.send_multipart([b"SET", value, str(self._i).encode()])
                return dealer.recv_multipart(copy=False)

            return set_call
        name = b"OBJECT" if what == "get_object" else b"SCALAR"

        def call() -> object:
            self._i += 1
            dealer.send_multipart([name, str(self._i).encode()])
            return dealer.recv_multipart(copy=False)

        return call

    def in_flight(self, seconds: float) -> float:
        return raw_in_flight(self.dealer, seconds)

    def mib(self, n: int, read_only: bool) -> float:
        """Seconds taken by ``n`` 1 MiB gets (raw sends the same bytes either way)."""
        t0 = time.perf_counter()
        for i in range(n):
            self.dealer.send_multipart([b"MIB", str(i).encode()])
            self.dealer.recv_multipart(copy=False)
        return time.perf_counter() - t0

    def mib_fresh(self, n: int) -> float:
        """Seconds taken by ``n`` gets of a new 1 MiB array each (sent with ``copy=False``)."""
        t0 = time.perf_counter()
        for i in range(n):
            self.dealer.send_multipart([b"MIBFRESH", str(i).encode()])
            self.dealer.recv_multipart(copy=False)
        return time.perf_counter() - t0

    def subscribers(self, count: int, updates: int) -> dict[str, Any]:
        return raw_subscribers(self.ctx, self.endpoint, count, updates)

    def close(self) -> None:
        self.dealer.close()


# ----------------------------------------------------------------------------- rda


class Handler(RequestReplyCallback):
    """get answers the payload named by the device; a set of ``SCALAR/Publish`` with ``n``
    makes a server thread notify every source n times (the separate-process publisher)."""

    server: Server | None = None
    kept: np.ndarray[Any, Any] | None = None

    def get(self, request: GetRequest) -> None:
        if request.device == "MIBFRESH":
            values = fresh_mib(request.id)
            request.complete(Data(values=values))
        elif request.device == "MIBFRESHKEPT":  # the same, but the device keeps the array:
            values = fresh_mib(request.id)  # copied, as it must be (the A/B of the hand-over)
            self.kept = values
            request.complete(Data(values=values))
        else:
            request.complete(PAYLOADS.get(request.device, SCALAR))

    def set(self, request: SetRequest) -> None:
        data = request.data
        if request.property == "Publish" and self.server is not None:
            server, n = self.server, int(data["n"])
            threading.Thread(target=publish, args=(server, n), daemon=True).start()
        request.complete()


def publish(server: Server, n: int) -> None:
    sources = [s for s in server.subscriptions() if s.property == "Acquisition"]
    for i in range(n):
        for source in sources:
            source.notify(Data(current=float(i)))


def rda_server(port: int = 0, inline: bool = True) -> Server:
    """The benchmark's server; ``inline``: handlers start on the dispatcher (the default),
    else they run on workers (``ServerBuilder.inline_handlers(False)``)."""
    handler = Handler()
    server = (
        ServerBuilder("BENCH")
        .endpoint(f"tcp://127.0.0.1:{port}")
        .request_reply(handler)
        .subscription(SubscriptionCallback())
        .devices("*")
        .immediate_updates(False)
        .directory(None)
        .inline_handlers(inline)
        .build()
    )
    handler.server = server
    return server


class Rda:
    """An rda ``ClientService``; ``server``: the server when it runs in this process (its
    subscriptions are then fed directly, else through a ``SCALAR/Publish`` set)."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        server: Server | None = None,
        subscriptions: bool = True,
    ) -> None:
        self.name = name
        # False: no subscription passes (a server whose handlers differ, not its notifications)
        self.subscriptions = subscriptions
        self.server = server
        config = Config(workers=2, lane_spin=LANE_SPIN if name == "rda" else 0.0)
        self.client = ClientService(StaticDirectory({"*": endpoint}), config)
        self._publisher = self.client.access_point("SCALAR", "Publish")
        self._stats0 = self.client.statistics()

    def round_trip(self, what: str) -> Callable[[], object]:
        if what == "set":
            setting = self.client.access_point("SCALAR", "Setting")
            return lambda: setting.set(SCALAR)
        if what == "get_object":
            obj = self.client.access_point("OBJECT", "Acquisition")
            return lambda: obj.get().data["doubles"]
        scalar = self.client.access_point("SCALAR", "Acquisition")
        return lambda: scalar.get().data["current"]

    def in_flight(self, seconds: float) -> float:
        return gets_in_flight(self.client.access_point("SCALAR", "Acquisition"), seconds)

    def mib(self, n: int, read_only: bool) -> float:
        """Seconds taken by ``n`` 1 MiB gets (``read_only``: the array sent out of band)."""
        mib = self.client.access_point("MIBRO" if read_only else "MIB", "Acquisition")
        t0 = time.perf_counter()
        for _ in range(n):
            assert len(mib.get().data["values"]) == 131072
        return time.perf_counter() - t0

    def mib_fresh(self, n: int, kept: bool = False) -> float:
        """Seconds taken by ``n`` gets of a 1 MiB array the handler builds for each (``kept``:
        and keeps, so that it is copied)."""
        mib = self.client.access_point("MIBFRESHKEPT" if kept else "MIBFRESH", "Acquisition")
        t0 = time.perf_counter()
        for _ in range(n):
            assert len(mib.get().data["values"]) == 131072
        return time.perf_counter() - t0

    def _notify(self, n: int) -> None:
        if self.server is not None:
            publish(self.server, n)
        else:
            self._publisher.set(Data(n=n))

    def subscribers(self, count: int, updates: int) -> dict[str, Any]:
        return rda_subscribers(self.client, self._notify, count, updates)

    def statistics(self) -> dict[str, Any]:
        """The client's request and loss counters over the whole run."""
        now, before = self.client.statistics(), self._stats0
        keys = ("requests", "replies", "late_replies", "timeouts", "gaps", "dropped")
        return {k: getattr(now, k) - getattr(before, k) for k in keys}

    def close(self) -> None:
        self.client.close()


class RdaUser(Rda):
    """:class:`Rda` with the patterns a user writes from the docs (futures, listeners)."""

    def in_flight(self, seconds: float) -> float:
        ap = self.client.access_point("SCALAR", "Acquisition")
        window = deque(ap.get_async() for _ in range(IN_FLIGHT))
        done = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            window.popleft().result()
            done += 1
            window.append(ap.get_async())
        elapsed = time.perf_counter() - t0
        for future in window:
            future.result()
        return done / elapsed

    def subscribers(self, count: int, updates: int) -> dict[str, Any]:
        return rda_listeners(self.client, self._notify, count, updates)


class DocumentedHandler(RequestReplyCallback):
    """The get handler a user writes from docs/server.md: a new ``Data`` per request, completed
    as ``AcquiredData``; a set of ``Publish`` starts a publisher thread (see
    :func:`documented_publish`)."""

    server: Server | None = None

    def __init__(self) -> None:
        self.value = 1.5
        self.ints = np.arange(40, dtype=np.int32)
        self.doubles = np.linspace(0.0, 1.0, 40)
        self.strings = [f"element-{i:02d}" for i in range(40)]

    def get(self, request: GetRequest) -> None:
        device = request.device
        if device == "OBJECT":
            d = Data()
            d.append("ints", self.ints, DataType.INT32_ARRAY)
            d.append("doubles", self.doubles)
            d.append("strings", self.strings)
        elif device == "MIB":  # the device keeps its array: copied into the reply
            d = MIB
        elif device == "MIBRO":
            d = MIB_READ_ONLY
        elif device == "MIBFRESH":
            d = Data(values=fresh_mib(request.id))
        else:
            d = Data(value=self.value)
        request.complete(AcquiredData(d))

    def set(self, request: SetRequest) -> None:
        data = request.data
        if request.property == "Publish" and self.server is not None:
            server, n = self.server, int(data["n"])
            threading.Thread(target=documented_publish, args=(server, n), daemon=True).start()
        request.complete()


def documented_publish(server: Server, n: int) -> None:
    """The publisher thread of docs/server.md: ``server.subscriptions()`` each time round."""
    for i in range(n):
        for source in server.subscriptions():
            source.notify(AcquiredData(Data(value=float(i))))


def documented_server(port: int = 0) -> Server:
    """The RDA3-style server of docs/server.md, "Raw callbacks": every default kept (the
    endpoint given, no directory to register in)."""
    handler = DocumentedHandler()
    server = (
        ServerBuilder("BENCHDOC")
        .endpoint(f"tcp://127.0.0.1:{port}")
        .request_reply(handler)
        .subscription(SubscriptionCallback())
        .directory(None)
        .build()
    )
    handler.server = server
    return server


class RdaDocumented(Rda):
    """The client of docs/client.md against :func:`documented_server`: blocking gets with a
    timeout reading a field, a window of futures waited with a timeout, listeners."""

    def round_trip(self, what: str) -> Callable[[], object]:
        if what == "set":
            setting = self.client.access_point("SCALAR", "Setting")
            return lambda: setting.set(Data(value=1.5), timeout=5.0)
        if what == "get_object":
            obj = self.client.access_point("OBJECT", "Acquisition")
            return lambda: obj.get(timeout=5.0).data["doubles"]
        scalar = self.client.access_point("SCALAR", "Acquisition")
        return lambda: scalar.get(timeout=5.0).data["value"]

    def in_flight(self, seconds: float) -> float:
        ap = self.client.access_point("SCALAR", "Acquisition")
        window = deque(ap.get_async() for _ in range(IN_FLIGHT))
        done = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            window.popleft().result(timeout=10).data["value"]
            done += 1
            window.append(ap.get_async())
        elapsed = time.perf_counter() - t0
        for future in window:
            future.result(timeout=10)
        return done / elapsed

    def mib(self, n: int, read_only: bool) -> float:
        mib = self.client.access_point("MIBRO" if read_only else "MIB", "Acquisition")
        t0 = time.perf_counter()
        for _ in range(n):
            assert len(mib.get(timeout=5.0).data["values"]) == 131072
        return time.perf_counter() - t0

    def mib_fresh(self, n: int, kept: bool = False) -> float:
        mib = self.client.access_point("MIBFRESH", "Acquisition")
        t0 = time.perf_counter()
        for _ in range(n):
            assert len(mib.get(timeout=5.0).data["values"]) == 131072
        return time.perf_counter() - t0

    def subscribers(self, count: int, updates: int) -> dict[str, Any]:
        return rda_listeners(self.client, self._notify, count, updates)


def rda_listeners(
    client: ClientService, notify: Callable[[int], None], count: int, updates: int
) -> dict[str, Any]:
    """As :func:`rda_subscribers`, each subscription read by its ``listener``."""
    received = [0] * count
    gaps = [0] * count
    firsts = [threading.Event() for _ in range(count)]
    lasts = [threading.Event() for _ in range(count)]

    def listener(i: int) -> Callable[[Any], None]:
        def on(n: Any) -> None:
            if n.update_type is UpdateType.FIRST:
                firsts[i].set()
                return
            received[i] += 1
            gaps[i] += n.gap
            if n.seq >= updates + 1:
                lasts[i].set()

        return on

    ap = client.access_point("SCALAR", "Acquisition")
    subs = [ap.subscribe(listener=listener(i), queue_size=100_000) for i in range(count)]
    for first in firsts:
        assert first.wait(10)
    stats0 = client.statistics()
    t0 = time.perf_counter()
    notify(updates)
    for last in lasts:
        last.wait(60)
    elapsed = time.perf_counter() - t0
    stats1 = client.statistics()
    for sub in subs:
        sub.close()
    total = sum(received)
    return {
        "sent": updates * count,
        "received": total,
        "gaps": sum(gaps),
        "dropped": stats1.dropped - stats0.dropped,
        "uncounted_losses": updates * count - total - sum(gaps),
        "updates_per_s": total / elapsed,
    }


def rda_subscribers(
    client: ClientService, notify: Callable[[int], None], count: int, updates: int
) -> dict[str, Any]:
    subs = [
        client.access_point("SCALAR", "Acquisition").subscribe(queue_size=100_000)
        for _ in range(count)
    ]
    for sub in subs:
        first = sub.poll(10)
        assert first is not None and first.update_type is UpdateType.FIRST
    stats0 = client.statistics()
    received = [0] * count
    gaps = [0] * count
    last_seq = [0] * count

    # One consumer thread for all subscriptions, woken by the dispatcher when a queue that
    # was empty receives a notification (the same hook rda.aio uses).
    wake = threading.Event()
    for sub in subs:
        sub.set_wakeup(wake.set)

    def consume() -> None:
        pending = set(range(count))
        deadline = time.perf_counter() + 60
        while pending and time.perf_counter() < deadline:
            wake.clear()
            for i in list(pending):
                while (n := subs[i].poll_nowait()) is not None:
                    received[i] += 1
                    gaps[i] += n.gap
                    last_seq[i] = n.seq
                    if n.seq >= updates + 1:  # FIRST was seq 1
                        pending.discard(i)
                        break
            if pending:
                wake.wait(0.1)

    consumer = threading.Thread(target=consume, name="bench-consumer")
    t0 = time.perf_counter()
    consumer.start()
    notify(updates)
    consumer.join()
    elapsed = time.perf_counter() - t0
    stats1 = client.statistics()
    for sub in subs:
        sub.close()
    total = sum(received)
    counted = total + sum(gaps)
    return {
        "sent": updates * count,
        "received": total,
        "gaps": sum(gaps),
        "dropped": stats1.dropped - stats0.dropped,
        "uncounted_losses": updates * count - counted,
        "updates_per_s": total / elapsed,
    }


def rda_slow_consumer(client: ClientService, server: Server, updates: int) -> dict[str, Any]:
    """A consumer that reads nothing until the publisher is done, with a 100-slot queue:
    most updates are dropped (client side) or conflated (server side), and every one of them
    must show up in ``.gap``."""
    sub = client.access_point("SCALAR", "Acquisition").subscribe(queue_size=100)
    first = sub.poll(10)
    assert first is not None and first.update_type is UpdateType.FIRST
    stats0 = client.statistics()
    for i in range(updates):
        for source in server.subscriptions():
            source.notify(Data(current=float(i)))
    # Let everything arrive (received or known missed) before reading anything.
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        now = client.statistics()
        if now.notifications - stats0.notifications + now.gaps - stats0.gaps >= updates:
            break
        time.sleep(0.01)
    received = gaps = 0
    last = 1
    while last < updates + 1:
        n = sub.poll(10)
        if n is None:
            break
        received += 1
        gaps += n.gap
        last = n.seq
    stats1 = client.statistics()
    sub.close()
    return {
        "sent": updates,
        "received": received,
        "gaps": gaps,
        "dropped_here": stats1.dropped - stats0.dropped,
        "conflated_at_server": (stats1.gaps - stats0.gaps),
        "uncounted_losses": updates - received - gaps,
    }


def rda_resume(restarts: int) -> dict[str, Any]:
    server = rda_server()
    server.start()
    port = int(server.endpoint.rsplit(":", 1)[1])
    client = ClientService(StaticDirectory({"*": server.endpoint}), Config(workers=1))
    times = []
    try:
        sub = client.access_point("SCALAR", "Acquisition").subscribe()
        assert sub.poll(10) is not None
        for _ in range(restarts):
            server.stop()
            lost = sub.poll(10)
            assert lost is not None and lost.error is not None
            server = rda_server(port)
            server.start()
            listening = time.perf_counter()
            first = sub.poll(10)
            assert first is not None and first.update_type is UpdateType.FIRST
            times.append(time.perf_counter() - listening)
    finally:
        client.close()
        server.stop()
    return {
        "restarts": restarts,
        "median_s": statistics.median(times),
        "max_s": max(times),
    }
