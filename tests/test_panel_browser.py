"""``rda panel`` in a real browser: Debian's Chromium driven by Playwright, against the demo.

One stand per module (the demo server and a panel as processes, heartbeat timeout 2 s, free
ports, their logs in the module's tmp folder) and one browser; each test opens its own page.
On failure a test leaves ``failure.png`` and ``console.log`` in its tmp folder. Every request
the pages make is checked to stay on 127.0.0.1.

With ``RDA_PANEL_SCREENSHOTS=DIR`` (``make panel-screenshots``) the tests also save the
screenshots that docs/panel.md shows.
"""

from __future__ import annotations

import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from rda.testing import free_port

CHROMIUM = Path("/usr/bin/chromium")
# Fail, not skip, without the browser (as the etcd and Prometheus tests do without theirs):
# `make install` installs it, and a silently skipped browser suite would hide a broken setup.
if not CHROMIUM.exists():
    pytest.fail("needs /usr/bin/chromium: run `make chromium`", pytrace=False)

SHOTS = os.environ.get("RDA_PANEL_SCREENSHOTS")
WAIT = 15_000  # ms: generous bound for what a loaded 2-core machine needs to show something


class _Lines:
    """A process's stdout, line by line, read by a thread (copied to ``log``): a bounded wait
    on a pipe needs it, since a buffered reader may hold lines that select() cannot see."""

    def __init__(self, proc: subprocess.Popen[str], log: IO[str]) -> None:
        self.proc = proc
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(log,), daemon=True)
        self._thread.start()

    def _read(self, log: IO[str]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            log.write(line)
            log.flush()
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, needle: str, timeout: float) -> str:
        """The first line containing ``needle``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"no {needle!r} from {self.proc.args!r} in {timeout} s"
                ) from None
            if line is None:
                raise RuntimeError(
                    f"{self.proc.args!r} exited ({self.proc.wait()}) before {needle!r}"
                )
            if needle in line:
                return line

    def join(self) -> None:
        self._thread.join(10)


class Stand:
    """The demo server (restartable on the same port) and a panel, in ``folder``."""

    def __init__(self, folder: Path, heartbeat_timeout: float = 2.0) -> None:
        self.folder = folder
        self.heartbeat_timeout = heartbeat_timeout
        self.env = {
            **os.environ,
            "RDA_DIRECTORY_FILE": str(folder / "directory.json"),
            "RDA_HEARTBEAT_INTERVAL": str(heartbeat_timeout / 4),
            "RDA_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
            "RDA_RECONNECT_MAX": "0.5",
            "PYTHONUNBUFFERED": "1",
        }
        self.server_port = free_port()
        self.server: subprocess.Popen[str] | None = None
        self.panel: subprocess.Popen[str] | None = None
        self.url = ""
        self._logs: list[IO[str]] = []
        self._readers: list[_Lines] = []
        self._extra: list[subprocess.Popen[str]] = []

    def spawn(self, name: str, *args: str) -> tuple[subprocess.Popen[str], _Lines]:
        log = (self.folder / f"{name}.log").open("a")
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rda._cli", *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
            cwd=self.folder,
        )
        lines = _Lines(proc, log)
        self._readers.append(lines)
        return proc, lines

    def start_server(self, *extra: str) -> None:
        endpoint = f"tcp://127.0.0.1:{self.server_port}"
        self.server, lines = self.spawn("server", "serve", "demo", "--bind", endpoint, *extra)
        lines.wait_for("endpoint", 30.0)

    def start_pausable(self, port: int) -> tuple[subprocess.Popen[str], _Lines]:
        """The PAUSABLE server on ``port``, once it serves."""
        log = (self.folder / "pausable.log").open("a")
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-c", PAUSABLE, f"tcp://127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
            cwd=self.folder,
        )
        self._extra.append(proc)
        lines = _Lines(proc, log)
        self._readers.append(lines)
        lines.wait_for("endpoint", 30.0)
        return proc, lines

    def kill_server(self) -> None:
        """SIGKILL: the server vanishes without a goodbye, as a crashed one does."""
        assert self.server is not None
        self.server.kill()
        self.server.wait(10)
        self.server = None

    def start_panel(self, *extra: str) -> str:
        self.panel, lines = self.spawn("panel", "panel", "--port", "0", *extra)
        line = lines.wait_for("rda panel:", 30.0)
        self.url = line.split()[2]
        return self.url

    def close(self) -> None:
        for proc in (self.panel, self.server, *self._extra):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for reader in self._readers:
            reader.join()
        for log in self._logs:
            log.close()
        self.panel = self.server = None


# A server of its own for the staleness and alarm tests, started and killed by pid: TICK/Value
# published at 10 Hz, paused and resumed by SIGUSR1 (it says "paused"/"publishing"), and a
# settable TICK/Setting with metadata (A, 2 digits, limits -10..10, MINOR above 5, MAJOR above
# 8). Registered in the stand's file directory, as the demo is.
PAUSABLE = """
import signal, sys, threading, time
from pydantic import BaseModel
import rda
from rda.admin import install

