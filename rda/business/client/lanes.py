"""Blocking gets and sets on the calling thread's own lane (``rda.transport.zmq_lane``).

A mixin of :class:`rda.business.client.service.ClientService`. A blocking ``get``/``set`` whose thread
may take its lane sends and receives there itself, with no hand-off to the dispatcher: the
structure of a raw pyzmq round trip (issue 11; counts in docs/client.md). Everything else a
request has stays as on the shared connection: its entry in a pending table, failure when the
shared connection to its server is lost or the client closes (those owners end the request by
completing its ``LaneCompletion``), and its deadline, on the client's clock. The caller,
waiting in its lane, wakes every ``WAIT_SLICE`` while its reply is overdue: it looks at the
completion and ends the request itself once its deadline has passed (no timer entry, which
cost two lock round trips per call).

When a call takes the lane (``Config.direct_calls``, on by default):

* the transport offers lanes (the ZeroMQ one; the in-memory transport does not) and the
  shared connection to the server is established (handshake done): a lane never has to
  discover a dead or refusing server on its own;
* no request sent through the shared connection is still waiting for its reply. A request
  on the lane could overtake one of those, and a client's requests to a device are answered
  in the order it sent them (a server runs one device's requests in FIFO order): an ``ap.set``
  right after an ``ap.get_async`` must not be served first. The call then takes the shared
  connection and queues behind them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rda.business.client.endpoints import Endpoint
from rda.business.client.replies import LaneCompletion, Pending, op_name
from rda.business.client.statistics import ClientCounters
from rda.serialization._header import RequestType
from rda.serialization._message import BodyKind, Buffer, Message
from rda.serialization.errors import RdaError, TransportError
from rda.transport.api import ClientTransport, DirectLane
from rda.transport.protocol import Kind, encode_routed

__all__ = ["NO_LANE", "LaneCalls"]

# ``_lane_call``'s answer when the call cannot take a lane (then it goes the shared way).
NO_LANE: Any = object()
_LANE_OPS = frozenset({RequestType.GET, RequestType.SET})


class LaneCalls:
    """The lane side of a client service (see the module docstring)."""

    _closing: bool
    _transport: ClientTransport
    _counters: ClientCounters
    _clock: Callable[[], float]
    _endpoints: dict[str, Endpoint]
    _pending: dict[int, Pending]
    # Requests on lanes: apart from ``_pending``, whose emptiness says "nothing sent through
    # the shared connections is in flight".
    _lane_pending: dict[int, Pending]
    _ids: Any
    _request_count: Any
    _lanes_on: bool
    _lane_of: Callable[[int], DirectLane | None] | None

    if TYPE_CHECKING:  # provided by ClientService

        def _expire(self, rid: int) -> None: ...

        def _disconnected(self, rid: int, address: str, reason: str) -> None: ...

    def _init_lanes(self, enabled: bool) -> None:
        self._lane_pending = {}
        self._lane_of = getattr(self._transport, "lane", None)
        self._lanes_on = enabled and self._lane_of is not None

    def _lane_call(
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
        if op not in _LANE_OPS or self._pending or self._closing:
            return NO_LANE
        ep = self._endpoints.get(endpoint)  # a dict read under the GIL; no lock needed
        if ep is None or not ep.acked:
            return NO_LANE
        conn = ep.connection
        assert self._lane_of is not None
        lane = None if conn is None else self._lane_of(conn)
        if lane is None or conn is None:
            return NO_LANE
        rid = next(self._ids)
        next(self._request_count)
        done = LaneCompletion()
        now = self._clock()
        self._lane_pending[rid] = Pending(done, conn, op_name(op), device, prop, timeout, now)
        # No entry on the timer (two lock round trips per call): the caller, waking every
        # WAIT_SLICE while its reply is overdue, ends the request itself at its deadline.
        deadline = now + timeout

        def ended() -> bool:
            if done.outcome is None and self._clock() >= deadline:
                self._expire(rid)
            return done.outcome is not None

        if ep.connection != conn or self._closing:
            # Lost or closing between the check and the registration: the scan that fails
            # the requests of a lost connection may have missed our entry.
            self._disconnected(rid, ep.address, ep.last_reason or "connection lost")
        else:
            frames = encode_routed(Kind.REQUEST, op, rid, device, prop, selector, body)
            try:
                message = lane.call(frames, rid, ended, self._clock())
            except TransportError as exc:
                self._disconnected(rid, ep.address, str(exc))
            else:
                if message is not None:
                    return convert(self._lane_reply(rid, message, done))
        return self._lane_outcome(done, convert)

    def _lane_reply(self, rid: int, message: Message, done: LaneCompletion) -> Message:
        p = self._lane_pending.pop(rid, None)
        if p is None:
            # Ended meanwhile (deadline, disconnection, close): that outcome stands.
            self._counters.late_replies += 1
            outcome = done.outcome
            if isinstance(outcome, BaseException):
                raise outcome
            assert outcome is not None
            return outcome
        if message.header.request_type is RequestType.EXCEPTION:
            self._counters.errors += 1
        else:
            self._counters.replies += 1
        self._counters.round_trips.observe(p.op, p.device, self._clock() - p.sent_at)
        return message

    @staticmethod
    def _lane_outcome(done: LaneCompletion, convert: Callable[[Message], Any]) -> Any:
        outcome = done.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:  # cannot happen: every path above ended the request
            raise RdaError("internal error: a lane request ended without an outcome")
        return convert(outcome)

    def _take_pending(self, rid: int) -> Pending | None:
        """Remove request ``rid`` from whichever table holds it."""
        p = self._pending.pop(rid, None)
        if p is None:
            p = self._lane_pending.pop(rid, None)
        return p
