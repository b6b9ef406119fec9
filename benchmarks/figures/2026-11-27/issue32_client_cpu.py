"""The client business layer's CPU per blocking get, without a network (issue 32).

A transport that answers each request inside ``send`` (the shared path: pending table, timer
deadline, the dispatcher's completion, ``ReplyWaiter``) and a lane that answers inside
``call`` (the lane path), both on the calling thread, so that ``time.thread_time_ns`` counts
all of the client's work for a get and none of another process's. ``reply_build_ns`` is what
the fake spends building each reply (part of both other figures). Prints one JSON object;
run it from each of two checkouts in turns and compare medians.

    PYTHONPATH=. python benchmarks/figures/2026-11-27/issue32_client_cpu.py [N]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.serialization import binary
from rda.serialization.data import Data
from rda.serialization.header import (
    DataContext,
    Header,
    HeaderFlags,
    RequestType,
    UpdateType,
    encode_context,
)
from rda.serialization.message import BodyKind, Buffer, Message
from rda.transport.api import ClientHandler, ClientTransportStatistics, TransportSettings
from rda.transport.protocol import Incoming, Kind, decode_frames, encode_message, encode_routed

BODY = [
    (BodyKind.DATA, binary.encode(Data(x=1.0))),
    (BodyKind.DATA_CONTEXT, encode_context(DataContext("", 1, 2), 0)),
]


def reply_to(frames: Sequence[Buffer]) -> Message:
    request = decode_frames(frames, from_server=False)
    assert isinstance(request, Incoming)
    h = request.message.header
    header = Header(RequestType.REPLY, h.id, h.device, h.property, "", UpdateType.NORMAL,
                    HeaderFlags.NONE)  # fmt: skip
    reply = decode_frames(encode_message(Kind.REPLY, header, BODY), from_server=True)
    assert isinstance(reply, Incoming)
    return reply.message


class Lane:
    def call(
        self, frames: Sequence[Buffer], rid: int, ended: Callable[[], bool], now: float
    ) -> Message:
        return reply_to(frames)


class Answering:
    """A ClientTransport that answers in ``send``; with ``lanes``, offers a lane too."""

    def __init__(self, handler: ClientHandler, lanes: bool) -> None:
        self.handler = handler
        self.lanes = lanes
        self.connections = 0

    def lane(self, connection: int) -> Lane | None:
        return Lane() if self.lanes else None

    def wake_later(self, waker: Any) -> None:
        waker.set()

    def start(self) -> None:
        pass

    def connect(self, endpoint: str) -> int:
        self.connections += 1
        return self.connections

    def send(self, connection: int, frames: Sequence[Buffer]) -> None:
        self.handler.on_messages(connection, [reply_to(frames)])  # type: ignore[attr-defined]

    def disconnect(self, connection: int) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass

    def statistics(self) -> ClientTransportStatistics:
        return ClientTransportStatistics()


def per_get(lanes: bool, n: int) -> float:
    made: list[Answering] = []

    def factory(h: ClientHandler, s: TransportSettings, i: dict[str, Any]) -> Any:
        made.append(Answering(h, lanes))
        return made[0]

    client = ClientService(
        StaticDirectory({"*": "tcp://127.0.0.1:1"}),
        Config(request_timeout=5.0),
        transport_factory=factory,
    )
    ap = client.access_point("PS1", "Acquisition")
    ap.get()  # connects
    made[0].handler.on_connected(1, {})  # the CONNECT_ACK: lanes may be taken from now on
    for _ in range(2000):
        ap.get()
    t0 = time.thread_time_ns()
    for _ in range(n):
        ap.get()
    t1 = time.thread_time_ns()
    stats = client.statistics()
    client.close()
    assert stats.replies == n + 2001, stats
    return (t1 - t0) / n


def reply_build(n: int) -> float:
    frames = encode_routed(Kind.REQUEST, RequestType.GET, 1, "PS1", "Acquisition", "", [])
    t0 = time.thread_time_ns()
    for _ in range(n):
        reply_to(frames)
    return (time.thread_time_ns() - t0) / n


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    print(
        json.dumps(
            {
                "shared_ns": per_get(False, n),
                "lane_ns": per_get(True, n),
                "reply_build_ns": reply_build(n),
            }
        )
    )
