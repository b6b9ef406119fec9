"""Echo round trip through the rda ZeroMQ transports beside raw pyzmq DEALER/ROUTER.

Both arrangements run in this one process, in the same run: the server is a thread (raw: a
ROUTER echo loop; rda: the server transport's dispatcher, whose handler echoes by calling
``transport.send``), the client is driven from the main thread. Measured:

* latency: p50/p99 of ``round_trips`` sequential round trips;
* throughput: round trips per second with ``in_flight`` requests outstanding for ``seconds``.

The rda client is measured in three modes: ``user_thread`` (the main thread sends through the
inproc pipe and waits for the reply handler to signal it: two extra thread hops per round
trip), ``dispatcher`` (the reply handler sends the next request itself, as a business layer
answering on the dispatcher would: no extra hop) and ``dispatcher_shared_context`` (the same,
with client and server sharing one zmq context, i.e. one libzmq I/O thread, as the raw
baseline does; by default each transport creates its own). The arrangements are interleaved
in ``rounds``; ratios are rda / raw, so they survive a noisy machine. ``cpu_us_per_round_trip``
is the process CPU time (all threads) per sequential round trip.

    .venv/bin/python benchmarks/transport.py [--round-trips N] [--seconds S] [--in-flight K]
                                             [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import zmq

from rda.serialization.header import Header, RequestType
from rda.serialization.message import BodyKind, Message
from rda.transport.api import TransportSettings
from rda.transport.protocol import Kind, encode_message
from rda.transport.zmq_client import ZmqClientTransport
from rda.transport.zmq_server import ZmqServerTransport

BODY = b"\x00" * 64


def frames_for(rid: int) -> list[Any]:
    return encode_message(
        Kind.REQUEST, Header(RequestType.GET, rid, "BENCH", "Echo"), [(BodyKind.DATA, BODY)]
    )


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    samples = sorted(samples_ns)
    return {
        "p50_us": samples[len(samples) // 2] / 1000.0,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000.0,
        "mean_us": statistics.fmean(samples) / 1000.0,
    }


# ----------------------------------------------------------------------------- raw pyzmq


def raw_echo_server(
    ctx: zmq.Context[zmq.Socket[bytes]], ready: threading.Event
) -> tuple[threading.Thread, list[str]]:
    endpoint: list[str] = []

    def run() -> None:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        endpoint.append(f"tcp://127.0.0.1:{port}")
        ready.set()
        try:
            while True:
                router.send_multipart(router.recv_multipart())
        except zmq.ContextTerminated:
            router.close(0)

    thread = threading.Thread(target=run, name="raw-echo")
    thread.start()
    ready.wait()
    return thread, endpoint


class RawEcho:
    """The baseline: a DEALER in the calling thread, a ROUTER echo loop in a thread."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.thread, endpoint = raw_echo_server(self.ctx, threading.Event())
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(endpoint[0])
        self.msg = frames_for(1)
        self.latency(200)  # warm-up

    def latency(self, round_trips: int) -> list[int]:
        dealer, msg = self.dealer, self.msg
        samples = []
        for _ in range(round_trips):
            t0 = time.perf_counter_ns()
            dealer.send_multipart(msg)
            dealer.recv_multipart()
            samples.append(time.perf_counter_ns() - t0)
        return samples

    def throughput(self, seconds: float, in_flight: int) -> tuple[int, float]:
        dealer, msg = self.dealer, self.msg
        for _ in range(in_flight):
            dealer.send_multipart(msg)
        done = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            dealer.recv_multipart()
            dealer.send_multipart(msg)
            done += 1
        elapsed = time.perf_counter() - start
        for _ in range(in_flight):
            dealer.recv_multipart()
        return done, elapsed

    def close(self) -> None:
        self.dealer.close(0)
        self.ctx.term()
        self.thread.join()


# ----------------------------------------------------------------------------- rda transports


class EchoHandler:
    def __init__(self) -> None:
        self.transport: ZmqServerTransport | None = None

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        pass

    def on_message(self, peer: bytes, message: Message) -> None:
        h = message.header
        reply = Header(RequestType.REPLY, h.id, h.device, h.property, h.selector)
        assert self.transport is not None
        self.transport.send(peer, encode_message(Kind.REPLY, reply, message.body))

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        pass


class BenchClient:
    """Reply handler with three modes: signal the user thread, or send the next request."""

    def __init__(self) -> None:
        self.transport: ZmqClientTransport | None = None
        self.conn = 0
        self.connected = threading.Event()
        self.reply = threading.Event()
        self.mode = "signal"
        self.remaining = 0
        self.samples: list[int] = []
        self.t0 = 0
        self.done = 0
        self.finished = threading.Event()
        self.msg = frames_for(1)
        self.slots = threading.Semaphore(0)
        self.stop = False
        self.outstanding = 0

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self.connected.set()

    def on_message(self, connection: int, message: Message) -> None:
        mode = self.mode
        if mode == "signal":
            self.reply.set()
        elif mode == "slots":
            self.done += 1
            self.slots.release()
        elif mode == "latency":
            now = time.perf_counter_ns()
            self.samples.append(now - self.t0)
            self.remaining -= 1
            if self.remaining > 0:
                self.t0 = time.perf_counter_ns()
                assert self.transport is not None
                self.transport.send(connection, self.msg)
            else:
                self.finished.set()
        elif mode == "throughput":
            self.done += 1
            if not self.stop:
                assert self.transport is not None
                self.transport.send(connection, self.msg)
            else:
                self.outstanding -= 1
                if self.outstanding == 0:
                    self.finished.set()

    def on_disconnected(self, connection: int, reason: str) -> None:
        pass


