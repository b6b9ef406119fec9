"""Issue 28 point 4, the hand-over's A/B on a real rda server in a child process
(``rpc.py --serve rda``): the same handler work (a new 1 MiB array per get), sent zero-copy
(``MIBFRESH``) or copied because the handler keeps the array (``MIBFRESHKEPT``), in
alternating passes of 50 gets; per get, the server process's CPU time (``process_time`` in the
child, all its threads) and the client's wall time. Run from the repository root:
``.venv/bin/python benchmarks/figures/2026-11-26/issue28_zero_copy_server_ab.py``.
Output: issue28_zero_copy_server_ab.txt."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import rpc
from _contestants import Rda

PASSES = 12
GETS = 50


def main() -> None:
    child = rpc.Child("rda")
    rda = Rda("rda", child.endpoint, subscriptions=False)
    try:
        for kept in (False, True):
            rda.mib_fresh(GETS, kept)  # warm up
        cpu = {False: 0.0, True: 0.0}
        wall = {False: 0.0, True: 0.0}
        for turn in range(2 * PASSES):
            kept = bool(turn % 2)
            before = rpc.ask_child(child, "cpu")["seconds"]
            wall[kept] += rda.mib_fresh(GETS, kept)
            cpu[kept] += rpc.ask_child(child, "cpu")["seconds"] - before
        counts = rpc.ask_child(child, "array_replies")
        gets = PASSES * GETS
        for label, kept in (("zero-copy (fresh)", False), ("copied (kept)", True)):
            print(
                f"{label:18} server cpu {cpu[kept] / gets * 1e6:6.0f} us/get, "
                f"client wall {wall[kept] / gets * 1e6:6.0f} us/get"
            )
        print(f"server counts: {counts}, load average {os.getloadavg()[0]:.2f}")
    finally:
        rda.close()
        child.close()


if __name__ == "__main__":
    main()