class Level(BaseModel):
    level: float = 0.0

class Ticker(rda.Device):
    def __init__(self):
        super().__init__()
        self.count = 0
        self.level = 0.0

    @rda.prop("Value", blocking=False)
    def value(self, request):
        return rda.Data(value=self.count + 1 / 3, count=self.count)

    @rda.prop("Setting", schema=Level, blocking=False, fields={"level": rda.Field(
        units="A", precision=2, limits=(-10.0, 10.0), warning=(None, 5.0), alarm=(None, 8.0))})
    def setting(self, request):
        return rda.Data(level=self.level)

    @setting.setter
    def write_setting(self, value, request):
        self.level = value.level

toggled, done = threading.Event(), threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: toggled.set())
signal.signal(signal.SIGTERM, lambda *_: done.set())
device = Ticker()
builder = install(rda.ServerBuilder("PausableServer").endpoint(sys.argv[1]).device("TICK", device))
with builder.build() as server:
    print("endpoint", server.endpoint, flush=True)
    paused = False
    while not done.wait(0.1):
        if toggled.is_set():
            toggled.clear()
            paused = not paused
            print("paused" if paused else "publishing", flush=True)
        if not paused:
            device.count += 1
            now = time.time_ns()
            data = rda.Data(value=device.count + 1 / 3, count=device.count)
            device.publish("Value", rda.AcquiredData(data, rda.DataContext("", now, now, "")))
"""


PAST = 120  # recorded PS1/Acquisition values, one every 2 s up to a few seconds ago


def record_past(root: Path) -> Path:
    """A recorder store holding the last 4 minutes of PS1/Acquisition (a slow sine)."""
    from rda.pipeline.recorder.service import Recorder, Sample
    from rda.serialization.data import Data
    from rda.serialization.header import DataContext

    recorder = Recorder(root, recorder_id="panel-test", convert=True, convert_interval=3600.0)
    recorder.start()
    now = time.time_ns()
    try:
        for i in range(PAST):
            stamp = now - (PAST - i) * 2_000_000_000
            value = 2.0 * math.sin(i / 8)  # 0.0 first: the test finds it in the CSV
            sample = Sample(Data(current=value, unit="A"), DataContext("C", stamp, stamp, ""))
            assert recorder.offer("PS1", "Acquisition", None, sample)
        assert recorder.flush()
    finally:
        recorder.stop()
    return root


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stand() -> Iterator[Stand]:
    # Its own folder, not pytest's tmp_path: pytest prunes old tmp folders of other runs
    # (other test sessions on the machine), and these processes live in theirs.
    with tempfile.TemporaryDirectory(prefix="rda-panel-stand-") as folder:
        stand = Stand(Path(folder))
        try:
            store = record_past(stand.folder / "store")
            stand.start_server()
            stand.start_panel("--allow-set", "--history", str(store))
            yield stand
        finally:
            stand.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(
    stand: Stand, browser: Browser, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    page = context.new_page()
    console: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(stand.url)
    try:
        yield page
    finally:
        call = getattr(request.node, "rep_call", None)  # set by tests/conftest.py
        if call is None or call.failed:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            (tmp_path / "console.log").write_text("\n".join(console) + "\n")
            for log in stand.folder.glob("*.log"):
                (tmp_path / log.name).write_text(log.read_text())
        context.close()
    outside = [u for u in requests if urlsplit(u).hostname not in ("127.0.0.1", None)]
    assert not outside, f"the page reached outside 127.0.0.1: {outside}"
    assert not [c for c in console if c.startswith("pageerror")], console


def shot(page: Page, name: str) -> None:
    """A screenshot for docs/panel.md, only when RDA_PANEL_SCREENSHOTS names a folder."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def open_view(page: Page, address: str) -> Any:
    page.locator(f'[data-prop="{address}"]').click()
    view = page.locator(f'article[data-view="{address}"]')
    expect(view.get_by_test_id("view-head")).to_have_class("view-head status-ok", timeout=WAIT)
    return view


