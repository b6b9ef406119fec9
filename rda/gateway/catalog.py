"""Which PVs the gateway answers for: the devices of the directory (filtered by a glob) and
the properties their servers list.

pvAccess searches arrive on p4p's threads and must be answered at once, so they never wait
for rda: a refresher thread (``rda-gateway-catalog``) asks the directory for its devices and
each server for its property list (admin ``devices``) every ``refresh`` seconds, and
:meth:`Catalog.knows` reads the last answer. A device whose server does not list properties
(a server of raw callbacks, or one whose policy refuses the admin command) is served for any
property name; a PV for a property that does not exist then shows the server's error.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from rda.business.client.service import ClientService
from rda.serialization.data import Data
from rda.serialization.errors import RdaError

__all__ = ["ADMIN_TIMEOUT", "Catalog"]

log = logging.getLogger("rda.gateway")

ADMIN_TIMEOUT = 2.0
_GLOB = frozenset("*?[")


class Catalog:
    """Devices and their properties, as last learnt."""

    def __init__(self, client: ClientService, pattern: str = "*", refresh: float = 5.0) -> None:
        self._client = client
        self.pattern = pattern
        self._refresh = refresh
        # device -> its property names (None: any, the server lists none)
        self._devices: dict[str, frozenset[str] | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def start(self) -> None:
        self.refresh_once()
        self._thread = threading.Thread(target=self._run, name="rda-gateway-catalog", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            # A round waits at most ADMIN_TIMEOUT per reply, all asked at once.
            self._thread.join(timeout + ADMIN_TIMEOUT + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._refresh):
            try:
                self.refresh_once()
            except Exception:  # the next round tries again; searches use the last answer
                log.exception("gateway: catalog refresh failed")

    def refresh_once(self) -> None:
        """Ask the directory and every server once; replace the catalogue."""
        mapping: Mapping[str, str] = self._client.directory.devices()
        asked: dict[str, Future[Data]] = {}
        for endpoint in sorted(set(mapping.values())):
            asked[endpoint] = self._client.admin_async(endpoint, "devices", ADMIN_TIMEOUT)
        devices: dict[str, frozenset[str] | None] = {}
        for name in mapping:  # plain names of the directory, until a server lists more
            if not (_GLOB & set(name)) and fnmatch.fnmatchcase(name, self.pattern):
                devices[name] = None
        for endpoint, future in asked.items():
            try:
                reply = future.result(ADMIN_TIMEOUT + 1.0)
            except (RdaError, TimeoutError) as exc:
                log.debug("gateway: %s lists no devices (%s)", endpoint, exc)
                continue
            devices.update(_listed(reply, self.pattern))
        self._devices = devices
        self.rounds += 1

    def knows(self, device: str, prop: str) -> bool:
        """True when ``device/prop`` is served (from the last refresh)."""
        props = self._devices.get(device, _MISSING)
        if props is _MISSING:
            return False
        return props is None or prop in props

    def devices(self) -> dict[str, frozenset[str] | None]:
        return dict(self._devices)


_MISSING: Any = object()


def _listed(reply: Data, pattern: str) -> dict[str, frozenset[str] | None]:
    """A server's admin ``devices`` reply: device -> property names (None when not listed)."""
    properties = reply.get("properties")
    out: dict[str, frozenset[str] | None] = {}
    for name in reply.get("devices", []):
        name = str(name)
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        rows = None
        if isinstance(properties, Data) and name in properties:
            rows = frozenset(str(r["name"]) for r in properties[name].get("properties", []))
        out[name] = rows
    return out