class RdaEcho:
    """The rda client and server transports; the client is driven in two ways."""

    def __init__(self, shared_context: bool) -> None:
        # Like the raw baseline, client and server may share one context (one libzmq I/O
        # thread); by default each transport makes its own (two I/O threads).
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = zmq.Context() if shared_context else None
        sh = EchoHandler()
        self.server = ZmqServerTransport(
            "tcp://127.0.0.1:0", sh, TransportSettings(), context=self.ctx
        )
        sh.transport = self.server
        self.server.start()
        self.bc = bc = BenchClient()
        self.client = ZmqClientTransport(bc, TransportSettings(), context=self.ctx)
        bc.transport = self.client
        self.client.start()
        self.conn = self.client.connect(self.server.endpoint)
        bc.connected.wait(10)
        self.latency_user(200)  # warm-up

    def latency_user(self, round_trips: int) -> list[int]:
        """The user thread sends through the pipe and waits for the handler's signal."""
        bc, client, conn, msg = self.bc, self.client, self.conn, self.bc.msg
        bc.mode = "signal"
        samples = []
        for _ in range(round_trips):
            bc.reply.clear()
            t0 = time.perf_counter_ns()
            client.send(conn, msg)
            bc.reply.wait()
            samples.append(time.perf_counter_ns() - t0)
        return samples

    def throughput_user(self, seconds: float, in_flight: int) -> tuple[int, float]:
        bc, client, conn, msg = self.bc, self.client, self.conn, self.bc.msg
        bc.mode = "slots"
        bc.done = 0
        for _ in range(in_flight):
            bc.slots.release()
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            bc.slots.acquire()
            client.send(conn, msg)
        elapsed = time.perf_counter() - start
        done = bc.done
        for _ in range(in_flight):
            bc.slots.acquire()
        return done, elapsed

    def latency_dispatcher(self, round_trips: int) -> list[int]:
        """The reply handler sends the next request itself."""
        bc = self.bc
        bc.mode = "latency"
        bc.samples = []
        bc.remaining = round_trips
        bc.finished.clear()
        bc.t0 = time.perf_counter_ns()
        self.client.send(self.conn, bc.msg)
        bc.finished.wait(120)
        return bc.samples

    def throughput_dispatcher(self, seconds: float, in_flight: int) -> tuple[int, float]:
        bc = self.bc
        bc.mode = "throughput"
        bc.done = 0
        bc.stop = False
        bc.outstanding = in_flight
        bc.finished.clear()
        start = time.perf_counter()
        for _ in range(in_flight):
            self.client.send(self.conn, bc.msg)
        time.sleep(seconds)
        bc.stop = True
        done = bc.done
        elapsed = time.perf_counter() - start
        bc.finished.wait(10)
        return done, elapsed

    def close(self) -> None:
        self.client.close()
        self.server.close()
        if self.ctx is not None:
            self.ctx.term()


def summary(samples: list[int], done: int, elapsed: float, cpu: float) -> dict[str, float]:
    # CPU time of the whole process (all threads, libzmq's I/O threads included) per
    # sequential round trip: unlike wall-clock latency, barely affected by other processes.
    return {
        **percentiles(samples),
        "cpu_us_per_round_trip": cpu / len(samples) * 1e6,
        "throughput_per_s": done / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # Interleave the arrangements in rounds, so that a burst of load from other processes
    # hits all of them alike and the ratios stay meaningful on a shared machine.
    modes = ("user_thread", "dispatcher", "dispatcher_shared_context")
    raw_echo, rda_echo, rda_shared = RawEcho(), RdaEcho(False), RdaEcho(True)
    runs: dict[str, Any] = {
        name: {"samples": [], "done": 0, "elapsed": 0.0, "cpu": 0.0} for name in ("raw", *modes)
    }
    n = max(1, args.round_trips // args.rounds)
    window = args.seconds / args.rounds
    measure = {
        "raw": (raw_echo.latency, raw_echo.throughput),
        "user_thread": (rda_echo.latency_user, rda_echo.throughput_user),
        "dispatcher": (rda_echo.latency_dispatcher, rda_echo.throughput_dispatcher),
        "dispatcher_shared_context": (
            rda_shared.latency_dispatcher,
            rda_shared.throughput_dispatcher,
        ),
    }
    try:
        for _ in range(args.rounds):
            for name, (latency, throughput) in measure.items():
                cpu = time.process_time()
                runs[name]["samples"] += latency(n)
                runs[name]["cpu"] += time.process_time() - cpu
                done, elapsed = throughput(window, args.in_flight)
                runs[name]["done"] += done
                runs[name]["elapsed"] += elapsed
    finally:
        rda_shared.close()
        rda_echo.close()
        raw_echo.close()
    results = {
        name: summary(r["samples"], r["done"], r["elapsed"], r["cpu"]) for name, r in runs.items()
    }
    raw = results["raw"]
    rda = {mode: results[mode] for mode in modes}
    ratios = {
        mode: {
            "p50_ratio": rda[mode]["p50_us"] / raw["p50_us"],
            "p99_ratio": rda[mode]["p99_us"] / raw["p99_us"],
            "throughput_ratio": rda[mode]["throughput_per_s"] / raw["throughput_per_s"],
            "cpu_ratio": rda[mode]["cpu_us_per_round_trip"] / raw["cpu_us_per_round_trip"],
        }
        for mode in modes
    }
    report = {
        "benchmark": "transport echo",
        "round_trips": args.round_trips,
        "in_flight": args.in_flight,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "body_bytes": len(BODY),
        "raw_pyzmq": raw,
        "rda": rda,
        "ratios": ratios,
        "targets": {"p50_ratio_max": 1.3, "throughput_ratio_min": 0.6},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