# -- tests ---------------------------------------------------------------------------------


def test_tree_shows_the_demo_devices_and_the_server_state(page: Page) -> None:
    for address in ("PS1/Acquisition", "PS1/Setting", "PS3/Setting", "BPM1/Orbit", "FAULTY/Status"):
        expect(page.locator(f'[data-prop="{address}"]')).to_be_visible(timeout=WAIT)
    server = page.locator('[data-server="RdaDemoServer"]')
    expect(server.get_by_test_id("server-state")).to_have_text("connected")
    expect(server.locator(".facts")).to_contain_text("clients")
    # The filter box narrows the tree.
    page.locator("#filter").fill("orbit")
    expect(page.locator('[data-prop="BPM1/Orbit"]')).to_be_visible()
    expect(page.locator('[data-prop="PS1/Acquisition"]')).to_have_count(0)


def test_acquisition_shows_a_value_that_changes_and_takes_a_selector(
    stand: Stand, page: Page
) -> None:
    view = open_view(page, "PS1/Acquisition")
    current = view.locator('tr[data-field="current"] td.fvalue')
    expect(current).not_to_be_empty()
    first = current.inner_text()
    # 10 Hz of noisy measurements: a new value well within 2 s.
    expect(current).not_to_have_text(first, timeout=2_000)
    expect(view.locator('tr[data-field="current"] td.ftype')).to_have_text("float64")
    expect(view.locator('tr[data-field="unit"] td.fvalue')).to_have_text('"A"')
    # The demo declares the current's precision (4) and units: "-0.0039 A", the full value in
    # the cell's tooltip.
    shown, full = current.evaluate("c => [c.firstChild.nodeValue, c.title]")  # one instant
    assert re.fullmatch(r"-?\d+\.\d{4} A", shown), shown
    assert float(full) == pytest.approx(float(shown.split()[0]), abs=1e-4)
    expect(view.get_by_test_id("update-type")).to_have_text("NORMAL")
    expect(view.get_by_test_id("cycle")).to_contain_text("CPS.USER.")
    shot(page, "panel-acquisition")
    # Choosing a cycle selector subscribes again with it: a FIRST update, then values.
    view.get_by_test_id("selector").fill("CPS.USER.MD1")
    view.get_by_test_id("selector").press("Enter")
    expect(view.get_by_test_id("selector-shown")).to_have_text("CPS.USER.MD1")
    expect(view.get_by_test_id("view-head")).to_have_class("view-head status-ok")
    expect(view.get_by_test_id("update-type")).to_have_text("NORMAL", timeout=WAIT)
    assert "CPS.USER.MD1" in server_selectors(stand, "PS1", "Acquisition")


def server_selectors(stand: Stand, device: str, prop: str) -> set[str]:
    """The selectors the demo server has subscribers for, asked over its admin command."""
    from rda.business.client.service import ClientService
    from rda.business.directory import StaticDirectory

    endpoint = f"tcp://127.0.0.1:{stand.server_port}"
    with ClientService(directory=StaticDirectory({"*": endpoint})) as client:
        reply = client.admin(endpoint, "subscriptions", 10.0, device=device, property=prop)
    return {str(row["selector"]) for row in reply.get("sources", [])}


