"""What a thread hand-off costs a round trip, and whether leader/follower removes it.

rda's default get runs its handler on a worker (the handler may block), so the server
dispatcher wakes a worker and the worker's reply wakes the dispatcher: 4.3 context switches
and 8 system calls per get more than raw pyzmq (docs/server.md, "Structural counts"). This
benchmark asks whether another arrangement of threads could keep a blocking-capable handler
off the dispatcher for less, with rda taken out of the picture: bare pyzmq and threads, a
trivial handler, the server in a child process, round trips from a DEALER here.

* ``raw``: one thread receives, runs the handler and replies (rda with inline handlers).
* ``hop``: a dispatcher receives and hands the request to a worker (deque + lock release);
  the worker hands the reply back (deque + eventfd the dispatcher polls), which sends it
  (rda's default arrangement).
* ``hop_direct_reply``: as ``hop``, but the worker sends the reply itself when it can take
  the socket's lock, which the dispatcher holds except while it sleeps in ``poll(2)``; after
  the send it checks ``EVENTS`` and wakes the dispatcher if a request arrived meanwhile (the
  send may have consumed that signal). Only the request crosses threads.
* ``leader_follower``: the thread that received the request hands the socket to a standby
  thread (lock release) and runs the handler itself; the reply goes to the new leader
  (deque + eventfd), which sends it. The hand-off of the socket is off the critical path,
  the hand-back of the reply is not.
* ``inline_watchdog``: ``raw`` plus a watchdog thread that wakes every millisecond and looks
  at how long the current handler has run: what an "optimistic inline" design would add to
  every request (run each handler on the receiving thread; only one that runs past a
  threshold gets the socket taken over by a standby thread). Only the watchdog's cost is
  measured here; the trivial handler never triggers a take-over.

Arrangements alternate ``--rounds`` times (the machine's load drifts); the JSON has each
round's median round trip and the medians over rounds, as ratios to ``raw``.

Usage: ``python benchmarks/handoff.py [--rounds 6] [--round-trips 3000]``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import zmq

ARRANGEMENTS = ("raw", "hop", "hop_direct_reply", "leader_follower", "inline_watchdog")
_PAYLOAD = b"x" * 60  # about the size of a scalar get's reply
_ONE = (1).to_bytes(8, "little")


def _handler(request: bytes) -> bytes:
    return _PAYLOAD


def _drain_replies(router: zmq.Socket[bytes], fd: int, replies: collections.deque[Any]) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 8)
    while replies:
        router.send_multipart(replies.popleft())


def _serve_raw(router: zmq.Socket[bytes]) -> None:
    while True:
        rid, request = router.recv_multipart()
        router.send_multipart([rid, _handler(request)])


def _serve_inline_watchdog(router: zmq.Socket[bytes]) -> None:
    busy_since = [0.0]  # 0: no handler running

    def watchdog() -> None:
        overdue = 0
        while True:
            time.sleep(0.001)
            started = busy_since[0]
            if started and time.monotonic() - started > 0.002:
                overdue += 1  # a real design would take the socket over here

    threading.Thread(target=watchdog, daemon=True).start()
    while True:
        rid, request = router.recv_multipart()
        busy_since[0] = time.monotonic()
        reply = _handler(request)
        busy_since[0] = 0.0
        router.send_multipart([rid, reply])


def _serve_hop(router: zmq.Socket[bytes], fd: int, poller: zmq.Poller) -> None:
    tasks: collections.deque[tuple[bytes, bytes]] = collections.deque()
    replies: collections.deque[list[bytes]] = collections.deque()
    wake = threading.Lock()
    wake.acquire()

    def worker() -> None:
        while True:
            wake.acquire()
            while tasks:
                rid, request = tasks.popleft()
                replies.append([rid, _handler(request)])
                os.write(fd, _ONE)

    threading.Thread(target=worker, daemon=True).start()
    while True:
        for sock, _ in poller.poll():
            if sock is not router:
                _drain_replies(router, fd, replies)
                continue
            # One client, one request at a time: POLLIN on a ROUTER means a whole message.
            rid, request = router.recv_multipart()
            tasks.append((rid, request))
            if wake.locked():  # the worker sleeps on it (or holds it while it works)
                wake.release()


def _serve_leader_follower(router: zmq.Socket[bytes], fd: int, poller: zmq.Poller) -> None:
    replies: collections.deque[list[bytes]] = collections.deque()
    standby = [threading.Lock(), threading.Lock()]
    for lock in standby:
        lock.acquire()

    def run(me: int) -> None:
        other = 1 - me
        if me == 1:
            standby[me].acquire()  # the second thread starts as the standby
        while True:
            request: list[bytes] | None = None
            while request is None:  # leading: only this thread touches the socket
                for sock, _ in poller.poll():
                    if sock is router:
                        request = router.recv_multipart()
                    else:
                        _drain_replies(router, fd, replies)
            standby[other].release()  # the other thread leads from now on
            rid, body = request
            replies.append([rid, _handler(body)])
            os.write(fd, _ONE)
            standby[me].acquire()

    threading.Thread(target=run, args=(1,), daemon=True).start()
    run(0)


def _serve_hop_direct_reply(router: zmq.Socket[bytes], fd: int) -> None:
    tasks: collections.deque[tuple[bytes, bytes]] = collections.deque()
    replies: collections.deque[list[bytes]] = collections.deque()
    wake = threading.Lock()
    wake.acquire()
    # The socket's token: the dispatcher holds it except while it sleeps in poll(2); whoever
    # holds it may use the socket (a lock is the full memory barrier ZeroMQ asks for).
    role = threading.Lock()
    role.acquire()

    def worker() -> None:
        while True:
            wake.acquire()
            while tasks:
                rid, request = tasks.popleft()
                reply = [rid, _handler(request)]
                if role.acquire(blocking=False):
                    try:
                        router.send_multipart(reply)
                        # The send may have consumed the signal of a request that arrived
                        # meanwhile: the sleeping dispatcher must hear of it.
                        if router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                            os.write(fd, _ONE)
                    finally:
                        role.release()
                else:
                    replies.append(reply)
                    os.write(fd, _ONE)

    threading.Thread(target=worker, daemon=True).start()
    sleeper = select.poll()
    sleeper.register(router.getsockopt(zmq.FD), select.POLLIN)
    sleeper.register(fd, select.POLLIN)
    while True:
        while True:
            try:
                rid, request = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            tasks.append((rid, request))
            if wake.locked():
                wake.release()
        _drain_replies(router, fd, replies)
        role.release()
        sleeper.poll()
        role.acquire()


def serve(kind: str) -> None:
    """Child process: print the endpoint, serve until killed."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    if kind == "raw":
        _serve_raw(router)
    if kind == "inline_watchdog":
        _serve_inline_watchdog(router)
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(fd, zmq.POLLIN)
    if kind == "hop":
        _serve_hop(router, fd, poller)
    if kind == "hop_direct_reply":
        _serve_hop_direct_reply(router, fd)
    _serve_leader_follower(router, fd, poller)


