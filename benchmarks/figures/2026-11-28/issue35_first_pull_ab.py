"""A/B of the first and repeat pulls of a stored window (issue35_first_pull_ab.json).

Each round, for each variant (a directory with an ``rda`` package, put first on PYTHONPATH):
a fresh ``rda history serve STORE`` in its own process, a client in a third process that
connects (a pull of an empty window), then pulls the whole window ``--pulls`` times with
``history_table``; wall time per pull and the server's CPU seconds for it. Variants alternate
within each round (the machine is shared). STORE holds one signal ``DEV/Prop`` and a file
``window`` with ``start end`` in ns (as ``history_service.py``'s store, kept).

    python issue35_first_pull_ab.py STORE before=/path/a after=/path/b [--rounds 3]
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
import sys, time
from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
root, endpoint, pulls = sys.argv[1], sys.argv[2], int(sys.argv[3])
start, end = map(int, open(root + '/window').read().split())
client = ClientService(StaticDirectory({'history:*': endpoint}), Config(request_timeout=600.0))
client.history_table('DEV', 'Prop', start - 2_000_000, start - 1_000_000)
print('ready', flush=True)
for _ in range(pulls):
    sys.stdin.readline()
    begin = time.perf_counter()
    rows = client.history_table('DEV', 'Prop', start, end).num_rows
    print(round(time.perf_counter() - begin, 3), rows, flush=True)
client.close()
"""


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
        seconds, rows = client.stdout.readline().split()
        out.append(
            {"s": float(seconds), "rows": int(rows), "server_cpu_s": _cpu(server.pid) - before}
        )
    client.wait(60)
    server.terminate()
    server.wait(60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("variants", nargs="+", help="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pulls", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        for variant in args.variants:
            name, path = variant.split("=", 1)
            pulls = run(args.store, path, args.pulls)
            rounds.append({"variant": name, "pulls": pulls, "load": os.getloadavg()})
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    print(json.dumps(rounds, indent=2))


if __name__ == "__main__":
    main()
