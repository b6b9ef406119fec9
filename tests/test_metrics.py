"""The Prometheus collectors and the /metrics endpoint, over real HTTP on 127.0.0.1.

A fake server supplies snapshots whose counters the test moves; the end-to-end check against
a real server is in test_admin_server.py.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from rda.admin.metrics import (
    ClientCollector,
    MetricsEndpoint,
    metrics_endpoint,
    registry_for,
    start_metrics,
    stop_metrics,
)
from rda.business.client.statistics import ClientStatistics
from rda.business.scheduler import SchedulerStatistics
from rda.business.server.statistics import (
    DURATION_BUCKETS,
    ClientSnapshot,
    HistogramSnapshot,
    ServerStatistics,
    SourceSnapshot,
)
from rda.testing import wait_until
from rda.transport.api import ClientTransportStatistics, ServerTransportStatistics


class FakeServer:
    def __init__(self) -> None:
        self.name = "MetricsServer"
        self.endpoint = "tcp://127.0.0.1:1"
        self.started_at = 1_700_000_000.0
        self.gets = 0
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)

    def uptime(self) -> float:
        return 5.0

    def settings(self) -> dict[str, object]:
        return {}

    def devices(self) -> list[str]:
        return []

    def clients(self) -> list[ClientSnapshot]:
        return []

    def sources(self) -> list[SourceSnapshot]:
        return []

    def observe_get(self, bucket: int) -> None:
        self.gets += 1
        self.durations[bucket] += 1

    def statistics(self) -> ServerStatistics:
        hist = HistogramSnapshot(
            DURATION_BUCKETS, tuple(self.durations), 0.002 * self.gets, self.gets
        )
        return ServerStatistics(
            transport=ServerTransportStatistics(
                bytes_in=100 * self.gets,
                bytes_out=50,
                peers=1,
                heartbeat_timeouts=4,
                decode_errors=2,
                notifications_conflated=6,
                messages_dropped=7,
                auth_failures=15,
                lanes=16,
            ),
            scheduler=SchedulerStatistics(3, 1, 10, 0, 8, 1, 2, 2, 9),
            requests={("get", "ok"): self.gets, ("set", "overload"): 5},
            durations={"get": hist},
            subscriptions=11,
            sources=12,
            notifications_sent=13,
            handler_errors=14,
            late_completions=0,
            clients=1,
        )

    def disconnect_client(self, peer_hex: str) -> bool:
        return False


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert isinstance(sample, Sample)
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    stop_metrics(fake)


def test_metrics_endpoint_serves_server_statistics(server: FakeServer) -> None:
    endpoint = start_metrics(server, port=0)
    assert endpoint.port > 0
    assert metrics_endpoint(server) is endpoint
    s = "MetricsServer"
    server.observe_get(3)
    first = scrape(endpoint.url)
    assert first[("rda_requests_total", (("outcome", "ok"), ("server", s), ("type", "get")))] == 1
    assert (
        first[("rda_requests_total", (("outcome", "overload"), ("server", s), ("type", "set")))]
        == 5
    )
    assert first[("rda_connected_clients", (("server", s),))] == 1
    assert first[("rda_subscriptions", (("server", s),))] == 11
    assert first[("rda_subscription_sources", (("server", s),))] == 12
    assert first[("rda_notifications_sent_total", (("server", s),))] == 13
    assert first[("rda_notifications_conflated_total", (("server", s),))] == 6
    assert first[("rda_messages_dropped_total", (("server", s),))] == 7
    assert first[("rda_auth_failures_total", (("server", s),))] == 15
    assert first[("rda_lanes", (("server", s),))] == 16
    assert first[("rda_scheduler_queued_tasks", (("server", s),))] == 3
    assert (
        first[("rda_scheduler_tasks_dropped_total", (("reason", "rejected"), ("server", s)))] == 8
    )
    assert first[("rda_heartbeat_timeouts_total", (("server", s),))] == 4
    assert first[("rda_decode_errors_total", (("server", s),))] == 2
    assert first[("rda_handler_errors_total", (("server", s),))] == 14
    assert first[("rda_server_start_time_seconds", (("server", s),))] == 1_700_000_000.0
    # The process collector rides along.
    assert any(name == "process_cpu_seconds_total" for name, _ in first)

    # Values move after more requests: counter, histogram buckets (cumulative), bytes.
    server.observe_get(3)
    server.observe_get(len(DURATION_BUCKETS))  # slower than the largest bound
    second = scrape(endpoint.url)
    get_ok = ("rda_requests_total", (("outcome", "ok"), ("server", s), ("type", "get")))
    assert second[get_ok] == 3
    bucket = "rda_request_duration_seconds_bucket"
    le_1ms = (bucket, (("le", "0.001"), ("server", s), ("type", "get")))
    le_10s = (bucket, (("le", "10.0"), ("server", s), ("type", "get")))
    le_inf = (bucket, (("le", "+Inf"), ("server", s), ("type", "get")))
    assert (first[le_1ms], second[le_1ms]) == (1, 2)
    assert second[le_10s] == 2
    assert second[le_inf] == 3
    count = ("rda_request_duration_seconds_count", (("server", s), ("type", "get")))
    assert second[count] == 3
    assert second[("rda_received_bytes_total", (("server", s),))] == 300


def test_start_twice_keeps_one_endpoint_and_stop_is_idempotent(server: FakeServer) -> None:
    endpoint = start_metrics(server, port=0)
    assert start_metrics(server, port=0) is endpoint
    stop_metrics(server)
    stop_metrics(server)
    assert metrics_endpoint(server) is None
    with pytest.raises(OSError):
        urllib.request.urlopen(endpoint.url, timeout=2)


class FakeClient:
    def __init__(self) -> None:
        self.stats = ClientStatistics(
            transport=ClientTransportStatistics(bytes_in=77, lanes=4),
            pending=2,
            gaps=3,
            reconnects=1,
        )

    def statistics(self) -> ClientStatistics:
        return self.stats


def test_client_collector() -> None:
    client = FakeClient()
    with MetricsEndpoint(registry_for(ClientCollector(client, name="cli"), process=False)) as ep:
        samples = scrape(ep.url)
        labels = (("client", "cli"),)
        assert samples[("rda_client_pending", labels)] == 2
        assert samples[("rda_client_gaps_total", labels)] == 3
        assert samples[("rda_client_reconnects_total", labels)] == 1
        assert samples[("rda_client_received_bytes_total", labels)] == 77
        assert samples[("rda_client_lanes", labels)] == 4
        client.stats = ClientStatistics(gaps=5)
        assert scrape(ep.url)[("rda_client_gaps_total", labels)] == 5
    # Closed: the port no longer answers (bounded wait: the socket closes synchronously).

    def refused() -> bool:
        try:
            urllib.request.urlopen(ep.url, timeout=1)
        except OSError:
            return True
        return False

    wait_until(refused, "the metrics endpoint to stop answering after close")
