"""Instructions and simulated cache misses per blocking get, per THREAD of each process
(issue 38, fifth session): rpc_counts.py's client and server processes of one contestant
under ``valgrind --tool=callgrind --separate-threads=yes --cache-sim=yes``, ``n`` gets
counted after 300 uncounted ones. Prints one line per thread that ran more than 50
instructions per get: the side, callgrind's file (``.1-NN``: thread NN) and every event per
get (Ir instructions; I1mr/D1mr/D1mw first-level misses; the simulated caches are
callgrind's defaults for this CPU).

    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue38_s5_latency_callgrind.py rda 1000
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import rpc_counts


def main() -> None:
    name, n = sys.argv[1], int(sys.argv[2])
    folder = tempfile.mkdtemp(prefix="issue38-s5-cg-")
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
    grind += ["--cache-sim=yes", f"--callgrind-out-file={folder}/cg.%p"]
    pair = rpc_counts.Pair(name, grind)
    quiet = {"check": True, "stdout": subprocess.DEVNULL}
    try:
        pair.run("get", 300)
        for pid in pair.pids.values():
            subprocess.run(["callgrind_control", "-z", str(pid)], **quiet)  # type: ignore[call-overload]
            subprocess.run(["callgrind_control", "-i", "on", str(pid)], **quiet)  # type: ignore[call-overload]
        pair.run("get", n)
        for pid in pair.pids.values():
            subprocess.run(["callgrind_control", "-i", "off", str(pid)], **quiet)  # type: ignore[call-overload]
            subprocess.run(["callgrind_control", "-d", "get", str(pid)], **quiet)  # type: ignore[call-overload]
        for side, pid in pair.pids.items():
            for dump in sorted(Path(folder).glob(f"cg.{pid}*")):
                events: list[str] = []
                totals: list[int] = []
                for line in dump.read_text().splitlines():
                    if line.startswith("events:"):
                        events = line.split()[1:]
                    elif line.startswith("totals:"):
                        totals = [int(x) for x in line.split()[1:]]
                        break
                if totals and totals[0] / n > 50:
                    per_get = {e: round(v / n, 1) for e, v in zip(events, totals, strict=True)}
                    print(name, side, dump.name, per_get, flush=True)
    finally:
        pair.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
