"""The Prometheus endpoint: custom collectors that read ``statistics()`` at scrape time.

No metric object is touched on the message path (STYLE.md 12): the server counts with plain
integers in its own snapshots, and a scrape converts the latest snapshot into metric families.
A scrape therefore costs one ``statistics()`` call per server, whatever the traffic.

Names follow the Prometheus conventions: ``rda_`` prefix, base units (seconds, bytes),
``_total`` on counters (added by prometheus_client), and a ``server`` label on every family so
several servers in one process can share one registry.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from rda.admin.registry import AdminServer
from rda.business.client.statistics import ClientStatistics
from rda.business.server.statistics import HistogramSnapshot, ServerStatistics

__all__ = [
    "ClientCollector",
    "MetricsEndpoint",
    "ServerCollector",
    "metrics_endpoint",
    "registry_for",
    "start_client_metrics",
    "start_metrics",
    "stop_metrics",
]


class ServerCollector(Collector):
    """Metric families for one server, built from ``server.statistics()`` on each scrape."""

    def __init__(self, server: AdminServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        stats: ServerStatistics = server.statistics()
        name = server.name
        lbl = ["server"]

        info = InfoMetricFamily("rda_server", "Server identity.", labels=lbl)
        info.add_metric([name], {"endpoint": server.endpoint})
        yield info
        yield _gauge(
            "rda_server_start_time_seconds", "Server start, UNIX time.", name, server.started_at
        )

        requests = CounterMetricFamily(
            "rda_requests",
            "Requests handled, by type and outcome.",
            labels=["server", "type", "outcome"],
        )
        for (kind, outcome), count in sorted(stats.requests.items()):
            requests.add_metric([name, kind, outcome], count)
        yield requests

        denied = CounterMetricFamily(
            "rda_requests_denied",
            "Requests refused by the authorization policy, by principal and operation.",
            labels=["server", "principal", "operation"],
        )
        for (principal, operation), count in sorted(stats.denied.items()):
            denied.add_metric([name, principal, operation], count)
        yield denied

        durations = HistogramMetricFamily(
            "rda_request_duration_seconds",
            "Time from a request's arrival to its reply, by type.",
            labels=["server", "type"],
        )
        for kind, hist in sorted(stats.durations.items()):
            durations.add_metric([name, kind], _cumulative(hist), sum_value=float(hist.sum))
        yield durations

        transport = stats.transport
        scheduler = stats.scheduler
        yield _gauge("rda_connected_clients", "Clients connected now.", name, stats.clients)
        yield _gauge("rda_subscriptions", "Active subscriptions.", name, stats.subscriptions)
        yield _gauge(
            "rda_subscription_sources",
            "Distinct (device, property, selector, filters) being published.",
            name,
            stats.sources,
        )
        yield _counter(
            "rda_notifications_sent",
            "Notifications sent to subscribers.",
            name,
            stats.notifications_sent,
        )
        yield _counter(
            "rda_notifications_conflated",
            "Notifications replaced by a newer one for a slow client.",
            name,
            transport.notifications_conflated,
        )
        yield _counter(
            "rda_messages_dropped",
            "Messages dropped because a peer's queue was full.",
            name,
            transport.messages_dropped,
        )
        yield _gauge(
            "rda_peer_queue_depth",
            "Messages waiting for slow clients.",
            name,
            transport.peer_queue_depth,
        )
        yield _counter(
            "rda_auth_failures",
            "Connections refused in the CURVE/ZAP handshake (no or unknown key, garbage).",
            name,
            transport.auth_failures,
        )
        yield _gauge(
            "rda_scheduler_queued_tasks", "Tasks waiting in the scheduler.", name, scheduler.queued
        )
        yield _gauge("rda_scheduler_running_tasks", "Tasks running now.", name, scheduler.running)
        yield _gauge(
            "rda_scheduler_max_group_queue_depth",
            "Highest number of tasks any one group ever held waiting.",
            name,
            scheduler.max_queue_depth,
        )
        yield _counter("rda_scheduler_tasks_executed", "Tasks run.", name, scheduler.executed)
        yield _counter("rda_scheduler_tasks_failed", "Tasks that raised.", name, scheduler.failed)
        dropped = CounterMetricFamily(
            "rda_scheduler_tasks_dropped",
            "Tasks not run because a group queue was full, by reason.",
            labels=["server", "reason"],
        )
        dropped.add_metric([name, "rejected"], scheduler.rejected)
        dropped.add_metric([name, "dropped_oldest"], scheduler.dropped_oldest)
        dropped.add_metric([name, "dropped_newest"], scheduler.dropped_newest)
        yield dropped
        yield from _transport_families(transport, name, lbl)
        yield from _error_families(stats, name)


class ClientCollector(Collector):
    """Metric families for a ``ClientService``, from ``client.statistics()`` on each scrape."""

    def __init__(self, client: _HasClientStatistics, name: str = "client") -> None:
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
        yield from _transport_families(stats.transport, name, lbl, prefix="rda_client_")
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
        yield connected
        yield reconnects


class _HasClientStatistics(Protocol):
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


def _transport_families(
    transport: Any, name: str, labels: list[str], prefix: str = "rda_"
) -> Iterator[Metric]:
    pairs = (
        ("bytes_in", "received_bytes", "Bytes received."),
        ("bytes_out", "sent_bytes", "Bytes sent."),
        ("messages_in", "received_messages", "Messages received."),
        ("messages_out", "sent_messages", "Messages sent."),
        ("heartbeat_timeouts", "heartbeat_timeouts", "Peers dropped after a heartbeat timeout."),
        ("decode_errors", "decode_errors", "Messages that could not be decoded."),
        ("protocol_errors", "protocol_errors", "Messages that broke the protocol."),
    )
    for field, metric, help_text in pairs:
        value = getattr(transport, field, None)
        if isinstance(value, int):
            fam = CounterMetricFamily(f"{prefix}{metric}", help_text, labels=labels)
            fam.add_metric([name], value)
            yield fam
    lanes = GaugeMetricFamily(
        f"{prefix}lanes",
        "Direct lanes open: blocking callers' own connections (docs/client.md).",
        labels=labels,
    )
    lanes.add_metric([name], transport.lanes)
    yield lanes


def _error_families(stats: ServerStatistics, name: str) -> Iterator[Metric]:
    yield _counter(
        "rda_handler_errors", "Exceptions raised by request handlers.", name, stats.handler_errors
    )
    yield _counter(
        "rda_late_completions",
        "Requests completed after they were already answered (e.g. past their deadline).",
        name,
        stats.late_completions,
    )


def _gauge(metric: str, help_text: str, server: str, value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(metric, help_text, labels=["server"])
    fam.add_metric([server], value)
    return fam


def _counter(metric: str, help_text: str, server: str, value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(metric, help_text, labels=["server"])
    fam.add_metric([server], value)
    return fam


def _cumulative(hist: HistogramSnapshot) -> list[tuple[str, float]]:
    """Per-bucket counts (last one +Inf) -> Prometheus' cumulative ``le`` buckets."""
    running = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip(hist.buckets, hist.counts, strict=False):
        running += count
        out.append((_bound(bound), running))
    running += sum(hist.counts[len(hist.buckets) :])
    out.append(("+Inf", running))
    return out


