"""Client/server round trips through the whole rda stack beside raw pyzmq DEALER/ROUTER.

Two arrangements, each measured for raw pyzmq and for rda in the same run, on tcp loopback:

* ``in_process``: the servers are threads of this process (raw: a ROUTER loop answering with
  pre-encoded bytes; rda: a ``Server`` from ``ServerBuilder``, dispatcher + workers), so client
  and server share one GIL;
* ``separate_process``: the same servers in child processes (``rpc.py --serve raw|rda|
  rda_workers``), the deployment arrangement. Two rda servers run there: ``rda``, whose
  handlers start on the dispatcher (the default; a long one is handed over to a standby
  dispatcher), as raw pyzmq's and PyTango's do on the receiving thread, and ``rda_workers``,
  whose handlers always run on workers (``ServerBuilder.inline_handlers(False)``, the
  default before issue 28). Two clients talk to ``rda``: ``rda`` (callbacks and a
  ``set_wakeup`` consumer, the fastest patterns) and ``rda_user`` (``get_async()`` futures,
  ``subscribe(listener=...)``: what docs/client.md shows first; issue 28's harness). A third
  server, ``rda_documented``, is the user's whole program (issue 38): the RDA3-style callback
  server of docs/server.md with every default, building a ``Data`` per get and publishing
  from a thread iterating ``server.subscriptions()``, talked to by the ``rda_documented``
  client (blocking gets with a timeout, futures waited with a timeout, listeners).

The client is driven from the main thread (raw: a DEALER; rda: a ``ClientService``). Ratios
are rda / raw (or raw / rda for latencies) within one arrangement, so they survive a noisy
machine. Measured:

* get p50/p99 of a scalar and of the RDA3 benchmark object (int32[40], float64[40],
  string[40]), set p50 (``ratio``'s ``set_p50``: raw's set sends the same encoded scalar and
  gets a short acknowledgement back; PyTango's is ``write_attribute``);
* get throughput with 64 requests in flight;
* 1 MiB float64 array get, MB/s: a writable array the server keeps (a module constant: it
  must be copied into the DATA body, the device could write to it while it is sent), the same
  array read-only (sent as a frame of its own, out of band), both against raw's 1 MiB; and
  ``mib_fresh_get``: the handler builds a new writable 1 MiB array per get (``np.empty`` +
  ``fill``), which rda sends zero-copy once the handler returned, against raw doing the same
  work and sending it with ``copy=False`` (raw's best). ``array_replies`` (separate
  processes) gives the rda server's ``zero_copy_replies``/``copied_replies``, the memcpy
  avoided per fresh get, and an A/B of the same handler work sent zero-copy or copied (the
  handler keeping the array): the server's CPU time and the client's wall time per get;
* subscription updates/s received with 1 and with 10 subscribers, and the count of updates
  dropped or reported as gaps (received + gaps + dropped must equal sent: nothing lost
  without being counted); not for ``rda_workers`` (a notification runs no handler);
* time from a restarted server listening to the FIRST update of a resumed subscription.

Every contestant of an arrangement stays connected for the whole run, and they alternate
within each of ``--rounds`` rounds (default 3): the latency series block by block (50 round
trips each, the order rotating), every other measure pass by pass (the order rotating per
round). So the passes a ratio compares are seconds apart, not a whole pass of every measure
(this is a shared 2-core machine whose load drifts). The ratios compare per-measure medians
over the rounds; ``ratio_per_round`` lists each round's. The slow-consumer and restart cases
run in-process only (they drive the server directly). Prints one JSON object.

    .venv/bin/python benchmarks/rpc.py [--quick] [--mode in_process|separate_process|both]

``--secure`` runs the CURVE arrangement instead (``benchmarks/_secure.py``).

PyTango (``pip install rda[bench]``), when installed, is one more contestant of the
separate-process arrangement (``tango``, ``ratio_tango``; ``benchmarks/_tango.py``): a
device served without a Tango database, the same gets, set, 64 in flight and 1 MiB, and
subscriptions (change events pushed by a device thread, read through event queues, the
callback variant nested as ``callback``). Without it the report says ``"tango": "absent:
..."``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import _patterns
import _structure
import _tango
import zmq
from _contestants import (
    MIB_BYTES,
    Raw,
    RawServer,
    Rda,
    RdaDocumented,
    RdaUser,
    documented_server,
    pct,
    rda_resume,
    rda_server,
    rda_slow_consumer,
)

Contestant = Raw | Rda | _tango.Tango
T = TypeVar("T")
LATENCIES = ("get_scalar", "get_object", "set")
BLOCK = 50  # round trips per contestant before the next one takes over
CHUNKS = 6  # the in-flight measure, in turns of --seconds / CHUNKS
MIB_BLOCK = 10  # 1 MiB gets per turn
AB_GETS = 50  # 1 MiB gets per pass of the hand-over's A/B (array_replies)


def interleaved(
    contestants: Sequence[Contestant], run: Callable[[Contestant], T], turns: int
) -> list[list[T]]:
    """``run`` ``turns`` times per contestant, the contestants taking turns (the first of
    each turn rotating): drift of the machine's load hits them all alike. Per contestant,
    its results in order."""
    out: list[list[T]] = [[] for _ in contestants]
    for turn in range(turns):
        for k in range(len(contestants)):
            i = (turn + k) % len(contestants)
            out[i].append(run(contestants[i]))
    return out


def _mib_run(read_only: bool) -> Callable[[Contestant], float]:
    """One turn of the 1 MiB gets: seconds for ``MIB_BLOCK`` of them."""
    return lambda c: c.mib(MIB_BLOCK, read_only)


def interleaved_latencies(contestants: Sequence[Contestant], n: int) -> list[dict[str, Any]]:
    """Per contestant, p50/p99 of ``n`` round trips (in whole blocks of ``BLOCK``) of each
    kind in ``LATENCIES``, the contestants taking turns block by block."""
    out: list[dict[str, Any]] = [{} for _ in contestants]
    for what in LATENCIES:
        calls = {id(c): c.round_trip(what) for c in contestants}
        for call in calls.values():
            for _ in range(200):  # warm up (and connected)
                call()

        def block(c: Contestant, calls: dict[int, Callable[[], object]] = calls) -> list[float]:
            call, samples = calls[id(c)], []
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                call()
                samples.append(time.perf_counter() - t0)
            return samples

        blocks = interleaved(contestants, block, max(1, n // BLOCK))
        for i, mine in enumerate(blocks):
            out[i][what] = pct([t for b in mine for t in b])
    return out


def one_round(
    contestants: Sequence[Contestant], args: argparse.Namespace, index: int
) -> list[dict[str, Any]]:
    """Every measure once for every contestant; the order of the passes rotates with
    ``index``."""
    results = interleaved_latencies(contestants, args.round_trips)
    chunk = args.seconds / CHUNKS
    rates = interleaved(contestants, lambda c: c.in_flight(chunk), CHUNKS)
    for i, r in enumerate(rates):
        results[i]["in_flight_64_per_s"] = statistics.fmean(r)  # chunks of equal length
    mib_blocks = max(1, args.mib_gets // MIB_BLOCK)
    # raw sends the same bytes in both passes: each pass has its own raw baseline.
    for key, read_only in (("mib_get_MBps", False), ("mib_read_only_get_MBps", True)):
        for c in contestants:
            c.mib(MIB_BLOCK, read_only)  # warm up: socket buffers grow with the traffic
        times = interleaved(contestants, _mib_run(read_only), mib_blocks)
        for i, t in enumerate(times):
            results[i][key] = len(t) * MIB_BLOCK * MIB_BYTES / sum(t) / 1e6
    fresh = [c for c in contestants if hasattr(c, "mib_fresh")]
    for c in fresh:
        c.mib_fresh(MIB_BLOCK)  # warm up
    times = interleaved(fresh, lambda c: c.mib_fresh(MIB_BLOCK), mib_blocks)  # type: ignore[union-attr]
    for c, t in zip(fresh, times, strict=True):
        results[contestants.index(c)]["mib_fresh_get_MBps"] = (
            len(t) * MIB_BLOCK * MIB_BYTES / sum(t) / 1e6
        )
    order = [(index + k) % len(contestants) for k in range(len(contestants))]
    for count, updates in ((1, args.updates), (10, args.updates // 4)):
        for i in order:
            if contestants[i].subscriptions:
                results[i][f"subscription_{count}"] = contestants[i].subscribers(count, updates)
    return results


def median_of(rounds: list[Any]) -> Any:
    """Per measure, the median over rounds (the worst for ``uncounted_losses`` and ``max_s``:
    a loss or a slow resume in any round must show)."""
    first = rounds[0]
    if isinstance(first, dict):
        out = {}
        for key in first:
            values = [r[key] for r in rounds]
            if key in ("uncounted_losses", "max_s"):
                out[key] = max(values)
            else:
                out[key] = median_of(values)
        return out
    if isinstance(first, bool) or not isinstance(first, int | float):
        return rounds[-1]
    return statistics.median(rounds)


def run_rounds(contestants: Sequence[Contestant], args: argparse.Namespace) -> dict[str, Any]:
    """``args.rounds`` rounds; the report compares each rda contestant with raw (the first):
    ``ratio``/``targets_met`` for the one named ``rda``, ``ratio_<x>``/``targets_met_<x>``
    for ``rda_<x>``; ``ratio_per_round`` (and ``ratio_<x>_per_round``) list each round's."""
    rounds = [one_round(contestants, args, r) for r in range(args.rounds)]
    result: dict[str, Any] = {}
    medians = [median_of([r[i] for r in rounds]) for i in range(len(contestants))]
    for c, m in zip(contestants, medians, strict=True):
        result[c.name] = m
        if isinstance(c, Rda):
            m["client_statistics"] = c.statistics()
    for i, c in enumerate(contestants[1:], start=1):
        suffix = "" if c.name == "rda" else "_" + c.name.removeprefix("rda_")
        compared = compare(medians[0], medians[i])
        result["ratio" + suffix] = compared["ratio"]
        result["targets_met" + suffix] = compared["targets"]
        result["ratio" + suffix + "_per_round"] = [compare(r[0], r[i])["ratio"] for r in rounds]
    result["rounds"] = args.rounds
    return result


