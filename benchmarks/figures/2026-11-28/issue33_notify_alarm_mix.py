"""The alarm's cost per notification with the panel benchmark's values (issue 33), no network.

``SubscriptionSource.notify`` to one active subscriber on a transport that only counts, of the
values ``benchmarks/panel.py --part notify`` publishes (``value = sin(i / 100)`` with warning
limits +-0.9 and alarm limits +-0.99, precision 3: about 20 % of the values MINOR, 9 % MAJOR),
the property declared with those fields ("on") or with none ("off"). CPU time
(``time.process_time``) per notification in ns, seven runs of 20 000 each arm, in turns;
prints the sorted runs as JSON. Run it from each of two checkouts in turns:

    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue33_notify_alarm_mix.py
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

import rda
from rda.business.common import AcquiredData
from rda.business.server.properties import PropertyTable
from rda.business.server.requests import ClientInfo
from rda.business.server.subscriptions import AlarmRule, SubscriptionSource
from rda.serialization.data import Data
from rda.serialization.header import DataContext

N = 20000


class CountingTransport:
    published = 0

    def wait_for_room(self) -> None:
        pass

    def publish(self, targets: Sequence[Any], tail: Sequence[Any], conflate: bool) -> None:
        CountingTransport.published += 1


def source(alarm: AlarmRule | None) -> SubscriptionSource:
    s = SubscriptionSource(
        "FAST",
        "Value",
        "",
        None,
        ("FAST", "Value", "", b""),
        CountingTransport(),  # type: ignore[arg-type]
    )
    s.add_subscriber(b"p", 1, ClientInfo(b"p"))
    s.send_first(b"p", 1, None, RuntimeError("first"))
    s.alarm = alarm
    return s


def main() -> None:
    fields = {
        "value": rda.Field(units="A", precision=3, warning=(-0.9, 0.9), alarm=(-0.99, 0.99)),
        "count": rda.Field(description="publication number"),
    }
    declared = {("FAST", "Value"): rda.PropertyDescription("FAST", "Value", fields)}
    table = PropertyTable({}, declared, True)
    now = time.time_ns()
    values = [
        AcquiredData(Data(value=math.sin(i / 100), count=i), DataContext("B", now, now, ""))
        for i in range(N)
    ]

    def run(s: SubscriptionSource) -> float:
        t0 = time.process_time()
        for v in values:
            s.notify(v)
        return (time.process_time() - t0) / N * 1e9

    off, on = source(None), source(table.encoder("FAST", "Value"))
    runs: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(7):
        runs["off"].append(run(off))
        runs["on"].append(run(on))
    print(json.dumps({k: sorted(round(x) for x in v) for k, v in runs.items()}))


if __name__ == "__main__":
    main()
