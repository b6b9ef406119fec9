"""Serialization benchmark: the RDA3 paper's object through rda, msgpack and pickle.

The paper (its "Serialization" section) times encode + decode of an object holding an int
array, a double array and a string array of 40 elements each, 100,000 cycles: 4.22 us per
cycle for CMW's C++ serializer, 13.4 us for msgpack. Here the same object is a
``Data(a=int32[40], b=float64[40], c=string[40])`` and goes through:

* ``rda_compiled`` / ``rda_python``: ``decode(encode(data))`` through each implementation of
  the wire codec (the Cython extension and the pure-Python fallback; docs/serialization.md);
* ``msgpack_lists``: ``unpackb(packb(obj))`` with ``obj`` the same values as Python lists
  (msgpack cannot hold numpy arrays; the lists are made once, outside the timing);
* ``msgpack_numpy``: the fair comparison for equal input and output: numpy arrays are turned
  into lists for ``packb`` and back into arrays after ``unpackb``, inside the timing;
* ``pickle``: ``loads(dumps(data))`` of the Data itself (highest protocol).

All run in the same process, interleaved, ``--repeats`` rounds: each case's median and best
round are reported, and each ratio to msgpack is taken within a round (the median of those
ratios and their range): absolute times swing a lot on a shared machine, the ratios much less.
The load average is recorded before and after.

The compiled decoder keeps a bounded cache of short ASCII strings (docs/serialization.md):
the paper object sends the same 40 strings every cycle, so its strings come from that cache.
``*_fresh`` cases show the other end: ``fresh_objects`` paper objects whose strings all
differ (more distinct strings than the cache holds), taken in turn, through rda and through
msgpack over lists, so every string the compiled decoder meets is a miss.

Also times a 1 MiB float64 array encode + decode; decode is a zero-copy view, so it should
cost microseconds, not a memcpy per MiB.

Usage: ``python benchmarks/serialization.py [--cycles N] [--repeats R]``; prints JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from rda.serialization import Data, binary
from rda.serialization.binary import Codec

PAPER_CPP_US = 4.22
PAPER_MSGPACK_US = 13.42


def paper_object(tag: str = "") -> Data:
    return Data(
        a=np.arange(40, dtype=np.int32) * 1000,
        b=np.linspace(0.0, 1.0, 40),
        c=[f"element{tag}_{i:02d}" for i in range(40)],
    )


def as_lists(data: Data) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else list(v)) for k, v in data.items()}


def best_ns(fn: Callable[[], Any], cycles: int) -> int:
    """Nanoseconds for ``cycles`` calls of ``fn`` (one timed run)."""
    start = time.perf_counter_ns()
    for _ in range(cycles):
        fn()
    return time.perf_counter_ns() - start


def codecs() -> list[Codec]:
    """Both implementations of the binary codec, compiled first; only pure when not built."""
    return [c for c in (binary.COMPILED, binary.PYTHON) if c is not None]


# One closure per case, over the codec's functions bound once (no attribute look-up per cycle).
def _round_trip(codec: Codec, data: Data) -> Callable[[], Any]:
    enc, dec = codec.encode, codec.decode
    return lambda: dec(enc(data))


def _encode_only(codec: Codec, data: Data) -> Callable[[], Any]:
    enc = codec.encode
    return lambda: enc(data)


def _decode_only(codec: Codec, raw: bytes) -> Callable[[], Any]:
    dec = codec.decode
    return lambda: dec(raw)


def _fresh_round_trip(codec: Codec, objects: list[Data]) -> Callable[[], Any]:
    enc, dec, nxt = codec.encode, codec.decode, itertools.cycle(objects).__next__
    return lambda: dec(enc(nxt()))


def _fresh_decode_only(codec: Codec, raws: list[bytes]) -> Callable[[], Any]:
    dec, nxt = codec.decode, itertools.cycle(raws).__next__
    return lambda: dec(nxt())


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh-objects", type=int, default=128)
    args = parser.parse_args()
    cycles, repeats = args.cycles, args.repeats
    load_before = os.getloadavg()

    data = paper_object()
    lists = as_lists(data)
    fresh = [paper_object(f"_{n:04d}") for n in range(args.fresh_objects)]
    fresh_lists = [as_lists(d) for d in fresh]
    fresh_packed = [msgpack.packb(x) for x in fresh_lists]
    fresh_raw = [binary.PYTHON.encode(d) for d in fresh]
    packb, unpackb = msgpack.packb, msgpack.unpackb
    dumps, loads = pickle.dumps, pickle.loads
    proto = pickle.HIGHEST_PROTOCOL
    raw = binary.PYTHON.encode(data)

    def msgpack_lists() -> Any:
        return unpackb(packb(lists))

    def msgpack_numpy() -> Any:
        out = unpackb(packb({"a": data["a"].tolist(), "b": data["b"].tolist(), "c": data["c"]}))
        return np.array(out["a"], np.int32), np.array(out["b"], np.float64), out["c"]

    def pickle_cycle() -> Any:
        return loads(dumps(data, proto))

    next_lists = itertools.cycle(fresh_lists).__next__
    next_packed = itertools.cycle(fresh_packed).__next__

    def msgpack_lists_fresh() -> Any:
        return unpackb(packb(next_lists()))

    def msgpack_lists_fresh_decode_only() -> Any:
        return unpackb(next_packed())

    cases: dict[str, Callable[[], Any]] = {}
    for codec in codecs():
        # same bytes, same Data, both ways
        assert codec.encode(data) == raw and codec.decode(raw) == data
        cases[f"rda_{codec.name}"] = _round_trip(codec, data)
        cases[f"rda_{codec.name}_encode_only"] = _encode_only(codec, data)
        cases[f"rda_{codec.name}_decode_only"] = _decode_only(codec, raw)
        assert [codec.decode(r) for r in fresh_raw] == fresh
        cases[f"rda_{codec.name}_fresh"] = _fresh_round_trip(codec, fresh)
        cases[f"rda_{codec.name}_fresh_decode_only"] = _fresh_decode_only(codec, fresh_raw)
    cases.update(
        msgpack_lists=msgpack_lists,
        msgpack_numpy=msgpack_numpy,
        pickle=pickle_cycle,
        msgpack_lists_fresh=msgpack_lists_fresh,
        msgpack_lists_fresh_decode_only=msgpack_lists_fresh_decode_only,
    )
    rounds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():  # interleaved, so load drift hits every case alike
            fn()
            rounds[name].append(best_ns(fn, cycles) / cycles / 1000)
    us = {name: _median(r) for name, r in rounds.items()}
    best = {name: min(r) for name, r in rounds.items()}

    def ratio(case: str, baseline: str) -> dict[str, Any]:
        """``case`` over ``baseline``, round by round (both timed in the same round)."""
        per_round = [a / b for a, b in zip(rounds[case], rounds[baseline], strict=True)]
        return {
            "median": round(_median(per_round), 3),
            "min": round(min(per_round), 3),
            "max": round(max(per_round), 3),
            "rounds": [round(x, 3) for x in per_round],
        }

    per_impl: dict[str, Any] = {}
    for codec in codecs():
        name = f"rda_{codec.name}"
        cycle = us[name]
        to_lists = ratio(name, "msgpack_lists")
        per_impl[codec.name] = {
            "cycle_us": round(cycle, 3),
            "encode_us": round(us[f"{name}_encode_only"], 3),
            "decode_us": round(us[f"{name}_decode_only"], 3),
            "ratio_to_msgpack_lists": to_lists["median"],
            "ratio_to_msgpack_lists_rounds": to_lists,
            "ratio_to_msgpack_numpy": ratio(name, "msgpack_numpy")["median"],
            "ratio_to_pickle": ratio(name, "pickle")["median"],
            "fresh_strings": {
                "cycle_us": round(us[f"{name}_fresh"], 3),
                "decode_us": round(us[f"{name}_fresh_decode_only"], 3),
                "ratio_to_msgpack_lists": ratio(f"{name}_fresh", "msgpack_lists_fresh"),
                "decode_ratio_to_msgpack_unpackb": ratio(
                    f"{name}_fresh_decode_only", "msgpack_lists_fresh_decode_only"
                ),
            },
            "meets_4_22_us": cycle < PAPER_CPP_US,
            "meets_0_3_msgpack_lists": to_lists["median"] <= 0.3,
            "meets_half_msgpack_lists": to_lists["median"] <= 0.5,
            "meets_half_msgpack_numpy": cycle <= 0.5 * us["msgpack_numpy"],
            "float64_1mib": big_array(codec, cycles, repeats),
        }
    if "compiled" in per_impl and "python" in per_impl:
        per_impl["speedup_compiled_over_python"] = round(us["rda_python"] / us["rda_compiled"], 2)

    report = {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cycles": cycles,
        "repeats": repeats,
        "fresh_objects": args.fresh_objects,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "implementation_in_use": binary.implementation,
        "paper_object": {
            "us_per_cycle": {k: round(v, 3) for k, v in us.items()},
            "us_per_cycle_best": {k: round(v, 3) for k, v in best.items()},
            "us_per_cycle_rounds": {k: [round(x, 3) for x in r] for k, r in rounds.items()},
            "bytes": {
                "rda": len(raw),
                "msgpack": len(packb(lists)),
                "pickle": len(dumps(data, proto)),
            },
            "target_us": PAPER_CPP_US,
            "paper_us": {"cmw_cpp": PAPER_CPP_US, "msgpack_cpp": PAPER_MSGPACK_US},
        },
        "implementations": per_impl,
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


def big_array(codec: Codec, cycles: int, repeats: int) -> dict[str, Any]:
    """Encode + decode of a 1 MiB float64 array: decode is a zero-copy view, not a memcpy."""
    big = np.random.default_rng(0).random(131072)  # 1 MiB of float64
    big_data = Data(x=big)
    big_raw = codec.encode(big_data)
    big_out = codec.decode(big_raw)["x"]
    zero_copy = bool(np.shares_memory(big_out, np.frombuffer(big_raw, np.uint8)))
    assert np.array_equal(big_out, big)
    big_cycles = max(50, cycles // 200)
    enc_ns = dec_ns = 10**18
    for _ in range(repeats):
        enc_ns = min(enc_ns, best_ns(lambda: codec.encode(big_data), big_cycles))
        dec_ns = min(dec_ns, best_ns(lambda: codec.decode(big_raw), big_cycles))
    enc_us, dec_us = enc_ns / big_cycles / 1000, dec_ns / big_cycles / 1000
    mib = big.nbytes
    return {
        "bytes": len(big_raw),
        "encode_us": round(enc_us, 2),
        "decode_us": round(dec_us, 2),
        "encode_gb_per_s": round(mib / enc_us / 1000, 2),
        "decode_gb_per_s": round(mib / dec_us / 1000, 2),
        "decode_zero_copy": zero_copy,
    }


if __name__ == "__main__":
    main()
