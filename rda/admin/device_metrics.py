"""Per-device metric families of a server, each label bounded by the server's configuration.

A (device, property) pair has figures of its own once it answered ``ok`` and while fewer than
``Config.metrics_devices`` pairs have them (``RequestCounters``); everything else is the pair
(``other``, ``other``). The notification families reuse the same pairs, and the per-group
queue depth names only the server's own devices (and the admin group): a client cannot mint
a series by sending a name. docs/metrics.md has the cardinality arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rda.admin.metric_families import add_histogram, gauge
from rda.admin.registry import AdminServer
from rda.business.histogram import OTHER
from rda.business.server.dispatch import ADMIN_GROUP
from rda.business.server.statistics import ServerStatistics

__all__ = ["device_families", "group_families"]

_PAIR = ["server", "device", "property"]


def device_families(server: AdminServer, stats: ServerStatistics, name: str) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "rda_device_requests", "Requests answered, by device and property.", labels=_PAIR
    )
    errors = CounterMetricFamily(
        "rda_device_errors",
        "Requests answered with an error (any outcome but ok), by device and property.",
        labels=_PAIR,
    )
    durations = HistogramMetricFamily(
        "rda_device_request_duration_seconds",
        "Time from a request's arrival to its reply, by device and property.",
        labels=_PAIR,
    )
    tracked: set[tuple[str, str]] = set()
    for pair in stats.devices:
        labels = [name, pair.device, pair.property]
        tracked.add((pair.device, pair.property))
        requests.add_metric(labels, pair.requests)
        errors.add_metric(labels, pair.errors)
        add_histogram(durations, labels, pair.durations)
    yield requests
    yield errors
    yield durations
    yield gauge(
        "rda_device_pairs",
        "(device, property) pairs with metrics of their own (the other pair not counted).",
        name,
        max(0, len(tracked) - 1),
    )
    yield gauge(
        "rda_device_pairs_limit",
        "Most (device, property) pairs with metrics of their own (Config.metrics_devices).",
        name,
        stats.device_limit,
    )
    yield from _notification_families(server, tracked, name)


def _notification_families(
    server: AdminServer, tracked: set[tuple[str, str]], name: str
) -> Iterator[Metric]:
    sent: dict[tuple[str, str], int] = {(OTHER, OTHER): 0}
    conflated: dict[tuple[str, str], int] = {(OTHER, OTHER): 0}
    for source in server.sources():
        key = (source.device, source.property)
        if key not in tracked:
            key = (OTHER, OTHER)
        sent[key] = sent.get(key, 0) + source.notifications_sent
        conflated[key] = conflated.get(key, 0) + source.conflated
    sent_family = CounterMetricFamily(
        "rda_property_notifications_sent",
        "Notifications handed to the transport for current subscriptions, by property.",
        labels=_PAIR,
    )
    conflated_family = CounterMetricFamily(
        "rda_property_notifications_conflated",
        "Notifications of current subscriptions replaced by a newer one for a slow client.",
        labels=_PAIR,
    )
    for (device, prop), count in sorted(sent.items()):
        sent_family.add_metric([name, device, prop], count)
        conflated_family.add_metric([name, device, prop], conflated.get((device, prop), 0))
    yield sent_family
    yield conflated_family


def group_families(server: AdminServer, stats: ServerStatistics, name: str) -> Iterator[Metric]:
    """Tasks waiting in the busiest scheduler groups (``BUSIEST_GROUPS`` at most); a group
    that is not one of the server's devices (a request's made-up name) counts as other."""
    own = set(server.devices())
    own.add(ADMIN_GROUP)
    depths: dict[str, int] = {}
    for group, depth in stats.scheduler.busiest:
        label = group if group in own else OTHER
        depths[label] = depths.get(label, 0) + depth
    family = GaugeMetricFamily(
        "rda_scheduler_group_queue_depth",
        "Tasks waiting in the busiest device groups now (at most 10 groups; 0 when idle).",
        labels=["server", "group"],
    )
    # The other series is always there (0 when idle), so it never appears late.
    family.add_metric([name, OTHER], depths.pop(OTHER, 0))
    for group, depth in sorted(depths.items()):
        family.add_metric([name, group], depth)
    yield family
