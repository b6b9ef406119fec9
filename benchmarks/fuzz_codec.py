"""Fuzz the compiled binary decoder: mutated, truncated, spliced and random inputs.

Compiled code must never crash the interpreter on bad bytes, and must agree with the pure-Python
decoder (docs/serialization.md, "Implementations"). The inputs run in child processes, in
chunks, so that a crash (a signal, not an exception) is caught and reported by this parent
with the input that caused it: before decoding each input a child writes its index into a
small file with one ``pwrite``, which survives the child's death.

Some seeds carry out-of-band arrays (``encode(data, arrays)``, docs/serialization.md, "Out of
band"): their bodies are mutated like the others, and their arrays are sometimes dropped,
cut short, reordered or joined by a stray one, so the decoder's checks of the references meet
bad input too.

Each input goes through the compiled ``decode`` and, unless ``--no-compare``, the pure one.
Outcomes are counted: decoded (both gave equal Data), decode_error (both raised DecodeError),
disagreements (one decoded, the other raised, or the Data differ), other_exceptions (anything
but DecodeError: a bug), message_differs (both raised, with different messages: reported, not a
failure). Inputs are generated from ``--seed`` and the chunk number only, so any finding can
be reproduced exactly.

Usage: ``python benchmarks/fuzz_codec.py [--count 1000000] [--seed 1] [--chunk 100000]``;
prints JSON; the exit status is 1 when a crash, a disagreement or another exception was seen.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rda.serialization import Data, DataType, DecodeError, DecodeLimits, binary

T = DataType
_INTERESTING = [0, 1, 2, 7, 8, 9, 0x10, 0x19, 0x20, 0x21, 0x7F, 0x80, 0xFF]
_INTERESTING_U32 = [0, 1, 4, 9, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFF0, 1 << 16]


Seed = tuple[bytes, tuple[bytes, ...]]  # a body and the out-of-band arrays it refers to


def _frozen(arr: Any) -> Any:
    arr.flags.writeable = False
    return arr


def corpus() -> list[Seed]:
    """Valid encodings of every type, shape and nesting kind: the seeds to mutate."""
    nd = np.array([["a", "é"], ["", "xyz"]], dtype=object)
    items = [
        Data(),
        Data(x=1, v=1.5, on=True, s="hé"),
        Data(
            a=np.arange(40, dtype=np.int32),
            b=np.linspace(0.0, 1.0, 40),
            c=[f"element_{i:02d}" for i in range(40)],
        ),
        Data(n=["a", "", "bc"], e=[]),
        Data(m=np.arange(6, dtype=np.int8).reshape(2, 3), z=np.empty((0, 3))),
        Data(d={"k": np.int32(7)}, l=[{}, {"q": [1.0, 2.0]}]),
        Data(s=nd, bb=np.array([True, False, True]), f=np.float32(2.5)),
        Data(i8=np.int8(-3), i16=np.int16(300), u=np.array([1, 2], np.int16)),
        Data(deep={"a": {"b": {"c": {"d": [{"e": "x"}]}}}}),
        Data(f32=np.array([1.5, -2.0], np.float32), i64=np.array([[1, 2], [3, 4]])),
    ]
    seeds: list[Seed] = [(binary.encode_python(d), ()) for d in items]
    # Out of band: 1-D and N-D, at the top, nested and in a Data array (64 KiB and up each).
    big = [
        Data(a=_frozen(np.arange(9000.0)), x=1),
        Data(
            m=_frozen(np.ones((2, 3, 6000), dtype=np.int32)),
            n=Data(q=_frozen(np.zeros(70000, dtype=np.int8))),
            l=[Data(z=_frozen(np.arange(17000, dtype=np.float32)))],
        ),
    ]
    for d in big:
        arrays: list[Any] = []
        body = binary.encode_python(d, arrays)
        seeds.append((body, tuple(bytes(a) for a in arrays)))
    return seeds


def _mutate_arrays(rng: random.Random, arrays: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """Mostly the arrays as encoded; sometimes one too few, too many, short or out of order."""
    kind = rng.randrange(10)
    if kind == 0 and arrays:
        return arrays[:-1]
    if kind == 1:
        return (*arrays, rng.randbytes(rng.randrange(64)))
    if kind == 2 and arrays:
        first = arrays[0]
        return (first[: len(first) - rng.randint(1, 9)], *arrays[1:])
    if kind == 3 and len(arrays) > 1:
        return (arrays[-1], *arrays[1:-1], arrays[0])
    return arrays


def mutate(rng: random.Random, seeds: list[Seed]) -> tuple[bytes, tuple[bytes, ...]]:
    """One fuzz input from ``rng``: a seed mutated one of six ways, or random bytes; with the
    seed's out-of-band arrays, themselves perhaps mutated."""
    body, seed_arrays = rng.choice(seeds)
    arrays = _mutate_arrays(rng, seed_arrays)
    raw = bytearray(body)
    kind = rng.randrange(7)
    if kind == 0 or not raw:  # random bytes
        return rng.randbytes(rng.randrange(65)), arrays
    if kind == 1:  # truncated
        return bytes(raw[: rng.randrange(len(raw))]), arrays
    if kind == 2:  # 1-4 random bytes replaced
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    elif kind == 3:  # an interesting byte (tags, ndim, high bits)
        raw[rng.randrange(len(raw))] = rng.choice(_INTERESTING)
    elif kind == 4:  # an interesting u32 (counts, sizes, dims) at any offset
        i = rng.randrange(len(raw))
        raw[i : i + 4] = rng.choice(_INTERESTING_U32).to_bytes(4, "little")
    elif kind == 5:  # bytes inserted or deleted
        i = rng.randrange(len(raw) + 1)
        if rng.random() < 0.5:
            raw[i:i] = rng.randbytes(rng.randint(1, 8))
        else:
            del raw[i : i + rng.randint(1, 8)]
    else:  # two seeds spliced
        other = rng.choice(seeds)[0]
        raw = raw[: rng.randrange(len(raw) + 1)] + other[rng.randrange(len(other) + 1) :]
    return bytes(raw), arrays


