"""Client instructions per update received, counted by callgrind in a client process (every
thread of it: libzmq's I/O thread, the dispatcher, the listener's worker or the consumer), the
twin of issue38_notify_server_callgrind.py; ``SIDE=server``: the server process's instead,
counted over the same window (so raw pyzmq's server is counted too); ``SIDE=counts``: no
callgrind, each process's context switches (over its threads, /proc) and CPU time per update.

    TREE=/path/to/checkout OUT=/tmp/cg.out N=3000 SUBS=1 PATTERN=listener \
        python issue38_notify_client_callgrind.py

The server is ``rpc.py --serve rda`` of ``TREE`` (``SERVER=raw``: raw pyzmq's ROUTER, the client
then raw's loop of ``_contestants.raw_subscribers``), run normally; the client runs under
callgrind. ``PATTERN``: ``listener`` (rda_user: ``subscribe(listener=...)``), ``poll`` (rda:
``poll_nowait`` from a consumer thread woken by ``set_wakeup``). 500 updates warm up, then
instrumentation is on for exactly ``N`` published updates per subscriber. Prints the
instructions per update received, with the gaps (conflated by the server while the slowed
client read) and the count received.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WARM = 500


def client(pattern: str, subs_wanted: int, n: int) -> None:
    """In the callgrind child: subscribe, warm up, then wait for "go" on stdin."""
    endpoint = sys.stdin.readline().strip()
    if pattern == "raw":
        raw_client(endpoint, subs_wanted, n)
        return
    from rda.business.client.service import ClientService
    from rda.business.config import Config
    from rda.business.directory import StaticDirectory
    from rda.serialization.data import Data
    from rda.serialization.header import UpdateType

    service = ClientService(StaticDirectory({"*": endpoint}), Config(workers=2))
    lock, done = threading.Lock(), threading.Event()
    counts = {"got": 0, "gaps": 0, "target": 0, "firsts": 0}

    def seen(seq: int, gap: int) -> None:
        with lock:
            counts["got"] += 1
            counts["gaps"] += gap
            if seq >= counts["target"] + 1:  # FIRST was seq 1
                counts["done_subs"] = counts.get("done_subs", 0) + 1
                if counts["done_subs"] >= subs_wanted:
                    done.set()

    ap = service.access_point("SCALAR", "Acquisition")
    if pattern == "listener":

        def on(note: Any) -> None:
            if note.update_type is UpdateType.FIRST:
                with lock:
                    counts["firsts"] += 1
                return
            seen(note.seq, note.gap)

        subs = [ap.subscribe(listener=on, queue_size=100_000) for _ in range(subs_wanted)]
        deadline = time.monotonic() + 120
        while counts["firsts"] < subs_wanted and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        subs = [ap.subscribe(queue_size=100_000) for _ in range(subs_wanted)]
        for sub in subs:
            first = sub.poll(60)
            assert first is not None and first.update_type is UpdateType.FIRST
        wake = threading.Event()
        for sub in subs:
            sub.set_wakeup(wake.set)
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                wake.clear()
                for sub in subs:
                    while (note := sub.poll_nowait()) is not None:
                        seen(note.seq, note.gap)
                wake.wait(0.1)

        consumer = threading.Thread(target=consume, name="consumer", daemon=True)
        consumer.start()
    publish = service.access_point("SCALAR", "Publish")
    for total in (WARM, WARM + n):
        counts["done_subs"] = 0
        counts["target"] = total
        if total > WARM:
            print("ready", flush=True)
            sys.stdin.readline()  # instrumentation is on
            counts["got"] = counts["gaps"] = 0
        publish.set(Data(n=total - (0 if total == WARM else WARM)), timeout=60)
        assert done.wait(600), f"updates missing: {counts}"
        done.clear()
    print(f"done {counts['got']} {counts['gaps']}", flush=True)
    sys.stdin.readline()  # instrumentation is off
    for sub in subs:
        sub.close()
    service.close()


def raw_client(endpoint: str, subs_wanted: int, n: int) -> None:
    import zmq

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    control = ctx.socket(zmq.DEALER)
    control.linger = 0
    control.connect(endpoint)
    control.send(b"RESET")
    control.recv()
    socks = []
    poller = zmq.Poller()
    for _ in range(subs_wanted):
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        s.rcvhwm = 0
        s.connect(endpoint)
        s.send(b"HELLO")
        poller.register(s, zmq.POLLIN)
        socks.append(s)
    time.sleep(0.5)
    for count in (WARM, n):
        if count == n:
            print("ready", flush=True)
            sys.stdin.readline()
        control.send_multipart([b"PUB", str(count).encode()])
        expected, received = count * subs_wanted, 0
        while received < expected:
            for s, _ in poller.poll(1000):
                while True:
                    try:
                        s.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    received += 1
    print(f"done {received} 0", flush=True)
    sys.stdin.readline()
    for s in [*socks, control]:
        s.close()
    ctx.term()


def proc_counts(pid: int) -> tuple[int, int, float]:
    """(voluntary, involuntary context switches over the process's threads, CPU seconds)."""
    vol = invol = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol += int(line.split()[1])
        except OSError:
            pass  # a thread that ended meanwhile
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return vol, invol, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    n, subs_wanted = int(os.environ.get("N", "3000")), int(os.environ.get("SUBS", "1"))
    pattern = os.environ.get("PATTERN", "listener")
    server_kind = os.environ.get("SERVER", "rda")
    if server_kind == "raw":
        pattern = "raw"
    side = os.environ.get("SIDE", "client")
    root, out = Path(os.environ["TREE"]), os.environ["OUT"]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'benchmarks'}")
    valgrind = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
    ]  # fmt: skip
    server = subprocess.Popen(
        [*(valgrind if side == "server" else []), sys.executable,
         str(root / "benchmarks/rpc.py"), "--serve", server_kind],
        cwd=root, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert server.stdout is not None and server.stdin is not None
    endpoint = server.stdout.readline().strip()
    command = [
        *(valgrind if side == "client" else []), sys.executable, os.path.abspath(__file__), "--client", pattern, str(subs_wanted), str(n),
    ]  # fmt: skip
    child = subprocess.Popen(
        command, cwd=root, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    child.stdin.write(endpoint + "\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "ready"
    control = ["callgrind_control", "-i"]
    counted = child if side == "client" else server
    if side == "counts":
        before = [proc_counts(p.pid) for p in (server, child)]
    else:
        subprocess.run([*control, "on", str(counted.pid)], check=True, stdout=subprocess.DEVNULL)
    child.stdin.write("go\n")
    child.stdin.flush()
    _, got, gaps = child.stdout.readline().split()
    if side == "counts":
        after = [proc_counts(p.pid) for p in (server, child)]
    else:
        subprocess.run([*control, "off", str(counted.pid)], check=True, stdout=subprocess.DEVNULL)
    child.stdin.write("stop\n")
    child.stdin.close()
    child.wait(300)
    server.stdin.close()
    server.wait(120)
    if side == "counts":
        per = int(got)
        for name, b, a in zip(("server", "client"), before, after, strict=True):
            print(
                f"{name}: {(a[0] - b[0]) / per:.3f} voluntary, {(a[1] - b[1]) / per:.3f} "
                f"involuntary switches, {(a[2] - b[2]) / per * 1e6:.1f} us CPU per update "
                f"({got} received, {gaps} gaps, {pattern}, {subs_wanted} subscriber(s))"
            )
        return
    total = 0
    for path in glob.glob(out + "*"):
        with open(path) as f:
            total += sum(int(line.split()[1]) for line in f if line.startswith("totals:"))
    print(
        f"{side} {total / int(got):.0f} instructions per update received "
        f"({got} received, {gaps} gaps, {pattern}, {subs_wanted} subscriber(s))"
    )


if __name__ == "__main__":
    main()