def test_a_set_shows_the_immediate_update_and_a_refusal_the_servers_message(page: Page) -> None:
    view = open_view(page, "PS2/Setting")
    expect(view.get_by_test_id("update-type")).to_have_text("FIRST")
    form = view.locator(".setform")
    form.locator('input[name="current"]').fill("7.25")
    form.get_by_test_id("set").click()
    form.get_by_test_id("confirm-set").click()
    expect(form.get_by_test_id("set-status")).to_have_text("set: done", timeout=WAIT)
    expect(view.get_by_test_id("update-type")).to_have_text("IMMEDIATE", timeout=WAIT)
    expect(view.locator('tr[data-field="current"] td.fvalue')).to_contain_text("7.25")
    # Out of the schema's -100..100: the server's validation message, next to the field.
    form.locator('input[name="current"]').fill("500")
    form.get_by_test_id("set").click()
    form.get_by_test_id("confirm-set").click()
    error = form.get_by_test_id("field-error-current")
    expect(error).to_contain_text("less than or equal to 100", timeout=WAIT)
    expect(view.locator('tr[data-field="current"] td.fvalue')).to_contain_text("7.25")
    shot(page, "panel-set")


def test_a_2d_array_renders_as_an_image(page: Page) -> None:
    view = open_view(page, "BPM1/Orbit")
    canvas = view.locator('canvas[data-image="orbit"]')
    expect(canvas).to_be_visible(timeout=WAIT)
    size = canvas.evaluate("c => [c.width, c.height]")
    assert size == [64, 2]
    # Painted: the colour-mapped pixels are not all the same.
    distinct = canvas.evaluate(
        "c => new Set(c.getContext('2d').getImageData(0, 0, c.width, c.height).data).size"
    )
    assert distinct > 10
    expect(view.locator('div[data-plot="positions"] canvas').first).to_be_visible()
    # Its colour scale with the value range, its rows named by the value's `planes`, its
    # columns by `positions`.
    image = view.locator('[data-image-view="orbit"]')
    expect(image.get_by_test_id("colour-scale")).to_be_visible()
    expect(image.get_by_test_id("scale-max")).not_to_be_empty()
    expect(image.get_by_test_id("row-labels")).to_have_text("HV")
    expect(image.get_by_test_id("x-axis")).to_contain_text("positions")
    shot(page, "panel-orbit")
    # Rows as lines: H and V, two lines against the monitors' positions.
    image.get_by_test_id("rows-as-lines").click()
    lines = image.locator('[data-lines="orbit"]')
    expect(lines).to_have_attribute("data-series", "2", timeout=WAIT)
    expect(lines.locator(".u-legend")).to_contain_text("H")
    expect(lines.locator(".u-legend")).to_contain_text("V")
    expect(lines.locator("canvas").first).to_be_visible()
    expect(canvas).to_be_hidden()
    shot(page, "panel-orbit-lines")


def test_strip_chart_plots_fields_of_several_devices_and_exports_csv(page: Page) -> None:
    for address in ("PS1/Acquisition", "PS3/Acquisition"):
        view = open_view(page, address)
        view.locator(f'[data-chart="{address}/current"]').click()
    chart = page.locator("#chart")
    expect(chart.locator(".chip")).to_have_count(2, timeout=WAIT)
    # --history: PS1's series opened already filled with the recorded past; PS3 has none.
    expect(chart.locator('[data-series="PS1/Acquisition/current"]')).to_contain_text(
        f"({PAST} recorded)"
    )
    expect(chart.locator('[data-series="PS3/Acquisition/current"]')).not_to_contain_text("recorded")
    expect(chart.locator("canvas").first).to_be_visible()
    # Points arrive: the CSV holds rows for both series.
    page.wait_for_timeout(1500)
    with page.expect_download(timeout=WAIT) as download:
        page.locator("#chart-csv").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines[0] == "time_utc,PS1/Acquisition/current,PS3/Acquisition/current"
    past = [line for line in lines[1:] if line.split(",")[1] in ("0.0", "0")]
    assert len(past) == 1, "the oldest recorded value is in the export"
    live = [line for line in lines[1:] if line.split(",")[2]]
    assert len(live) > 3, lines
    page.locator("#chart-pause").click()
    expect(page.locator("#chart-pause")).to_have_text("Resume")
    shot(page, "panel-chart")


