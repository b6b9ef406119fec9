"""Before/after in one run: raw; main's rda (workers) and rda_inline (declared non-blocking);
this branch's rda (default: optimistic inline). Latency p50 per block-interleaved round."""
import json, os, subprocess, sys
sys.path.insert(0, "benchmarks")
import zmq
import rpc, _structure
from _contestants import Raw, Rda

class MainChild(_structure.Child):
    def __init__(self, kind):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(["/work/main/.venv/bin/python", "/work/main/benchmarks/rpc.py", "--serve", kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/work/main", env=env)
        self.endpoint = self.proc.stdout.readline().strip()
        assert self.endpoint

ctx = zmq.Context()
children = [rpc.Child("raw"), MainChild("rda"), MainChild("rda_inline"), rpc.Child("rda")]
names = ["raw", "main_workers", "main_inline", "new_default"]
cs = [Raw(ctx, children[0].endpoint)] + [Rda(n, ch.endpoint, subscriptions=False) for n, ch in zip(names[1:], children[1:])]
try:
    out = []
    for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        res = rpc.interleaved_latencies(cs, int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
        rates = rpc.interleaved(cs, lambda c: c.in_flight(0.3), 4)
        row = {c.name: {k: round(v["p50_us"], 1) for k, v in res[i].items()} for i, c in enumerate(cs)}
        for i, c in enumerate(cs):
            row[c.name]["in_flight"] = round(sum(rates[i]) / len(rates[i]))
        out.append(row)
        print(json.dumps(row), flush=True)
    ratios = {n: {k: round(sorted(o[n][k] / o["raw"][k] if k != "in_flight" else o[n][k] / o["raw"][k] for o in out)[len(out)//2], 2) for k in out[0]["raw"]} for n in names[1:]}
    print("median ratios", json.dumps(ratios))
finally:
    for c in cs: c.close()
    ctx.term()
    for ch in children: ch.close()
