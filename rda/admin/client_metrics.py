"""Metric families of a client service, from ``client.statistics()`` on each scrape.

Label ``client`` is the name given to :func:`rda.admin.metrics.start_client_metrics`; the
round-trip histograms add ``type`` (get, set, admin) or ``device`` (the first
``Config.metrics_devices`` devices, then ``other``), and the per-server families ``endpoint``
(the servers this client was configured or directed to).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rda.admin.metric_families import add_histogram, transport_families
from rda.business.client.statistics import ClientStatistics

__all__ = ["ClientCollector", "HasClientStatistics"]


class ClientCollector(Collector):
    """Metric families for a ``ClientService``, from ``client.statistics()`` on each scrape."""

    def __init__(self, client: HasClientStatistics, name: str = "client") -> None:
        self._client = client
        self._name = name

    def collect(self) -> Iterator[Metric]:
        stats = self._client.statistics()
        name = self._name
        lbl = ["client"]
        for field, help_text in _CLIENT_GAUGES:
            gauge = GaugeMetricFamily(f"rda_client_{field}", help_text, labels=lbl)
            gauge.add_metric([name], getattr(stats, field))
            yield gauge
        for field, help_text in _CLIENT_COUNTERS:
            counter = CounterMetricFamily(f"rda_client_{field}", help_text, labels=lbl)
            counter.add_metric([name], getattr(stats, field))
            yield counter
        yield from transport_families(stats.transport, name, lbl, prefix="rda_client_")
        # Per server endpoint: is it up, and how often it came back (issue 12).
        connected = GaugeMetricFamily(
            "rda_client_server_connected",
            "1 if the connection to this server is up (handshake done), else 0.",
            labels=["client", "endpoint"],
        )
        reconnects = CounterMetricFamily(
            "rda_client_server_reconnects",
            "Connections to this server re-established after a loss.",
            labels=["client", "endpoint"],
        )
        for server in stats.servers:
            connected.add_metric([name, server.endpoint], 1 if server.state == "connected" else 0)
            reconnects.add_metric([name, server.endpoint], server.reconnects)
        disconnected = CounterMetricFamily(
            "rda_client_server_disconnected_seconds",
            "Time spent reconnecting to this server after losing the connection.",
            labels=["client", "endpoint"],
        )
        for server in stats.servers:
            disconnected.add_metric([name, server.endpoint], server.disconnected_seconds)
        yield connected
        yield reconnects
        yield disconnected
        yield from _round_trip_families(stats, name)


def _round_trip_families(stats: ClientStatistics, name: str) -> Iterator[Metric]:
    per_type, per_device = stats.round_trips
    by_type = HistogramMetricFamily(
        "rda_client_round_trip_seconds",
        "Time from sending a request to its reply, by request type.",
        labels=["client", "type"],
    )
    for kind, hist in per_type.items():
        add_histogram(by_type, [name, kind], hist)
    yield by_type
    by_device = HistogramMetricFamily(
        "rda_client_device_round_trip_seconds",
        "Time from sending a request to its reply, by device (capped; then other).",
        labels=["client", "device"],
    )
    for device, hist in per_device.items():
        add_histogram(by_device, [name, device], hist)
    yield by_device


class HasClientStatistics(Protocol):
    def statistics(self) -> ClientStatistics: ...


_CLIENT_GAUGES = (
    ("pending", "Requests waiting for a reply."),
    ("subscriptions", "Open subscriptions."),
    ("connections", "Server connections open."),
)
_CLIENT_COUNTERS = (
    ("requests", "Requests sent."),
    ("replies", "Replies received."),
    ("errors", "Requests answered with an error."),
    ("timeouts", "Requests that timed out."),
    ("late_replies", "Replies that arrived after their request timed out (dropped)."),
    ("disconnected_requests", "Requests failed by a lost connection."),
    ("notifications", "Notifications received."),
    ("gaps", "Notifications missed according to sequence numbers."),
    ("dropped", "Notifications dropped because a subscription queue was full."),
    ("listener_errors", "Subscription listeners that raised."),
    ("reconnects", "Reconnections after a lost connection."),
)
