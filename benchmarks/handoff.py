"""What a thread hand-off costs a round trip, and whether leader/follower removes it.

rda's default get runs its handler on a worker (the handler may block), so the server
dispatcher wakes a worker and the worker's reply wakes the dispatcher: 4.3 context switches
and 8 system calls per get more than raw pyzmq (docs/performance.md, "Structural counts"). This
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
* ``hop_eventfd_late``: as ``hop``, but each thread wakes the other through an eventfd
  written as late as possible. The worker sleeps in a blocking ``os.read`` on its own
  eventfd instead of a lock; the dispatcher does not wake it when it appends the task but
  right before it goes to sleep in ``poll`` itself; the worker does not signal a reply at
  once but right before it goes back to sleep in ``os.read`` (or before it takes the next
  task). ``os.write`` releases the GIL before its system call, and writing just before
  blocking means the woken thread should find the GIL free instead of waking, finding the
  GIL held and sleeping again.
* ``hop_spin``: as ``hop``, but both waiting sides spin before they sleep: the worker, after
  a task, and the dispatcher, after handing a task off, call ``os.sched_yield()`` (which
  releases the GIL each time) and check their deque for up to ``SPIN_SECONDS`` (100 us)
  before they sleep (the worker in ``os.read`` on its eventfd, the dispatcher in ``poll``);
  each side signals the other only when it sees the other's "asleep" flag. The price: a
  spinning thread keeps a CPU busy for up to 100 us after every hand-off, on a machine where
  every other process would want it. The server's CPU column understates that: each
  ``sched_yield`` gives way to any other runnable thread (the client here, the I/O threads),
  so it only counts the part of the spin that found a CPU otherwise idle, while the spinner
  stays on a run queue, competing, for most of the run.

Every arrangement's server child runs for the whole benchmark, and within each of
``--rounds`` rounds they take turns of 50 round trips (who starts rotates), so the machine's
drifting load hits them alike; the JSON has each round's median round trip and the medians
over rounds, as ratios to ``raw``. (The idle children cost little meanwhile: the watchdog's
wake-up every millisecond is the most.) It also has each server child's CPU time (user +
system, all its threads, from ``/proc/<pid>/stat``) per round trip over the round, per round
and as the median over rounds. ``/proc`` counts CPU time
in clock ticks (10 ms): with 3,000 round trips one tick is 3.3 us per round trip, so the CPU
column is coarse (a few percent of a round trip's CPU) and only larger differences count.

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

ARRANGEMENTS = (
    "raw",
    "hop",
    "hop_direct_reply",
    "leader_follower",
    "inline_watchdog",
    "hop_eventfd_late",
    "hop_spin",
)
SPIN_SECONDS = 100e-6  # how long hop_spin's threads spin before they sleep
BLOCK = 50  # round trips per arrangement before the next one takes its turn
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
                        events: int = router.getsockopt(zmq.EVENTS)  # type: ignore[assignment]
                        if events & zmq.POLLIN:
                            os.write(fd, _ONE)
                    finally:
                        role.release()
                else:
                    replies.append(reply)
                    os.write(fd, _ONE)

    threading.Thread(target=worker, daemon=True).start()
    sleeper = select.poll()
    router_fd: int = router.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int for FD
    sleeper.register(router_fd, select.POLLIN)
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


def _serve_hop_eventfd_late(router: zmq.Socket[bytes], fd: int, poller: zmq.Poller) -> None:
    tasks: collections.deque[tuple[bytes, bytes]] = collections.deque()
    replies: collections.deque[list[bytes]] = collections.deque()
    wake_worker = os.eventfd(0)  # blocking: the worker sleeps in os.read on it

    def worker() -> None:
        owed = False  # a reply was appended and the dispatcher not told yet
        while True:
            while tasks:
                if owed:  # tell the dispatcher only now, before taking the next task
                    os.write(fd, _ONE)
                rid, request = tasks.popleft()
                replies.append([rid, _handler(request)])
                owed = True
            if owed:  # or now, right before this thread blocks
                os.write(fd, _ONE)
                owed = False
            # Each os.write above follows its reply's append and each dispatcher write follows
            # its task's append, and every read is followed by a look at the deque: no wake-up
            # is lost. A write for a task already taken leaves a stale count: one empty pass.
            os.read(wake_worker, 8)

    threading.Thread(target=worker, daemon=True).start()
    owed = False  # a task was appended and the worker not woken yet
    while True:
        if owed:  # wake the worker only now, right before this thread blocks in poll
            os.write(wake_worker, _ONE)
            owed = False
        for sock, _ in poller.poll():
            if sock is not router:
                _drain_replies(router, fd, replies)
                continue
            # One client, one request at a time: POLLIN on a ROUTER means a whole message.
            rid, request = router.recv_multipart()
            tasks.append((rid, request))
            owed = True


def _spin_until(queue: collections.deque[Any]) -> bool:
    """Yield the CPU (and the GIL) until ``queue`` has an item or SPIN_SECONDS have passed."""
    deadline = time.perf_counter() + SPIN_SECONDS
    while not queue:
        if time.perf_counter() > deadline:
            return False
        os.sched_yield()  # releases the GIL: the other thread can run meanwhile
    return True


def _serve_hop_spin(router: zmq.Socket[bytes], fd: int, poller: zmq.Poller) -> None:
    tasks: collections.deque[tuple[bytes, bytes]] = collections.deque()
    replies: collections.deque[list[bytes]] = collections.deque()
    wake_worker = os.eventfd(0)  # blocking: the worker sleeps in os.read on it
    # Each side signals the other only when the other has announced it sleeps. A sleeper sets
    # its flag and then looks at its deque once more; a producer appends and then looks at the
    # flag. Under the GIL these steps are sequentially ordered, so either the producer sees the
    # flag and signals, or its append came before the sleeper's second look, which finds it:
    # no wake-up is lost. A signal sent while the sleeper's second look already found the item
    # is stale; it costs one empty pass (the worker reads again, the dispatcher polls again).
    worker_asleep = [False]
    dispatcher_asleep = [False]

    def worker() -> None:
        while True:
            if not _spin_until(tasks):
                worker_asleep[0] = True
                while not tasks:  # the second look; loops over stale signals
                    os.read(wake_worker, 8)
                worker_asleep[0] = False
            while tasks:
                rid, request = tasks.popleft()
                replies.append([rid, _handler(request)])
                if dispatcher_asleep[0]:
                    os.write(fd, _ONE)

    threading.Thread(target=worker, daemon=True).start()
    while True:
        dispatcher_asleep[0] = True
        events = [] if replies else poller.poll()  # the second look, then sleep
        dispatcher_asleep[0] = False
        for sock, _ in events:
            if sock is not router:
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 8)
                continue
            # One client, one request at a time: POLLIN on a ROUTER means a whole message.
            rid, request = router.recv_multipart()
            tasks.append((rid, request))
            if worker_asleep[0]:
                os.write(wake_worker, _ONE)
            _spin_until(replies)
        while replies:
            router.send_multipart(replies.popleft())


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
    if kind == "hop_eventfd_late":
        _serve_hop_eventfd_late(router, fd, poller)
    if kind == "hop_spin":
        _serve_hop_spin(router, fd, poller)
    _serve_leader_follower(router, fd, poller)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid``, all its threads (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as stat:
        # comm (field 2) may hold spaces and parentheses: split after its closing one.
        fields = stat.read().rpartition(")")[2].split()
    utime, stime = int(fields[14 - 3]), int(fields[15 - 3])  # fields 14 and 15; [0] is 3
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


class Contestant:
    """One arrangement's server child and the DEALER that drives it."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], kind: str) -> None:
        self.kind = kind
        self.child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", kind],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.dealer = ctx.socket(zmq.DEALER)
        self.dealer.linger = 0
        assert self.child.stdout is not None
        self.dealer.connect(self.child.stdout.readline().strip())
        self.dealer.rcvtimeo = 10_000  # a server that stopped answering fails the run, bounded
        self.round_trips(500)  # warm up

    def round_trips(self, n: int) -> list[float]:
        samples = []
        dealer = self.dealer
        for _ in range(n):
            t0 = time.perf_counter()
            dealer.send(b"get")
            dealer.recv()
            samples.append(time.perf_counter() - t0)
        return samples

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.child.pid)

    def close(self) -> None:
        self.dealer.close()
        self.child.kill()
        self.child.wait(10)


