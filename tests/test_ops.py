"""The ops files (ops/): alert rules checked and unit-tested by promtool, the Grafana dashboard
well-formed and naming only metric families rda exposes and docs/metrics.md documents.

promtool comes with Debian's prometheus package (``make prometheus``, run by ``make test``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "ops" / "prometheus" / "rda-alerts.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "rda-alerts.test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "rda-dashboard.json"
DOCS = ROOT / "docs" / "metrics.md"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make prometheus` installs Debian's prometheus package")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, cwd=RULES.parent
    )


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), flags=re.MULTILINE)


def test_promtool_checks_the_rules() -> None:
    done = _run("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = _run("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_fail_when_an_alert_misbehaves(tmp_path: Path) -> None:
    """Control: the unit tests can fail (a threshold moved past the test's load)."""
    rules = RULES.read_text().replace(
        "> 0.01\n        for: 5m\n        labels:\n          severity: critical",
        "> 0.5\n        for: 5m\n        labels:\n          severity: critical",
    )
    assert rules != RULES.read_text()
    (tmp_path / "rda-alerts.yml").write_text(rules)
    shutil.copy(RULE_TESTS, tmp_path / "rda-alerts.test.yml")
    done = subprocess.run(
        [promtool(), "test", "rules", "rda-alerts.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "RdaHandlerFaults" in done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    text = RULE_TESTS.read_text()
    # Each "- alertname: X" block up to the next one; a firing test lists exp_labels.
    blocks = re.split(r"^\s*- alertname: ", text, flags=re.MULTILINE)[1:]
    fired = {block.split()[0] for block in blocks if "exp_labels:" in block}
    assert sorted(fired) == sorted(alert_names())
    assert len(alert_names()) >= 15


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


def metric_names(expression: str) -> set[str]:
    """The rda_* metric names a PromQL expression reads (suffixes of histograms and counters
    taken off, to compare with the families docs/metrics.md lists)."""
    names = set(re.findall(r"\b(rda_[a-z_]+)", expression))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


def documented_families() -> set[str]:
    return set(re.findall(r"`(rda_[a-z_]+)`", DOCS.read_text()))


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "rda-overview"
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in panels if p["type"] == "row"}
    assert titles == {"Servers", "Latency", "Devices", "Subscriptions", "Recorder"}
    for panel in panels:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                # Balanced brackets: a hand edit that breaks one is caught before Grafana.
                expr = target["expr"]
                for opening, closing in ("()", "{}", "[]"):
                    assert expr.count(opening) == expr.count(closing), expr


def test_ops_files_use_only_documented_families() -> None:
    documented = documented_families()
    used: set[str] = set()
    for expression in dashboard_queries():
        used |= metric_names(expression)
    used |= metric_names(RULES.read_text())
    assert used, "no rda metric found in the ops files"
    assert used <= documented, sorted(used - documented)
