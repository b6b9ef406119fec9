"""Server instructions per notification sent, counted by callgrind in the ``rpc.py --serve rda``
child (every thread of the server process: the publisher thread's ``notify``, fan-out,
encoding and the sends).

    TREE=/path/to/checkout OUT=/tmp/cg.out N=5000 SUBS=1 python issue38_notify_server_callgrind.py

``SUBS`` listener subscriptions on ``SCALAR/Acquisition``; 500 notifications warm up, then
instrumentation is on for exactly ``N`` published updates (a ``SCALAR/Publish`` set starts the
child's publisher thread). Prints the instructions per notification sent (``N * SUBS``).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.serialization.data import Data
from rda.serialization.header import UpdateType


def main() -> None:
    n, subs_wanted = int(os.environ.get("N", "5000")), int(os.environ.get("SUBS", "1"))
    root, out = Path(os.environ["TREE"]), os.environ["OUT"]
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        sys.executable, str(root / "benchmarks/rpc.py"), "--serve", "rda",
    ]  # fmt: skip
    child = subprocess.Popen(
        command, cwd=root, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    endpoint = child.stdout.readline().strip()
    service = ClientService(StaticDirectory({"*": endpoint}), Config(request_timeout=60.0))
    lock, done = threading.Lock(), threading.Event()
    got, firsts, target = [0], [0], [0]

    def on(note: Notification) -> None:
        with lock:
            if note.update_type is UpdateType.FIRST:
                firsts[0] += 1
                return
            got[0] += 1 + note.gap
            if got[0] >= target[0]:
                done.set()

    ap = service.access_point("SCALAR", "Acquisition")
    subs = [ap.subscribe(listener=on, queue_size=100_000) for _ in range(subs_wanted)]
    deadline = time.monotonic() + 120
    while firsts[0] < subs_wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    publish = service.access_point("SCALAR", "Publish")
    target[0] = 500 * subs_wanted
    publish.set(Data(n=500), timeout=60)
    assert done.wait(300), "warm-up notifications missing"
    done.clear()
    control = ["callgrind_control", "-i"]
    subprocess.run([*control, "on", str(child.pid)], check=True, stdout=subprocess.DEVNULL)
    target[0] = (500 + n) * subs_wanted
    publish.set(Data(n=n), timeout=60)
    assert done.wait(600), "notifications missing"
    subprocess.run([*control, "off", str(child.pid)], check=True, stdout=subprocess.DEVNULL)
    for sub in subs:
        sub.close()
    service.close()
    child.stdin.close()
    child.wait(120)
    total = 0
    for path in glob.glob(out + "*"):
        with open(path) as f:
            total += sum(int(line.split()[1]) for line in f if line.startswith("totals:"))
    print(f"{total / (n * subs_wanted):.0f} instructions per notification sent")


if __name__ == "__main__":
    main()