def one_round(contestants: list[Contestant], n: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per arrangement, the median round trip and the server's CPU per round trip (us), from
    ``n`` round trips each, taken in turns of ``BLOCK`` (who starts rotates)."""
    samples: dict[str, list[float]] = {c.kind: [] for c in contestants}
    cpu0 = {c.kind: c.cpu_seconds() for c in contestants}
    turn = 0
    while len(samples[contestants[0].kind]) < n:
        size = min(BLOCK, n - len(samples[contestants[0].kind]))
        for k in range(len(contestants)):
            c = contestants[(turn + k) % len(contestants)]
            samples[c.kind] += c.round_trips(size)
        turn += 1
    p50 = {kind: statistics.median(s) * 1e6 for kind, s in samples.items()}
    cpu = {c.kind: (c.cpu_seconds() - cpu0[c.kind]) / n * 1e6 for c in contestants}
    return p50, cpu


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
    cpu_rounds = []
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    contestants: list[Contestant] = []
    try:
        for kind in ARRANGEMENTS:
            contestants.append(Contestant(ctx, kind))
        for _ in range(args.rounds):
            p50, cpu_us = one_round(contestants, args.round_trips)
            rounds.append({kind: round(us, 1) for kind, us in p50.items()})
            cpu_rounds.append({kind: round(us, 1) for kind, us in cpu_us.items()})
    finally:
        for c in contestants:
            c.close()
        ctx.term()
    medians = {kind: statistics.median(r[kind] for r in rounds) for kind in ARRANGEMENTS}
    cpu = {kind: statistics.median(r[kind] for r in cpu_rounds) for kind in ARRANGEMENTS}
    print(
        json.dumps(
            {
                "load_average": os.getloadavg(),
                "round_trips": args.round_trips,
                "p50_us_per_round": rounds,
                "cpu_us_per_round": cpu_rounds,
                "p50_us": medians,
                "cpu_us_per_round_trip": cpu,
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
