import json, sys, os
sys.path.insert(0, "benchmarks")
import zmq, rpc
from _contestants import Raw, Rda, RdaUser
ctx = zmq.Context()
ch = [rpc.Child("raw"), rpc.Child("rda")]
cs = [Raw(ctx, ch[0].endpoint), Rda("rda", ch[1].endpoint), RdaUser("rda_user", ch[1].endpoint)]
n = int(sys.argv[1]); count = int(sys.argv[2]); turns = int(sys.argv[3])
try:
    res = rpc.interleaved(cs, lambda c: c.subscribers(count, n), turns)
    for c, r in zip(cs, res):
        print(c.name, [round(x["updates_per_s"]) for x in r], "lost-counted", [x.get("gaps", 0) + x.get("dropped", 0) for x in r], "uncounted", [x.get("uncounted_losses") for x in r])
finally:
    for c in cs: c.close()
    ctx.term()
    for c in ch: c.close()
