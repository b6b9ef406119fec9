"""Helpers the collectors share: one-sample families, histograms, the transport's counters.

Every helper builds prometheus_client metric families from plain numbers of a statistics
snapshot, at scrape time; none keeps state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rda.business.histogram import HistogramSnapshot

__all__ = ["add_histogram", "counter", "gauge", "transport_families"]


def gauge(metric: str, help_text: str, server: str, value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(metric, help_text, labels=["server"])
    fam.add_metric([server], value)
    return fam


def counter(metric: str, help_text: str, server: str, value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(metric, help_text, labels=["server"])
    fam.add_metric([server], value)
    return fam


def add_histogram(
    family: HistogramMetricFamily, labels: list[str], hist: HistogramSnapshot
) -> None:
    family.add_metric(labels, _cumulative(hist), sum_value=float(hist.sum))


def _cumulative(hist: HistogramSnapshot) -> list[tuple[str, float]]:
    """Per-bucket counts (last one +Inf) -> Prometheus' cumulative ``le`` buckets."""
    running = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip(hist.buckets, hist.counts, strict=False):
        running += count
        out.append((repr(float(bound)), running))
    running += sum(hist.counts[len(hist.buckets) :])
    out.append(("+Inf", running))
    return out


def transport_families(
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
