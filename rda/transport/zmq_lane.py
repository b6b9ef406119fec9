"""Direct lanes: a blocking caller's own DEALER to a server, so its request and reply never
pass through the dispatcher.

Why (issue 11, counted by benchmarks/rpc.py): a blocking ``get`` routed through the client
dispatcher costs the caller's hand-off to the dispatcher, the dispatcher's wake-up for the
request, another for the reply, and the caller's wake-up: two thread wake-ups and about
eleven system calls per get more than raw pyzmq, and half the client's CPU per get. A lane is
what raw pyzmq does: the calling thread sends on its own socket and waits in a blocking
receive on it. Each socket still has exactly one owner (docs/architecture.md): the thread that made
the lane is the only one that sends and receives on it; the transport closes it only while
holding the lane's lock, after its thread died or when the transport closes.

A lane is a session of its own at the server (a CONNECT with ``"lane": True``; the server
does not heartbeat it and lets it expire quietly when idle). What the shared connection does
for the whole client stays there: liveness (a lane is used only while the shared connection
to that server is up, and a lost shared connection fails the lane's call too), reconnection,
subscriptions and every asynchronous request.

The lane's rules (when to introduce itself again, which message is the reply) are
``client_session.LaneSession``'s, the bookkeeping of all lanes ``lanes.LanePool``'s; this
module is the socket. Waiting: the caller sleeps in libzmq's blocking receive, waking every
``WAIT_SLICE`` seconds
(only while a reply is overdue) to ask ``ended()`` whether its owner ended the request
(deadline, disconnection, close). Nothing else can interrupt it: no other thread may touch
the socket. With ``TransportSettings.lane_spin`` (``Config.lane_spin``) the first wait polls
for the reply that long, the GIL released, before it sleeps: a reply that comes meanwhile is
taken without this thread being put to sleep and woken by libzmq's I/O thread.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from rda.serialization.errors import TransportError
from rda.serialization.message import Message
from rda.transport import _zmq_common as common
from rda.transport.api import Buffer, TransportSettings
from rda.transport.client_session import LaneSession
from rda.transport.curve import ClientCurve, apply_client
from rda.transport.lanes import WAIT_SLICE, Lane, LanePool
from rda.transport.protocol import encode_connect
from rda.transport.ratelog import RateLimitedLog

__all__ = ["ZmqLane", "open_lanes"]

log = logging.getLogger("rda.transport.lane")
# Shared by every lane of the process: what a server sends is logged once per kind per second.
_peer_log = RateLimitedLog(log)


class ZmqLane(Lane):
    """One thread's DEALER to one server (see ``lanes.Lane``)."""

    __slots__ = ("_handle", "_sock", "_spin")

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        connection: int,
        session: LaneSession,
        spin: float = 0.0,
    ) -> None:
        super().__init__(connection, session)
        self._sock: zmq.Socket[bytes] | None = sock
        # Read once: every attribute read on a pyzmq Socket goes through its __getattr__ hook.
        self._handle: int = sock.underlying
        # TransportSettings.lane_spin: how long the first wait for a reply polls before
        # sleeping (the direct receive only; through pyzmq the wait just sleeps).
        self._spin = spin

    @property
    def closed(self) -> bool:
        return self._sock is None

    def _send(self, frames: Sequence[Buffer], hello: bool) -> None:
        sock = self._sock
        assert sock is not None  # checked under the lock by call()
        try:
            if hello:
                common.send_frames(sock, self.session.hello, True, self._handle)
            common.send_frames(sock, frames, True, self._handle)
        except zmq.ZMQError as exc:
            raise TransportError(f"sending to {self.session.address} failed: {exc}") from exc

    def _wait(self, request_id: int, ended: Callable[[], bool]) -> Message | None:
        sock = self._sock
        assert sock is not None
        session = self.session
        recv_direct, handle = common.direct_recv, self._handle
        frames: list[Any] | int | None = None
        spin = self._spin  # the first wait only: a reply already overdue is not polled for
        while True:
            # Waits up to RCVTIMEO with the GIL released, the reply's small frames as bytes
            # (_direct_zmq); on an error (an errno) pyzmq receives again and raises its own.
            if recv_direct is not None:
                frames = recv_direct(handle, common.COPY_BELOW, True, spin)
                spin = 0.0
            if recv_direct is None or isinstance(frames, int):
                try:
                    frames = common.recv_copied(sock, 0)  # waits up to RCVTIMEO
                except zmq.ZMQError as exc:
                    address = self.session.address
                    raise TransportError(f"receiving from {address} failed: {exc}") from exc
            if frames is None:
                if ended():
                    return None
                continue
            message = session.received(frames, request_id, _peer_log)
            if message is not None:
                return message

    def _release(self) -> None:
        if self._sock is not None:
            common.close_socket(self._sock)
            self._sock = None


def open_lanes(
    context: zmq.Context[zmq.Socket[bytes]],
    settings: TransportSettings,
    info: dict[str, Any],
    curve: ClientCurve | None,
) -> LanePool:
    """The lane pool of a ZeroMQ client transport: each lane a DEALER of ``context``."""
    hello = encode_connect({**info, "lane": True})
    max_size = settings.max_message_size
    spin = settings.lane_spin

    def open_lane(address: str, connection: int, refresh_after: float) -> ZmqLane | None:
        sock: zmq.Socket[bytes] = context.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, -1)  # a lost lane is replaced, not repaired
            sock.setsockopt(zmq.ROUTING_ID, b"l" + uuid.uuid4().bytes)
            sock.setsockopt(zmq.MAXMSGSIZE, max_size)
            sock.setsockopt(zmq.RCVTIMEO, int(WAIT_SLICE * 1000))
            sock.setsockopt(zmq.SNDTIMEO, int(WAIT_SLICE * 1000))
            if curve is not None:
                apply_client(sock, curve, address)
            sock.connect(address)
        except (zmq.ZMQError, TransportError) as exc:
            common.close_socket(sock)
            log.debug("no lane to %s: %s", address, exc)
            return None
        except BaseException:
            common.close_socket(sock)
            raise
        session = LaneSession(address, hello, refresh_after, max_size)
        return ZmqLane(sock, connection, session, spin)

    return LanePool(open_lane)