def test_losing_the_server_turns_the_view_red_and_its_return_green_with_first(
    stand: Stand, page: Page
) -> None:
    view = open_view(page, "PS1/Acquisition")
    head = view.get_by_test_id("view-head")
    stand.kill_server()
    try:
        # Within the heartbeat timeout (2 s), plus one frame and the test's polling on a busy
        # machine: a SIGKILLed server is usually noticed at once (the TCP connection drops).
        expect(head).to_have_class("view-head status-error", timeout=2_000 + 1_500)
        expect(view.get_by_test_id("view-error")).to_contain_text("DisconnectedError")
        expect(
            page.locator('[data-server="RdaDemoServer"] [data-testid="server-state"]')
        ).not_to_have_text("connected", timeout=WAIT)
        shot(page, "panel-disconnected")
    finally:
        stand.start_server()
    expect(head).to_have_class("view-head status-ok", timeout=WAIT)
    expect(view).to_have_attribute("data-recovered-with", "FIRST")
    expect(view.get_by_test_id("view-error")).to_be_empty()


def test_a_failing_property_shows_the_servers_error(page: Page) -> None:
    page.locator('[data-prop="FAULTY/Status"]').click()
    view = page.locator('article[data-view="FAULTY/Status"]')
    expect(view.get_by_test_id("view-head")).to_have_class("view-head status-error", timeout=WAIT)
    expect(view.get_by_test_id("view-error")).to_contain_text("interlock chain open")


def wait_count(page: Page, address: str, testid: str, at_least: float) -> None:
    """Until the view's number ``testid`` (e.g. received) reaches ``at_least``."""
    page.wait_for_function(
        """([address, testid, n]) => {
            const b = document.querySelector(
                `article[data-view="${address}"] [data-testid="${testid}"]`);
            return b !== null && parseFloat(b.textContent) >= n;
        }""",
        arg=[address, testid, at_least],
        timeout=WAIT,
    )


