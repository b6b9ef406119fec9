"""What property metadata costs on the message path (issue 33), without a network.

Four figures, CPU time (``time.process_time``), best of 15 repeats:

* ``notify_plain_ns``: ``SubscriptionSource.notify`` of a two-field value to one active
  subscriber on a transport that only counts (no metadata declared: must equal the baseline);
* ``notify_declared_ns`` / ``notify_alarmed_ns``: the same with alarm limits declared, the
  value within them / in a MAJOR alarm (only on a checkout that has metadata);
* ``get_result_ns``: the client's conversion of a decoded get REPLY to ``AcquiredData``;
* ``acquired_ns``: ``AcquiredData(data)``, what every documented get handler builds.

Prints one JSON object; run it from each of two checkouts in turns and compare medians:

    PYTHONPATH=. python benchmarks/figures/2026-11-28/issue33_metadata_cost.py
"""

from __future__ import annotations

import importlib.util
import json
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any

from rda.business.client.replies import get_result
from rda.business.common import AcquiredData
from rda.business.server.requests import ClientInfo
from rda.business.server.subscriptions import SubscriptionSource
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import DataContext, RequestType, encode_context
from rda.serialization.message import BodyKind
from rda.transport.protocol import Incoming, Kind, decode_frames, encode_routed

N = 20000


class CountingTransport:
    published = 0

    def wait_for_room(self) -> None:
        pass

    def publish(self, targets: Sequence[Any], tail: Sequence[Any], conflate: bool) -> None:
        CountingTransport.published += 1


def best_ns(fn: Callable[[], object]) -> float:
    return min(timeit.repeat(fn, number=N, repeat=15, timer=time.process_time)) / N * 1e9


def source(alarm: Any = None) -> SubscriptionSource:
    s = SubscriptionSource(
        "PS1",
        "Setting",
        "",
        None,
        ("PS1", "Setting", "", b""),
        CountingTransport(),  # type: ignore[arg-type]
    )
    s.add_subscriber(b"p", 1, ClientInfo(b"p"))
    s.send_first(b"p", 1, None, RuntimeError("first"))
    if alarm is not None:
        s.alarm = alarm
    return s


def main() -> None:
    figures: dict[str, float] = {}
    plain = source()
    value = Data(current=1.5, mode="DC")
    figures["notify_plain_ns"] = best_ns(lambda: plain.notify(value))
    if importlib.util.find_spec("rda.business.server.properties") is not None:
        import rda
        from rda.business.server.properties import PropertyTable

        field = rda.Field(units="A", warning=(-8, 8), alarm=(-9, 9))
        declared = {
            ("PS1", "Setting"): rda.PropertyDescription("PS1", "Setting", {"current": field})
        }
        table = PropertyTable({}, declared, True)
        watched = source(table.encoder("PS1", "Setting"))
        high = Data(current=9.5, mode="DC")
        figures["notify_declared_ns"] = best_ns(lambda: watched.notify(value))
        figures["notify_alarmed_ns"] = best_ns(lambda: watched.notify(high))
    body = [
        (BodyKind.DATA, binary.encode(value)),
        (BodyKind.DATA_CONTEXT, encode_context(DataContext(acq_stamp=5))),
    ]
    frames = [
        bytes(f) for f in encode_routed(Kind.REPLY, RequestType.REPLY, 7, "PS1", "S", "", body)
    ]
    event = decode_frames(list(frames), from_server=True)
    assert isinstance(event, Incoming)
    message = event.message
    get_result(message)  # decodes and caches the body: what follows is the conversion alone
    figures["get_result_ns"] = best_ns(lambda: get_result(message))
    figures["acquired_ns"] = best_ns(lambda: AcquiredData(value))
    print(json.dumps({k: round(v) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
