"""The pvAccess gateway: every rda property as pvAccess PVs (``rda gateway pva``).

:class:`PvaGateway` owns a p4p ``Server`` with one ``DynamicProvider`` whose handler
(:class:`PvDirectory`) answers searches from the :class:`~rda.gateway.catalog.Catalog` and
makes one :class:`~rda.gateway.pvs.GatewayPv` per PV name a client opens, shared by all its
clients and forgotten when the last leaves. The PVs read one rda subscription per
(device, property, selector) (:class:`~rda.gateway.feeds.FeedTable`); puts go through the
:class:`~rda.gateway.puts.PutGate`.

Threads: p4p's own (pvAccess I/O, searches); ``rda-gateway-pva[0]``, the work queue every
PV's handler calls run on (first connect, last disconnect, put: none blocks, a put's set is
asynchronous); ``rda-gateway-catalog``; and the rda client's (its listener workers show the
updates). :meth:`PvaGateway.stop` stops the server first (no new operation), closes every
PV, the feeds, the catalogue and the work queue, each bounded; the rda client belongs to the
caller.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from p4p.server import DynamicProvider, Server
from p4p.util import ThreadedWorkQueue

from rda.business.client.service import ClientService
from rda.gateway.catalog import Catalog
from rda.gateway.feeds import FeedTable
from rda.gateway.naming import parse_pv_name
from rda.gateway.puts import PutGate, PutRules
from rda.gateway.pvs import GatewayPv

__all__ = ["MAX_PVS", "GatewayStatistics", "PvDirectory", "PvaGateway"]

log = logging.getLogger("rda.gateway")

# PVs open at once (each has at least one pvAccess channel); a client opening more is
# refused the channel, counted.
MAX_PVS = 10_000


@dataclass(frozen=True, slots=True)
class GatewayStatistics:
    """What the gateway serves and has done."""

    pvs: int  # PVs with at least one pvAccess client
    feeds: int  # rda subscriptions open
    feeds_opened: int  # rda subscriptions opened since start
    gaps: int  # updates rda counted as missed, on the open feeds
    devices: int  # devices in the catalogue
    channels_refused: int  # channels refused (MAX_PVS reached)
    puts_done: int
    puts_refused: int  # by the gateway (no --allow-put, rules, conversion)
    puts_failed: int  # refused or failed by rda


class PvDirectory:
    """p4p's ``DynamicProvider`` handler: which names exist, and their PVs."""

    def __init__(
        self, catalog: Catalog, feeds: FeedTable, puts: PutGate, queue: Any, max_pvs: int
    ) -> None:
        self._catalog = catalog
        self._feeds = feeds
        self._puts = puts
        self._queue = queue
        self._max = max_pvs
        self._lock = threading.Lock()
        self._pvs: dict[str, GatewayPv] = {}
        self._closed = False
        self.refused = 0

    def testChannel(self, name: str) -> bool:
        # Only names the catalogue knows: p4p claims a channel for any other true answer
        # (its NotYet included), and pvAccess clients repeat their searches, so a device
        # that appears later is found at the next search after the catalogue's refresh.
        try:
            pv = parse_pv_name(name)
        except ValueError:
            return False
        return self._catalog.knows(pv.device, pv.prop)

    def makeChannel(self, name: str, peer: str) -> Any:
        try:
            parsed = parse_pv_name(name)
        except ValueError:
            return None
        with self._lock:
            if self._closed:
                return None
            pv = self._pvs.get(name)
            if pv is None:
                if len(self._pvs) >= self._max:
                    self.refused += 1
                    log.warning(
                        "gateway: %d PVs open, channel %s from %s refused", self._max, name, peer
                    )
                    return None
                pv = GatewayPv(parsed, self._feeds, self._queue, self._puts, self._forget)
                self._pvs[name] = pv
        return pv.shared

    def _forget(self, pv: GatewayPv) -> None:
        with self._lock:
            if self._pvs.get(pv.text) is pv:
                del self._pvs[pv.text]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pvs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pvs, self._pvs = list(self._pvs.values()), {}
        for pv in pvs:
            pv.close()


class PvaGateway:
    """Serves the rda devices ``client`` finds (those matching ``devices``) over pvAccess.

    ``conf``: p4p server configuration (``EPICS_PVAS_*`` keys), used instead of the
    environment's when given. Puts need ``allow_put`` and ``rules``.
    """

    def __init__(
        self,
        client: ClientService,
        *,
        devices: str = "*",
        allow_put: bool = False,
        rules: PutRules | None = None,
        conf: dict[str, str] | None = None,
        refresh: float = 5.0,
        put_timeout: float = 5.0,
        max_pvs: int = MAX_PVS,
    ) -> None:
        self.client = client
        self.catalog = Catalog(client, devices, refresh)
        self.feeds = FeedTable(client)
        self.puts = PutGate(client, allow_put=allow_put, rules=rules, timeout=put_timeout)
        self._conf = conf
        self._max_pvs = max_pvs
        self._queue: Any = None
        self._server: Any = None
        self._directory: PvDirectory | None = None
        self._provider: Any = None

    def start(self) -> PvaGateway:
        self._queue = ThreadedWorkQueue(name="rda-gateway-pva", workers=1, maxsize=0, daemon=True)
        self._queue.start()
        self.catalog.start()
        self._directory = PvDirectory(
            self.catalog, self.feeds, self.puts, self._queue, self._max_pvs
        )
        self._provider = DynamicProvider("rda-gateway", self._directory)
        if self._conf is None:
            self._server = Server(providers=[self._provider])
        else:
            self._server = Server(providers=[self._provider], conf=self._conf, useenv=False)
        return self

    def conf(self) -> dict[str, str]:
        """The server's effective configuration (its port: ``EPICS_PVAS_SERVER_PORT``)."""
        if self._server is None:
            raise RuntimeError("the gateway is not started")
        conf: dict[str, str] = self._server.conf()
        return conf

    def statistics(self) -> GatewayStatistics:
        d = self._directory
        return GatewayStatistics(
            pvs=0 if d is None else len(d),
            feeds=len(self.feeds),
            feeds_opened=self.feeds.opened,
            gaps=self.feeds.gaps(),
            devices=len(self.catalog.devices()),
            channels_refused=0 if d is None else d.refused,
            puts_done=self.puts.allowed,
            puts_refused=self.puts.refused,
            puts_failed=self.puts.failed,
        )

    def stop(self, timeout: float = 2.0) -> None:
        """Stop serving: the server first (its clients are disconnected), then the PVs, the
        rda subscriptions, the catalogue and the work queue. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        if self._directory is not None:
            self._directory.close()
        self.feeds.close()
        self.catalog.stop(timeout)
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.stop()

    def __enter__(self) -> PvaGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
