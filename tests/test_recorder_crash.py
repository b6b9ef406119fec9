"""Crash test: a recorder under load SIGKILLed at random moments loses no acked row, duplicates none.

A subprocess recorder feeds itself from a local fire-hose through the storage core and appends
every acknowledgement (first, last seq) to a file the moment it is made. It flushes every 10 ms
and converts every 30 ms, so a random kill lands inside a segment write or a conversion most of
the time. After each kill a new process restarts on the same root. Finally every acknowledged
``(recorder_id, seq)`` must be in the Parquet store exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from rda.pipeline.recorder.service import Recorder
from rda.testing import wait_until

CHILD = r"""
import sys, time
import numpy as np
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.header import DataContext

import rda.pipeline.recorder.converter as converter
import rda.pipeline.recorder.journal as journal

root, acks, mode = sys.argv[1], sys.argv[2], sys.argv[3]
out = open(acks, "a")


def stuck(what):
    print("stuck", what, flush=True)
    time.sleep(3600)


if mode == "segment":  # hang inside the 3rd segment write: tmp written, not renamed
    real_write, calls = journal.write_durably, [0]

    def write_durably(path, payload):
        calls[0] += 1
        if calls[0] == 3:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(bytes(payload)[: len(payload) // 2])
            stuck("segment")
        real_write(path, payload)

    journal.write_durably = write_durably
elif mode == "conversion":  # hang after the first Parquet file of the second group
    real_parquet, files = converter._write_parquet, [0]

    def write_parquet(path, table):
        real_parquet(path, table)
        files[0] += 1
        if files[0] > 1 and converter.Converter._converted_groups >= 1:
            stuck("conversion")

    converter._write_parquet = write_parquet
    real_group = converter.Converter._convert_group
    converter.Converter._converted_groups = 0

    def convert_group(self, group):
        done = real_group(self, group)
        converter.Converter._converted_groups += 1
        return done

    converter.Converter._convert_group = convert_group

def on_ack(first, last):
    out.write(f"{first} {last}\n")
    out.flush()

recorder = Recorder(root, recorder_id="crash", flush_interval=0.01, flush_rows=2000,
                    convert_interval=0.03, queue_limit=20000, on_ack=on_ack)
recorder.start()
print("ready", recorder.acked_seq, flush=True)
i = 0
while True:
    now = time.time_ns()
    for _ in range(300):
        i += 1
        data = Data(i=i, x=i * 0.5, wave=np.arange(i % 7, dtype=np.float64))
        recorder.offer(f"PS{i % 3}", "Acq", None, Sample(data, DataContext("C", now, now, "S")))
    time.sleep(0.002)
"""


def _acked(path: Path) -> set[int]:
    seqs: set[int] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            first, last = map(int, line.split())
            seqs.update(range(first, last + 1))
    return seqs


def _stored(root: Path) -> list[tuple[str, int]]:
    keys: list[tuple[str, int]] = []
    for path in root.glob("device=*/property=*/date=*/part-*.parquet"):
        table = pq.read_table(path, columns=["recorder_id", "seq"])
        keys.extend(
            zip(
                table.column("recorder_id").to_pylist(),
                table.column("seq").to_pylist(),
                strict=True,
            )
        )
    return keys


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(os.getpid())
    acks = tmp_path / "acks.txt"
    root = tmp_path / "store"
    previous_max = 0
    for _ in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(acks), "load"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            ready = child.stdout.readline().split()
            assert ready[0] == "ready"
            # The restarted recorder continues after the last durable seq: nothing acked is lost.
            assert int(ready[1]) >= previous_max
            # Wait (bounded) until it acknowledges under load, then kill at a random instant.
            wait_until(
                lambda: max(_acked(acks), default=0) > previous_max,  # noqa: B023 (used at once)
                "the recorder to acknowledge something",
            )
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            if child.stdout is not None:
                child.stdout.close()
        previous_max = max(_acked(acks))
    final = Recorder(root, recorder_id="crash")
    final.start()
    assert final.acked_seq >= previous_max
    final.stop()  # converts every remaining segment
    stored = _stored(root)
    seqs = [seq for _, seq in stored]
    assert len(seqs) == len(set(seqs)), "a row was stored twice"
    assert {rid for rid, _ in stored} == {"crash"}
    missing = _acked(acks) - set(seqs)
    assert not missing, f"{len(missing)} acknowledged rows missing, e.g. {sorted(missing)[:5]}"


def _kill_when_stuck(root: Path, acks: Path, mode: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(acks), mode], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split()[0] == "ready"
        assert child.stdout.readline().split() == ["stuck", mode]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def _recover_and_check(root: Path, acks: Path) -> None:
    final = Recorder(root, recorder_id="crash")
    final.start()
    assert final.acked_seq >= max(_acked(acks))
    final.stop()
    seqs = [seq for _, seq in _stored(root)]
    assert len(seqs) == len(set(seqs)), "a row was stored twice"
    assert not _acked(acks) - set(seqs), "an acknowledged row is missing"
    assert not list(root.rglob("*.tmp")), "a temporary file survived recovery"


def test_kill_inside_a_segment_write(tmp_path: Path) -> None:
    root, acks = tmp_path / "store", tmp_path / "acks.txt"
    _kill_when_stuck(root, acks, "segment")
    assert list((root / "_journal" / "crash").glob(".seg-*.tmp")), "the kill missed the write"
    assert len((acks).read_text().splitlines()) == 2  # two segments were acknowledged
    _recover_and_check(root, acks)


def test_kill_inside_a_conversion(tmp_path: Path) -> None:
    root, acks = tmp_path / "store", tmp_path / "acks.txt"
    _kill_when_stuck(root, acks, "conversion")
    progress = json.loads((root / "_journal" / "crash" / "progress.json").read_text())
    assert progress["planned"] is not None, "the kill missed the conversion"
    _recover_and_check(root, acks)
