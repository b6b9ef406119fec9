"""Authorization check benchmark: what the RBAC policy costs per request (issue 10: < 5 us
with a 50-rule policy).

The server's dispatcher calls ``Authorizer.allowed(principal, device, property, operation)``
once per get/set/subscribe/admin request. Measured here, with a 50-rule policy (globs of every
kind: literal, ``*``, ``?``, character classes, on devices, properties and operations):

* ``allowed_hit``: the steady state, a working set of 600 (principal, access point, operation)
  keys requested round-robin, every one already decided once (one dict lookup each);
* ``allowed_miss``: a new key each time (the cache cleared before each round): the compiled
  rules scanned, plus the cache insert;
* ``decide_worst``: the uncached scan for a principal whose roles reach all 50 rules, for a
  request no rule matches (every rule's matchers run, then the default deny);
* baselines in the same run: a bare dict lookup of a 4-tuple key (the floor of any cache), and
  one raw pyzmq inproc PAIR send + recv of a 64-byte frame (the cheapest hop a request takes
  anyway).

Wall-clock figures swing a lot on a shared machine: best of ``--repeats`` interleaved runs, and
structural counts (Python function calls per check, from cProfile) that do not depend on load.

Usage: ``python benchmarks/policy.py [--cycles N] [--repeats R]``; prints JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq

from rda.business.policy import Authorizer, Policy

TARGET_US = 5.0
OPERATIONS = ("get", "set", "subscribe")


def fifty_rule_policy() -> Policy:
    """50 rules over 5 roles; principal ``p{i}`` has role ``r{i % 5}``, ``root`` has all."""
    roles = [f"r{i}" for i in range(5)]
    rules: list[dict[str, str]] = []
    for i in range(48):
        role = roles[i % 5]
        kind = i % 4
        if kind == 0:
            rule = {"device": f"DEV{i:02d}", "property": "Acquisition", "operation": "get"}
        elif kind == 1:
            rule = {"device": f"PS{i % 10}*", "property": "Set?ing", "operation": "[gs]et"}
        elif kind == 2:
            rule = {"device": f"MAG[{i % 10}-9]*", "property": "*", "operation": "subscribe"}
        else:
            rule = {"device": "*", "property": f"Status{i}", "operation": "*"}
        rules.append({"role": role, **rule, "effect": "deny" if i % 7 == 0 else "allow"})
    rules.append({"role": "r0", "operation": "admin:*", "effect": "allow"})
    rules.append({"role": "*", "operation": "admin:ping", "effect": "allow"})
    principals = {f"p{i}": [roles[i % 5]] for i in range(20)}
    principals["root"] = roles
    return Policy.from_dict({"roles": roles, "principals": principals, "rules": rules})


def working_set() -> list[tuple[str, str, str, str]]:
    keys = []
    for i in range(600):
        device = ("DEV", "PS", "MAG", "BPM")[i % 4] + f"{i % 37:02d}"
        prop = ("Acquisition", "Setting", "Status3", "Other")[i % 4]
        keys.append((f"p{i % 20}", device, prop, OPERATIONS[i % 3]))
    return keys


def best_ns(fn: Callable[[], Any], repeats: int) -> int:
    best = 10**18
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - start)
    return best


def calls_per_check(fn: Callable[[], Any], checks: int) -> float:
    profile = cProfile.Profile()
    profile.runcall(fn)
    stats = pstats.Stats(profile)
    total: int = stats.total_calls  # type: ignore[attr-defined]
    return round((total - 1) / checks, 2)  # minus the runcall'd function itself


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=100, help="passes over the working set")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cycles, repeats = args.cycles, args.repeats

    policy = fifty_rule_policy()
    assert len(policy.rules) == 50
    authorizer = Authorizer(policy)
    keys = working_set()
    allowed = authorizer.allowed
    decided = [allowed(*key) for key in keys]  # warm the cache; also the decisions' spread
    n = len(keys) * cycles

    def hits(passes: int) -> None:
        for _ in range(passes):
            for key in keys:
                allowed(*key)

    def misses(passes: int) -> None:
        for _ in range(passes):
            authorizer._decisions.clear()
            for key in keys:
                allowed(*key)

    worst_key = ("root", "NOWHERE", "Nothing", "get")
    assert authorizer.decide(*worst_key) == (False, None)
    decide = authorizer.decide

    def worst() -> None:
        for _ in range(n // 10):
            decide(*worst_key)

    table = {key: True for key in keys}

    def dict_floor() -> None:
        get = table.get
        for _ in range(cycles):
            for key in keys:
                get(key)

    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://policy-bench")
    b.connect("inproc://policy-bench")
    frame = b"x" * 64
    zmq_rounds = max(1000, n // 20)

    def pyzmq_hop() -> None:
        send, recv = a.send, b.recv
        for _ in range(zmq_rounds):
            send(frame)
            recv()

    try:
        cases: dict[str, tuple[Callable[[], None], int]] = {
            "allowed_hit": (lambda: hits(cycles), n),
            "allowed_miss": (lambda: misses(cycles), n),
            "decide_worst": (worst, n // 10),
            "dict_lookup_floor": (dict_floor, n),
            "pyzmq_inproc_send_recv": (pyzmq_hop, zmq_rounds),
        }
        best: dict[str, int] = {}
        for _ in range(repeats):  # interleaved, so load drift hits every case alike
            for name, (fn, _count) in cases.items():
                best[name] = min(best.get(name, 10**18), best_ns(fn, 1))
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
    us = {name: best[name] / count / 1000 for name, (_fn, count) in cases.items()}

    report = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "rules": len(policy.rules),
        "working_set": len(keys),
        "allowed_fraction": round(sum(decided) / len(decided), 3),
        "passes": cycles,
        "repeats": repeats,
        "us_per_check": {k: round(v, 4) for k, v in us.items()},
        "python_calls_per_check": {
            # one pass profiled: the calls per check do not depend on the pass count
            "allowed_hit": calls_per_check(lambda: hits(1), len(keys)),
            "allowed_miss": calls_per_check(lambda: misses(1), len(keys)),
        },
        "ratio_hit_to_dict_floor": round(us["allowed_hit"] / us["dict_lookup_floor"], 2),
        "ratio_hit_to_pyzmq_hop": round(us["allowed_hit"] / us["pyzmq_inproc_send_recv"], 3),
        "target_us": TARGET_US,
        "meets_target_hit": us["allowed_hit"] < TARGET_US,
        "meets_target_miss": us["allowed_miss"] < TARGET_US,
        "meets_target_worst": us["decide_worst"] < TARGET_US,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