def compare(raw: dict[str, Any], rda: dict[str, Any]) -> dict[str, Any]:
    """rda's ratios to raw and issue 28's targets (set for the separate-process arrangement;
    issue 11's were 1.5, 0.5, 0.85 and 0.6), for the measures ``rda`` has."""
    ratio = {
        "get_scalar_p50": rda["get_scalar"]["p50_us"] / raw["get_scalar"]["p50_us"],
        "get_object_p50": rda["get_object"]["p50_us"] / raw["get_object"]["p50_us"],
        # raw's set sends the same encoded value and gets a short acknowledgement back.
        "set_p50": rda["set"]["p50_us"] / raw["set"]["p50_us"],
        "in_flight_64": rda["in_flight_64_per_s"] / raw["in_flight_64_per_s"],
        "mib_get": rda["mib_get_MBps"] / raw["mib_get_MBps"],
        # Not a target of its own: the same get, the array sent out of band (read-only).
        "mib_get_read_only": rda["mib_read_only_get_MBps"] / raw["mib_read_only_get_MBps"],
    }
    if "mib_fresh_get_MBps" in rda:  # a new writable array per get: zero-copy once returned
        ratio["mib_fresh_get"] = rda["mib_fresh_get_MBps"] / raw["mib_fresh_get_MBps"]
    targets = {
        "get_scalar_p50": ratio["get_scalar_p50"] <= 1.25,
        "in_flight_64": ratio["in_flight_64"] >= 0.7,
        "mib_get": ratio["mib_get"] >= 0.85,
    }
    losses = []
    for count in (1, 10):
        key = f"subscription_{count}"
        if key in rda:
            ratio[key] = rda[key]["updates_per_s"] / raw[key]["updates_per_s"]
            targets[key] = ratio[key] >= 0.8
            losses.append(rda[key])
    if "subscription_slow_consumer" in rda:
        losses.append(rda["subscription_slow_consumer"])
    if losses:
        targets["no_uncounted_loss"] = all(x["uncounted_losses"] == 0 for x in losses)
    if "resume_after_restart" in rda:
        targets["resume_le_0.3s"] = rda["resume_after_restart"]["max_s"] <= 0.3
    return {"ratio": ratio, "targets": targets}


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    raw_server = RawServer(ctx)
    server = rda_server(inline=not args.worker_handlers)
    server.start()
    contestants: list[Contestant] = [Raw(ctx, raw_server.endpoint)]
    try:
        contestants.append(Rda("rda", server.endpoint, server))
        result = run_rounds(contestants, args)
        rda = contestants[1]
        assert isinstance(rda, Rda)
        slow = rda_slow_consumer(rda.client, server, args.updates // 4)
    finally:
        for c in contestants:
            c.close()
        server.stop()
        raw_server.stop.set()
        raw_server.thread.join()
        ctx.term()
    result["rda"]["subscription_slow_consumer"] = slow
    result["rda"]["resume_after_restart"] = rda_resume(args.restarts)
    # The in-process-only cases join the targets of the one round-independent report.
    extra = compare(result["raw"], result["rda"])["targets"]
    result["targets_met"].update(
        {k: v for k, v in extra.items() if k in ("no_uncounted_loss", "resume_le_0.3s")}
    )
    return result


def separate_process(args: argparse.Namespace) -> dict[str, Any]:
    children = [Child("raw"), Child("rda"), Child("rda_workers"), Child("rda_documented")]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    contestants: list[Contestant] = []
    try:
        contestants.append(Raw(ctx, children[0].endpoint))
        contestants.append(Rda("rda", children[1].endpoint))
        contestants.append(RdaUser("rda_user", children[1].endpoint))
        contestants.append(Rda("rda_workers", children[2].endpoint, subscriptions=False))
        contestants.append(RdaDocumented("rda_documented", children[3].endpoint))
        if _tango.available() and not args.no_tango:
            children.append(Child("tango"))
            contestants.append(_tango.Tango(children[-1].endpoint))
            result = run_rounds(contestants, args)
        else:
            result = run_rounds(contestants, args)
            result["tango"] = "absent: pytango not installed (pip install 'rda[bench]')"
        rda = contestants[1]
        assert isinstance(rda, Rda)
        result["array_replies"] = array_replies(children, rda, args)
        return result
    finally:
        for c in contestants:
            c.close()
        ctx.term()
        for child in children:
            child.close()


def array_replies(
    children: Sequence[_structure.Child], rda: Rda, args: argparse.Namespace
) -> dict[str, Any]:
    """The hand-over of issue 28, counted. Per rda server (child), ``zero_copy_replies`` and
    ``copied_replies`` over the whole run and the memcpy avoided per fresh 1 MiB get (the
    kept ``mib_get`` array is copied, as it must be). Then an A/B in one process: the same
    handler work (a new 1 MiB array per get), sent zero-copy (``fresh``) or copied because
    the handler keeps the array (``fresh_kept``), passes of ``AB_GETS`` alternating; per get, the server's
    CPU time (``time.process_time`` in the child) and the client's wall time."""
    fresh_gets = args.rounds * (max(1, args.mib_gets // MIB_BLOCK) + 1) * MIB_BLOCK
    out: dict[str, Any] = {}
    # The rda child also answers rda_user's fresh gets; rda_workers only its own client's.
    for child, name, clients in ((children[1], "rda", 2), (children[2], "rda_workers", 1)):
        counts = ask_child(child, "array_replies")
        counts["memcpy_avoided_bytes_per_fresh_get"] = (
            counts["zero_copy_replies"] * (1 << 20) / (fresh_gets * clients)
        )
        out[name] = counts
    cpu: dict[bool, list[float]] = {False: [], True: []}
    wall: dict[bool, list[float]] = {False: [], True: []}
    passes = 2 if args.quick else 12  # of AB_GETS each way (noise: see docs/performance.md)
    for turn in range(2 * passes):
        kept = bool(turn % 2)
        before = ask_child(children[1], "cpu")["seconds"]
        wall[kept].append(rda.mib_fresh(AB_GETS, kept))
        cpu[kept].append(ask_child(children[1], "cpu")["seconds"] - before)
    gets = passes * AB_GETS
    out["a_b_per_get_us"] = {
        label: {
            "server_cpu": sum(cpu[kept]) / gets * 1e6,
            "client_wall": sum(wall[kept]) / gets * 1e6,
        }
        for label, kept in (("fresh", False), ("fresh_kept", True))
    }
    return out


def ask_child(child: _structure.Child, line: str) -> dict[str, Any]:
    """A line to an rda server child (``serve``'s ``on_line``), its JSON answer."""
    assert child.proc.stdin is not None and child.proc.stdout is not None
    child.proc.stdin.write(line + "\n")
    child.proc.stdin.flush()
    answer: dict[str, Any] = json.loads(child.proc.stdout.readline())
    return answer


def serve(kind: str) -> None:
    """Child process: run a raw or rda server, print its endpoint, answer ``counts`` lines
    (structural counts, see _structure), stop when stdin closes."""
    if os.environ.get(_structure.COUNT_ENV) == "1":
        _structure.install()
    if kind == "tango":
        _tango.serve()
        return
    if kind == "raw":
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        raw = RawServer(ctx)
        print(raw.endpoint, flush=True)
        _structure.serve_counts_loop()
        raw.stop.set()
        raw.thread.join()
        ctx.term()
    else:
        if kind == "rda_documented":
            server = documented_server()
        else:
            server = rda_server(inline=kind != "rda_workers")
        server.start()
        print(server.endpoint, flush=True)

        def on_line(line: str) -> None:
            if line == "array_replies":
                stats = server.statistics()
                counts = {"zero_copy_replies": stats.zero_copy_replies}
                counts["copied_replies"] = stats.copied_replies
                # Dispatching handed to the standby because a handler ran past handover_after.
                counts["handovers"] = stats.transport.handovers
                print(json.dumps(counts), flush=True)
            elif line == "cpu":
                print(json.dumps({"seconds": time.process_time()}), flush=True)

        _structure.serve_counts_loop(on_line)
        server.stop()


def Child(kind: str) -> _structure.Child:
    """``rpc.py --serve kind`` in a child process; ``endpoint`` once it listens."""
    return _structure.Child(os.path.abspath(__file__), kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    parser.add_argument(
        "--mode", choices=("in_process", "separate_process", "both"), default="both"
    )
    parser.add_argument(
        "--no-structure", action="store_true", help="skip the structural counts (and strace)"
    )
    parser.add_argument(
        "--worker-handlers",
        action="store_true",
        help="the in-process rda server runs gets/sets on workers (inline_handlers(False)); "
        "separate processes always measure both",
    )
    parser.add_argument("--no-tango", action="store_true", help="leave PyTango out")
    parser.add_argument(
        "--serve",
        choices=("raw", "rda", "rda_workers", "rda_documented", "tango"),
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--secure", action="store_true", help="CURVE vs plain (_secure.py)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of alternated passes (1 with --quick)"
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.secure:
        import _secure  # beside this script (sys.path[0])

        json.dump(_secure.run(args.quick), sys.stdout, indent=2)
        print()
        return
    args.round_trips = 300 if args.quick else 3000
    args.seconds = 0.5 if args.quick else 3.0
    args.mib_gets = 10 if args.quick else 100
    args.updates = 2000 if args.quick else 40000
    args.restarts = 2 if args.quick else 5
    args.structure_ops = 500 if args.quick else 2000
    if args.quick:
        args.rounds = 1

    report: dict[str, Any] = {
        "load_average_before": os.getloadavg(),
        "worker_handlers_in_process": args.worker_handlers,
    }
    # The timed passes run without the structural counters (a Python wrapper per pyzmq call,
    # which costs raw pyzmq's per-frame calls more than rda's one call per message).
    if args.mode in ("in_process", "both"):
        report["in_process"] = in_process(args)
    if args.mode in ("separate_process", "both"):
        report["separate_process"] = separate_process(args)
    if not args.no_structure:
        # Counted from here on, in this process and in the children started now.
        _structure.install()
        os.environ[_structure.COUNT_ENV] = "1"
        # Separate processes (the deployment arrangement): each side's counts are its own.
        n = args.structure_ops
        report["structure_per_operation"] = {
            "raw": _structure.raw_structure(Child, n),
            "rda": _structure.rda_structure(Child, n),
            # The patterns docs/client.md shows (futures, listeners), issue 28's harness.
            "rda_user": _patterns.rda_patterns(Child, n),
            "rda_workers": _structure.rda_structure(
                Child, n, kind="rda_workers", notifications=False
            ),
        }
    report["load_average_after"] = os.getloadavg()
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
