"""Structural counts for benchmarks/rpc.py: what one get or one notification costs in calls
(and the ``--serve`` child process that rpc.py and these counts run against).

Wall-clock figures are noisy on a shared machine; these counts are not. Per process:

* ``pyzmq``: calls into libzmq through pyzmq that release the GIL (``send``/``recv`` per frame,
  the ``getsockopt(EVENTS)`` checks) and ``poll`` calls (``zmq_poll`` or ``poll(2)``), counted
  by wrapping the functions the code calls (rda's transport calls module-level aliases of the
  backend methods, and ``direct_send``/``direct_recv``/``direct_recv_routed``, its
  GIL-keeping calls straight into libzmq, one per message: counted as one send/recv each; raw
  pyzmq calls ``zmq.Socket`` methods);
* ``context_switches``: voluntary + involuntary switches of every thread of the process, ended
  ones included (``getrusage``): each voluntary one is a thread going to sleep, i.e. a
  wake-up later;
* ``syscalls``: system calls of every thread, from ``strace -c -f -p <pid>`` attached for a
  separate pass over the same number of operations (strace slows the run, not the counts);
  absent when strace is missing or may not attach.

Installed, for the structural passes only, in both the benchmark process and the ``--serve``
child (``COUNT_ENV`` in its environment), which answers the line ``counts`` on its stdin with
one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq
from _in_flight import raw_window

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.serialization.data import Data

COUNTS: dict[str, int] = {"send": 0, "recv": 0, "events": 0, "poll": 0}
# Set in the environment of a ``--serve`` child that must count (the structural passes only:
# the counting wrappers would slow the timed passes).
COUNT_ENV = "RDA_BENCH_COUNT"
_installed = False


def _counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        COUNTS[name] += 1
        return fn(*args, **kwargs)

    return wrapper


class _CountingPoll:
    """``select.poll()`` whose ``poll`` calls are counted (what rda's Selector sleeps in)."""

    def __init__(self) -> None:
        self._poll = _real_select_poll()

    def register(self, fd: Any, mask: int = select.POLLIN) -> None:
        self._poll.register(fd, mask)

    def modify(self, fd: Any, mask: int) -> None:
        self._poll.modify(fd, mask)

    def unregister(self, fd: Any) -> None:
        self._poll.unregister(fd)

    def poll(self, timeout: Any = None) -> list[tuple[int, int]]:
        COUNTS["poll"] += 1
        return self._poll.poll(timeout)


_real_select_poll = select.poll


def install() -> None:
    """Count pyzmq calls from here on (idempotent); call before sockets are created."""
    global _installed
    if _installed:
        return
    _installed = True
    from rda.transport import _zmq_common as common

    for attr, name in (("_backend_send", "send"), ("_backend_recv", "recv")):
        if hasattr(common, attr):
            setattr(common, attr, _counting(name, getattr(common, attr)))
    # Direct (GIL-keeping) calls into libzmq: one send/recv call each, whatever the frames.
    for attr, name in (
        ("direct_send", "send"),
        ("direct_recv", "recv"),
        ("direct_recv_routed", "recv"),
    ):
        if getattr(common, attr, None) is not None:
            setattr(common, attr, _counting(name, getattr(common, attr)))
    if hasattr(common, "_backend_get"):
        common._backend_get = _counting("events", common._backend_get)
    # The transport's own reference to the select module (a private import of its module).
    setattr(common, "select", _SelectShim())  # noqa: B010
    zmq.Socket.send = _counting("send", zmq.Socket.send)  # type: ignore[method-assign]
    zmq.Socket.recv = _counting("recv", zmq.Socket.recv)  # type: ignore[method-assign]
    zmq.Socket.poll = _counting("poll", zmq.Socket.poll)  # type: ignore[method-assign]
    zmq.Poller.poll = _counting("poll", zmq.Poller.poll)  # type: ignore[method-assign]


class _SelectShim(types.ModuleType):
    """Stands in for the ``select`` module inside rda's transport: only ``poll`` differs."""

    def __init__(self) -> None:
        super().__init__("select")

    POLLIN = select.POLLIN
    POLLOUT = select.POLLOUT

    def poll(self) -> _CountingPoll:
        return _CountingPoll()

    def __getattr__(self, name: str) -> Any:
        return getattr(select, name)


def context_switches() -> int:
    """Voluntary + involuntary context switches of every thread of this process, those that
    ended included (``getrusage``: a thread that ended between two snapshots, such as a
    dispatcher that handed the lead over, would otherwise take its switches with it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def snapshot() -> dict[str, int]:
    return {**COUNTS, "context_switches": context_switches()}


def per_op(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    return {k: round((after[k] - before[k]) / n, 2) for k in before}


def serve_counts_loop(on_line: Callable[[str], None] | None = None) -> None:
    """Child side: answer ``counts`` on stdin with a snapshot until stdin closes."""
    for line in sys.stdin:
        if line.strip() == "counts":
            print(json.dumps(snapshot()), flush=True)
        elif on_line is not None:
            on_line(line.strip())


def strace_total(text: str) -> int | None:
    """Calls on the ``total`` line of ``strace -c`` (the usecs/call column may be blank)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[-1] == "total" and len(fields) >= 4:
            numbers = fields[2:-1]
            return int(numbers[1] if len(numbers) >= 2 else numbers[0])
    return None


@contextlib.contextmanager
def strace(pids: dict[str, int]) -> Iterator[dict[str, Any]]:
    """System calls of every thread of each of ``pids`` while the block runs: a dict filled
    on exit, per name the total and the four commonest calls, or the reason there is none."""
    result: dict[str, Any] = dict.fromkeys(pids, "not run: strace missing")
    exe = shutil.which("strace")
    if exe is None:
        yield result
        return
    folder = tempfile.mkdtemp(prefix="rda-counts-")
    procs = {}
    said: dict[str, list[str]] = {}
    readers = []
    for name, pid in pids.items():
        out = os.path.join(folder, f"{name}.txt")
        cmd = [exe, "-c", "-f", "-o", out, "-p", str(pid)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs[name] = (proc, out)
        said[name] = []
        attached = threading.Event()
        readers.append(attached)
        threading.Thread(
            target=_read_stderr, args=(proc, said[name], attached), daemon=True
        ).start()
    # strace says "attached" once it holds every thread of the process (or exits refused).
    for attached in readers:
        attached.wait(30)
    try:
        yield result
    finally:
        for name, (proc, out) in procs.items():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            try:
                text = Path(out).read_text()
            except OSError:
                text = ""
            total = strace_total(text)
            if total is None:
                reason = said[name][-1:] or ["no output"]
                result[name] = f"not permitted: {reason[0].strip()}"
            else:
                result[name] = {"total": total, "top": strace_top(text)}
            with contextlib.suppress(OSError):
                os.unlink(out)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _read_stderr(proc: subprocess.Popen[str], lines: list[str], attached: threading.Event) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "attached" in line:
            attached.set()
    attached.set()  # strace ended (refused, or stopped): nobody waits any longer


def strace_top(text: str) -> dict[str, int]:
    """The four commonest system calls of an ``strace -c`` table."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] != "total" and fields[0][0].isdigit():
            with contextlib.suppress(ValueError):
                calls[fields[-1]] = int(fields[3])
    return dict(sorted(calls.items(), key=lambda kv: -kv[1])[:4])


class Child:
    """``script --serve kind`` in a child process; ``endpoint`` once it listens."""

    def __init__(self, script: str, kind: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, script, "--serve", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint:
            self.close()
            raise RuntimeError(f"the {kind} server process did not start")

    def counts(self) -> dict[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("counts\n")
        self.proc.stdin.flush()
        counts: dict[str, int] = json.loads(self.proc.stdout.readline())
        return counts

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def measure(child: Child, run: Callable[[int], None], n: int) -> dict[str, Any]:
    """Per-operation counts of ``run(n)`` on both sides: pyzmq calls and context switches in
    one pass, system calls (strace) in a second pass of the same size."""
    mine0, theirs0 = snapshot(), child.counts()
    run(n)
    mine1, theirs1 = snapshot(), child.counts()
    with strace({"client": os.getpid(), "server": child.proc.pid}) as syscalls:
        run(n)

    def per_call(side: str) -> float | None:  # None: strace missing or refused
        traced = syscalls[side]
        return round(traced["total"] / n, 2) if isinstance(traced, dict) else None

    return {
        "client": {**per_op(mine0, mine1, n), "syscalls": per_call("client")},
        "server": {**per_op(theirs0, theirs1, n), "syscalls": per_call("server")},
    }


def raw_structure(make_child: Callable[[str], Child], n: int) -> dict[str, Any]:
    child = make_child("raw")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.rcvhwm = 0
        dealer.connect(child.endpoint)

        def gets(count: int) -> None:
            for i in range(count):
                dealer.send_multipart([b"SCALAR", str(i).encode()])
                dealer.recv_multipart(copy=False)

        gets(200)  # warm up, and connected
        out = {
            "get": measure(child, gets, n),
            "in_flight": measure(child, lambda count: raw_window(dealer, count), n),
        }
        dealer.send(b"HELLO")

        def notifications(count: int) -> None:
            dealer.send_multipart([b"PUB", str(count).encode()])
            for _ in range(count):
                dealer.recv_multipart(copy=False)

        out["notification"] = measure(child, notifications, n)
        dealer.close()
        return out
    finally:
        ctx.term()
        child.close()


def rda_structure(
    make_child: Callable[[str], Child], n: int, kind: str = "rda", notifications: bool = True
) -> dict[str, Any]:
    """Per get (and per notification unless ``notifications`` is False) against a
    ``--serve kind`` child: ``rda`` (handlers start on the dispatcher) or ``rda_workers``."""
    child = make_child(kind)
    client = ClientService(StaticDirectory({"*": child.endpoint}), Config(workers=2))
    try:
        scalar = client.access_point("SCALAR", "Acquisition")

        def gets(count: int) -> None:
            for _ in range(count):
                scalar.get()

        gets(200)
        out = {"get": measure(child, gets, n)}
        if not notifications:
            return out
        sub = scalar.subscribe(queue_size=100_000)
        first = sub.poll(10)
        assert first is not None
        publisher = client.access_point("SCALAR", "Publish")
        last = [first.seq]
        conflated = [0]

        def burst(count: int) -> None:
            # Read until the burst's last update: when the client falls behind (strace slows
            # it), the server conflates some (counted in ``.gap``: nothing is lost uncounted).
            publisher.set(Data(n=count))
            target = last[0] + count
            while last[0] < target:
                update = sub.poll(30)
                assert update is not None
                conflated[0] += update.gap
                last[0] = update.seq

        out["notification"] = measure(child, burst, n)
        out["notification"]["conflated"] = conflated[0]  # of 2 x n sent (both passes)
        sub.close()
        return out
    finally:
        client.close()
        child.close()
