"""The panel's rda side and its WebSocket protocol, against the demo server over real ZeroMQ.

The panel runs in this process (uvicorn on a thread, port 0); a plain WebSocket client plays
the browser, so the protocol's refusals are checked without Chromium.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("websockets")

import uvicorn
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from rda.admin import install
from rda.business.client.service import ClientService
from rda.business.directory import StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.demo import demo_builder
from rda.panel.app import create_app
from rda.panel.history import ServiceHistory
from rda.panel.session import MAX_VIEWS
from rda.panel.source import PanelSource, SetRefused, live_state
from rda.panel.views import ViewSlot
from rda.pipeline.recorder.service import Recorder, Sample
from rda.serialization.data import Data
from rda.serialization.errors import HistoryUnavailableError, RemoteError
from rda.serialization.header import DataContext
from rda.testing import wait_until


@pytest.fixture
def server() -> Iterator[Server]:
    with install(demo_builder(directory=None, rate_hz=50.0)).build() as server:
        yield server


@pytest.fixture
def source(server: Server) -> Iterator[PanelSource]:
    client = ClientService(directory=StaticDirectory({"*": server.endpoint}))
    source = PanelSource(client, "tester")
    try:
        yield source
    finally:
        source.close()
        client.close()


def test_discover_learns_devices_properties_and_facts(server: Server, source: PanelSource) -> None:
    (entry,) = source.discover()
    assert entry["endpoint"] == server.endpoint and entry["state"] == "connected"
    assert entry["error"] is None and entry["name"] == "RdaDemoServer"
    devices = {d["name"]: d["properties"] for d in entry["devices"]}
    assert set(devices) == {"PS1", "PS2", "PS3", "BPM1", "FAULTY"}
    # Each property row also carries its declared metadata (docs/server.md, "Property
    # metadata"): description, fields, alarm.
    assert [(p["name"], p["writable"]) for p in devices["PS1"]] == [
        ("Acquisition", False),
        ("Setting", True),
    ]
    assert entry["role"] == "server"
    assert {d["kind"] for d in entry["devices"]} == {"device"}
    assert entry["facts"]["clients"] >= 1 and entry["facts"]["requests"] > 0
    (again,) = source.discover()
    assert "request_rate" in again["facts"]


def test_a_stopped_server_stays_in_the_tree_marked_disconnected(
    server: Server, source: PanelSource
) -> None:
    source.discover()
    server.stop()
    (entry,) = source.discover()
    assert entry["state"] != "connected" and entry["error"]
    assert {d["name"] for d in entry["devices"]} >= {"PS1", "BPM1"}  # the last known tree


def test_the_connection_state_corrects_the_trees_state_at_once(
    server: Server, source: PanelSource
) -> None:
    (entry,) = source.discover()
    assert source.states() == {server.endpoint: "connected"}
    view = ViewSlot("v", lambda: None)
    source.attach("PS1", "Acquisition", "", view)  # something wants the server back
    server.stop()
    wait_until(lambda: source.states()[server.endpoint] != "connected", timeout=10.0)
    assert live_state(entry["state"], source.states()[server.endpoint]) in (
        "reconnecting",
        "connecting",
    )
    # Back up: the connection says so before the next discovery does.
    assert live_state("reconnecting", "connected") == "connected"
    # A state the admin replies gave (a failing server on a live connection) stands.
    assert live_state("disconnected", "connected") == "disconnected"
    assert live_state("connected", None) == "connected"


def test_the_alarm_watch_lists_errors_alarms_and_disconnections_newest_first() -> None:
    import rda
    from rda.panel.alarms import AlarmWatch

    class Magnet(rda.Device):
        @rda.prop("Current", blocking=False, fields={"i": rda.Field(units="A", alarm=(None, 8.0))})
        def current(self, request: Any) -> rda.Data:
            return rda.Data(i=0.0)

    magnet = Magnet()
    builder = demo_builder(directory=None, rate_hz=50.0).device("MAG", magnet)
    with install(builder).build() as server:
        client = ClientService(directory=StaticDirectory({"*": server.endpoint}))
        source = PanelSource(client, "tester")
        watch = AlarmWatch(source)
        try:
            described = source.describe("MAG", "Current")
            assert described is not None and described["fields"]["i"]["units"] == "A"
            watch.follow(source.discover())
            assert (
                source.feeds() == 9
            )  # every property (PS1-3 x 2, Orbit, Status, MAG): one feed each
            wait_until(lambda: watch.evaluate() or watch.summary(), timeout=10.0)
            (faulty,) = watch.summary()
            assert faulty["device"] == "FAULTY" and faulty["state"] == "error"
            assert "interlock chain open" in faulty["message"]
            # Publish only once the watch's MAG subscriber has had its FIRST (is active): an
            # update published before that is not delivered to it (docs/client.md).
            wait_until(
                lambda: any(
                    s.device == "MAG" and s.notifications_sent >= 1 for s in server.sources()
                ),
                "the MAG/Current subscriber's FIRST",
                timeout=10.0,
            )
            now = time.time_ns()
            magnet.publish(
                "Current", rda.AcquiredData(rda.Data(i=9.0), rda.DataContext("", now, now, ""))
            )
            wait_until(
                lambda: watch.evaluate() and "MAG/Current" in watch.severities(), timeout=10.0
            )
            first = watch.summary()[0]  # the newest first
            assert (first["device"], first["severity"], first["field"]) == ("MAG", "MAJOR", "i")
            assert watch.severities()["MAG/Current"] == "MAJOR"
            server.stop()
            wait_until(
                lambda: (
                    watch.evaluate() or all(r["state"] == "disconnected" for r in watch.summary())
                ),
                timeout=10.0,
            )
            rows = watch.summary()
            assert len(rows) == 9 and {r["severity"] for r in rows} == {"INVALID"}
        finally:
            watch.close()
            assert source.feeds() == 0
            source.close()
            client.close()


def test_a_set_keeps_the_current_values_types_and_logs_who_asked(
    source: PanelSource, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="rda.panel"):
        source.set("PS1", "Setting", "", {"current": "12"}, "127.0.0.1:5555")
    value = source.client.access_point("PS1", "Setting").get().data
    assert value["current"] == 12.0 and isinstance(value["current"], float)
    assert "by tester for browser 127.0.0.1:5555" in caplog.text


def test_a_refused_set_names_the_field_and_the_servers_message(source: PanelSource) -> None:
    with pytest.raises(SetRefused) as refused:
        source.set("PS1", "Setting", "", {"current": 500}, "b")
    assert refused.value.field == "current" and "less than or equal to 100" in str(refused.value)
    with pytest.raises(SetRefused) as refused:
        source.set("PS1", "Setting", "", {"current": "ten"}, "b")
    assert refused.value.field == "current"
    with pytest.raises(SetRefused) as refused:
        source.set("PS1", "Setting", "", {"voltage": 1}, "b")
    assert refused.value.field == "voltage"
    assert source.client.access_point("PS1", "Setting").get().data["current"] == 0.0


def test_views_of_one_property_share_one_subscription(source: PanelSource) -> None:
    seen = [threading.Event(), threading.Event()]
    slots = [ViewSlot(f"v{i}", seen[i].set) for i in range(2)]
    for slot in slots:
        source.attach("PS1", "Acquisition", "", slot)
    assert source.feeds() == 1
    assert all(e.wait(10) for e in seen)
    frame = slots[1].take()
    assert frame is not None and frame.status == "ok"
    source.detach("PS1", "Acquisition", "", slots[0])
    assert source.feeds() == 1
    source.detach("PS1", "Acquisition", "", slots[1])
    assert source.feeds() == 0


# -- the WebSocket protocol -------------------------------------------------------------------


@pytest.fixture
def panel_url(source: PanelSource) -> Iterator[str]:
    app = create_app(source, allow_set=False, refresh=0.2)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, name="test-panel-uvicorn")
    thread.start()
    try:
        wait_until(lambda: web.started or not thread.is_alive(), "uvicorn to start")
        assert web.started
        port = web.servers[0].sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        web.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


def _next(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        message: dict[str, Any] = json.loads(ws.recv(timeout=10))
        if message["type"] == kind:
            return message


@pytest.mark.usefixtures("no_thread_leak")
def test_the_socket_says_hello_sends_the_tree_and_refuses_bad_requests(panel_url: str) -> None:
    with connect(panel_url) as ws:
        hello = _next(ws, "hello")
        assert hello["allow_set"] is False and hello["max_fps"] == 30
        tree = _next(ws, "tree")
        while not tree["servers"]:  # sent at once, maybe before the first discovery ended
            tree = _next(ws, "tree")
        assert tree["servers"][0]["name"] == "RdaDemoServer"
        ws.send("not json")
        assert "bad request" in _next(ws, "error")["error"]
        ws.send(json.dumps({"op": "explode"}))
        assert "unknown op" in _next(ws, "error")["error"]
        ws.send(json.dumps({"op": "set", "id": 7, "device": "PS1", "property": "Setting",
                            "values": {"current": 1}}))  # fmt: skip
        reply = _next(ws, "set_result")
        assert reply["id"] == 7 and reply["ok"] is False and "--allow-set" in reply["error"]


@pytest.mark.usefixtures("no_thread_leak")
def test_a_tab_gets_frames_that_account_for_every_update_and_a_bounded_view_count(
    panel_url: str,
) -> None:
    with connect(panel_url) as ws:
        ws.send(json.dumps({"op": "open", "view": "a", "device": "PS1", "property": "Acquisition"}))
        received = folded = 0
        while received < 20:
            for frame in _next(ws, "frames")["frames"]:
                assert frame["view"] == "a" and frame["status"] == "ok"
                assert {f["name"] for f in frame["fields"]} == {"current", "set_point", "unit"}
                folded += frame["folded"]
                received = frame["received"]
        assert folded == received  # every update is in exactly one frame's count
        for i in range(MAX_VIEWS - 1):
            ws.send(json.dumps({"op": "open", "view": f"x{i}", "device": "PS2",
                                "property": "Setting"}))  # fmt: skip
        ws.send(json.dumps({"op": "open", "view": "one-too-many", "device": "PS2",
                            "property": "Setting"}))  # fmt: skip
        assert f"at most {MAX_VIEWS} views" in _next(ws, "error")["error"]


def test_a_view_off_the_tabs_screen_gets_no_frames_until_it_shows(panel_url: str) -> None:
    with connect(panel_url) as ws:
        for view in ("shown", "hidden"):
            ws.send(json.dumps({"op": "open", "view": view, "device": "PS1",
                                "property": "Acquisition"}))  # fmt: skip
        ws.send(json.dumps({"op": "show", "view": "hidden", "visible": False}))
        # Frames of the shown view keep coming: after its 20th frame, none came for the other
        # since the first two rounds (the "show" crossed at most one frame in flight).
        seen: dict[str, int] = {"shown": 0, "hidden": 0}
        while seen["shown"] < 20:
            for frame in _next(ws, "frames")["frames"]:
                seen[frame["view"]] += 1
        hidden_before = seen["hidden"]
        while seen["shown"] < 40:
            for frame in _next(ws, "frames")["frames"]:
                seen[frame["view"]] += 1
        assert seen["hidden"] == hidden_before
        ws.send(json.dumps({"op": "show", "view": "hidden", "visible": True}))
        while True:  # shown again: one frame folding every update it missed
            frames = {f["view"]: f for f in _next(ws, "frames")["frames"]}
            if "hidden" in frames:
                assert frames["hidden"]["folded"] > 1
                break


def test_a_cross_origin_page_cannot_open_the_socket(panel_url: str) -> None:
    with (
        pytest.raises(Exception, match=r"1008|403|rejected"),
        connect(
            panel_url,
            origin=Origin("http://evil.example"),
        ) as ws,
    ):
        ws.recv(timeout=5)


def test_a_denied_subscription_reaches_the_view_as_not_authorized() -> None:
    from rda.business.policy import Policy

    policy = Policy.from_dict(
        {
            "roles": ["viewer"],
            "anonymous_roles": ["viewer"],
            "rules": [
                {
                    "role": "viewer",
                    "device": "PS1",
                    "property": "Acquisition",
                    "operation": "subscribe",
                    "effect": "allow",
                },
                {"role": "*", "operation": "admin:*", "effect": "allow"},
            ],
        }
    )
    builder = install(demo_builder(directory=None)).policy(policy)
    with builder.build() as server:
        client = ClientService(directory=StaticDirectory({"*": server.endpoint}))
        source = PanelSource(client, "anonymous")
        try:
            allowed, denied = threading.Event(), threading.Event()
            ok, refused = ViewSlot("ok", allowed.set), ViewSlot("no", denied.set)
            source.attach("PS1", "Acquisition", "", ok)
            source.attach("PS1", "Setting", "", refused)
            assert allowed.wait(10) and denied.wait(10)
            frame = refused.take()
            assert frame is not None and frame.status == "error" and frame.error is not None
            assert frame.error.startswith("NotAuthorizedError: ")
            frame = ok.take()
            assert frame is not None and frame.status == "ok"
        finally:
            source.close()
            client.close()


def test_the_rda_command_has_panel_with_its_options() -> None:
    from click.testing import CliRunner

    from rda._cli import build

    result = CliRunner().invoke(build(), ["panel", "--help"])
    assert result.exit_code == 0
    for option in ("--port", "--bind", "--key", "--server-key", "--allow-set", "--history"):
        assert option in result.output


def test_a_port_in_use_is_one_line_and_exit_6() -> None:
    import socket

    from click.testing import CliRunner

    from rda._cli import build

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(build(), ["panel", "--port", str(port)])
    assert result.exit_code == 6
    assert f"cannot bind 127.0.0.1:{port}" in result.output


# -- the strip chart's past from a recorder's history service ----------------------------------


@pytest.fixture
def history_service(tmp_path: Path) -> Iterator[tuple[Recorder, ClientService]]:
    recorder = Recorder(
        tmp_path,
        recorder_id="panel",
        flush_interval=0.02,
        convert=False,
        serve=ServerBuilder("PanelHistory").directory(None),
    )
    recorder.start()  # no patterns: the test offers the rows
    assert recorder.history_server is not None
    client = ClientService(StaticDirectory({"history:*": recorder.history_server.endpoint}))
    try:
        yield recorder, client
    finally:
        client.close()
        recorder.stop()


def test_the_chart_past_comes_from_a_recorder_serving_history(
    history_service: tuple[Recorder, ClientService],
) -> None:
    recorder, client = history_service
    now = time.time_ns()
    for i in range(30):
        stamp = now - (30 - i) * 1_000_000_000
        value = Data(current=float(i), unit="A", on=True)
        assert recorder.offer(
            "PS1", "Acquisition", None, Sample(value, DataContext("C", stamp, stamp, ""))
        )
        if i == 10:
            error = RemoteError("Boom", "a failed acquisition is skipped")
            assert recorder.offer(
                "PS1", "Acquisition", None, Sample(None, DataContext(acq_stamp=stamp + 1), error)
            )
    old = now - 20 * 60 * 1_000_000_000  # outside a 10-minute window
    assert recorder.offer(
        "PS1", "Acquisition", None, Sample(Data(current=-1.0), DataContext(acq_stamp=old))
    )
    assert recorder.flush()
    past = ServiceHistory(client).series("PS1", "Acquisition", "current", 10)
    assert past["v"] == [float(i) for i in range(30)]
    assert past["t"] == sorted(past["t"]) and abs(past["t"][-1] - now / 1e9) < 2
    assert ServiceHistory(client).series("PS1", "Acquisition", "unit", 10) == {"t": [], "v": []}
    with pytest.raises(HistoryUnavailableError):
        ServiceHistory(client).series("PS9", "Acquisition", "current", 10)


def test_a_recorder_is_shown_as_a_recorder_not_as_an_empty_device(tmp_path: Path) -> None:
    recorder = Recorder(
        tmp_path,
        ["PS*/Acquisition"],  # nothing serves PS*: it records nothing, it serves history:PS*
        recorder_id="panel",
        convert=False,
        serve=install(ServerBuilder("PanelRecorder").directory(None)),  # as `rda record --serve`
    )
    recorder.start()
    try:
        assert recorder.history_server is not None
        endpoint = recorder.history_server.endpoint
        client = ClientService(directory=StaticDirectory({"history:PS*": endpoint}))
        source = PanelSource(client, "tester")
        try:
            (entry,) = source.discover()
        finally:
            source.close()
            client.close()
    finally:
        recorder.stop()
    assert entry["name"] == "PanelRecorder" and entry["role"] == "recorder"
    (device,) = entry["devices"]
    assert device["kind"] == "recorder" and device["records"] == "PS*"


def test_the_panel_reads_a_curve_server_with_its_key_file(tmp_path: Path) -> None:
    # `rda panel --key FILE --server-key KEY`: the flags' client security (client_security),
    # then the panel's discovery (admin commands) and a view, all through CURVE.
    import rda.security as security
    from rda.admin.cli.common import client_security
    from rda.business.config import Config

    server_keys, panel_keys = security.generate_keypair(), security.generate_keypair()
    key_file = tmp_path / "panel.key"
    security.save_keypair(panel_keys, key_file)
    sec = security.ServerSecurity(server_keys, clients={"panel": panel_keys.public})
    with install(demo_builder(directory=None, rate_hz=50.0)).security(sec).build() as server:
        settings = client_security(Config(), key_file, server_keys.public)
        assert settings is not None
        client = ClientService(directory=StaticDirectory({"*": server.endpoint}), security=settings)
        source = PanelSource(client, f"curve:{panel_keys.public}")
        try:
            (entry,) = source.discover()
            assert entry["state"] == "connected" and entry["error"] is None
            assert {d["name"] for d in entry["devices"]} >= {"PS1", "BPM1"}
            arrived = threading.Event()
            slot = ViewSlot("curve", arrived.set)
            source.attach("PS1", "Acquisition", "", slot)
            assert arrived.wait(10)
            frame = slot.take()
            assert frame is not None and frame.status == "ok"
            # The server knows the panel by the name its key is listed under.
            assert {c.principal for c in server.clients()} == {"panel"}
            assert server.statistics().transport.auth_failures == 0
        finally:
            source.close()
            client.close()
