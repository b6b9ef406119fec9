"""rda's endpoints checked by Prometheus' own tools (issue 25).

- ``promtool check metrics`` on the server's, a client's and a recorder's exposition while
  they work;
- a real Prometheus (its own config and data directory under the test's tmp dir, 127.0.0.1,
  a free port, 1 s scrapes, the ops alert rules loaded) scrapes a demo server and a client
  under a known load; its HTTP API then answers ``rate(rda_requests_total[...])`` and a
  ``histogram_quantile`` consistent with that load, runs every dashboard query, and evaluates
  every alert rule without error.

Waits are bounded polls of Prometheus' own API; the process is stopped by its pid.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import rda.admin
from rda.admin.metrics import MetricsEndpoint, metrics_endpoint, start_client_metrics
from rda.business.client.service import ClientService
from rda.business.directory import StaticDirectory
from rda.business.histogram import DURATION_BUCKETS
from rda.business.server.builder import Server
from rda.demo import demo_builder
from rda.pipeline.recorder.metrics import start_recorder_metrics
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.errors import RdaError
from rda.testing import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "ops" / "prometheus" / "rda-alerts.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "rda-dashboard.json"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: `make prometheus` installs Debian's prometheus package")
    return path


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()  # type: ignore[no-any-return]


def _check_metrics(text: str) -> None:
    done = subprocess.run(
        [_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@dataclass
class Load:
    """Blocking gets (and a failing one now and then) from a client thread until stopped;
    counts what it sent and the longest round trip it saw."""

    client: ClientService
    ok: int = 0
    faults: int = 0
    longest: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="test-load", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        setting = self.client.access_point("PS1", "Setting")
        faulty = self.client.access_point("FAULTY", "Status")
        while not self.stop.is_set():
            started = time.perf_counter()
            setting.get(timeout=10)
            self.longest = max(self.longest, time.perf_counter() - started)
            self.ok += 1
            if self.ok % 50 == 0:
                with pytest.raises(RdaError):
                    faulty.get(timeout=10)
                self.faults += 1
            time.sleep(0.002)  # a steady load, not a flood of the 2-core machine

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(10)
        assert not self.thread.is_alive()


@dataclass
class Demo:
    server: Server
    client: ClientService
    client_metrics: MetricsEndpoint

    @property
    def server_url(self) -> str:
        endpoint = metrics_endpoint(self.server)
        assert endpoint is not None
        return endpoint.url


@pytest.fixture
def demo() -> Iterator[Demo]:
    builder = demo_builder(directory=None, rate_hz=20.0).metrics_port(0)
    server = rda.admin.install(builder).build().start()
    client = ClientService(directory=StaticDirectory({"*": server.endpoint}))
    endpoint = start_client_metrics(client, port=0, name="load")
    try:
        yield Demo(server, client, endpoint)
    finally:
        endpoint.close()
        client.close()
        server.stop()


def test_promtool_accepts_the_server_and_client_exposition_under_load(demo: Demo) -> None:
    load = Load(demo.client)
    sub = demo.client.access_point("PS2", "Acquisition").subscribe()
    load.start()
    try:
        wait_until(lambda: load.ok >= 100 and load.faults >= 1, "some load", timeout=30.0)
        server_text = _get(demo.server_url)
        client_text = _get(demo.client_metrics.url)
    finally:
        load.finish()
        sub.close()
    assert 'rda_device_requests_total{device="PS1",property="Setting"' in server_text
    assert 'outcome="handler_error",server="RdaDemoServer",type="get"}' in server_text
    assert 'rda_client_round_trip_seconds_bucket{client="load"' in client_text
    _check_metrics(server_text)
    _check_metrics(client_text)
    docs = (ROOT / "docs" / "metrics.md").read_text()
    exposed = set(re.findall(r"^# TYPE (rda_client_\w+) ", client_text, flags=re.MULTILINE))
    assert exposed and not {f for f in exposed if f"`{f}" not in docs}, exposed


def test_promtool_accepts_the_recorder_exposition_under_load(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "store", recorder_id="r1")
    recorder.start()
    endpoint = start_recorder_metrics(recorder, 0)
    stop = threading.Event()

    def offer() -> None:
        i = 0
        while not stop.is_set():
            recorder.offer("PS1", "Acq", None, Sample(Data(x=i)))
            i += 1
            time.sleep(0.001)

    writer = threading.Thread(target=offer, name="test-recorder-load", daemon=True)
    writer.start()
    try:
        wait_until(lambda: recorder.statistics().acked_rows > 50, "rows acknowledged", timeout=30.0)
        text = _get(f"http://127.0.0.1:{endpoint.port}/metrics")
    finally:
        stop.set()
        writer.join(10)
        endpoint.close()
        recorder.stop()
    assert "rda_recorder_rows_acked_total" in text
    _check_metrics(text)


class Prometheus:
    """A Prometheus server of the test's own: config and data under ``folder``."""

    def __init__(self, folder: Path, targets: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # JSON is YAML: no YAML library needed to write the configuration.
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "metrics_path": urllib.parse.urlsplit(url).path,
                    "static_configs": [{"targets": [urllib.parse.urlsplit(url).netloc]}],
                }
                for job, url in targets.items()
            ],
        }
        config_file = folder / "prometheus.yml"
        config_file.write_text(json.dumps(config))
        self.log_file = folder / "prometheus.log"
        self._log = self.log_file.open("w")
        self.process = subprocess.Popen(
            [
                _tool("prometheus"),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.console.templates=",
                "--web.console.libraries=",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_file.read_text()[-3000:]}")
        try:
            return _get(f"{self.url}/-/ready").startswith("Prometheus Server is Ready")
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        reply = json.loads(_get(f"{self.url}/api/v1/{path}?{query}"))
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expression)
        assert data["resultType"] == "vector", data
        return data["result"]  # type: ignore[no-any-return]

    def value(self, expression: str) -> float | None:
        result = self.query(expression)
        return None if not result else float(result[0]["value"][1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_a_real_prometheus_scrapes_a_demo_server_under_load(demo: Demo, tmp_path: Path) -> None:
    prometheus = Prometheus(
        tmp_path, {"rda": demo.server_url, "rda-client": demo.client_metrics.url}
    )
    load = Load(demo.client)
    try:
        wait_until(prometheus.ready, "prometheus ready", timeout=30.0)
        wait_until(
            lambda: prometheus.value('sum(up{job=~"rda.*"})') == 2.0,
            "both rda targets scraped",
            timeout=30.0,
        )
        load.start()
        ok = 'rda_requests_total{job="rda", type="get", outcome="ok"}'
        # At least three scrapes that saw the counter move, the load still running.
        wait_until(
            lambda: (prometheus.value(f"changes({ok}[20s])") or 0) >= 3,
            "three scrapes",
            timeout=30.0,
        )

        rate = prometheus.query(f"rate({ok}[10s])")
        assert len(rate) == 1 and float(rate[0]["value"][1]) > 0
        assert rate[0]["metric"]["server"] == "RdaDemoServer"

        quantile = prometheus.value(
            "histogram_quantile(0.5, sum by (le) "
            '(rate(rda_request_duration_seconds_bucket{job="rda", type="get"}[10s])))'
        )
        assert quantile is not None and math.isfinite(quantile) and quantile > 0
        # Every server-side duration is shorter than the client's round trip, so the estimate
        # cannot pass the first bucket bound at or above the longest round trip seen so far.
        longest = load.longest
        bound = next((b for b in DURATION_BUCKETS if b >= longest), math.inf)
        assert quantile <= bound, (quantile, longest)

        per_device = prometheus.query(
            "histogram_quantile(0.99, sum by (le, device, property) (rate("
            'rda_device_request_duration_seconds_bucket{job="rda", device="PS1"}[10s])))'
        )
        assert [r["metric"]["property"] for r in per_device] == ["Setting"]
        client_side = prometheus.value(
            "histogram_quantile(0.5, sum by (le) "
            '(rate(rda_client_round_trip_seconds_bucket{job="rda-client", type="get"}[10s])))'
        )
        assert client_side is not None and client_side > 0
    finally:
        if load.thread is not None:
            load.finish()
    try:
        # Load stopped: the last scrape must show exactly what the client sent.
        wait_until(
            lambda: prometheus.value(ok) == float(load.ok),
            f"{load.ok} gets in prometheus",
            timeout=30.0,
        )
        faults = 'rda_requests_total{job="rda", type="get", outcome="handler_error"}'
        wait_until(
            lambda: prometheus.value(faults) == float(load.faults), "the faults", timeout=30.0
        )
        assert prometheus.value('rda_handler_errors_total{job="rda"}') == float(load.faults)

        # Every dashboard query is valid PromQL for this Prometheus.
        for expression in _dashboard_queries():
            concrete = expression.replace("$server", ".*").replace("$__rate_interval", "10s")
            prometheus.api("query", query=concrete)

        # Every alert rule is evaluated on the real series without error.
        def evaluated() -> list[dict[str, Any]] | None:
            rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            return rules if all(r["health"] != "unknown" for r in rules) else None

        rules = wait_until(evaluated, "every rule evaluated", timeout=30.0)
        assert {r["health"] for r in rules} == {"ok"}, [r for r in rules if r["health"] != "ok"]
        # The demo's FAULTY device faults 1 request in 51 (2 %): above RdaHandlerFaults' 1 %.
        pending = {r["name"]: r["state"] for r in rules}
        assert pending["RdaHandlerFaults"] in {"pending", "firing"}
        assert pending["RdaTargetDown"] == "inactive"
    finally:
        prometheus.stop()
