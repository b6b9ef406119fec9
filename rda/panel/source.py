"""The rda side of the panel: one ``ClientService`` for every browser tab.

- :meth:`PanelSource.discover` learns the servers (the directory's endpoints), their devices
  and properties (admin ``devices``) and admin facts (``info``, ``clients``,
  ``subscriptions``, ``stats``), with the client's connection state of each server;
- :meth:`PanelSource.attach` shares one rda subscription per (device, property, selector)
  among all the views showing it, in every tab (:class:`Feed`), and ends it with the last;
- :meth:`PanelSource.set` writes a property from a browser form, keeping the current value's
  field types, and logs who asked (the panel's principal and the browser's address).

Blocking calls (admin, get, set) are made on worker threads by the caller (the session runs
them with ``asyncio.to_thread``); nothing here touches the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from rda.business.client.history import HISTORY_PREFIX
from rda.business.client.service import ClientService
from rda.business.client.subscriptions import Notification, Subscription
from rda.panel.views import Viewer, describe_error
from rda.serialization.data import Data, DataType
from rda.serialization.errors import RdaError, RemoteError

__all__ = ["ADMIN_TIMEOUT", "DESCRIBE_TTL", "Feed", "PanelSource", "SetRefused", "live_state"]

log = logging.getLogger("rda.panel")

ADMIN_TIMEOUT = 1.5
DESCRIBE_TTL = 10.0
_DESCRIBED_MAX = 4096
_FACTS = ("info", "devices", "clients", "subscriptions", "stats")


class SetRefused(Exception):
    """A set from the browser that the panel or the server refused; ``field`` names the
    form field at fault when the message names one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Feed:
    """One rda subscription fanned out to the views that show it."""

    def __init__(self, client: ClientService, device: str, prop: str, selector: str) -> None:
        self.key = (device, prop, selector)
        self._lock = threading.Lock()
        self._slots: list[Viewer] = []
        self._last: Notification | None = None
        self._sub: Subscription = client.access_point(device, prop).subscribe(
            selector=selector or None, listener=self._deliver
        )

    def _deliver(self, n: Notification) -> None:
        with self._lock:
            self._last = n
            slots = list(self._slots)
        for slot in slots:
            slot.offer(n)

    def add(self, slot: Viewer) -> None:
        with self._lock:
            self._slots.append(slot)
            last = self._last
        # A view opened on a running subscription starts from its latest value at once.
        if last is not None:
            slot.offer(last)

    def remove(self, slot: Viewer) -> bool:
        """Detach ``slot``; True when no view is left (the caller closes the feed)."""
        with self._lock:
            if slot in self._slots:
                self._slots.remove(slot)
            return not self._slots

    def close(self) -> None:
        self._sub.close()


def live_state(shown: str, connection: str | None) -> str:
    """A server's state in the tree, corrected by its connection's state (``connection``, as
    the client's statistics say, None when the client has none): the views learn of a lost
    connection at once, the tree must agree within a second rather than at its next
    discovery. A state that came from the admin replies stands while the connection is up."""
    if connection is None:
        return shown
    if connection != "connected":
        return connection
    return "connected" if shown in ("reconnecting", "connecting", "refused") else shown


def _plain(value: Any) -> Any:
    """A reply field as JSON: nested Data as dicts, arrays as lists."""
    if isinstance(value, Data):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


