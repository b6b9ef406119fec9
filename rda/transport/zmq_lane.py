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

Waiting: the caller sleeps in libzmq's blocking receive, waking every ``WAIT_SLICE`` seconds
(only while a reply is overdue) to ask ``ended()`` whether its owner ended the request
(deadline, disconnection, close). Nothing else can interrupt it: no other thread may touch
the socket.
"""

from __future__ import annotations

import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from rda.serialization._message import Message
from rda.serialization.errors import DecodeError, ProtocolError, TransportError
from rda.transport import _zmq_common as common
from rda.transport._curve import ClientCurve, apply_client
from rda.transport._ratelog import RateLimitedLog
from rda.transport.api import Buffer, TransportSettings
from rda.transport.protocol import ConnectAck, Incoming, Reconnect, decode_frames, encode_connect

__all__ = ["WAIT_SLICE", "Lane", "Lanes"]

log = logging.getLogger("rda.transport.lane")
# Shared by every lane of the process: what a server sends is logged once per kind per second.
_peer_log = RateLimitedLog(log)

# How often a waiting caller checks whether its request was ended by someone else. A reply
# that comes in time never waits for it; a deadline or a disconnection is noticed this late.
WAIT_SLICE = 0.05
# A server forgets a silent lane after its heartbeat timeout: a lane idle for this share of it
# introduces itself again (a CONNECT just before the request, so no extra round trip).
_REFRESH_SHARE = 0.5


class Lane:
    """One thread's connection to one server; only that thread calls :meth:`call`."""

    __slots__ = (
        "_lock",
        "_orphaned",
        "_sock",
        "address",
        "bytes_in",
        "bytes_out",
        "connection",
        "decode_errors",
        "hello",
        "last_used",
        "max_size",
        "messages_in",
        "messages_out",
        "refresh_after",
        "stale",
        "thread",
    )

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        address: str,
        connection: int,
        refresh_after: float,
        hello: Sequence[Buffer],
        max_size: int,
    ) -> None:
        self._sock: zmq.Socket[bytes] | None = sock
        # Held by the owner for a whole call, and by whoever closes the socket.
        self._lock = threading.Lock()
        # Set by a close that found the lane in use: the owner closes it on its way out.
        self._orphaned = False
        self.address = address
        self.connection = connection  # the shared connection this lane was opened under
        self.thread = weakref.ref(threading.current_thread())
        self.refresh_after = refresh_after
        self.hello = hello  # our CONNECT
        self.max_size = max_size
        self.last_used = -float("inf")  # forces the first call's CONNECT
        # Written by the owner thread only; summed into the transport's statistics.
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        self.decode_errors = 0
        self.stale = 0  # replies to earlier, abandoned requests, read and dropped

    @property
    def closed(self) -> bool:
        return self._sock is None

    def call(
        self,
        frames: Sequence[Buffer],
        request_id: int,
        ended: Callable[[], bool],
        now: float,
    ) -> Message | None:
        """Send one request and wait on this thread for its reply.

        Returns None when ``ended()`` became true first (the owner decided the request's fate)
        and raises ``TransportError`` when the lane is closed or the send fails; the caller
        then fails the request as it would a lost connection.
        """
        with self._lock:
            sock = self._sock
            if sock is None:
                raise TransportError(f"the lane to {self.address} is closed")
            try:
                if now - self.last_used > self.refresh_after:
                    # New, or possibly forgotten by the server: introduce ourselves again.
                    common.send_frames(sock, self.hello, block=True)
                    self.messages_out += 1
                common.send_frames(sock, frames, block=True)
            except zmq.ZMQError as exc:
                raise TransportError(f"sending to {self.address} failed: {exc}") from exc
            self.messages_out += 1
            self.bytes_out += sum(map(len, frames))
            self.last_used = now
            try:
                return self._wait(sock, request_id, ended, self.max_size)
            finally:
                if self._orphaned:
                    common.close_socket(sock)
                    self._sock = None

    def _wait(
        self,
        sock: zmq.Socket[bytes],
        request_id: int,
        ended: Callable[[], bool],
        max_size: int,
    ) -> Message | None:
        while True:
            try:
                frames = common.recv_copied(sock, 0)  # waits up to RCVTIMEO
            except zmq.ZMQError as exc:
                raise TransportError(f"receiving from {self.address} failed: {exc}") from exc
            if frames is None:
                if ended():
                    return None
                continue
            self.messages_in += 1
            self.bytes_in += sum(map(len, frames))
            try:
                event = decode_frames(frames, from_server=True, max_size=max_size)
            except (DecodeError, ProtocolError) as exc:
                self.decode_errors += 1
                _peer_log.log(
                    "bad messages", "dropped a bad message from %s: %s", self.address, exc
                )
                continue
            if type(event) is Incoming:
                message = event.message
                if message.header.id == request_id:
                    return message
                self.stale += 1
            elif type(event) is ConnectAck and "error" in event.info:
                raise TransportError(f"{self.address} refused the lane: {event.info['error']}")
            elif type(event) is Reconnect:
                self.last_used = -float("inf")  # forgotten: the next call introduces itself
            # A CONNECT_ACK or a heartbeat: nothing to do.

    def close(self, timeout: float) -> bool:
        """Close the socket once no call uses it (any thread); False if it stayed in use."""
        if not self._lock.acquire(timeout=timeout):
            self._orphaned = True
            return False
        try:
            if self._sock is not None:
                common.close_socket(self._sock)
                self._sock = None
        finally:
            self._lock.release()
        return True


