"""Issue 28 point 4: a fresh 1 MiB array per message, sent zero-copy (a memoryview of the
array, pyzmq's ``copy=False``) or copied first (``tobytes()``, then sent the same way: what an
rda reply body is), with and without the sender keeping the array; PUSH/PULL over tcp
loopback in one process, 400 messages per pass, three passes of each. Per message: wall time
and process CPU time (all threads: libzmq's I/O thread, pyzmq's release of the buffers).
Output: issue28_zero_copy_send.txt."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import zmq

N = 400


def run(
    push: zmq.Socket[bytes], pull: zmq.Socket[bytes], mode: str, keep: bool
) -> tuple[float, float]:
    kept: list[Any] = []

    def drain() -> None:
        for _ in range(N):
            pull.recv(copy=False)

    reader = threading.Thread(target=drain)
    reader.start()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(N):
        values = np.empty(131072)
        values.fill(i)
        if mode == "zero":
            push.send(values.data.cast("B"), copy=False)
        else:
            push.send(values.tobytes(), copy=False)
        if keep:
            kept[:] = [values]
    reader.join()
    return (time.perf_counter() - t0) / N * 1e6, (time.process_time() - cpu0) / N * 1e6


def main() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    for _ in range(3):
        for mode, keep in (("zero", False), ("bytes", False), ("bytes", True)):
            wall, cpu = run(push, pull, mode, keep)
            print(f"{mode:5} keep={keep!s:5} wall {wall:6.0f} us  cpu {cpu:6.0f} us")
    push.close()
    pull.close()
    ctx.term()


if __name__ == "__main__":
    main()