def chunk_inputs(
    seed: int, chunk: int, count: int
) -> Iterator[tuple[Any, DecodeLimits | None, tuple[bytes, ...]]]:
    """The inputs of one chunk, in order: (buffer, limits, arrays); a function of (seed,
    chunk)."""
    rng = random.Random(seed * 1_000_003 + chunk)
    seeds = corpus()
    small = DecodeLimits(max_depth=3, max_elements=50)
    for _ in range(count):
        raw, arrays = mutate(rng, seeds)
        form = rng.randrange(8)  # mostly bytes; some bytearray/memoryview and tight limits
        buffer: Any = bytearray(raw) if form == 0 else memoryview(raw) if form == 1 else raw
        yield buffer, small if form == 2 else None, arrays


def _outcome(
    decode: Any, buffer: Any, limits: DecodeLimits | None, arrays: tuple[bytes, ...]
) -> tuple[str, Any]:
    try:
        return "data", decode(buffer, limits, arrays)
    except DecodeError as exc:
        return "error", str(exc)
    except Exception as exc:
        return "other", f"{type(exc).__name__}: {exc}"


def run_child(seed: int, chunk: int, count: int, compare: bool, index_file: str) -> None:
    """Decode one chunk; print its counts as JSON. Writes each input's index first."""
    compiled = binary.COMPILED
    if compiled is None:
        raise SystemExit("the compiled codec is not built")
    counts = dict.fromkeys(
        ("inputs", "decoded", "decode_error", "disagreements", "other_exceptions"), 0
    )
    counts["message_differs"] = 0
    examples: list[dict[str, str]] = []
    fd = os.open(index_file, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i, (buffer, limits, arrays) in enumerate(chunk_inputs(seed, chunk, count)):
            os.pwrite(fd, b"%12d" % i, 0)
            kind, value = _outcome(compiled.decode, buffer, limits, arrays)
            counts["inputs"] += 1
            bad = kind == "other"
            if bad:
                counts["other_exceptions"] += 1
            elif compare:
                pkind, pvalue = _outcome(binary.decode_python, buffer, limits, arrays)
                if pkind != kind or (kind == "data" and pvalue != value):
                    counts["disagreements"] += 1
                    bad = True
                elif kind == "error" and pvalue != value:
                    counts["message_differs"] += 1
                    if len(examples) < 5:
                        examples.append(
                            {"input": bytes(buffer).hex(), "compiled": value, "python": pvalue}
                        )
            if not bad:
                counts["decoded" if kind == "data" else "decode_error"] += 1
            elif len(examples) < 5:
                examples.append({"input": bytes(buffer).hex(), "compiled": str(value)})
    finally:
        os.close(fd)
    json.dump({"counts": counts, "examples": examples}, sys.stdout)


def fuzz(count: int, seed: int, chunk_size: int, compare: bool) -> dict[str, Any]:
    """Run ``count`` inputs in child processes of ``chunk_size`` each; the JSON report."""
    totals: dict[str, int] = {}
    examples: list[Any] = []
    crashes: list[dict[str, Any]] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        index_file = os.path.join(tmp, "index")
        for chunk, first in enumerate(range(0, count, chunk_size)):
            n = min(chunk_size, count - first)
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--seed",
                str(seed),
                "--chunk-number",
                str(chunk),
                "--count",
                str(n),
                "--index-file",
                index_file,
            ]
            if not compare:
                cmd.append("--no-compare")
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                crashes.append(_crash(seed, chunk, index_file, proc))
                continue
            report = json.loads(proc.stdout)
            for key, value in report["counts"].items():
                totals[key] = totals.get(key, 0) + value
            examples.extend(report["examples"][: max(0, 10 - len(examples))])
    return {
        "implementation_fuzzed": "compiled",
        "compared_with_python": compare,
        "seed": seed,
        "chunk_size": chunk_size,
        "counts": totals,
        "crashes": crashes,
        "examples": examples,
        "seconds": round(time.monotonic() - start, 1),
    }


def _crash(seed: int, chunk: int, index_file: str, proc: Any) -> dict[str, Any]:
    """What a child that died was decoding: its exit status and the input, reproduced."""
    try:
        with open(index_file, "rb") as f:
            index = int(f.read().strip() or b"-1")
    except (OSError, ValueError):
        index = -1
    found: dict[str, Any] = {
        "chunk": chunk,
        "returncode": proc.returncode,
        "index": index,
        "stderr": proc.stderr[-2000:],
    }
    if index >= 0:
        buffer, limits, arrays = list(chunk_inputs(seed, chunk, index + 1))[index]
        found["input"] = bytes(buffer).hex()
        found["arrays"] = [len(a) for a in arrays]
        found["limits"] = None if limits is None else [limits.max_depth, limits.max_elements]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=100_000, help="inputs per child process")
    parser.add_argument("--no-compare", action="store_true", help="skip the pure decoder")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk-number", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--index-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.seed, args.chunk_number, args.count, not args.no_compare, args.index_file)
        return
    report = fuzz(args.count, args.seed, args.chunk, not args.no_compare)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    c = report["counts"]
    failed = report["crashes"] or c.get("disagreements") or c.get("other_exceptions")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
