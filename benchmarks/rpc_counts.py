"""The counts that decide what a get costs (issue 38): CPU, context switches, system calls and
instructions per get, for rda (compiled and ``RDA_PURE_PYTHON=1``), raw pyzmq and PyTango in
the same run.

Latency and rate swing by 20-60 % between rounds on a shared machine; what a get costs the
machine does not. Every contestant is two processes of their own, started by this one (which
is not measured): a server (``benchmarks/rpc.py --serve raw|rda|tango``, the same servers
rpc.py measures) and a client (this script with ``--client``, driven over its stdin). The
pure-Python contestant's two processes run with ``RDA_PURE_PYTHON=1``; which path each process
really runs is checked from its memory map (the typed builds, ``*.compiled-*``, loaded or
not) and reported. Two measures, each of ``--gets`` gets:

* ``get``: blocking gets, one at a time (raw: DEALER send + receive; rda: ``ap.get()`` reading
  a field; PyTango: ``read_attribute(...).value``);
* ``in_flight``: gets kept 64 in flight (raw: one DEALER; rda: ``get_async()`` whose done
  callback sends the next, rpc.py's fast pattern; PyTango: ``read_attribute_asynch`` and
  ``read_attribute_reply``).

Per get and per process (client, server):

* ``cpu_us``: user + system CPU of every thread, from ``/proc/PID/task/*/schedstat`` (ns);
  when a thread came or went during the pass (``threads_changed``: PyTango's omniORB starts
  threads per call) from ``/proc/PID/stat`` instead (ended threads included, but in clock
  ticks: ``--gets`` is sized for a pass of a second or more);
* ``voluntary``/``involuntary``: context switches, summed over ``/proc/PID/task/*/status``
  (threads alive at both ends of the pass: an ended thread's are missing);
* ``syscalls``: ``strace -c -f -p PID`` attached to both processes in a second pass of the
  same size (strace slows the pass, which can change how often a loop finds nothing to read:
  the count is of the slowed pass). ``None`` with the reason when strace is missing or may not
  attach; the benchmark continues without it;
* with ``--callgrind``: ``instructions`` (callgrind Ir) in a third pass, both processes
  started again under ``valgrind --tool=callgrind --instr-atstart=no`` and instrumented
  (``callgrind_control -i on/off``) for exactly that pass.

Contestants alternate within each of ``--rounds`` rounds (the order rotating), all of them
connected for the whole run; the report gives per-round values, their medians, and rda's
ratios to raw pyzmq and to PyTango taken within the run. ``perf stat -p`` would count
system calls without slowing the pass, but does not count attached processes in this
container (reported as ``perf``).

    PYTHONPATH=. .venv/bin/python benchmarks/rpc_counts.py [--quick] [--callgrind]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RPC = HERE / "rpc.py"
IN_FLIGHT = 64
CONTESTANTS = ("raw", "rda", "rda_pure", "tango")
MEASURES = ("get", "in_flight")
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- client side
def client_calls(kind: str, endpoint: str) -> tuple[Callable[[int], None], Callable[[int], None]]:
    """``(gets(n), in_flight(n))`` for one kind of client, connected and warmed up."""
    if kind == "raw":
        import zmq
        from _in_flight import raw_window

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(endpoint)

        def raw_gets(n: int) -> None:
            for i in range(n):
                dealer.send_multipart([b"SCALAR", str(i).encode()])
                dealer.recv_multipart(copy=False)

        return raw_gets, lambda n: raw_window(dealer, n)
    if kind == "tango":
        import tango

        proxy = tango.DeviceProxy(endpoint)
        proxy.set_timeout_millis(10_000)

        def tango_gets(n: int) -> None:
            for _ in range(n):
                proxy.read_attribute("current").value  # noqa: B018 (the read is the point)

        def tango_window(n: int) -> None:
            window = deque(proxy.read_attribute_asynch("current") for _ in range(IN_FLIGHT))
            for _ in range(n - IN_FLIGHT):
                proxy.read_attribute_reply(window.popleft(), 10_000).value  # noqa: B018
                window.append(proxy.read_attribute_asynch("current"))
            for request in window:
                proxy.read_attribute_reply(request, 10_000)

        return tango_gets, tango_window
    from rda.business.client.service import ClientService
    from rda.business.config import Config
    from rda.business.directory import StaticDirectory

    service = ClientService(StaticDirectory({"*": endpoint}), Config(workers=2))
    ap = service.access_point("SCALAR", "Acquisition")

    def rda_gets(n: int) -> None:
        for _ in range(n):
            ap.get().data["current"]

    def rda_window(n: int) -> None:
        # rpc.py's fast pattern, by count: each completion sends the next until n were sent.
        lock = threading.Lock()
        finished = threading.Event()
        sent = min(IN_FLIGHT, n)
        done = 0

        def again(fut: Any) -> None:
            nonlocal sent, done
            fut.result().data["current"]  # decode in the completing thread, as a caller would
            with lock:
                done += 1
                more = sent < n
                if more:
                    sent += 1
                if done == n:
                    finished.set()
            if more:
                ap.get_async().add_done_callback(again)

        for _ in range(sent):
            ap.get_async().add_done_callback(again)
        if not finished.wait(600):
            raise RuntimeError("the in-flight gets did not finish")

    return rda_gets, rda_window


def client(kind: str, endpoint: str) -> None:
    """Child process: connect, warm up, print ``ready``; then per stdin line ``get N`` or
    ``in_flight N`` run the gets and print ``done``; stop when stdin closes."""
    gets, window = client_calls(kind, endpoint)
    gets(300)
    window(300)
    print("ready", flush=True)
    for line in sys.stdin:
        measure, n = line.split()
        (gets if measure == "get" else window)(int(n))
        print("done", flush=True)
    os._exit(0)  # PyTango's client threads have no stop call; nothing is left to flush


# ---------------------------------------------------------------------------- /proc counts
def proc_counts(pid: int) -> dict[str, Any]:
    """CPU ticks of the process (ended threads included), and per live thread its CPU time
    (ns, ``schedstat``) and context switches."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command's ")": state is field 3, utime field 14, stime field 15 (man 5 proc).
    ticks = int(fields[11]) + int(fields[12])
    threads: dict[str, tuple[int, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        voluntary = involuntary = ns = 0
        with contextlib.suppress(OSError):
            ns = int((task / "schedstat").read_text().split()[0])
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary = int(line.split()[1])
        threads[task.name] = (ns, voluntary, involuntary)
    return {"ticks": ticks, "threads": threads}


def proc_delta(before: dict[str, Any], after: dict[str, Any], n: int) -> dict[str, Any]:
    """Per get: CPU from the threads' ``schedstat`` (ns) and from the process's ticks, and
    context switches; ``threads_changed`` when a thread came or went during the pass (its
    switches and schedstat time are then missing, the ticks are not: ``cpu_us`` is then
    the ticks')."""
    both = before["threads"].keys() & after["threads"].keys()

    def total(i: int) -> int:
        return sum(after["threads"][t][i] - before["threads"][t][i] for t in both)

    changed = before["threads"].keys() != after["threads"].keys()
    schedstat = total(0) / n / 1e3
    ticks = (after["ticks"] - before["ticks"]) / TICK / n * 1e6
    return {
        # The threads' own clocks are exact but lose a thread that ended during the pass
        # (omniORB's per-call threads): then the process's ticks, which keep it.
        "cpu_us": ticks if changed else schedstat,
        "cpu_us_schedstat": schedstat,
        "cpu_us_ticks": ticks,
        "voluntary": total(1) / n,
        "involuntary": total(2) / n,
        "threads": len(after["threads"]),
        "threads_changed": changed,
    }


# ---------------------------------------------------------------------------- contestants
def leaf(pid: int) -> int:
    """The process that runs the program: ``pid`` itself, or its last descendant where a
    wrapper script started it as a child (Debian's ``valgrind`` runs ``valgrind.bin``)."""
    while True:
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:
                    children.append(int(entry.name))
        if len(children) != 1:
            return pid
        pid = children[0]


class Pair:
    """A contestant's server and client processes."""

    def __init__(self, name: str, grind: list[str] | None = None) -> None:
        self.name = name
        env = dict(os.environ)
        env.pop("RDA_PURE_PYTHON", None)
        if name == "rda_pure":
            env["RDA_PURE_PYTHON"] = "1"
        kind = "rda" if name.startswith("rda") else name
        self.grind = grind
        pre = grind or []
        pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        self.server = subprocess.Popen(
            [*pre, sys.executable, str(RPC), "--serve", kind], env=env, text=True, **pipes
        )
        assert self.server.stdout is not None
        self.endpoint = self.server.stdout.readline().strip()
        if not self.endpoint:
            self.close()
            raise RuntimeError(f"the {name} server did not start")
        script = str(Path(__file__).resolve())
        self.client = subprocess.Popen(
            [*pre, sys.executable, script, "--client", kind, self.endpoint],
            env=env,
            text=True,
            **pipes,
        )
        assert self.client.stdout is not None
        if self.client.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError(f"the {name} client did not start")
        self.pids = {"client": leaf(self.client.pid), "server": leaf(self.server.pid)}

    def paths(self) -> dict[str, str]:
        """Which path each process runs: ``compiled`` when a typed build is mapped."""
        out = {}
        for side, pid in self.pids.items():
            maps = Path(f"/proc/{pid}/maps").read_text()
            out[side] = "compiled" if ".compiled-" in maps else "python"
        return out

    def run(self, measure: str, n: int) -> None:
        assert self.client.stdin is not None and self.client.stdout is not None
        self.client.stdin.write(f"{measure} {n}\n")
        self.client.stdin.flush()
        if self.client.stdout.readline().strip() != "done":
            raise RuntimeError(f"the {self.name} client stopped")

    def close(self) -> None:
        for proc in (getattr(self, "client", None), self.server):
            if proc is None:
                continue
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def one_pass(pair: Pair, measure: str, n: int, syscalls: bool) -> dict[str, Any]:
    before = {side: proc_counts(pid) for side, pid in pair.pids.items()}
    pair.run(measure, n)
    after = {side: proc_counts(pid) for side, pid in pair.pids.items()}
    out = {side: proc_delta(before[side], after[side], n) for side in pair.pids}
    if syscalls:
        # Here, not at the top: the raw and PyTango client processes run this file too, and
        # _structure imports rda.
        from _structure import strace

        with strace(pair.pids) as traced:
            pair.run(measure, n)
        for side, value in traced.items():
            if isinstance(value, dict):
                out[side]["syscalls"] = value["total"] / n
                out[side]["syscalls_top"] = {k: v / n for k, v in value["top"].items()}
            else:
                out[side]["syscalls"] = None
                out[side]["syscalls_why"] = value
    out["cpu_us_total"] = out["client"]["cpu_us"] + out["server"]["cpu_us"]
    return out


def callgrind_pass(name: str, n: int) -> dict[str, Any]:
    """Instructions per get of both processes, each measure in its own instrumented pass."""
    folder = tempfile.mkdtemp(prefix="rda-callgrind-")
    out_file = os.path.join(folder, "cg.%p")
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    grind.append(f"--callgrind-out-file={out_file}")
    pair = Pair(name, grind)
    result: dict[str, Any] = {"paths": pair.paths()} if name.startswith("rda") else {}
    try:
        for measure in MEASURES:
            quiet: dict[str, Any] = {"check": True, "stdout": subprocess.DEVNULL}
            for pid in pair.pids.values():
                subprocess.run(["callgrind_control", "-z", str(pid)], **quiet)
                subprocess.run(["callgrind_control", "-i", "on", str(pid)], **quiet)
            pair.run(measure, n)
            counts = {}
            for side, pid in pair.pids.items():
                subprocess.run(["callgrind_control", "-i", "off", str(pid)], **quiet)
                subprocess.run(["callgrind_control", "-d", measure, str(pid)], **quiet)
                total = 0
                for dump in Path(folder).glob(f"cg.{pid}.*"):
                    for line in dump.read_text().splitlines():
                        if line.startswith("totals:"):
                            total += int(line.split()[1])
                            break
                    dump.unlink()
                counts[side] = total / n
            result[measure] = {**counts, "total": counts["client"] + counts["server"]}
    finally:
        pair.close()
        shutil.rmtree(folder, ignore_errors=True)
    return result


# ---------------------------------------------------------------------------- the run
def median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(rounds: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Medians over rounds per contestant, measure, side and count."""
    out: dict[str, Any] = {}
    for name in names:
        out[name] = {}
        for measure in MEASURES:
            passes = [r[name][measure] for r in rounds]
            summary: dict[str, Any] = {"cpu_us_total": median([p["cpu_us_total"] for p in passes])}
            for side in ("client", "server"):
                keys = ("cpu_us", "voluntary", "involuntary", "syscalls")
                side_out: dict[str, Any] = {}
                for key in keys:
                    values = [p[side][key] for p in passes if p[side].get(key) is not None]
                    side_out[key] = median(values) if values else None
                summary[side] = side_out
            out[name][measure] = summary
    return out


def ratios(summary: dict[str, Any], base: str) -> dict[str, Any]:
    """Each contestant's median count over ``base``'s, per measure (total and per side)."""
    out: dict[str, Any] = {}
    if base not in summary:
        return out
    for name, measures in summary.items():
        if name == base:
            continue
        out[name] = {}
        for measure, s in measures.items():
            b = summary[base][measure]
            r: dict[str, Any] = {}
            for key in ("cpu_us", "voluntary", "involuntary", "syscalls"):
                mine = [s[side][key] for side in ("client", "server")]
                theirs = [b[side][key] for side in ("client", "server")]
                if None in mine or None in theirs or sum(theirs) == 0:
                    continue
                r[f"{key}_total"] = sum(mine) / sum(theirs)
            out[name][measure] = r
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", nargs=2, metavar=("KIND", "ENDPOINT"), help=argparse.SUPPRESS)
    parser.add_argument("--gets", type=int, default=5000, help="gets per pass and measure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 gets, one round")
    parser.add_argument("--no-strace", action="store_true", help="skip the system-call passes")
    parser.add_argument(
        "--callgrind", action="store_true", help="also count instructions (valgrind, slow)"
    )
    parser.add_argument("--callgrind-gets", type=int, default=2000)
    parser.add_argument(
        "--contestants",
        default=",".join(CONTESTANTS),
        help="comma-separated, of " + ", ".join(CONTESTANTS),
    )
    args = parser.parse_args()
    if args.client:
        client(*args.client)
        return
    if args.quick:
        args.gets, args.rounds, args.callgrind_gets = 500, 1, 300
    import _tango

    names = [n for n in args.contestants.split(",") if n]
    report: dict[str, Any] = {
        "load_average_before": os.getloadavg(),
        "gets_per_pass": args.gets,
        "in_flight": IN_FLIGHT,
    }
    if "tango" in names and not _tango.available():
        names.remove("tango")
        report["tango"] = "absent: pytango not installed (pip install 'rda[bench]')"
    pairs: dict[str, Pair] = {}
    try:
        for name in names:
            pairs[name] = Pair(name)
        report["paths"] = {n: p.paths() for n, p in pairs.items() if n.startswith("rda")}
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            this: dict[str, Any] = {name: {} for name in names}
            for measure in MEASURES:
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    this[name][measure] = one_pass(
                        pairs[name], measure, args.gets, not args.no_strace
                    )
            this["load_average"] = os.getloadavg()
            rounds.append(this)
    finally:
        for pair in pairs.values():
            pair.close()
    summary = summarize(rounds, names)
    report["median"] = summary
    report["ratio_to_raw"] = ratios(summary, "raw")
    report["ratio_to_tango"] = ratios(summary, "tango")
    report["rounds"] = rounds
    if args.callgrind:
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            report["instructions"] = "not run: valgrind missing"
        else:
            counted: dict[str, Any] = {}
            for name in names:
                try:
                    counted[name] = callgrind_pass(name, args.callgrind_gets)
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    # valgrind refused or its control failed: the other counts still stand.
                    counted[name] = f"not counted: {exc}"
            report["instructions"] = counted
    report["load_average_after"] = os.getloadavg()
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
