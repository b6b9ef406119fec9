"""The ``--secure`` arrangement of ``benchmarks/rpc.py``: what CURVE (and a policy) cost.

Five set-ups in one process, on tcp loopback, measured in the same run and interleaved in
short chunks so that a noisy machine hits them alike:

* ``raw_plain`` / ``raw_curve``: pyzmq DEALER -> ROUTER thread answering a pre-encoded scalar;
  the CURVE one with server and client keys (no ZAP handler: the per-message cost, which is
  what is measured, is the same; ZAP runs once per connection);
* ``rda_plain`` / ``rda_curve``: ``ClientService`` -> ``Server`` get of a scalar, the second
  with ``ServerBuilder.security`` and ``ClientSecurity`` (CURVE + ZAP on the dispatcher);
* ``rda_curve_policy``: as ``rda_curve`` plus a 50-rule authorization policy whose last rule
  is the one that allows (only when the server has ``ServerBuilder.policy``).

Per set-up: get p50/p99 over round trips taken in chunks of 50, the set-ups in a shuffled
order per cycle; gets/s with 64 in flight (one set-up after the other, after the round trips);
CPU microseconds per get (``time.process_time`` over the round trips: every thread of the
process, libzmq's I/O threads included, so both ends' encryption is in it). Ratios are against
the plain set-up of the same family.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

import zmq
from _in_flight import gets_in_flight

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.security import ClientSecurity, KeyPair, ServerSecurity, generate_keypair
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.serialization import binary
from rda.serialization.data import Data

SCALAR = Data(current=1.5)
RAW_SCALAR = binary.encode(SCALAR)
POLICY_RULES = 50


class _Handler(RequestReplyCallback):
    def get(self, request: GetRequest) -> None:
        request.complete(SCALAR)


class _RawPair:
    """A ROUTER thread and a DEALER, optionally both CURVE."""

    def __init__(self, server: KeyPair | None, client: KeyPair | None) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        router = self.ctx.socket(zmq.ROUTER)
        router.linger = 0
        if server is not None:
            router.curve_server = True
            router.curve_secretkey = server.secret.encode()
            router.curve_publickey = server.public.encode()
        port = router.bind_to_random_port("tcp://127.0.0.1")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(router,), name="raw-secure")
        self.thread.start()
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 0
        if server is not None and client is not None:
            dealer.curve_serverkey = server.public.encode()
            dealer.curve_publickey = client.public.encode()
            dealer.curve_secretkey = client.secret.encode()
        dealer.connect(f"tcp://127.0.0.1:{port}")
        self.dealer = dealer

    def _serve(self, router: zmq.Socket[bytes]) -> None:
        while not self.stop.is_set():
            if router.poll(50):
                peer, tag = router.recv_multipart()
                router.send_multipart([peer, tag, RAW_SCALAR])
        router.close()

    def get(self) -> None:
        self.dealer.send(b"g")
        self.dealer.recv_multipart()

    def in_flight(self, seconds: float) -> float:
        dealer, done = self.dealer, 0
        for _ in range(64):
            dealer.send(b"g")
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            dealer.recv_multipart()
            done += 1
            dealer.send(b"g")
        elapsed = time.perf_counter() - t0
        for _ in range(64):
            dealer.recv_multipart()
        return done / elapsed

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.dealer.close()
        self.ctx.term()


def _policy(principal: str) -> Any | None:
    """A 50-rule policy that allows ``principal``'s gets by its last rule; None when the
    server has no authorization (``ServerBuilder.policy``) to give it to."""
    if not hasattr(ServerBuilder, "policy"):
        return None
    from rda.business.policy import Policy

    rules: list[dict[str, str]] = [
        {"role": "operator", "device": f"OTHER{i}*", "property": "*", "effect": "allow"}
        for i in range(POLICY_RULES - 1)
    ]
    rules.append({"role": "operator", "device": "SCALAR", "operation": "get", "effect": "allow"})
    return Policy.from_dict(
        {"roles": ["operator"], "principals": {principal: ["operator"]}, "rules": rules}
    )


class _RdaPair:
    """A Server and a ClientService, optionally CURVE (+ a policy)."""

    def __init__(self, keys: dict[str, KeyPair] | None, policy: Any | None = None) -> None:
        builder = (
            ServerBuilder("BENCH-SECURE")
            .endpoint("tcp://127.0.0.1:0")
            .request_reply(_Handler())
            .devices("*")
            .directory(None)
        )
        security = None
        if keys is not None:
            builder.security(
                ServerSecurity(keys["server"], clients={"bench": keys["bench"].public})
            )
            security = ClientSecurity(keys["bench"], server_key=keys["server"].public)
        if policy is not None:
            builder.policy(policy)
        self.server: Server = builder.build().start()
        self.client = ClientService(
            StaticDirectory({"*": self.server.endpoint}), Config(workers=2), security=security
        )
        self.ap = self.client.access_point("SCALAR", "Acquisition")

    def get(self) -> None:
        self.ap.get()

    def in_flight(self, seconds: float) -> float:
        return gets_in_flight(self.ap, seconds)

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def _round_trips(pair: Any, n: int) -> tuple[list[float], float]:
    samples = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        pair.get()
        samples.append(time.perf_counter() - t0)
    return samples, time.process_time() - cpu0


def run(quick: bool) -> dict[str, Any]:
    # Short chunks in a shuffled order per cycle: a burst of load from the other processes
    # on this machine lands on every set-up alike instead of on whichever ran then.
    chunk, cycles = (50, 6) if quick else (50, 60)
    seconds = 0.5 if quick else 2.0
    keys = {name: generate_keypair() for name in ("server", "bench")}
    policy = _policy("bench")
    pairs: dict[str, Any] = {
        "raw_plain": _RawPair(None, None),
        "raw_curve": _RawPair(keys["server"], keys["bench"]),
        "rda_plain": _RdaPair(None),
        "rda_curve": _RdaPair(keys),
    }
    if policy is not None:
        pairs["rda_curve_policy"] = _RdaPair(keys, policy)
    samples: dict[str, list[float]] = {name: [] for name in pairs}
    cpu: dict[str, float] = dict.fromkeys(pairs, 0.0)
    order = list(pairs)
    shuffle = random.Random(1).shuffle
    try:
        for pair in pairs.values():
            _round_trips(pair, 200)  # warm up: handshakes, caches
        for _ in range(cycles):
            shuffle(order)
            for name in order:
                got, cpu_seconds = _round_trips(pairs[name], chunk)
                samples[name] += got
                cpu[name] += cpu_seconds
        throughput = {name: pair.in_flight(seconds) for name, pair in pairs.items()}
    finally:
        for pair in pairs.values():
            pair.close()
    n = chunk * cycles
    p50 = {name: statistics.median(got) * 1e6 for name, got in samples.items()}
    p99 = {name: sorted(got)[int(n * 0.99)] * 1e6 for name, got in samples.items()}
    results = {
        name: {
            "get_p50_us": p50[name],
            "get_p99_us": p99[name],
            "cpu_us_per_get": cpu[name] / n * 1e6,
            "in_flight_64_per_s": throughput[name],
        }
        for name in pairs
    }

    def ratio(name: str, base: str) -> dict[str, float]:
        a, b = results[name], results[base]
        return {
            "get_p50": a["get_p50_us"] / b["get_p50_us"],
            "cpu_per_get": a["cpu_us_per_get"] / b["cpu_us_per_get"],
            "in_flight_64": a["in_flight_64_per_s"] / b["in_flight_64_per_s"],
        }

    ratios = {
        "raw_curve/raw_plain": ratio("raw_curve", "raw_plain"),
        "rda_curve/rda_plain": ratio("rda_curve", "rda_plain"),
        "rda_curve/raw_curve": ratio("rda_curve", "raw_curve"),
    }
    targets: dict[str, bool] = {}
    if "rda_curve_policy" in results:
        ratios["rda_curve_policy/rda_plain"] = ratio("rda_curve_policy", "rda_plain")
        targets["curve_policy_get_p50_le_1.15x_plain"] = (
            ratios["rda_curve_policy/rda_plain"]["get_p50"] <= 1.15
        )
    return {
        "arrangement": "in_process",
        "round_trips": n,
        "chunk": chunk,
        "policy_rules": POLICY_RULES if policy is not None else 0,
        "results": results,
        "ratio": ratios,
        "targets_met": targets,
    }
