"""Panel layouts without a browser: the pydantic model, ``POST /api/layout``, ``--layout`` and
``--kiosk`` on the command line (the browser side is in tests/test_panel_browser.py)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")

from click.testing import CliRunner

with warnings.catch_warnings():
    # Starlette's test client warns that it will move to httpx2: still the documented way to
    # drive an app's HTTP and WebSocket routes in one process.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from rda._cli import build
from rda.business.client.service import ClientService
from rda.business.directory import StaticDirectory
from rda.panel.app import create_app
from rda.panel.layout import (
    MAX_LAYOUT_BYTES,
    Layout,
    LayoutError,
    load_layout,
    parse_layout,
)
from rda.panel.session import MAX_VIEWS
from rda.panel.source import PanelSource

GOOD: dict[str, Any] = {
    "version": 1,
    "title": "PS wall",
    "time_zone": "local",
    "columns": 2,
    "views": [
        {"device": "PS1", "property": "Acquisition", "selector": "CPS.USER.MD1"},
        {"device": "BPM1", "property": "Orbit", "images": {"orbit": "lines"}},
    ],
    "chart": {
        "window": 60,
        "series": [{"device": "PS1", "property": "Acquisition", "field": "current"}],
    },
}


def test_a_layout_round_trips_and_fills_its_defaults() -> None:
    layout = parse_layout(json.dumps(GOOD))
    assert layout.views[0].selector == "CPS.USER.MD1" and layout.views[1].selector == ""
    assert layout.views[1].images == {"orbit": "lines"}
    assert layout.chart.series[0].selector == ""
    assert parse_layout(json.dumps(layout.model_dump())) == layout
    empty = parse_layout("{}")
    assert empty == Layout() and empty.chart.window == 300 and empty.time_zone == "utc"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"views": [{"device": "PS1"}]}, "views.0.property: Field required"),
        ({"views": [{"device": "", "property": "P"}]}, "views.0.device"),
        ({"chart": {"window": 42}}, "chart.window"),
        ({"time_zone": "Mars"}, "time_zone"),
        ({"columns": 0}, "columns"),
        ({"version": 2}, "version"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"views": [{"device": "D", "property": "P", "images": {"a": "3d"}}]}, "images.a"),
        (
            {"views": [{"device": "D", "property": "P"}] * (MAX_VIEWS + 1)},
            "views: List should have at most",
        ),
    ],
)
def test_a_bad_layout_says_what_and_where(change: dict[str, Any], says: str) -> None:
    with pytest.raises(LayoutError, match="not a panel layout") as caught:
        parse_layout(json.dumps({**GOOD, **change}))
    assert says in str(caught.value)


def test_not_json_too_big_or_missing_is_a_layout_error(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="not JSON"):
        parse_layout("{views: []")
    with pytest.raises(LayoutError, match="at most"):
        parse_layout(" " * (MAX_LAYOUT_BYTES + 1))
    with pytest.raises(LayoutError, match=r"missing\.json"):
        load_layout(tmp_path / "missing.json")
    path = tmp_path / "wall.json"
    path.write_text(json.dumps(GOOD))
    assert load_layout(path).title == "PS wall"


@pytest.fixture
def web() -> Iterator[TestClient]:
    client = ClientService(directory=StaticDirectory({}))
    try:
        layout = parse_layout(json.dumps(GOOD))
        app = create_app(
            PanelSource(client, "t"), hosts=frozenset({"testserver"}), layout=layout, kiosk=True
        )
        yield TestClient(app)  # no lifespan: nothing to discover
    finally:
        client.close()


def test_the_panel_checks_a_layout_from_the_browser(web: TestClient) -> None:
    reply = web.post("/api/layout", content=json.dumps(GOOD))
    assert reply.status_code == 200
    assert reply.json() == parse_layout(json.dumps(GOOD)).model_dump()
    bad = web.post("/api/layout", content=json.dumps({"views": [{"device": "PS1"}]}))
    assert bad.status_code == 400 and "views.0.property" in bad.json()["error"]
    huge = web.post("/api/layout", content=b" " * (MAX_LAYOUT_BYTES + 10))
    assert huge.status_code == 413
    assert web.get("/api/layout").status_code == 405  # only checked, never stored or served


def test_kiosk_and_layout_reach_every_tab_and_kiosk_refuses_sets(web: TestClient) -> None:
    with web.websocket_connect("/ws") as ws:
        hello = ws.receive_json()
        assert hello["type"] == "hello" and hello["kiosk"] is True
        assert hello["allow_set"] is False  # kiosk wins over allow_set
        assert hello["layout"]["title"] == "PS wall"
        ws.send_json({"op": "set", "id": 1, "device": "PS1", "property": "Setting", "values": {}})
        while (reply := ws.receive_json())["type"] != "set_result":
            pass
        assert reply["ok"] is False and "disabled" in reply["error"]


def test_rda_panel_layout_refuses_a_bad_file_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"views": [{"device": "PS1"}]}))
    result = CliRunner().invoke(build(), ["panel", "--port", "0", "--layout", str(bad)])
    assert result.exit_code == 2, result.output
    assert "--layout" in result.output and "views.0.property: Field required" in result.output
    result = CliRunner().invoke(build(), ["panel", "--layout", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "none.json" in result.output
    help_text = CliRunner().invoke(build(), ["panel", "--help"]).output
    assert "--layout" in help_text and "--kiosk" in help_text