def test_a_paused_publisher_turns_the_view_stale_with_its_last_good_time(
    stand: Stand, page: Page
) -> None:
    proc, lines = stand.start_pausable(free_port())
    try:
        view = open_view(page, "TICK/Value")
        # Judged once the rate is measured on enough updates (10 at 10 Hz here).
        wait_count(page, "TICK/Value", "received", 12)
        expect(view).to_have_attribute("data-stale", "false")
        # No precision declared: 6 significant digits (12.3333), not the repr's 17.
        shown = view.locator('tr[data-field="value"] td.fvalue').evaluate(
            "c => c.firstChild.nodeValue"
        )
        assert re.fullmatch(r"\d+\.\d+", shown) and len(shown.replace(".", "")) == 6, shown
        os.kill(proc.pid, signal.SIGUSR1)
        lines.wait_for("paused", WAIT / 1000)
        expect(view).to_have_attribute("data-stale", "true", timeout=WAIT)
        # Stale is not an error (the server is up): grey, with the last good value's time.
        expect(view.get_by_test_id("view-head")).to_have_class("view-head status-ok")
        expect(view.get_by_test_id("stale")).to_contain_text("last good value 20")
        expect(view.get_by_test_id("rate")).to_contain_text("none for")
        # The age keeps counting up while nothing arrives.
        wait_count(page, "TICK/Value", "age", 1.0)
        shot(page, "panel-stale")
        os.kill(proc.pid, signal.SIGUSR1)
        lines.wait_for("publishing", WAIT / 1000)
        expect(view).to_have_attribute("data-stale", "false", timeout=WAIT)
        expect(view.get_by_test_id("stale")).to_be_hidden()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_killed_server_goes_red_keeping_its_stamp_disables_sets_and_bands_the_chart(
    stand: Stand, page: Page
) -> None:
    port = free_port()
    proc, _ = stand.start_pausable(port)
    try:
        view = open_view(page, "TICK/Value")
        wait_count(page, "TICK/Value", "received", 3)
        view.locator('[data-chart="TICK/Value/value"]').click()
        page.locator("#chart-window").select_option("60")
        setting = open_view(page, "TICK/Setting")
        level = setting.locator('.setform input[name="level"]')
        expect(level).to_be_enabled()
        badge = page.locator('[data-server="PausableServer"] [data-testid="server-state"]')
        expect(badge).to_have_text("connected", timeout=WAIT)
        os.kill(proc.pid, signal.SIGKILL)  # as `kill -9`: no goodbye
        proc.wait(10)
        head = view.get_by_test_id("view-head")
        expect(head).to_have_class("view-head status-error", timeout=WAIT)
        expect(view).to_have_attribute("data-disconnected", "true")
        # The last acquisition stays visible, named as the last one.
        expect(view.locator(".meta")).to_contain_text("last acquired")
        expect(view.get_by_test_id("acquired")).to_contain_text("20")
        expect(view.get_by_test_id("rate")).to_have_text("-")
        # The tree agrees with the views: within 1 s by design (a 0.25 s poll of the client's
        # connection states); the bound here allows for a loaded machine.
        expect(badge).not_to_have_text("connected", timeout=2_500)
        expect(level).to_be_disabled(timeout=WAIT)
        expect(setting.get_by_test_id("set")).to_be_disabled()
        expect(setting.get_by_test_id("form-note")).to_contain_text("disconnected")
        chart = page.locator("#chart")
        expect(chart).to_have_attribute("data-outages", "1", timeout=WAIT)
        expect(chart).to_have_attribute("data-open-outages", "1")
        page.wait_for_function(
            "() => Number(document.querySelector('#chart').dataset.bandsDrawn) >= 1", timeout=WAIT
        )
        if SHOTS:  # a band wide enough to see on the picture
            wait_count(page, "TICK/Value", "age", 4.0)
        shot(page, "panel-outage")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    again, _ = stand.start_pausable(port)
    try:
        expect(head).to_have_class("view-head status-ok", timeout=WAIT)
        expect(level).to_be_enabled(timeout=WAIT)
        expect(badge).to_have_text("connected", timeout=WAIT)
        expect(chart).to_have_attribute("data-open-outages", "0", timeout=WAIT)
        expect(chart).to_have_attribute("data-outages", "1")
    finally:
        again.kill()
        again.wait(10)


def test_a_recorder_is_shown_as_a_recorder(stand: Stand, page: Page) -> None:
    recorder, _ = stand.spawn(
        "recorder",
        "record",
        str(stand.folder / "recorded"),
        "PS1/Acquisition",
        "--id",
        "paneltest",
        "--serve",
        f"tcp://127.0.0.1:{free_port()}",
    )
    try:
        server = page.locator('[data-server="recorder-paneltest"]')
        expect(server.get_by_test_id("server-role")).to_have_text("recorder", timeout=WAIT)
        expect(server.get_by_test_id("records")).to_have_text("records the history of PS1")
        expect(server.locator("details.device")).to_have_count(0)  # no empty history:PS1
        shot(page, "panel-recorder")
    finally:
        recorder.terminate()
        recorder.wait(10)


def test_one_time_format_utc_or_local_stated_everywhere(stand: Stand, browser: Browser) -> None:
    # A browser in India: UTC+05:30 all year (no daylight saving to make the test depend on
    # the date), and a half-hour offset that a whole-hour formatter would get wrong.
    context = browser.new_context(
        viewport={"width": 1280, "height": 860}, timezone_id="Asia/Kolkata"
    )
    try:
        page = context.new_page()
        page.goto(stand.url)
        expect(page.get_by_test_id("landing")).to_be_visible(timeout=WAIT)
        view = open_view(page, "PS1/Acquisition")
        expect(page.get_by_test_id("landing")).to_be_hidden()
        iso = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "
        expect(view.get_by_test_id("acquired")).to_have_text(re.compile(iso + "UTC$"))
        view.locator('[data-chart="PS1/Acquisition/current"]').click()
        chart = page.locator("#chart")
        expect(chart.locator(".u-legend")).to_contain_text("time (UTC)", timeout=WAIT)
        page.get_by_test_id("tz").select_option("local")
        expect(view.get_by_test_id("acquired")).to_have_text(re.compile(iso + r"\+05:30$"))
        expect(chart.locator(".u-legend")).to_contain_text("time (+05:30)")
    finally:
        context.close()


