"""Prometheus metrics of a recorder, read from ``Recorder.statistics()`` at scrape time.

Nothing is counted through prometheus_client on the recording path: a scrape
turns one statistics snapshot into metric families. Every family carries a ``recorder`` label
so several recorders in one process can share a registry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from rda.pipeline.recorder.service import RecorderStatistics

__all__ = ["RecorderCollector", "RecorderMetricsEndpoint", "start_recorder_metrics"]

_STATES = ("created", "running", "error", "stopped")
_COUNTERS = {
    "received": ("rda_recorder_rows_received", "Rows taken from the queue (each got a seq)."),
    "overflow": ("rda_recorder_overflow", "Notifications refused because the queue was full."),
    "gaps": ("rda_recorder_gaps", "Updates the subscriptions reported as missed."),
    "acked_rows": ("rda_recorder_rows_acked", "Rows durable in the journal."),
    "segments_written": ("rda_recorder_segments_written", "Journal segments written."),
    "bytes_written": ("rda_recorder_journal_bytes", "Bytes of journal segments written."),
    "write_errors": ("rda_recorder_write_errors", "Failed journal writes (disk full, permission)."),
    "schema_changes": ("rda_recorder_schema_changes", "Type changes that opened a schema version."),
    "converted_segments": ("rda_recorder_segments_converted", "Segments converted to Parquet."),
    "parquet_files": ("rda_recorder_parquet_files_written", "Parquet files written."),
    "conversion_errors": ("rda_recorder_conversion_errors", "Failed conversions."),
    "missing_acq_stamps": (
        "rda_recorder_missing_acq_stamps",
        "Value rows sent without an acquisition stamp (stored at their receive time).",
    ),
    "repeated_first": (
        "rda_recorder_repeated_first",
        "FIRST updates not stored: they repeat a stored row (same stamp and value).",
    ),
    "compacted_files": ("rda_recorder_compacted_files", "Files written by compaction."),
    "compaction_inputs_removed": (
        "rda_recorder_compaction_inputs_removed",
        "Small files deleted once their compacted output was durable.",
    ),
    "partitions_deleted": (
        "rda_recorder_partitions_deleted",
        "Day partitions deleted for being older than --keep.",
    ),
    "compaction_errors": ("rda_recorder_compaction_errors", "Failed compaction rounds."),
}
_GAUGES = {
    "queue_depth": ("rda_recorder_queue_depth", "Notifications waiting in the queue."),
    "queue_limit": ("rda_recorder_queue_limit", "Capacity of the queue."),
    "pending_rows": ("rda_recorder_pending_rows", "Rows waiting for their journal segment."),
    "acked_seq": ("rda_recorder_acked_seq", "Highest acknowledged seq."),
    "lag_seconds": ("rda_recorder_lag_seconds", "Age of the oldest unacknowledged row."),
    "subscriptions": ("rda_recorder_subscriptions", "Open subscriptions."),
}


class _HasStatistics(Protocol):
    def statistics(self) -> RecorderStatistics: ...


class RecorderCollector(Collector):
    """A custom collector over one recorder's statistics snapshot."""

    def __init__(self, recorder: _HasStatistics) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        stats = self._recorder.statistics()
        labels = [stats.recorder_id]
        for attribute, (name, doc) in _COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=["recorder"])
            counter.add_metric(labels, float(getattr(stats, attribute)))
            yield counter
        for attribute, (name, doc) in _GAUGES.items():
            gauge = GaugeMetricFamily(name, doc, labels=["recorder"])
            gauge.add_metric(labels, float(getattr(stats, attribute)))
            yield gauge
        state = GaugeMetricFamily(
            "rda_recorder_state",
            "1 for the recorder's current state.",
            labels=["recorder", "state"],
        )
        for name in _STATES:
            state.add_metric([stats.recorder_id, name], 1.0 if stats.state == name else 0.0)
        yield state


class RecorderMetricsEndpoint:
    """A running ``/metrics`` HTTP endpoint; ``close()`` stops it (idempotent)."""

    def __init__(self, port: int, addr: str, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        self.port = int(self._server.server_port)
        self._closed = threading.Event()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5.0)


def start_recorder_metrics(
    recorder: _HasStatistics, port: int, addr: str = "127.0.0.1"
) -> RecorderMetricsEndpoint:
    """Serve the recorder's metrics on ``http://addr:port/metrics`` (port 0: any free port)."""
    registry = CollectorRegistry()
    registry.register(RecorderCollector(recorder))
    return RecorderMetricsEndpoint(port, addr, registry)
