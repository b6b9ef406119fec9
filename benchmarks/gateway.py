"""The pvAccess gateway against p4p's own Python server and a real IOC (JSON).

Three contestants serve the same load, each in processes of its own, in one run:

- ``sharedpv`` (the baseline): a p4p ``Server`` in Python with ``--pvs`` ``SharedPV``s
  (NTScalar double, the layout the IOC and the gateway serve), each posted ``--rate`` times a
  second;
- ``ioc``: the pvxs IOC (``python -m pvxslibs.ioc``) with ``--pvs`` ``calc`` records scanned at
  the same rate;
- ``gateway``: an rda server process publishing ``--pvs`` properties at the same rate, served
  by ``rda gateway pva`` as field PVs ``BENCH/Pnnn.value``.

All three serve at once. Gets: one client process's get p50/p99 on one PV (``--gets`` gets
after the channel is up), the contestants in turns for ``--rounds`` rounds (the median round
is reported, and the gateway's ratio per round). Then, one contestant at a time,
``--clients`` client processes each monitoring every PV for ``--seconds``: the update rate
each receives, the updates it missed (each value is a counter, so a jump is a loss), and the
serving process's CPU over the window (the gateway's, and the rda server's beside it). For the gateway, losses are compared with the gaps rda counted (the ``gaps``
field of each property PV): an uncounted loss is one neither rda nor the gateway reported.

The ratios are the gateway's to ``sharedpv``; the targets are issue 34's, read from
``benchmarks/gateway_targets.json``:

    .venv/bin/python benchmarks/gateway.py --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rda.testing import GatewayProcess, LocalIoc, PvaIsland, PvaMonitor, free_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
TARGETS = Path(__file__).with_name("gateway_targets.json")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _names(kind: str, pvs: int) -> list[str]:
    if kind == "gateway":
        return [f"BENCH/P{i:03d}.value" for i in range(pvs)]
    if kind == "ioc":
        return [f"IOC:P{i:03d}" for i in range(pvs)]
    return [f"SPV:P{i:03d}" for i in range(pvs)]


def _paced(rate: float, stop: threading.Event, tick: Any) -> None:
    """Call ``tick(n)`` ``rate`` times a second (n counts from 1) until ``stop``."""
    start = time.monotonic()
    n = 0
    while not stop.is_set():
        n += 1
        tick(n)
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            stop.wait(delay)


def _wait_for_signal() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


# -- the processes this benchmark starts -----------------------------------------------------


def serve_sharedpv(pvs: int, rate: float) -> None:
    """``--role sharedpv``: p4p SharedPVs posted at ``rate`` until SIGTERM. They serve the
    type the gateway and the IOC serve (NTScalar double with display, control, valueAlarm),
    and each post carries what the gateway's does (value, alarm, timeStamp): the same bytes."""
    from p4p import Value
    from p4p.server import Server, StaticProvider
    from p4p.server.thread import SharedPV

    from rda.gateway import metadata, nt
    from rda.serialization.data import DataType

    stop = _wait_for_signal()
    provider = StaticProvider("bench")
    type_ = nt.field_type(DataType.FLOAT64, 0)
    head = {"alarm": metadata.NO_ALARM.as_dict(), "timeStamp": nt.stamp(time.time_ns())}
    initial = {"value": 0.0, **head, **metadata.field_metadata(None, (), "d")}
    shared = [SharedPV(initial=Value(type_, initial)) for _ in range(pvs)]
    for name, pv in zip(_names("sharedpv", pvs), shared, strict=True):
        provider.add(name, pv)
    server = Server(providers=[provider])
    print("ready", flush=True)

    def tick(n: int) -> None:
        for pv in shared:
            stamp = nt.stamp(time.time_ns())
            pv.post(Value(type_, {"value": float(n), "alarm": head["alarm"], "timeStamp": stamp}))

    _paced(rate, stop, tick)
    server.stop()


def serve_rda(port: int, pvs: int, rate: float) -> None:
    """``--role rda``: an rda server with properties BENCH/Pnnn published at ``rate``."""
    import rda
    from rda.business.server.devices import Device
    from rda.business.server.requests import GetRequest

    stop = _wait_for_signal()
    values = [0.0] * pvs

    def getter(i: int) -> Any:
        def get(self: Device, request: GetRequest) -> rda.Data:
            return rda.Data(value=values[i])

        return get

    # One property per PV, made as the class is (type() runs each property's __set_name__).
    members = {f"p{i}": rda.prop(f"P{i:03d}", blocking=False)(getter(i)) for i in range(pvs)}
    device = type("Bench", (Device,), members)()
    builder = rda.ServerBuilder("GatewayBench").endpoint(f"tcp://127.0.0.1:{port}")
    server = builder.directory(None).device("BENCH", device).build().start()
    print("ready", flush=True)

    def tick(n: int) -> None:
        for i in range(pvs):
            values[i] = float(n)
            device.publish(f"P{i:03d}", rda.Data(value=float(n)))

    _paced(rate, stop, tick)
    server.stop()


