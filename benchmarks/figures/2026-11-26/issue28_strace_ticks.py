"""System calls of an rda server process over 2000 sequential gets (strace -c -f -p), to
count what the standby's ticks cost (run it also with RDA_HANDOVER_AFTER=1.0). From the
repository root: ``.venv/bin/python benchmarks/figures/2026-11-26/issue28_strace_ticks.py rda``;
the summary lands in /tmp/i28/strace_<kind>.txt."""

import os
import subprocess
import sys
import time

sys.path.insert(0, "benchmarks")
import rpc

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory

env_kind = sys.argv[1]
os.makedirs("/tmp/i28", exist_ok=True)
ch = rpc.Child(env_kind)
c = ClientService(StaticDirectory({"*": ch.endpoint}), Config(workers=1))
ap = c.access_point("SCALAR", "Acquisition")
for _ in range(300):
    ap.get()
st = subprocess.Popen(
    ["strace", "-c", "-f", "-p", str(ch.proc.pid), "-o", f"/tmp/i28/strace_{env_kind}.txt"]
)
time.sleep(0.5)
t0 = time.perf_counter()
for _ in range(2000):
    ap.get()
el = time.perf_counter() - t0
st.send_signal(2)
st.wait()
c.close()
ch.close()
print(env_kind, "elapsed", round(el, 2))