def test_a_layout_is_saved_loaded_shared_by_link_and_opened_by_the_cli_as_a_kiosk(
    stand: Stand, page: Page, browser: Browser, tmp_path: Path
) -> None:
    from rda.panel.layout import parse_layout

    # Arrange a page: two views (a selector, the orbit as lines), a chart, two columns.
    acquisition = open_view(page, "PS1/Acquisition")
    acquisition.get_by_test_id("selector").fill("CPS.USER.MD1")
    acquisition.get_by_test_id("selector").press("Enter")
    acquisition.locator('[data-chart="PS1/Acquisition/current"]').click()
    orbit = open_view(page, "BPM1/Orbit")
    orbit.get_by_test_id("rows-as-lines").click()
    page.get_by_test_id("columns").select_option("2")
    with page.expect_download(timeout=WAIT) as download:
        page.get_by_test_id("layout-save").click()
    saved = tmp_path / "wall.json"
    saved.write_bytes(Path(download.value.path()).read_bytes())
    layout = parse_layout(saved.read_bytes())  # what the page saved is a valid layout
    assert [(v.device, v.property, v.selector) for v in layout.views] == [
        ("PS1", "Acquisition", "CPS.USER.MD1"),
        ("BPM1", "Orbit", ""),
    ]
    assert layout.views[1].images == {"orbit": "lines"} and layout.columns == 2
    assert [(s.device, s.selector, s.field) for s in layout.chart.series] == [
        ("PS1", "CPS.USER.MD1", "current")
    ]

    def laid_out(p: Page) -> None:
        view = p.locator('article[data-view="PS1/Acquisition"]')
        expect(view.get_by_test_id("view-head")).to_have_class("view-head status-ok", timeout=WAIT)
        expect(view.get_by_test_id("selector-shown")).to_have_text("CPS.USER.MD1")
        lines = p.locator('[data-image-view="orbit"]')
        expect(lines).to_have_attribute("data-mode", "lines", timeout=WAIT)
        chip = p.locator('#chart [data-series="PS1/Acquisition@CPS.USER.MD1/current"]')
        expect(chip).to_be_visible()
        expect(p.get_by_test_id("landing")).to_be_hidden()

    # Reloaded: an empty page; the file brings it all back.
    page.goto(stand.url)
    expect(page.get_by_test_id("landing")).to_be_visible(timeout=WAIT)
    page.get_by_test_id("layout-file").set_input_files(str(saved))
    laid_out(page)
    expect(page.get_by_test_id("layout-status")).to_have_text("layout from wall.json")
    shot(page, "panel-layout")
    # Shared as a link: a fresh page opened from it shows the same.
    page.get_by_test_id("layout-share").click()
    link = page.get_by_test_id("share-link").input_value()
    assert link.startswith(stand.url) and "#layout=" in link and page.url == link
    other = page.context.new_page()
    other.goto(link)
    laid_out(other)
    # The same link with ?kiosk: read-only, no tree, no set form, no close buttons.
    other.goto(link.replace("/#layout=", "/?kiosk#layout="))
    laid_out(other)
    expect(other.locator("body")).to_have_attribute("data-kiosk", "true")
    expect(other.locator("#side")).to_be_hidden()
    expect(other.locator(".view-head button").first).to_be_hidden()
    other.close()
    # A file that is no layout: the panel's reason, and the page as it was.
    bad = tmp_path / "bad.json"
    bad.write_text('{"views": [{"device": "PS1"}]}')
    page.get_by_test_id("layout-file").set_input_files(str(bad))
    expect(page.get_by_test_id("layout-status")).to_contain_text("views.0.property: Field required")
    expect(page.get_by_test_id("layout-status")).to_have_class("layout-status bad")
    expect(page.locator('article[data-view="PS1/Acquisition"]')).to_be_visible()

    # rda panel --layout FILE --kiosk: every new tab opens the layout, read-only.
    kiosk, lines = stand.spawn("kiosk", "panel", "--port", "0", "--allow-set", "--kiosk",
                               "--layout", str(saved))  # fmt: skip
    try:
        url = lines.wait_for("rda panel:", 30.0).split()[2]
        wall = page.context.new_page()
        wall.goto(url)
        laid_out(wall)
        expect(wall.locator("body")).to_have_attribute("data-kiosk", "true")
        expect(wall.locator("#mode")).to_contain_text("kiosk (read-only)")
        # --kiosk wins over --allow-set: no set form is built at all.
        expect(wall.locator(".setform input")).to_have_count(0)
        shot(wall, "panel-kiosk")
        wall.close()
    finally:
        kiosk.terminate()
        kiosk.wait(10)