def client(names: list[str], gets: int, seconds: float, request: str | None) -> None:
    """``--role client``: the p4p client, as every EPICS script would use it: ``gets`` gets
    of the first name, then (when ``seconds`` > 0) a monitor of every name; one JSON line."""
    from p4p.client.thread import Context

    ctx = Context("pva", nt=False)
    result: dict[str, Any] = {}
    if gets:
        ctx.get(names[0], timeout=30)  # the channel, connected once
        times = []
        for _ in range(gets):
            t0 = time.perf_counter()
            ctx.get(names[0], timeout=30)
            times.append(time.perf_counter() - t0)
        times.sort()
        result["get_p50_us"] = times[len(times) // 2] * 1e6
        result["get_p99_us"] = times[int(len(times) * 0.99)] * 1e6
    if seconds > 0:
        lock = threading.Lock()
        last: dict[str, float] = {}
        counts = {"updates": 0, "lost": 0}
        first_seen = threading.Event()

        def on(name: str, value: Any) -> None:
            if isinstance(value, Exception):
                return
            v = float(value["value"])
            with lock:
                before = last.get(name)
                last[name] = v
                if before is not None:
                    counts["updates"] += 1
                    if v > before + 1:
                        counts["lost"] += int(v - before - 1)
                if len(last) == len(names):
                    first_seen.set()

        # p4p's own Context.monitor can lose a subscription's first wake-up (and with it the
        # subscription) against a fast server: PvaMonitor cannot.
        monitor = PvaMonitor(ctx)
        for name in names:
            monitor.watch(name, on, request)
        if not first_seen.wait(120):
            raise SystemExit("not every PV gave a first value within 120 s")
        with lock:
            counts["updates"] = counts["lost"] = 0
        print("ready", flush=True)
        t0 = time.monotonic()
        time.sleep(seconds)
        with lock:
            elapsed = time.monotonic() - t0
            result["updates_per_s"] = counts["updates"] / elapsed
            result["lost"] = counts["lost"]
        monitor.close()
    ctx.close()
    print(json.dumps(result), flush=True)


# -- the orchestration -------------------------------------------------------------------------


def _role(args: list[str], island: PvaIsland) -> subprocess.Popen[str]:
    env = {**os.environ, **island.client_conf(), "PYTHONPATH": str(ROOT)}
    env.update(island.environment())
    return subprocess.Popen(
        [sys.executable, __file__, "--role", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _line(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} ended without a word (exit {proc.wait()})")
    return line.strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _gets(kind: str, island: PvaIsland, args: argparse.Namespace) -> dict[str, float]:
    names = _names(kind, args.pvs)
    getter = _role(["client", "--gets", str(args.gets), "--seconds", "0", *names[:1]], island)
    result: dict[str, float] = json.loads(_line(getter, f"{kind} get client"))
    getter.wait(60)
    return result


def _monitors(
    kind: str, island: PvaIsland, server_pids: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    names = _names(kind, args.pvs)
    command = ["client", "--gets", "0", "--seconds", str(args.seconds), "--request", args.request]
    clients = [_role([*command, *names], island) for _ in range(args.clients)]
    for c in clients:
        if _line(c, f"{kind} monitor client") != "ready":
            raise RuntimeError(f"{kind}: a monitor client did not get ready")
    cpu0 = {k: _cpu_seconds(pid) for k, pid in server_pids.items()}
    t0 = time.monotonic()
    outs = [json.loads(_line(c, f"{kind} monitor client")) for c in clients]
    elapsed = time.monotonic() - t0
    cpu = {k: (_cpu_seconds(pid) - cpu0[k]) / elapsed for k, pid in server_pids.items()}
    for c in clients:
        c.wait(60)
    rates = sorted(o["updates_per_s"] for o in outs)
    return {
        "monitor_updates_per_s_per_client": rates[len(rates) // 2],
        "monitor_updates_per_s_min": rates[0],
        "monitor_lost": sum(o["lost"] for o in outs),
        "monitor_expected_per_s_per_client": args.pvs * args.rate,
        "cpu_per_s": {k: round(v, 3) for k, v in cpu.items()},
    }


def _gateway_gaps(island: PvaIsland, pvs: int) -> int:
    from p4p.client.thread import Context

    with Context("pva", conf=island.client_conf(), useenv=False, nt=False) as ctx:
        values = ctx.get([f"BENCH/P{i:03d}" for i in range(pvs)], timeout=30)
    return sum(int(v["gaps"]) for v in values)


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="rda-gateway-bench-"))
    out: dict[str, Any] = {
        "pvs": args.pvs,
        "rate_hz": args.rate,
        "clients": args.clients,
        "seconds": args.seconds,
        "gets": args.gets,
        "rounds": args.rounds,
        "request": args.request,
        "load_average": os.getloadavg(),
    }
    islands = {kind: PvaIsland() for kind in ("sharedpv", "ioc", "gateway")}
    database = folder / "bench.db"
    database.write_text(
        "".join(
            f'record(calc, "IOC:P{i:03d}") {{\n  field(SCAN, ".1 second")\n'
            f'  field(CALC, "A+1")\n  field(INPA, "IOC:P{i:03d}")\n}}\n'
            for i in range(args.pvs)
        )
    )
    load = ["--pvs", str(args.pvs), "--rate", str(args.rate)]
    port = free_port()
    spv = _role(["sharedpv", *load], islands["sharedpv"])
    rda_proc = _role(["rda", "--port", str(port), *load], islands["gateway"])
    ioc = LocalIoc(database, islands["ioc"], folder / "ioc.log")
    gateway = GatewayProcess(
        islands["gateway"], folder / "gateway.log", [], f"tcp://127.0.0.1:{port}"
    )
    try:
        # All three serve at once, so that each is measured under the same background.
        _line(spv, "sharedpv server")
        _line(rda_proc, "rda server")
        ioc.start()
        gateway.start(env={"PYTHONPATH": str(ROOT)})
        pids = {
            "sharedpv": {"sharedpv": spv.pid},
            "ioc": {"ioc": ioc.pid},
            "gateway": {"gateway": gateway.pid, "rda_server": rda_proc.pid},
        }
        # Gets: the contestants in turns, round after round (the machine's load drifts).
        rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in islands}
        for _ in range(args.rounds):
            for kind, island in islands.items():
                rounds[kind].append(_gets(kind, island, args))
        for kind in islands:
            p50s = sorted(r["get_p50_us"] for r in rounds[kind])
            p99s = sorted(r["get_p99_us"] for r in rounds[kind])
            out[kind] = {
                "get_p50_us": p50s[len(p50s) // 2],
                "get_p99_us": p99s[len(p99s) // 2],
                "get_p50_us_per_round": [round(r["get_p50_us"], 1) for r in rounds[kind]],
            }
        for kind, island in islands.items():
            out[kind].update(_monitors(kind, island, pids[kind], args))
        gaps = _gateway_gaps(islands["gateway"], args.pvs)
    finally:
        gateway.stop()
        ioc.stop()
        _stop(rda_proc)
        _stop(spv)
    gw, base = out["gateway"], out["sharedpv"]
    gw["rda_gaps"] = gaps
    # Each client sees every loss rda counted on the gateway's one subscription per PV.
    gw["uncounted_loss"] = max(0, gw["monitor_lost"] - gaps * args.clients)
    ratio = {
        "get_p50": gw["get_p50_us"] / base["get_p50_us"],
        "get_p50_per_round": [
            round(g["get_p50_us"] / b["get_p50_us"], 3)
            for g, b in zip(rounds["gateway"], rounds["sharedpv"], strict=True)
        ],
        "monitor_rate": gw["monitor_updates_per_s_per_client"]
        / base["monitor_updates_per_s_per_client"],
        # CPU is read in clock ticks (10 ms): a ratio needs a window of a few hundred.
        "cpu": gw["cpu_per_s"]["gateway"] / base["cpu_per_s"]["sharedpv"]
        if base["cpu_per_s"]["sharedpv"] >= 0.05
        else None,
        "get_p50_vs_ioc": gw["get_p50_us"] / out["ioc"]["get_p50_us"],
    }
    targets = json.loads(TARGETS.read_text())
    out["ratio"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ratio.items()}
    out["targets"] = targets
    out["targets_met"] = {
        "get_p50": ratio["get_p50"] <= targets["get_p50_max_ratio"],
        "monitor_rate": ratio["monitor_rate"] >= targets["monitor_rate_min_ratio"],
        "no_uncounted_loss": gw["uncounted_loss"] <= targets["uncounted_loss_max"],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["sharedpv", "rda", "client"])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--pvs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--gets", type=int, default=500)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--request",
        default="record[queueSize=100]",
        help="the monitors' pvRequest (default: a queue deep enough that a client descheduled "
        "for a moment on a loaded machine is not squashed by pvAccess)",
    )
    args = parser.parse_args()
    if args.role == "sharedpv":
        serve_sharedpv(args.pvs, args.rate)
    elif args.role == "rda":
        serve_rda(args.port, args.pvs, args.rate)
    elif args.role == "client":
        client(args.names, args.gets, args.seconds, args.request)
    else:
        print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
