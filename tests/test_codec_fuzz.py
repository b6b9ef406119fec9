"""A short run of ``benchmarks/fuzz_codec.py``: the compiled decoder on 20,000 fuzzed inputs.

The full run (>= 1,000,000 inputs) is a benchmark-style script, not a test; this bounded run
keeps the crash detection and the compiled-vs-pure agreement checked on every ``make test``.
The script runs its inputs in child processes, so a crash fails this test instead of killing
pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rda.serialization import binary

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz_codec.py"


def test_compiled_decoder_survives_and_agrees_with_pure_python_on_20k_fuzzed_inputs() -> None:
    assert binary.COMPILED is not None, "the compiled codec was not built"
    cmd = [sys.executable, str(SCRIPT), "--count", "20000", "--chunk", "10000", "--seed", "7"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50, check=False)
    report = json.loads(proc.stdout)
    counts = report["counts"]
    assert report["crashes"] == [], report["crashes"]
    assert counts["inputs"] == 20000
    assert counts["disagreements"] == 0, report["examples"]
    assert counts["other_exceptions"] == 0, report["examples"]
    assert counts["decoded"] + counts["decode_error"] == 20000
    # The mutations reach both outcomes: some inputs still decode, most are rejected.
    assert counts["decoded"] > 500 and counts["decode_error"] > 5000
    assert proc.returncode == 0, proc.stderr