class Lanes:
    """Every lane of one client transport: made on demand per (thread, server), counted,
    pruned when their thread has ended, and closed with the transport."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        settings: TransportSettings,
        info: dict[str, Any],
        curve: ClientCurve | None,
        limit: int = 64,
    ) -> None:
        self._context = context
        self._settings = settings
        self._hello = encode_connect({**info, "lane": True})
        self._curve = curve
        self._limit = limit
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Lane] = []
        self._closed = False
        # Counts of lanes already closed, so statistics never go backwards.
        self._retired = [0, 0, 0, 0, 0, 0]

    def of_thread(self, address: str, connection: int, refresh_after: float) -> Lane | None:
        """The calling thread's lane to ``address`` under the shared ``connection``; None
        when there can be none (transport closing, too many lanes, socket refused)."""
        mine: dict[str, Lane] | None = getattr(self._local, "lanes", None)
        if mine is None:
            mine = self._local.lanes = {}
        lane = mine.get(address)
        if lane is not None and lane.connection == connection and not lane.closed:
            return lane
        if lane is not None:
            # The shared connection was replaced (server restarted, moved): so is the lane.
            del mine[address]
            self._retire(lane)
        lane = self._open(address, connection, refresh_after)
        if lane is not None:
            mine[address] = lane
        return lane

    def _open(self, address: str, connection: int, refresh_after: float) -> Lane | None:
        with self._lock:
            if self._closed:
                return None
            self._prune_locked()
            if len(self._all) >= self._limit:
                return None
            try:
                sock = self._socket(address)
            except (zmq.ZMQError, TransportError) as exc:
                log.debug("no lane to %s: %s", address, exc)
                return None
            lane = Lane(
                sock,
                address,
                connection,
                refresh_after,
                self._hello,
                self._settings.max_message_size,
            )
            self._all.append(lane)
            return lane

    def _socket(self, address: str) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, -1)  # a lost lane is replaced, not repaired
            sock.setsockopt(zmq.ROUTING_ID, b"l" + uuid.uuid4().bytes)
            sock.setsockopt(zmq.MAXMSGSIZE, self._settings.max_message_size)
            sock.setsockopt(zmq.RCVTIMEO, int(WAIT_SLICE * 1000))
            sock.setsockopt(zmq.SNDTIMEO, int(WAIT_SLICE * 1000))
            if self._curve is not None:
                apply_client(sock, self._curve, address)
            sock.connect(address)
        except BaseException:
            common.close_socket(sock)
            raise
        return sock

    def _prune_locked(self) -> None:
        """Close the lanes of threads that have ended (their sockets are idle for good)."""
        dead = [lane for lane in self._all if lane.thread() is None or not _alive(lane)]
        for lane in dead:
            self._all.remove(lane)
            self._count_retired(lane)
            lane.close(0.0)

    def _retire(self, lane: Lane) -> None:
        with self._lock:
            if lane in self._all:
                self._all.remove(lane)
                self._count_retired(lane)
        lane.close(0.0)  # the owner (this thread) is not in a call: the lock is free

    def _count_retired(self, lane: Lane) -> None:
        for i, value in enumerate(_counts(lane)):
            self._retired[i] += value

    def counts(self) -> tuple[int, list[int]]:
        """(open lanes, [messages in, out, bytes in, out, decode errors, stale replies])."""
        with self._lock:
            totals = list(self._retired)
            for lane in self._all:
                for i, value in enumerate(_counts(lane)):
                    totals[i] += value
            return len(self._all), totals

    def close(self, timeout: float) -> None:
        """Close every lane; a caller still waiting gives its socket up within WAIT_SLICE."""
        with self._lock:
            self._closed = True
            lanes, self._all = self._all, []
        for lane in lanes:
            if not lane.close(timeout):
                log.warning("a lane to %s was still in use at close", lane.address)


def _alive(lane: Lane) -> bool:
    thread = lane.thread()
    return thread is not None and thread.is_alive()


def _counts(lane: Lane) -> tuple[int, int, int, int, int, int]:
    return (
        lane.messages_in,
        lane.messages_out,
        lane.bytes_in,
        lane.bytes_out,
        lane.decode_errors,
        lane.stale,
    )
