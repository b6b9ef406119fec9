"""The Prometheus endpoint: custom collectors that read ``statistics()`` at scrape time.

No metric object is touched on the message path: the server counts with plain
integers in its own snapshots, and a scrape converts the latest snapshot into metric families.
A scrape therefore costs one ``statistics()`` call per server, whatever the traffic.

Names follow the Prometheus conventions: ``rda_`` prefix, base units (seconds, bytes),
``_total`` on counters (added by prometheus_client), and a ``server`` label on every family so
several servers in one process can share one registry.
"""

from __future__ import annotations

import functools
import importlib.metadata
import threading
import weakref
from collections.abc import Iterator
from typing import Any

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

from rda.admin.client_metrics import ClientCollector, HasClientStatistics
from rda.admin.device_metrics import device_families, group_families
from rda.admin.metric_families import add_histogram, counter, gauge, transport_families
from rda.admin.registry import AdminServer
from rda.business.server.statistics import ServerStatistics

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

        info = InfoMetricFamily("rda_server", "Server identity and rda version.", labels=lbl)
        info.add_metric([name], {"endpoint": server.endpoint, "version": _version()})
        yield info
        yield gauge(
            "rda_server_start_time_seconds", "Server start, UNIX time.", name, server.started_at
        )
        yield gauge(
            "rda_directory_keys_overwritten",
            "This server's directory keys (etcd) that another wrote over to point elsewhere.",
            name,
            stats.directory_keys_overwritten,
        )

        requests = CounterMetricFamily(
            "rda_requests",
            "Requests answered, by type and outcome (a closed set: docs/metrics.md).",
            labels=["server", "type", "outcome"],
        )
        for (kind, outcome), count in sorted(stats.requests.items()):
            requests.add_metric([name, kind, outcome], count)
        yield requests

        denied = CounterMetricFamily(
            "rda_requests_denied",
            "Requests refused by the authorization policy, by principal (listed in the policy, "
            "anonymous or other) and operation (get, set, subscribe, admin:<known command> or "
            "admin:unknown).",
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
            add_histogram(durations, [name, kind], hist)
        yield durations
        yield from device_families(server, stats, name)

        transport = stats.transport
        scheduler = stats.scheduler
        yield gauge("rda_connected_clients", "Clients connected now.", name, stats.clients)
        yield counter(
            "rda_connections_accepted",
            "Client connections accepted (direct lanes not counted).",
            name,
            stats.connections_accepted,
        )
        yield counter(
            "rda_connections_closed",
            "Client connections ended: disconnect, heartbeat timeout, server stop.",
            name,
            stats.connections_closed,
        )
        yield gauge("rda_subscriptions", "Active subscriptions.", name, stats.subscriptions)
        yield gauge(
            "rda_subscription_sources",
            "Distinct (device, property, selector, filters) being published.",
            name,
            stats.sources,
        )
        yield counter(
            "rda_notifications_sent",
            "Notifications sent to subscribers.",
            name,
            stats.notifications_sent,
        )
        yield counter(
            "rda_notifications_conflated",
            "Notifications replaced by a newer one for a slow client.",
            name,
            transport.notifications_conflated,
        )
        yield counter(
            "rda_messages_dropped",
            "Messages dropped because a peer's queue was full.",
            name,
            transport.messages_dropped,
        )
        yield gauge(
            "rda_peer_queue_depth",
            "Messages waiting for slow clients.",
            name,
            transport.peer_queue_depth,
        )
        yield counter(
            "rda_auth_failures",
            "Connections refused in the CURVE/ZAP handshake (no or unknown key, garbage).",
            name,
            transport.auth_failures,
        )
        yield counter(
            "rda_handler_handovers",
            "Handlers that ran on the dispatcher past handover_after (a standby took the lead).",
            name,
            transport.handovers,
        )
        yield gauge(
            "rda_scheduler_queued_tasks", "Tasks waiting in the scheduler.", name, scheduler.queued
        )
        yield gauge("rda_scheduler_running_tasks", "Tasks running now.", name, scheduler.running)
        yield gauge(
            "rda_scheduler_max_group_queue_depth",
            "Highest number of tasks any one group ever held waiting.",
            name,
            scheduler.max_queue_depth,
        )
        yield counter("rda_scheduler_tasks_executed", "Tasks run.", name, scheduler.executed)
        yield counter("rda_scheduler_tasks_failed", "Tasks that raised.", name, scheduler.failed)
        dropped = CounterMetricFamily(
            "rda_scheduler_tasks_dropped",
            "Tasks not run because a group queue was full, by reason.",
            labels=["server", "reason"],
        )
        dropped.add_metric([name, "rejected"], scheduler.rejected)
        dropped.add_metric([name, "dropped_oldest"], scheduler.dropped_oldest)
        dropped.add_metric([name, "dropped_newest"], scheduler.dropped_newest)
        yield dropped
        in_alarm = GaugeMetricFamily(
            "rda_properties_in_alarm",
            "Properties with declared alarm limits whose last value is in alarm, by severity "
            "(minor, major, invalid).",
            labels=["server", "severity"],
        )
        for severity in ("minor", "major", "invalid"):
            in_alarm.add_metric([name, severity], stats.properties_in_alarm.get(severity, 0))
        yield in_alarm
        yield from group_families(server, stats, name)
        yield from transport_families(transport, name, lbl)
        yield from _error_families(stats, name)


def _error_families(stats: ServerStatistics, name: str) -> Iterator[Metric]:
    yield counter(
        "rda_handler_errors",
        "Exceptions raised by handlers that are not a typed client error (server faults).",
        name,
        stats.handler_errors,
    )
    yield counter(
        "rda_late_completions",
        "Requests completed after they were already answered (e.g. past their deadline).",
        name,
        stats.late_completions,
    )
    arrays = CounterMetricFamily(
        "rda_array_replies",
        "Get replies with big writable arrays: sent zero-copy (nothing else held them) or "
        "with a copy.",
        labels=["server", "copy"],
    )
    arrays.add_metric([name, "zero"], stats.zero_copy_replies)
    arrays.add_metric([name, "copied"], stats.copied_replies)
    yield arrays


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("rda")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
    client: HasClientStatistics, port: int = 0, host: str = "127.0.0.1", name: str = "client"
) -> MetricsEndpoint:
    """Serve a ``ClientService``'s metrics (label ``client=name``); close the endpoint when
    done (``with start_client_metrics(client) as endpoint: ...``)."""
    return MetricsEndpoint(registry_for(ClientCollector(client, name)), port=port, host=host)


def metrics_endpoint(server: AdminServer) -> MetricsEndpoint | None:
    """The running metrics endpoint of ``server`` (its ``.port``/``.url``), if any."""
    with _ENDPOINTS_LOCK:
        return _ENDPOINTS.get(server)