class PanelSource:
    """The panel's rda client: discovery, shared subscriptions, sets."""

    def __init__(self, client: ClientService, principal: str) -> None:
        self.client = client
        self.principal = principal
        self._lock = threading.Lock()
        self._feeds: dict[tuple[str, str, str], Feed] = {}
        # Last facts learnt per endpoint: a server that stops answering keeps its tree.
        self._known: dict[str, dict[str, Any]] = {}
        self._requests: dict[str, tuple[float, int]] = {}
        self._listed: set[str] = set()
        self._described: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    # -- discovery ---------------------------------------------------------------------------

    def endpoints(self) -> list[str]:
        """The directory's endpoints, and those the panel knew that left it: a crashed server
        stays in the tree, marked, until its devices are found served elsewhere."""
        mapping: Mapping[str, str] = self.client.directory.devices()
        listed = set(mapping.values())
        for endpoint, known in list(self._known.items()):
            if endpoint in listed:
                continue
            names = {d["name"] for d in known.get("devices", [])}
            if names and names <= {d for d, ep in mapping.items() if ep != endpoint}:
                del self._known[endpoint]  # moved: another endpoint serves them all now
                self._requests.pop(endpoint, None)
        self._listed = listed
        return sorted(listed | set(self._known))

    def discover(self) -> list[dict[str, Any]]:
        """Every server of the directory with its devices, properties, state and facts."""
        endpoints = self.endpoints()
        asked: dict[str, dict[str, Future[Data]]] = {
            ep: {c: self.client.admin_async(ep, c, ADMIN_TIMEOUT) for c in _FACTS}
            for ep in endpoints
        }
        answers: dict[str, tuple[dict[str, Data], str | None]] = {}
        for endpoint in endpoints:
            replies: dict[str, Data] = {}
            error = None
            for command, future in asked[endpoint].items():
                try:
                    replies[command] = future.result(ADMIN_TIMEOUT + 1.0)
                except Exception as exc:
                    error = describe_error(exc)
            answers[endpoint] = (replies, error)
        # Read after the replies: a first connection is "connecting" until its handshake.
        states = {s.endpoint: s for s in self.client.statistics().servers}
        servers = []
        for endpoint in endpoints:
            replies, error = answers[endpoint]
            known = self._known.get(endpoint, {"devices": []})
            if "devices" in replies:
                known = {"devices": self._devices(replies["devices"])}
                self._known[endpoint] = known
            if endpoint not in self._listed and error is not None:
                error += " (no longer in the directory)"
            stats = states.get(endpoint)
            state = "disconnected" if error is not None else "connected"
            if stats is not None and stats.state in ("reconnecting", "connecting"):
                state = stats.state
            kinds = {d["kind"] for d in known["devices"]}
            servers.append(
                {
                    "endpoint": endpoint,
                    # A server that only serves recorded history is a recorder.
                    "role": "recorder" if kinds == {"recorder"} else "server",
                    "name": str(replies["info"].get("name", endpoint))
                    if "info" in replies
                    else self._known.get(endpoint, {}).get("name", endpoint),
                    "state": state,
                    "error": error,
                    "reason": "" if stats is None else stats.last_reason,
                    "facts": self._facts(endpoint, replies),
                    "devices": known["devices"],
                }
            )
            if "info" in replies:
                self._known[endpoint]["name"] = str(replies["info"].get("name", endpoint))
        return servers

    @staticmethod
    def _devices(reply: Data) -> list[dict[str, Any]]:
        """Each device with its properties; a recorder's ``history:<pattern>`` entry is marked
        as such (``kind``: "recorder", ``records``: the pattern), not shown as a device."""
        properties = reply.get("properties")
        devices = []
        for name in reply.get("devices", []):
            rows: list[dict[str, Any]] = []
            if isinstance(properties, Data) and name in properties:
                rows = [_plain(r) for r in properties[name].get("properties", [])]
            device: dict[str, Any] = {"name": str(name), "properties": rows, "kind": "device"}
            if device["name"].startswith(HISTORY_PREFIX):
                device.update(kind="recorder", records=device["name"][len(HISTORY_PREFIX) :])
            devices.append(device)
        return devices

    def _facts(self, endpoint: str, replies: Mapping[str, Data]) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        if "info" in replies:
            info = replies["info"]
            facts.update(uptime=_plain(info.get("uptime")), pid=_plain(info.get("pid")))
            facts["host"] = _plain(info.get("host"))
        if "clients" in replies:
            facts["clients"] = int(replies["clients"].get("count", 0))
        if "subscriptions" in replies:
            facts["subscriptions"] = int(replies["subscriptions"].get("count", 0))
        if "stats" in replies:
            table = replies["stats"].get("requests")
            total = 0
            if isinstance(table, Data):
                for per_type in table.values():
                    if isinstance(per_type, Data):
                        total += sum(int(v) for v in per_type.values())
            now = time.monotonic()
            before = self._requests.get(endpoint)
            self._requests[endpoint] = (now, total)
            facts["requests"] = total
            if before is not None and now > before[0]:
                facts["request_rate"] = round((total - before[1]) / (now - before[0]), 1)
        return facts

    def states(self) -> dict[str, str]:
        """Each endpoint's connection state, as the client knows it now (no I/O)."""
        return {s.endpoint: s.state for s in self.client.statistics().servers}

    # -- subscriptions -----------------------------------------------------------------------

    def attach(self, device: str, prop: str, selector: str, slot: Viewer) -> None:
        """Show ``device/prop`` (cycle ``selector``, "" for none) in ``slot``."""
        key = (device, prop, selector)
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None:
                try:
                    feed = Feed(self.client, device, prop, selector)
                except RdaError as exc:
                    slot.fail(exc)
                    return
                self._feeds[key] = feed
            feed.add(slot)

    def detach(self, device: str, prop: str, selector: str, slot: Viewer) -> None:
        key = (device, prop, selector)
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None or not feed.remove(slot):
                return
            del self._feeds[key]
        feed.close()

    def feeds(self) -> int:
        with self._lock:
            return len(self._feeds)

    def describe(self, device: str, prop: str) -> dict[str, Any] | None:
        """``device/prop``'s declared metadata (units, precision, limits, alarm limits) as
        JSON, None when the server declares none or cannot say (an older server, an error):
        the view then shows plain values. Answers are kept ``DESCRIBE_TTL`` seconds: the views
        of one property in many tabs ask once."""
        key = (device, prop)
        now = time.monotonic()
        with self._lock:
            cached = self._described.get(key)
        if cached is not None and now - cached[0] < DESCRIBE_TTL:
            return cached[1]
        try:
            ap = self.client.access_point(device, prop)
            answer: dict[str, Any] | None = ap.describe(timeout=ADMIN_TIMEOUT).to_dict()
        except RdaError as exc:
            log.debug("panel: no description of %s/%s: %s", device, prop, exc)
            answer = None
        with self._lock:
            if len(self._described) >= _DESCRIBED_MAX:
                self._described.clear()  # bounded: names come from browsers
            self._described[key] = (now, answer)
        return answer

    # -- sets --------------------------------------------------------------------------------

    def set(
        self,
        device: str,
        prop: str,
        selector: str,
        values: Mapping[str, Any],
        browser: str,
    ) -> None:
        """Write ``values`` (form fields, as text or JSON numbers) to ``device/prop``, each
        converted to the type the property's current value has; raises :class:`SetRefused`."""
        ap = self.client.access_point(device, prop)
        try:
            current = ap.get(selector=selector or None).data
        except RdaError as exc:
            raise SetRefused(describe_error(exc)) from None
        types = current.types()
        data = Data()
        for name, text in values.items():
            kind = types.get(name)
            if kind is None:
                raise SetRefused(f"{name}: not a field of {device}/{prop}", name)
            try:
                data.append(name, _convert(text, kind), type=kind)
            except (TypeError, ValueError) as exc:
                raise SetRefused(f"{name}: {exc}", name) from None
        log.info(
            "set %s/%s%s %s by %s for browser %s",
            device,
            prop,
            f" selector={selector}" if selector else "",
            dict(data.items()),
            self.principal,
            browser,
        )
        try:
            ap.set(data, selector=selector or None)
        except RemoteError as exc:
            field = next((n for n in values if n in str(exc.message)), None)
            raise SetRefused(describe_error(exc), field) from None
        except RdaError as exc:
            raise SetRefused(describe_error(exc)) from None

    def close(self) -> None:
        with self._lock:
            feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            feed.close()


def _convert(value: Any, kind: DataType) -> Any:
    """A form value as the Python value of ``kind`` (only scalars and strings are editable)."""
    if kind == DataType.STRING:
        return str(value)
    if kind == DataType.BOOL:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{value!r} is not a boolean")
    if kind in (DataType.FLOAT32, DataType.FLOAT64):
        return float(value)
    if kind in (DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64):
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(str(value).strip()) if isinstance(value, str) else int(value)
    raise ValueError(f"a {kind.name} field cannot be set from the panel")
