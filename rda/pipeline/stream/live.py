"""``rda-live``: a best-effort Spark streaming source that subscribes to devices directly.

BEST EFFORT, by design: rows exist only in the memory of the query's driver. Nothing is
replayed: rows that arrive while the query is down, or that were received but not yet
committed when it failed, are lost; a subscription queue that overflows drops its oldest rows
(counted by the subscription as gaps). For exactly-once, record with ``rda record`` and stream
the journal with ``rda-journal``.

The source is a ``SimpleDataSourceStreamReader``: Spark runs ``read`` on the driver, which
drains the subscriptions' queues. The client and its subscriptions are made lazily by the first
``read`` (the source object is pickled before that) and closed by ``stop``.

Options: ``signals`` (required; comma-separated ``DEV/Prop`` or ``DEV/Prop@SELECTOR``),
``endpoint`` (``tcp://host:port``; default: the directory), ``queueSize`` (per subscription,
default 1,000,000).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

__all__ = ["LIVE_SCHEMA", "LiveDataSource", "LiveStreamReader", "notification_row"]

LIVE_SCHEMA = (
    "device string, property string, selector string, acq_stamp long, ts timestamp, "
    "cycle_stamp long, cycle_name string, recv_stamp long, error string, data string"
)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def notification_row(device: str, prop: str, notification: Any, recv_stamp: int) -> tuple[Any, ...]:
    """One row of :data:`LIVE_SCHEMA` from a ``Notification`` (a bad body: an error row)."""
    context = notification.context
    error = notification.error
    text = None
    if error is None:
        try:
            data = notification.data
            text = json.dumps(data.to_dict(), default=_json_default, separators=(",", ":"))
        except Exception as exc:  # a body that does not decode is recorded, not raised
            error = exc
    acq = context.acq_stamp
    return (
        device,
        prop,
        context.selector,
        acq,
        _EPOCH + datetime.timedelta(microseconds=acq // 1000),
        context.cycle_stamp,
        context.cycle_name,
        recv_stamp,
        None if error is None else f"{type(error).__name__}: {error}",
        text,
    )


def _parse_signals(text: str) -> list[tuple[str, str, str | None]]:
    signals = []
    for item in (s.strip() for s in text.split(",")):
        target, _, selector = item.partition("@")
        device, slash, prop = target.partition("/")
        if not slash or not device or not prop or any(c in target for c in "*?["):
            raise ValueError(f"rda-live: {item!r} is not DEVICE/PROPERTY[@SELECTOR] (no globs)")
        signals.append((device, prop, selector or None))
    return signals


class LiveStreamReader(SimpleDataSourceStreamReader):
    """Drains the subscriptions on each micro-batch; offsets count the rows delivered."""

    def __init__(self, options: dict[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        if not opts.get("signals"):
            raise ValueError("rda-live: option 'signals' (DEV/Prop[@SEL],...) is required")
        self.signals = _parse_signals(opts["signals"])
        self.endpoint = opts.get("endpoint")
        if self.endpoint is not None and "://" not in self.endpoint:
            raise ValueError(f"rda-live: {self.endpoint!r} is not an endpoint like tcp://h:p")
        try:
            self.queue_size = int(opts.get("queuesize", "1000000"))
        except ValueError:
            raise ValueError("rda-live: 'queueSize' must be an integer") from None
        self._client: Any = None
        self._subscriptions: list[tuple[str, str, Any]] = []

    def _subscribe(self) -> None:
        from rda.business.client.service import ClientService
        from rda.business.directory import StaticDirectory

        directory = None if self.endpoint is None else StaticDirectory({"*": self.endpoint})
        self._client = ClientService(directory=directory)
        for device, prop, selector in self.signals:
            point = self._client.access_point(device, prop)
            subscription = point.subscribe(selector=selector, queue_size=self.queue_size)
            self._subscriptions.append((device, prop, subscription))

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        if self._client is None:
            self._subscribe()
        rows = []
        for device, prop, subscription in self._subscriptions:
            while (notification := subscription.poll_nowait()) is not None:
                rows.append(notification_row(device, prop, notification, time.time_ns()))
        return iter(rows), {"rows": int(start["rows"]) + len(rows)}

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[tuple[Any, ...]]:
        """A replay after a restart: the rows were only in memory, so there are none."""
        return iter(())

    def stop(self) -> None:
        for _, _, subscription in self._subscriptions:
            subscription.close()
        self._subscriptions.clear()
        if self._client is not None:
            self._client.close()
            self._client = None


class LiveDataSource(DataSource):
    """``spark.readStream.format("rda-live").option("signals", "PS1/Acquisition").load()``."""

    @classmethod
    def name(cls) -> str:
        return "rda-live"

    def schema(self) -> str:
        return LIVE_SCHEMA

    def simpleStreamReader(self, schema: Any) -> LiveStreamReader:
        return LiveStreamReader(dict(self.options))
