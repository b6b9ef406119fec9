"""Fuzz the compiled REQUEST/REPLY frame parser (``rda.transport._cframe``).

Compiled code must never crash the interpreter on bad bytes, and must agree with the
pure-Python parser (``protocol._decode_message``): for every input the compiled
``parse_message`` either returns None (the message takes the Python path, which names the
error or, for the rare forms the fast path leaves alone, decodes it) or a Message equal to
the Python parser's. When the Python parser raises, the compiled one must have returned None.

Inputs are valid messages (random headers and bodies, some with external body frames) and
mutations of them: byte flips, interesting values at random offsets, truncation, extension,
dropped and added frames. They run in child processes, one chunk each, so that a crash (a
signal, not an exception) is reported by this parent with the seed and chunk that reproduce
it exactly.

Usage: ``python benchmarks/fuzz_frames.py [--count 1000000] [--seed 1] [--chunk 100000]``;
prints JSON; the exit status is 1 on a crash, a disagreement or another exception.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from typing import Any

from rda.serialization import BodyKind, DecodeError, Header, RequestType, UpdateType
from rda.serialization.header import HeaderFlags
from rda.transport import protocol
from rda.transport.protocol import LARGE_BODY, Kind, encode_message

_INTERESTING = [0, 1, 2, 3, 4, 5, 0x7F, 0x80, 0x81, 0x82, 0xFE, 0xFF]
_NAMES = ["", "PS1", "Acquisition", "CPS.USER.ALL", "é", "x" * 300]


def valid(rng: random.Random) -> tuple[list[bytes], int]:
    """A well-formed REQUEST or REPLY: (frames, kind byte)."""
    kind = rng.choice((Kind.REQUEST, Kind.REPLY))
    header = Header(
        rng.choice(list(RequestType)),
        rng.getrandbits(64),
        rng.choice(_NAMES),
        rng.choice(_NAMES),
        rng.choice(_NAMES),
        rng.choice(list(UpdateType)),
        rng.choice((HeaderFlags.NONE, HeaderFlags.CONFLATABLE)),
    )
    body = []
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        size = rng.choice((0, 1, 13, 40, 300, LARGE_BODY))
        body.append((rng.choice(list(BodyKind)), rng.randbytes(size)))
    frames = [bytes(f) for f in encode_message(kind, header, body)]
    return frames, int(kind)


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(frames)) if frames else 0
        if not frames:
            frames.append(rng.randbytes(rng.randrange(40)))
            continue
        f = bytearray(frames[i])
        if op == 0 and f:  # flip a bit
            pos = rng.randrange(len(f))
            f[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and f:  # an interesting byte, mostly in the header and body table
            pos = rng.randrange(min(len(f), 64))
            f[pos] = rng.choice(_INTERESTING)
        elif op == 2:  # truncate
            del f[rng.randrange(len(f) + 1) :]
        elif op == 3:  # extend
            f += rng.randbytes(rng.randrange(1, 9))
        elif op == 4 and len(frames) > 1:  # drop a frame
            del frames[i]
            continue
        elif op == 5:  # add a frame
            frames.append(rng.randbytes(rng.choice((0, 5, LARGE_BODY))))
            continue
        elif op == 6 and len(f) > 4:  # a random u32 at a random place
            pos = rng.randrange(len(f) - 3)
            f[pos : pos + 4] = rng.getrandbits(32).to_bytes(4, "little")
        frames[i] = bytes(f)
    return frames


def same(a: Any, b: Any) -> bool:
    return a.header == b.header and [(k, bytes(v)) for k, v in a.body] == [
        (k, bytes(v)) for k, v in b.body
    ]


def run_chunk(seed: int, chunk: int, count: int) -> dict[str, Any]:
    from rda.transport._cframe import parse_message

    rng = random.Random(seed * 1_000_003 + chunk)
    counts = {
        "inputs": 0,
        "accepted": 0,
        "left_to_python": 0,
        "python_decoded_what_compiled_left": 0,
        "disagreements": 0,
        "other": 0,
    }
    examples: list[str] = []
    for _ in range(count):
        frames, kind = valid(rng)
        mutated = rng.random() < 0.9
        if mutated:
            frames = mutate(rng, frames)
        max_size = rng.choice((1 << 28, 1 << 28, 100)) if mutated else 1 << 28
        as_views: list[object] = (
            [memoryview(f) for f in frames] if rng.random() < 0.5 else list(frames)
        )
        counts["inputs"] += 1
        try:
            fast = parse_message(as_views, kind, max_size)
        except Exception as exc:  # the compiled parser must never raise
            counts["other"] += 1
            examples.append(f"compiled raised {exc!r} on {[f.hex() for f in frames]}")
            continue
        try:
            if not frames or frames[0][:1] != bytes([kind]) or sum(map(len, frames)) > max_size:
                raise DecodeError("not a message of this kind, or too big")
            slow = protocol._decode_message(frames)
        except DecodeError:
            slow = None
        if fast is None:
            counts["left_to_python"] += 1
            if slow is not None:
                # Valid forms the fast path leaves alone (flags outside HeaderFlags' members);
                # an unmutated message is never one of them.
                counts["python_decoded_what_compiled_left"] += 1
                if not mutated:
                    counts["disagreements"] += 1
                    examples.append(f"valid message left to python: {[f.hex() for f in frames]}")
        elif slow is not None and same(fast, slow):
            counts["accepted"] += 1
        else:
            counts["disagreements"] += 1
            examples.append(f"compiled {fast!r} python {slow!r} on {[f.hex() for f in frames]}")
    return {"counts": counts, "examples": examples[:5]}


def fuzz(count: int, seed: int, chunk_size: int) -> dict[str, Any]:
    totals: dict[str, int] = {}
    examples: list[str] = []
    crashes: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for chunk, start in enumerate(range(0, count, chunk_size)):
        n = min(chunk_size, count - start)
        cmd = [sys.executable, __file__, "--child", str(seed), str(chunk), str(n)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            crashes.append(
                {"seed": seed, "chunk": chunk, "returncode": proc.returncode, "stderr": proc.stderr}
            )
            continue
        report = json.loads(proc.stdout)
        for k, v in report["counts"].items():
            totals[k] = totals.get(k, 0) + v
        examples += report["examples"]
    return {
        "counts": totals,
        "crashes": crashes,
        "examples": examples[:10],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=100_000)
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_chunk(*args.child)))
        return
    report = fuzz(args.count, args.seed, args.chunk)
    print(json.dumps(report, indent=2))
    bad = (
        report["crashes"] or report["counts"].get("disagreements") or report["counts"].get("other")
    )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