def _bound(value: float) -> str:
    return repr(float(value))


class MetricsEndpoint:
    """An HTTP ``/metrics`` endpoint on its own registry (bound to 127.0.0.1 by default).

    ``port=0`` binds a random free port; ``.port`` and ``.url`` tell which. ``close`` is
    idempotent and joins the serving thread.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int = 0,
        host: str = "127.0.0.1",
    ) -> None:
        self.registry = registry
        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        self._thread.name = "rda-metrics"
        self.host = host
        self.port: int = int(self._httpd.server_address[1])
        self._closed = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> MetricsEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def registry_for(*collectors: Collector, process: bool = True) -> CollectorRegistry:
    """A fresh registry holding ``collectors`` and (by default) the process collector."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    if process:
        ProcessCollector(registry=registry)
    return registry


# One endpoint per server object; weak so a forgotten server is not kept alive by metrics.
_ENDPOINTS: weakref.WeakKeyDictionary[Any, MetricsEndpoint] = weakref.WeakKeyDictionary()
_ENDPOINTS_LOCK = threading.Lock()


def start_metrics(server: AdminServer, port: int = 0, host: str = "127.0.0.1") -> MetricsEndpoint:
    """Serve ``server``'s metrics (and the process collector) on ``host:port``.

    Idempotent per server: a second call returns the running endpoint (so installing the
    hooks twice cannot try to bind a fixed port twice).
    """
    with _ENDPOINTS_LOCK:
        running = _ENDPOINTS.get(server)
        if running is None:
            running = MetricsEndpoint(registry_for(ServerCollector(server)), port=port, host=host)
            _ENDPOINTS[server] = running
        return running


def stop_metrics(server: AdminServer) -> None:
    """Stop ``server``'s metrics endpoint if one runs (idempotent)."""
    with _ENDPOINTS_LOCK:
        endpoint = _ENDPOINTS.pop(server, None)
    if endpoint is not None:
        endpoint.close()


def start_client_metrics(
    client: _HasClientStatistics, port: int = 0, host: str = "127.0.0.1", name: str = "client"
) -> MetricsEndpoint:
    """Serve a ``ClientService``'s metrics (label ``client=name``); close the endpoint when
    done (``with start_client_metrics(client) as endpoint: ...``)."""
    return MetricsEndpoint(registry_for(ClientCollector(client, name)), port=port, host=host)


def metrics_endpoint(server: AdminServer) -> MetricsEndpoint | None:
    """The running metrics endpoint of ``server`` (its ``.port``/``.url``), if any."""
    with _ENDPOINTS_LOCK:
        return _ENDPOINTS.get(server)
