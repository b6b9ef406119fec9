"""``rda bench rpc`` (benchmarks/rpc.py) with the ``rda`` contestant's ``Config.lane_spin``
given first on the command line (issue 38, fifth session): ``0`` is every client as
benchmarks/rpc.py runs it (the default; the polling code is inert at 0), ``0.0001`` the
``rda`` contestant polling for 100 us. The other arguments go to rpc.py; run the two
alternately and compare each run's ratios to raw pyzmq.

    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue38_s5_rpc_ab.py 0 \\
        --mode separate_process --no-structure --rounds 1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import _contestants
import rpc


def main() -> None:
    _contestants.LANE_SPIN = float(sys.argv.pop(1))
    rpc.main()


if __name__ == "__main__":
    main()
