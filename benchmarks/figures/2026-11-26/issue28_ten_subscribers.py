import json, sys, os, subprocess
sys.path.insert(0, "benchmarks")
import zmq, rpc, _structure
from _contestants import Raw, Rda, RdaUser
class MainChild(_structure.Child):
    def __init__(self, kind):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(["/work/main/.venv/bin/python", "/work/main/benchmarks/rpc.py", "--serve", kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/work/main", env=env)
        self.endpoint = self.proc.stdout.readline().strip()
ctx = zmq.Context()
ch = [rpc.Child("raw"), MainChild("rda"), rpc.Child("rda")]
cs = [Raw(ctx, ch[0].endpoint), Rda("main_server", ch[1].endpoint), Rda("new_server", ch[2].endpoint)]
n = int(sys.argv[1]); count = int(sys.argv[2]); turns = int(sys.argv[3])
try:
    res = rpc.interleaved(cs, lambda c: c.subscribers(count, n), turns)
    for c, r in zip(cs, res):
        print(c.name, [round(x["updates_per_s"]) for x in r], "lost-counted", [x.get("gaps", 0) + x.get("dropped", 0) for x in r])
finally:
    for c in cs: c.close()
    ctx.term()
    for c in ch: c.close()
