"""One pvAccess PV of the gateway: a p4p ``SharedPV`` showing a feed's updates.

The PV is the handler of its own ``SharedPV``: the first pvAccess client to connect attaches
it to its feed (``onFirstConnect``, opening the rda subscription if it is the feed's first
PV), the last to leave detaches it and closes it (``onLastDisconnect``), so a PV nobody reads
costs nothing and the next client waits for a fresh ``FIRST`` value. Until its first update
the PV is closed: a get or monitor waits for it (p4p holds the operation until ``open``).

The type is built from the first value (:mod:`rda.gateway.nt`) and kept while the layout of
the values stays the same; a value of another layout (a server that changed the property)
closes the PV and opens it with the new type, which pvAccess clients see as a reconnection.
An update without a value (an error, a lost server) posts only the alarm, on the last value.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from p4p import Value
from p4p.server.thread import SharedPV

from rda.gateway import metadata, nt
from rda.gateway.feeds import Feed, FeedTable, Update
from rda.gateway.naming import PvName
from rda.serialization.data import Data, DataType

__all__ = ["GatewayPv", "PutHandler", "resolve_field"]

log = logging.getLogger("rda.gateway")

PutHandler = Callable[["GatewayPv", Any], None]


def resolve_field(data: Data, path: tuple[str, ...]) -> tuple[DataType, Any]:
    """The type and value of the field at ``path`` of ``data``; ``KeyError`` names what is
    missing."""
    kind = DataType.DATA
    value: Any = data
    for depth, part in enumerate(path):
        if kind is not DataType.DATA or part not in value:
            raise KeyError(f"no field {'.'.join(path[: depth + 1])}")
        kind = value.type_of(part)
        value = value[part]
    return kind, value


class GatewayPv:
    """A PV named ``name``, showing the whole property or one field of the feed ``name.feed``."""

    def __init__(
        self,
        name: PvName,
        feeds: FeedTable,
        queue: Any,
        put: PutHandler,
        forget: Callable[[GatewayPv], None],
    ) -> None:
        self.name = name
        self.text = str(name)
        self._feeds = feeds
        self._put = put
        self._forget = forget
        self._lock = threading.Lock()
        self._attached = False
        # Closed for good: its values changed type. Its clients reconnect, and the provider
        # makes a new PV for them, opened with the new type from the feed's latest update.
        self._retired = False
        self._type_key: object = None  # what the open SharedPV's type was built from
        self._type: Any = None
        self.last: Update | None = None
        self.feed: Feed | None = None
        self.shared = SharedPV(handler=self, queue=queue)

    # -- p4p's handler calls, on the gateway's work queue -----------------------------------

    def onFirstConnect(self, pv: Any) -> None:
        with self._lock:
            if self._attached or self._retired:
                return
            self._attached = True
        self.feed = self._feeds.attach(self.name.feed, self)

    def onLastDisconnect(self, pv: Any) -> None:
        with self._lock:
            if self._retired:
                return  # its own closing (a new type): already detached and forgotten
            self._attached = False
            self._type_key = None
            self.shared.close()
        self._leave()

    def _leave(self) -> None:
        self._feeds.detach(self.name.feed, self)
        self.feed = None
        self._forget(self)

    def put(self, pv: Any, op: Any) -> None:
        self._put(self, op)

    # -- updates, on the feed's listener thread ---------------------------------------------

    def show(self, update: Update) -> None:
        with self._lock:
            if not self._attached:
                return
            self.last = update
            alarm = update.alarm
            try:
                built = self._build(update)
            except KeyError as exc:  # the value has no such field (any more)
                where = f"{self.name.device}/{self.name.prop}"
                alarm = metadata.AlarmState(
                    metadata.INVALID, metadata.DEVICE, f"{where}: {exc.args[0]}"
                )
                built = None
            if built is None:  # no value to show yet, or only an alarm on the last value
                self._post_alarm(update, alarm)
                return
            key, type_, full, changes = built
            if key == self._type_key:
                self.shared.post(changes if isinstance(changes, Value) else Value(type_, changes))
                return
            if self._type_key is None:
                self._type_key, self._type = key, type_
                self.shared.open(full if isinstance(full, Value) else Value(type_, full))
                return
            # A new type: p4p cannot change an open PV's type, and closing it disconnects
            # its clients, so this PV retires and their reconnection makes a new one.
            self._retired = True
            self._attached = False
            self.shared.close()
        self._leave()

    def _post_alarm(self, update: Update, alarm: metadata.AlarmState) -> None:
        head = _head(update)
        head["alarm"] = alarm.as_dict()
        if self._type_key is None:
            # Nothing shown yet (the first update is an error): a NaN double carries the
            # alarm until a value comes (then the PV reopens with the value's type).
            if self.name.whole:
                self._type_key, self._type = ("empty",), nt.property_type(())
                self.shared.open(Value(self._type, {**head, **_cycle(update)}))
            else:
                self._type_key = ("empty",)
                self._type = nt.field_type(DataType.FLOAT64, 0)
                init = {"value": math.nan, **head, **metadata.field_metadata(None, (), "d")}
                self.shared.open(Value(self._type, init))
            return
        extra = _cycle(update) if self.name.whole and self._type.getID() == nt.PROPERTY_ID else {}
        self.shared.post(Value(self._type, {**head, **extra}))

    def _build(self, update: Update) -> tuple[object, Any, Any, Any] | None:
        """(type key, type, initial value, changes to post) for ``update``; None when it
        carries no value for this PV."""
        data = update.data
        if data is None or (update.failed and self._type_key is not None):
            return None  # nothing to show, or only the alarm on the value shown
        head = _head(update)
        path = self.name.field
        if path:
            kind, value = resolve_field(data, path)
            if not update.failed:
                # A field PV shows its own field's alarm (its limits), not the property's.
                head["alarm"] = metadata.field_alarm(update.description, path, value).as_dict()
            if kind is DataType.DATA:
                return self._structure(value, update, head)
            if kind is DataType.DATA_ARRAY:
                wrapper = Data()
                wrapper.append("items", value, DataType.DATA_ARRAY)
                return self._structure(wrapper, update, head)
            ndim = nt.ndim_of(kind, value)
            type_ = nt.field_type(kind, ndim)
            if nt.field_kind(kind, ndim) == nt.FieldKind.NDARRAY:
                wrapped = nt.ndarray_value(value)
                wrapped["alarm"] = head["alarm"]
                wrapped["timeStamp"] = head["timeStamp"]
                return (("nd", kind), type_, wrapped, wrapped)
            shown = nt.scalar_value(kind, value)
            changes = {"value": shown, **head}
            code = nt.CODES[kind.element]
            full = {**changes, **metadata.field_metadata(update.description, path, code)}
            return (("field", kind, ndim), type_, full, changes)
        return self._structure(data, update, head)

    def _structure(
        self, data: Data, update: Update, head: dict[str, Any]
    ) -> tuple[object, Any, Any, Any]:
        layout = nt.layout_of(data)
        changes = {"value": nt.pv_value(data, layout), **head, **_cycle(update)}
        return (("struct", layout), nt.property_type(layout), changes, changes)

    def close(self) -> None:
        """Close the SharedPV (the gateway is stopping): its clients are disconnected."""
        with self._lock:
            self._attached = False
            self._retired = True
            self.shared.close()


def _head(update: Update) -> dict[str, Any]:
    stamp = update.context.acq_stamp or time.time_ns()
    return {"alarm": update.alarm.as_dict(), "timeStamp": nt.stamp(stamp)}


def _cycle(update: Update) -> dict[str, Any]:
    context = update.context
    return {
        "cycleName": context.cycle_name,
        "cycleStamp": nt.stamp(context.cycle_stamp),
        "selector": context.selector,
        "gaps": update.gaps,
    }