def test_metadata_formats_values_shows_limits_and_alarms_reach_the_summary(
    stand: Stand, page: Page
) -> None:
    proc, _ = stand.start_pausable(free_port())
    try:
        view = open_view(page, "TICK/Setting")
        expect(view).to_have_attribute("data-described", "true", timeout=WAIT)
        value = view.locator('tr[data-field="level"] td.fvalue')
        expect(value).to_contain_text("0.00 A")  # precision 2, units A
        form = view.locator(".setform")
        expect(form.get_by_test_id("limits-level")).to_have_text("limits -10 … 10 A")
        level = form.locator('input[name="level"]')
        expect(level).to_have_attribute("min", "-10")
        expect(level).to_have_attribute("max", "10")

        def set_level(text: str) -> None:
            level.fill(text)
            form.get_by_test_id("set").click()
            form.get_by_test_id("confirm-set").click()

        # Above the warning limit: MINOR on the header, the field and the tree entry.
        set_level("6")
        expect(view).to_have_attribute("data-alarm", "MINOR", timeout=WAIT)
        expect(value).to_contain_text("6.00 A")
        expect(view.locator('tr[data-field="level"]')).to_have_attribute("data-alarm", "MINOR")
        expect(view.get_by_test_id("alarm-badge")).to_have_text("MINOR")
        entry = page.locator('[data-prop="TICK/Setting"]')
        expect(entry).to_have_attribute("data-severity", "MINOR", timeout=WAIT)
        # Above the alarm limit: MAJOR, first in the summary (newest first).
        set_level("9")
        expect(view).to_have_attribute("data-alarm", "MAJOR", timeout=WAIT)
        expect(view.get_by_test_id("alarm")).to_contain_text("MAJOR")
        summary = page.get_by_test_id("alarm-summary")
        first = summary.locator("tr[data-alarm-row]").first
        expect(first).to_have_attribute("data-alarm-row", "TICK/Setting", timeout=WAIT)
        expect(first).to_have_attribute("data-severity", "MAJOR")
        expect(entry).to_have_attribute("data-severity", "MAJOR", timeout=WAIT)
        # The demo's failing property is there too, as an error.
        faulty = summary.locator('tr[data-alarm-row="FAULTY/Status"]')
        expect(faulty).to_have_attribute("data-state", "error", timeout=WAIT)
        shot(page, "panel-alarms")
        # Outside the control limits: refused by the server, naming the limit, next to the field.
        set_level("20")
        error = form.get_by_test_id("field-error-level")
        expect(error).to_contain_text("10", timeout=WAIT)
        expect(error).to_contain_text("level")
        expect(value).to_contain_text("9.00 A")
        # Back in range: no alarm, out of the summary.
        set_level("1")
        expect(view).to_have_attribute("data-alarm", "NONE", timeout=WAIT)
        expect(summary.locator('tr[data-alarm-row="TICK/Setting"]')).to_have_count(0, timeout=WAIT)
        expect(entry).to_have_attribute("data-severity", "NONE")
    finally:
        proc.kill()
        proc.wait(10)
