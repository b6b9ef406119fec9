"""The server's transport handler: the peer table, and each message to the object that owns it.

:class:`Dispatch` is the transport's ``ServerHandler``. Its ``on_*`` methods run on the
dispatcher thread and only decide who handles what:

- a connection or a departure updates the peer table (who each client is: its
  ``ClientInfo``, with the roles the policy gave it when it connected) and tells the
  subscription lifecycle (rda.business.server.lifecycle: a departed client's subscriptions
  end as if it had unsubscribed);
- a request is first put to the RBAC gate (rda.business.policy ``AccessGate``), from the
  parsed header alone: a denied request is answered and counted here, never reaches the
  scheduler or a handler, and its body is never decoded;
- then a GET, SET or SUBSCRIBE goes to the request runner (rda.business.server.runner: inline
  or on a worker, answered, encoded, sent), an ADMIN to the runner's admin group, an
  UNSUBSCRIBE to the subscription lifecycle; anything else is answered RemoteProtocolError.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rda.business import driver
from rda.business.metadata import DESCRIBE_SELECTOR
from rda.business.policy import AccessGate, Denial
from rda.business.server.lifecycle import SubscriptionLifecycle
from rda.business.server.requests import ClientInfo
from rda.business.server.runner import ADMIN_GROUP, TYPE_NAMES, BoundAdminHandler, RequestRunner
from rda.business.server.statistics import RequestCounters
from rda.serialization.errors import RemoteProtocolError
from rda.serialization.header import Header, RequestType
from rda.serialization.message import Message

__all__ = ["ADMIN_GROUP", "BoundAdminHandler", "Dispatch", "PeerState"]

_REQUESTS = frozenset({RequestType.GET, RequestType.SET, RequestType.SUBSCRIBE})
_CHECKED = _REQUESTS | {RequestType.ADMIN}


@dataclass(slots=True)
class PeerState:
    client: ClientInfo
    connected_since: float
    last_heard: float
    # A client's direct lane (its blocking calls' own connection): a session for requests,
    # not another client, so not listed or counted as one.
    lane: bool = False
    # When it connected on the monotonic clock: ``connected_for`` (``connected_since`` and
    # ``last_heard`` are wall-clock stamps for people, and jump with the wall clock).
    connected_at: float = 0.0


class Dispatch:
    """The transport's handler and the peer table; one per started server (see the module
    docstring). It owns none of the work: the gate, the runner and the lifecycle do."""

    def __init__(
        self,
        *,
        gate: AccessGate,
        runner: RequestRunner,
        subscriptions: SubscriptionLifecycle,
        counters: RequestCounters,
        clock: Callable[[], float],
        trust_declared: bool = False,
    ) -> None:
        self._gate = gate
        self._runner = runner
        self._subscriptions = subscriptions
        self._counters = counters
        self._clock = clock
        self._trust_declared = trust_declared
        self._peers: dict[bytes, PeerState] = {}
        self._peers_lock = threading.Lock()
        # Bound once: called for nearly every message.
        self._start = runner.start

    def peers(self) -> list[tuple[bytes, PeerState]]:
        """The connected clients (lanes left out)."""
        with self._peers_lock:
            return [(peer, state) for peer, state in self._peers.items() if not state.lane]

    def connected(self, peer: bytes) -> bool:
        """Whether ``peer`` (a client's connection or one of its lanes) is connected now."""
        with self._peers_lock:
            return peer in self._peers

    def refresh_roles(self) -> None:
        """After the gate's policy changed: give connected clients their roles under it (a
        request already in flight keeps the ClientInfo it was built with)."""
        with self._peers_lock:
            for state in self._peers.values():
                state.client = self._with_roles(state.client)

    def _with_roles(self, client: ClientInfo) -> ClientInfo:
        roles = self._gate.roles_of(client.principal)
        return client if roles == client.roles else dataclasses.replace(client, roles=roles)

    # -- ServerHandler: the dispatcher thread ------------------------------------------------

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        now = driver.wall_time()
        client = ClientInfo.from_info(peer, client_info, self._trust_declared)
        lane = client_info.get("lane") is True
        state = PeerState(self._with_roles(client), now, now, lane, self._clock())
        with self._peers_lock:
            self._peers[peer] = state
        if not state.lane:
            self._counters.connection(opened=True)
        self._subscriptions.peer_connected(peer)

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        with self._peers_lock:
            state = self._peers.pop(peer, None)
        if state is not None and not state.lane:
            self._counters.connection(opened=False)
        client = state.client if state is not None else ClientInfo(peer)
        self._subscriptions.peer_departed(peer, client)

    def on_message(self, peer: bytes, message: Message) -> None:
        received_at = self._clock()
        state = self._peers.get(peer)
        if state is not None:
            state.last_heard = driver.wall_time()
            client = state.client
        else:
            client = ClientInfo(peer)
        header = message.header
        rtype = header.request_type
        gate = self._gate
        if gate.authorizer is not None and rtype in _CHECKED:
            # From the header alone: a denied request is never queued nor decoded.
            denial = (
                gate.check_admin(client, header.device)
                if rtype is RequestType.ADMIN
                else gate.check(client, TYPE_NAMES[rtype], header.device, header.property)
            )
            if denial is not None:
                self._deny(peer, header, denial, received_at)
                return
        if rtype in _REQUESTS:
            if header.selector == DESCRIBE_SELECTOR and rtype is RequestType.GET:
                self._runner.describe(peer, header, received_at)
            else:
                self._start(message, client, received_at)
        elif rtype is RequestType.ADMIN:
            self._runner.start_admin(peer, message, client, received_at)
        elif rtype is RequestType.UNSUBSCRIBE:
            self._subscriptions.unsubscribe(peer, header.id, client)
        else:
            error = RemoteProtocolError(f"{rtype.name} is not a request a client may send")
            self._runner.send_error(peer, header, RequestType.EXCEPTION, error)

    def _deny(self, peer: bytes, header: Header, denial: Denial, received_at: float) -> None:
        """Answer, count and log a request the gate refused."""
        rtype = header.request_type
        if rtype is RequestType.ADMIN:
            device_label, prop = None, header.device
        else:
            device_label, prop = header.device, header.property
        reply_type = (
            RequestType.SUBSCRIBE_EXCEPTION
            if rtype is RequestType.SUBSCRIBE
            else RequestType.EXCEPTION
        )
        self._counters.denied(denial.principal, denial.operation)
        took = self._clock() - received_at
        self._counters.record(TYPE_NAMES[rtype], "denied", took, device_label, prop)
        self._runner.send_error(peer, header, reply_type, denial.error)
        self._gate.log_denial(denial, peer)
