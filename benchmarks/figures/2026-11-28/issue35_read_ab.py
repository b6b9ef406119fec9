"""A/B of served history pulls of a kept store, raw baselines in the same run (issue 35,
fourth session: issue35_read_*.json).

Each round, for each variant (a directory with an ``rda`` package, put first on PYTHONPATH),
in an order that turns round every round: a fresh ``rda history serve STORE`` in its own
process, a client in a third process that connects (a pull of an empty window), then pulls
the whole window ``--pulls`` times with ``history_table`` (the first is the fresh server's
first pull); wall time, server CPU and client CPU per pull. Then, the same round, the raw
baselines over the same bytes (the Arrow IPC streams of the query, as the first variant's
reader encodes them): raw pyzmq DEALER/ROUTER and raw pyarrow IPC over raw pyzmq, best of 3.
STORE holds one signal ``DEV/Prop`` and a file ``window`` with ``start end`` in ns.

    python issue35_read_ab.py STORE before=/path/a after=/path/b [--rounds 3] [--pulls 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_CLIENT = """
import resource, sys, time
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
root, endpoint, pulls = sys.argv[1], sys.argv[2], int(sys.argv[3])
start, end = map(int, open(root + '/window').read().split())
client = ClientService(StaticDirectory({'history:*': endpoint}), Config(request_timeout=600.0))
client.history_table('DEV', 'Prop', start - 2_000_000, start - 1_000_000)
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
print('ready', flush=True)
for _ in range(pulls):
    sys.stdin.readline()
    used = cpu()
    begin = time.perf_counter()
    table = client.history_table('DEV', 'Prop', start, end)
    print(round(time.perf_counter() - begin, 4), table.num_rows, round(cpu() - used, 3), flush=True)
    del table
client.close()
"""

_RAW = """
import json, sys
sys.path.insert(0, sys.argv[2])
from history_service import _chunks, _disk_reader, _raw_pyzmq
from rda.business.client.history import TABLE_CHUNK_ROWS
root = sys.argv[1]
start, end = map(int, open(root + '/window').read().split())
payloads = _chunks(_disk_reader(root), start, end, TABLE_CHUNK_ROWS)
raw = min(_raw_pyzmq(payloads, decode=False) for _ in range(3))
ipc = min(_raw_pyzmq(payloads, decode=True) for _ in range(3))
print(json.dumps({"raw_pyzmq_s": round(raw, 4), "raw_pyarrow_ipc_s": round(ipc, 4),
                  "wire_mib": round(sum(p.nbytes for p in payloads) / 2**20, 1)}))
"""

BENCHMARKS = str(Path(__file__).resolve().parents[2])


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(store: str, path: str, pulls: int) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=path, RDA_DIRECTORY_FILE=f"{store}/directory.json")
    command = [sys.executable, "-m", "rda._cli", "history", "serve", store]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert server.stderr is not None
    endpoint = server.stderr.readline().split()[-1]
    client = subprocess.Popen(
        [sys.executable, "-u", "-c", _CLIENT, store, endpoint, str(pulls)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert client.stdin is not None and client.stdout is not None
    assert client.stdout.readline().strip() == "ready"
    out = []
    for _ in range(pulls):
        before = _cpu(server.pid)
        client.stdin.write("\n")
        client.stdin.flush()
        seconds, rows, client_cpu = client.stdout.readline().split()
        out.append(
            {
                "s": float(seconds),
                "rows": int(rows),
                "server_cpu_s": round(_cpu(server.pid) - before, 3),
                "client_cpu_s": float(client_cpu),
            }
        )
    client.stdin.close()
    client.wait(60)
    client.stdout.close()
    server.terminate()
    server.wait(60)
    server.stderr.close()
    return out


def raw(store: str, path: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=path)
    done = subprocess.run(
        [sys.executable, "-c", _RAW, store, BENCHMARKS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("variants", nargs="+", help="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pulls", type=int, default=3)
    args = parser.parse_args()
    variants = [v.split("=", 1) for v in args.variants]
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        order = variants if number % 2 == 0 else variants[::-1]
        for name, path in order:
            load = os.getloadavg()[0]
            pulls = run(args.store, path, args.pulls)
            rounds.append({"round": number, "variant": name, "pulls": pulls, "load": load})
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
        baseline = raw(args.store, variants[0][1])
        rounds.append({"round": number, "variant": "raw", **baseline, "load": os.getloadavg()[0]})
        print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"store": args.store, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
