"""Where rda's get latency above raw pyzmq goes (issue 28, stop 21), separate processes.

1. ``ab``: get p50 in interleaved blocks of 100 (rotating order, 40 blocks each) of raw
   pyzmq, rda's default server and the same server with ``RDA_HANDOVER_AFTER=1.0`` (its
   standby ticks every 0.5 s instead of every 1 ms): does the standby's tick cost latency?
2. ``server``: an rda server child whose dispatcher's ``_drain_router``, the business layer's
   ``Dispatch.on_message`` / ``RequestRunner.run`` / ``RequestRunner.respond`` (``_run`` and
   ``_respond`` of ``Dispatch`` when this was measured) and the libzmq send are timed per get
   (``perf_counter_ns`` wrappers: they add about 0.1 us each);
3. ``client``: the client's time per get before its send, in the send, waiting (the server
   and both wires) and after the reply arrived (decode, statistics, ``AcquiredData``).

Run from the repository: ``python benchmarks/figures/2026-11-26/issue28_get_latency.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(BENCH))

import zmq  # noqa: E402
from _contestants import Raw, Rda, rda_server  # noqa: E402

PC = time.perf_counter_ns


def child(kind: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(BENCH / "rpc.py"), "--serve", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def ab(blocks: int = 40) -> dict[str, Any]:
    kinds = {
        "raw": ("raw", {}),
        "rda": ("rda", {}),
        "rda_tick_0.5s": ("rda", {"RDA_HANDOVER_AFTER": "1.0"}),
    }
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    procs = {name: child(kind, env) for name, (kind, env) in kinds.items()}
    calls: dict[str, Callable[[], object]] = {}
    closers = []
    for name, proc in procs.items():
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        c = Raw(ctx, endpoint) if name == "raw" else Rda(name, endpoint)
        closers.append(c.close)
        calls[name] = c.round_trip("get_scalar")
        for _ in range(500):
            calls[name]()
    samples: dict[str, list[int]] = {name: [] for name in kinds}
    names = list(kinds)
    for b in range(blocks):
        for name in names[b % 3 :] + names[: b % 3]:
            call, out = calls[name], samples[name]
            for _ in range(100):
                t0 = PC()
                call()
                out.append(PC() - t0)
    for close in closers:
        close()
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    ctx.term()
    p50 = {name: sorted(s)[len(s) // 2] / 1000 for name, s in samples.items()}
    return {
        name: {"p50_us": round(v, 1), "ratio": round(v / p50["raw"], 3)} for name, v in p50.items()
    }


def timed(owner: Any, name: str, acc: dict[str, int]) -> None:
    """Wrap ``owner.name`` so that its time accumulates in ``acc[name]``."""
    fn = getattr(owner, name)
    acc[name] = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = PC()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[name] += PC() - t0

    setattr(owner, name, wrapper)


def serve_timed() -> None:
    """Child: an rda server whose get path is timed; a line on stdin answers the sums."""
    from rda.business.server import dispatch, runner
    from rda.transport import _zmq_common, zmq_server

    acc: dict[str, int] = {}
    timed(zmq_server.ZmqServerTransport, "_drain_router", acc)
    timed(dispatch.Dispatch, "on_message", acc)
    for name in ("run", "respond"):
        timed(runner.RequestRunner, name, acc)
    timed(_zmq_common, "send_routed", acc)  # zmq_server's `common`: the same module
    server = rda_server()
    server.start()
    print(server.endpoint, flush=True)
    for _ in sys.stdin:
        print(json.dumps(acc), flush=True)
        for key in acc:
            acc[key] = 0
    server.stop()


def server_and_client(n: int = 10000, passes: int = 3) -> list[dict[str, Any]]:
    from rda.business.client import requests
    from rda.transport import _zmq_common as common
    from rda.transport import zmq_lane

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-timed"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    client = Rda("rda", proc.stdout.readline().strip())
    marks: dict[str, int] = {}
    send, recv = common.send_frames, common.recv_copied

    def marked_send(*args: Any, **kwargs: Any) -> Any:
        marks["s0"] = PC()
        try:
            return send(*args, **kwargs)
        finally:
            marks["s1"] = PC()

    def marked_recv(*args: Any, **kwargs: Any) -> Any:
        frames = recv(*args, **kwargs)
        marks["r1"] = PC()
        return frames

    common.send_frames, common.recv_copied = marked_send, marked_recv
    after: dict[str, int] = {}
    timed(zmq_lane, "decode_frames", after)
    timed(requests.RequestTable, "lane_reply", after)
    call = client.round_trip("get_scalar")
    for _ in range(2000):
        call()
    out = []
    for _ in range(passes):
        proc.stdin.write("x\n")
        proc.stdin.flush()
        proc.stdout.readline()
        for key in after:
            after[key] = 0
        split = dict.fromkeys(("before_send", "send", "waiting", "after_reply"), 0)
        for _ in range(n):
            t0 = PC()
            call()
            t1 = PC()
            split["before_send"] += marks["s0"] - t0
            split["send"] += marks["s1"] - marks["s0"]
            split["waiting"] += marks["r1"] - marks["s1"]
            split["after_reply"] += t1 - marks["r1"]
        proc.stdin.write("x\n")
        proc.stdin.flush()
        server = json.loads(proc.stdout.readline())
        out.append(
            {
                "client_us": {k: round(v / n / 1000, 2) for k, v in {**split, **after}.items()},
                "server_us": {k: round(v / n / 1000, 2) for k, v in server.items()},
            }
        )
    client.close()
    proc.stdin.close()
    proc.wait(10)
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve-timed"]:
        serve_timed()
    else:
        report = {"load_average": os.getloadavg(), "ab": [ab(), ab()], "split": server_and_client()}
        print(json.dumps(report, indent=1))
