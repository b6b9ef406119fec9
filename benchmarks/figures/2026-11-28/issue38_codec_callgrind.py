"""Instructions per codec call, by field type, for two builds of rda (issue 38, item 3).

Counted with callgrind (deterministic, unlike wall time on a shared machine): each case runs
N1 and N2 times in a child ``valgrind --tool=callgrind`` and the per-call count is
(I(N2) - I(N1)) / (N2 - N1), which cancels start-up. ``none`` is the loop itself (a lambda
call per iteration, included in every other row). msgpack rows are the same values as lists.

Usage: python issue38_codec_callgrind.py LIBDIR [LIBDIR...]  (each put first on PYTHONPATH)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, numpy as np, msgpack
from rda.serialization import Data, binary
C = binary.COMPILED
case, op, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = np.arange(40, dtype=np.int32) * 1000
b = np.linspace(0.0, 1.0, 40)
c = [f"element_{i:02d}" for i in range(40)]
cases = {"empty": Data(), "int32[40]": Data(a=a), "float64[40]": Data(b=b),
         "string[40]": Data(c=c), "paper": Data(a=a, b=b, c=c)}
if case == "msgpack":
    lists = {"a": a.tolist(), "b": b.tolist(), "c": c}
    p, u = msgpack.packb, msgpack.unpackb
    raw = p(lists)
    f = {"encode": lambda: p(lists), "decode": lambda: u(raw), "cycle": lambda: u(p(lists))}[op]
else:
    d = cases[case]; raw = C.encode(d); enc, dec = C.encode, C.decode
    f = {"encode": lambda: enc(d), "decode": lambda: dec(raw), "cycle": lambda: dec(enc(d)),
         "none": lambda: None}[op]
for _ in range(n):
    f()
"""
N1, N2 = 5000, 25000


def instructions(lib: str, script: str, case: str, op: str, n: int) -> int:
    env = dict(os.environ, PYTHONPATH=lib, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                script,
                case,
                op,
                str(n),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"callgrind reported no count: {out[-500:]}")
    return int(found.group(1))


def per_call(lib: str, script: str, case: str, op: str) -> int:
    a, b = (instructions(lib, script, case, op, n) for n in (N1, N2))
    return round((b - a) / (N2 - N1))


def main() -> None:
    libs = sys.argv[1:]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
        script = f.name
    rows = [
        (c, o)
        for c in ("empty", "int32[40]", "float64[40]", "string[40]", "paper")
        for o in ("encode", "decode")
    ]
    rows += [
        ("paper", "cycle"),
        ("paper", "none"),
        ("msgpack", "encode"),
        ("msgpack", "decode"),
        ("msgpack", "cycle"),
    ]
    print("case op " + " ".join(libs))
    for case, op in rows:
        print(case, op, *(per_call(lib, script, case, op) for lib in libs), flush=True)
    os.unlink(script)


if __name__ == "__main__":
    main()
