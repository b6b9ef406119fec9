"""Blocking gets and sets on the calling thread's own lane (``rda.transport.zmq_lane``).

:class:`LaneCaller` is held by a ``ClientService``. A blocking ``get``/``set`` whose thread
may take its lane sends and receives there itself, with no hand-off to the dispatcher: the
structure of a raw pyzmq round trip (issue 11; counts in docs/client.md). Everything else a
request has stays as on the shared connection: its entry in the request table (requests.py),
failure when the shared connection to its server is lost or the client closes (the table ends
the request by completing its ``LaneCompletion``), and its deadline, on the client's clock. The
caller, waiting in its lane, wakes every ``WAIT_SLICE`` while its reply is overdue: it looks at
the completion and ends the request itself once its deadline has passed (no timer entry, which
cost two lock round trips per call).

When a call takes the lane (``Config.direct_calls``, on by default):

* the transport offers a lane (``ClientTransport.lane``) and the shared connection to the
  server is established (handshake done): a lane never has to discover a dead or refusing
  server on its own;
* no request sent through the shared connection is still waiting for its reply. A request
  on the lane could overtake one of those, and a client's requests to a device are answered
  in the order it sent them (a server runs one device's requests in FIFO order): an ``ap.set``
  right after an ``ap.get_async`` must not be served first. The call then takes the shared
  connection and queues behind them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rda.business.client.connections import Connections
from rda.business.client.replies import LaneCompletion, Pending, op_name
from rda.business.client.requests import RequestTable
from rda.serialization.errors import RdaError, TransportError
from rda.serialization.header import RequestType
from rda.serialization.message import BodyKind, Buffer, Message
from rda.transport.api import ClientTransport, DirectLane, Waker
from rda.transport.protocol import Kind, encode_routed

__all__ = ["NO_LANE", "LaneCaller"]

# ``LaneCaller.call``'s answer when the call cannot take a lane (then it goes the shared way).
NO_LANE: Any = object()
_LANE_OPS = frozenset({RequestType.GET, RequestType.SET})
# Enum members read once: each ``RequestType.X`` (``BodyKind.X``, ``Kind.X``) read goes through
# the enum class's ``__getattr__`` hook on Python 3.11, ten times a module global's cost.
_REQUEST = Kind.REQUEST


class LaneCaller:
    """The lane side of a client service (see the module docstring).

    ``enabled``: ``Config.direct_calls``; a call takes a lane only when the transport offers
    one for the connection (``ClientTransport.lane``).
    """

    def __init__(
        self,
        transport: ClientTransport,
        requests: RequestTable,
        connections: Connections,
        clock: Callable[[], float],
        enabled: bool,
    ) -> None:
        self._requests = requests
        self._endpoint_at = connections.get
        self._clock = clock
        # The transport's lanes, and its deferred wake-up (ZmqClientTransport.wake_later: a
        # blocking caller woken by the dispatcher right before it polls again), reached here
        # and nowhere else in the client.
        self._lane_of: Callable[[int], DirectLane | None] = transport.lane
        self.wake_later: Callable[[Waker], None] = transport.wake_later
        self.enabled = enabled

    def call(
        self,
        op: RequestType,
        endpoint: str,
        device: str,
        prop: str,
        selector: str,
        body: list[tuple[BodyKind, Buffer]],
        timeout: float,
        convert: Callable[[Message], Any],
    ) -> Any:
        """``convert(reply)`` of a request made on this thread's lane, or NO_LANE."""
        requests = self._requests
        if op not in _LANE_OPS or requests.shared_waiting() or requests.closed:
            return NO_LANE
        ep = self._endpoint_at(endpoint)  # a dict read under the GIL; no lock needed
        if ep is None or not ep.acked:
            return NO_LANE
        conn = ep.connection
        lane = None if conn is None else self._lane_of(conn)
        if lane is None or conn is None:
            return NO_LANE
        done = LaneCompletion()
        now = self._clock()
        rid = requests.add_lane(Pending(done, conn, op_name(op), device, prop, timeout, now))
        if not rid:
            return self._outcome(done, convert)  # closed meanwhile
        # No entry on the timer (two lock round trips per call): the caller, waking every
        # WAIT_SLICE while its reply is overdue, ends the request itself at its deadline.
        deadline = now + timeout
        clock = self._clock

        def ended() -> bool:
            if done.outcome is None and clock() >= deadline:
                requests.expire(rid)
            return done.outcome is not None

        if ep.connection != conn:
            # Lost between the check and the registration: the scan that ends the requests
            # of a lost connection may have missed our entry.
            requests.disconnected(rid, ep.address, ep.last_reason or "connection lost")
        else:
            frames = encode_routed(_REQUEST, op, rid, device, prop, selector, body)
            try:
                message = lane.call(frames, rid, ended, now)
            except TransportError as exc:
                requests.disconnected(rid, ep.address, str(exc))
            else:
                if message is not None:
                    return convert(requests.lane_reply(rid, message, done))
        return self._outcome(done, convert)

    @staticmethod
    def _outcome(done: LaneCompletion, convert: Callable[[Message], Any]) -> Any:
        outcome = done.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:  # cannot happen: every path above ended the request
            raise RdaError("internal error: a lane request ended without an outcome")
        return convert(outcome)