def round_trip_median_us(kind: str, n: int) -> float:
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve", kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        assert child.stdout is not None
        dealer.connect(child.stdout.readline().strip())
        dealer.rcvtimeo = 10_000  # a server that stopped answering fails the run, bounded
        for _ in range(500):
            dealer.send(b"get")
            dealer.recv()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            dealer.send(b"get")
            dealer.recv()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e6
    finally:
        dealer.close()
        ctx.term()
        child.kill()
        child.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-trips", type=int, default=3000)
    parser.add_argument("--serve", choices=ARRANGEMENTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    rounds = []
    for _ in range(args.rounds):
        p50 = {kind: round_trip_median_us(kind, args.round_trips) for kind in ARRANGEMENTS}
        rounds.append({kind: round(us, 1) for kind, us in p50.items()})
    medians = {kind: statistics.median(r[kind] for r in rounds) for kind in ARRANGEMENTS}
    print(
        json.dumps(
            {
                "load_average": os.getloadavg(),
                "round_trips": args.round_trips,
                "p50_us_per_round": rounds,
                "p50_us": medians,
                "ratio_to_raw": {k: round(v / medians["raw"], 3) for k, v in medians.items()},
                "ratio_to_raw_per_round": [
                    {k: round(r[k] / r["raw"], 3) for k in ARRANGEMENTS} for r in rounds
                ],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
