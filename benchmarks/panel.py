"""``rda panel`` under fire: panel CPU, WebSocket bytes/s, and notify-to-paint latency (JSON).

For each rate (default 1 kHz and 10 kHz) a server process publishes ``FAST/Value`` (a float
and a counter, acquisition stamp taken at ``notify``) at that rate, and a panel process
(``rda panel``) subscribes to it for:

- ``--views`` (20) WebSocket clients, each with one open view of the property (plain Python
  clients: they count every byte the panel sends them): the panel process's CPU (user +
  system, from /proc) and the WebSocket bytes/s and frames/s, per view and in all, and the
  mean number of updates each frame folds;
- one Chromium page (Playwright, the system's /usr/bin/chromium) with the same view: the
  latency from the server's ``notify`` (the acquisition stamp) to the value painted (the next
  animation frame after the DOM update), p50 and p99. It includes the coalescing wait (up to
  1/30 s by design).

Baseline, in the same run: a raw pyzmq PUB/SUB pair at the same rate and payload (the
subscriber in its own process): its CPU per second to receive everything, and its
publish-to-receive latency. The ratios say what the panel costs beside the bare transport;
they are not like for like (the panel decodes, folds, renders JSON and sends to browsers).

Issue 33's parts (``--part``; ``all`` runs every one):

- ``notify``: the server's cost per notification (process CPU per published value, and the
  time inside ``publish``) with the property's metadata and alarm computation on (fields
  with units, precision, warning and alarm limits) and off, in alternating turns, one rda
  subscriber in its own process; baseline: a raw pyzmq PUB sending the same rate.
  Target: on within 10 % of off.
- ``update``: the panel process's CPU per update (one view, ``--rate`` 1 kHz), metadata on
  and off in alternating turns. Target: on within 10 % of off.
- ``views``: 200 views (200 properties at 10 Hz each, opened from a layout link) on one
  Chromium page: frame times from ``requestAnimationFrame`` and ``performance.now()``,
  p50/p99/max, and long tasks (a ``PerformanceObserver``); baseline: the same page with no
  view open. Target: p99 under 50 ms.
- ``latency``: the 1 kHz / 10 kHz fire test above (20 WebSocket views, browser latency).

    .venv/bin/python benchmarks/panel.py --seconds 5
    .venv/bin/python benchmarks/panel.py --part notify,update,views --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

TICK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _paced(rate: float, seconds: float | None, stop: threading.Event, send: Any) -> int:
    """Call ``send(i)`` ``rate`` times a second (in bursts each millisecond) until stopped."""
    start = time.perf_counter()
    sent = 0
    while not stop.is_set():
        elapsed = time.perf_counter() - start
        if seconds is not None and elapsed > seconds:
            break
        due = int(elapsed * rate) - sent
        for _ in range(due):
            send(sent)
            sent += 1
        time.sleep(0.001)
    return sent


# -- the processes this benchmark starts -----------------------------------------------------


def _device_class(meta: bool) -> Any:
    """A device with one property, ``Value``: with its fields' metadata and alarm limits
    declared (``meta``: the server computes an alarm per notification) or without."""
    import rda
    from rda.business.server.requests import GetRequest

    fields = (
        {
            "value": rda.Field(units="A", precision=3, warning=(-0.9, 0.9), alarm=(-0.99, 0.99)),
            "count": rda.Field(description="publication number"),
        }
        if meta
        else None
    )

    class Fast(rda.Device):
        @rda.prop("Value", blocking=False, fields=fields)
        def value(self, request: GetRequest) -> rda.Data:
            return rda.Data(value=0.0, count=0)

    return Fast


def serve(port: int, rate: float, meta: bool = False) -> None:
    """``--serve``: a server whose FAST/Value is published at ``rate`` until SIGTERM."""
    import signal

    import rda

    device = _device_class(meta)()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def publish(i: int) -> None:
        now = time.time_ns()
        device.publish("Value", rda.AcquiredData(rda.Data(value=float(np.sin(i / 100)), count=i),
                                                 rda.DataContext("BENCH", now, now, "")))  # fmt: skip

    builder = rda.ServerBuilder("PanelBench").endpoint(f"tcp://127.0.0.1:{port}")
    with builder.device("FAST", device).build():
        print("serving", flush=True)
        sent = _paced(rate, None, stop, publish)
    print(json.dumps({"published": sent}), flush=True)


def raw_sub(port: int, seconds: float) -> None:
    """``--raw-sub``: the baseline's subscriber; prints its CPU and latencies as JSON."""
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    print("ready", flush=True)
    latencies = []
    count = 0
    deadline = None
    cpu0 = time.process_time()
    while deadline is None or time.monotonic() < deadline:
        if not sub.poll(200):
            continue
        message = sub.recv()
        if deadline is None:
            deadline = time.monotonic() + seconds
            cpu0 = time.process_time()
        stamp = int.from_bytes(message[:8], "little")
        latencies.append((time.time_ns() - stamp) / 1e6)
        count += 1
    cpu = time.process_time() - cpu0
    sub.close()
    ctx.term()
    print(json.dumps({"received": count, "cpu_s": cpu, "latency_ms": latencies}), flush=True)


# -- the measurement ---------------------------------------------------------------------------


def _raw_baseline(rate: float, seconds: float) -> dict[str, Any]:
    import zmq

    port = _free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--raw-sub", str(port), "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    stop = threading.Event()
    payload = b"\0" * 24  # a float, a counter and a stamp, as the panel's value

    def send(i: int) -> None:
        pub.send(time.time_ns().to_bytes(8, "little") + payload)

    # PUB drops until the subscription has travelled: warm up, then measure.
    thread = threading.Thread(target=_paced, args=(rate, seconds + 3.0, stop, send))
    thread.start()
    out = json.loads(proc.stdout.readline())
    stop.set()
    thread.join()
    proc.wait(10)
    pub.close()
    ctx.term()
    lat = np.array(out["latency_ms"])
    return {
        "received_per_s": out["received"] / seconds,
        "subscriber_cpu_per_s": out["cpu_s"] / seconds,
        "latency_ms_p50": float(np.percentile(lat, 50)),
        "latency_ms_p99": float(np.percentile(lat, 99)),
    }


def _panel_views(url: str, views: int, seconds: float) -> dict[str, Any]:
    from websockets.sync.client import connect

    counts = [[0, 0, 0, 0] for _ in range(views)]  # bytes, frames, folded, values
    stop = threading.Event()
    ready = threading.Barrier(views + 1, timeout=60)

    def client(i: int) -> None:
        with connect(url.replace("http://", "ws://") + "ws", max_size=None) as ws:
            ws.send(json.dumps({"op": "open", "view": "v", "device": "FAST", "property": "Value"}))
            while True:  # wait for the first frame before counting
                message = json.loads(ws.recv(timeout=30))
                if message["type"] == "frames":
                    break
            ready.wait()
            while not stop.is_set():
                try:
                    text = ws.recv(timeout=0.2)
                except TimeoutError:
                    continue
                counts[i][0] += len(text)
                message = json.loads(text)
                if message["type"] == "frames":
                    for frame in message["frames"]:
                        counts[i][1] += 1
                        counts[i][2] += frame["folded"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(views)]
    for t in threads:
        t.start()
    ready.wait()
    return {"threads": threads, "counts": counts, "stop": stop}


def _browser_latency(url: str, seconds: float) -> list[float]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        page.goto(url + "?bench")
        page.locator('[data-prop="FAST/Value"]').click(timeout=30_000)
        page.wait_for_function("window.rdaLatency.length > 0", timeout=30_000)
        page.evaluate("window.rdaLatency.length = 0")
        time.sleep(seconds)
        samples: list[float] = page.evaluate("window.rdaLatency")
        browser.close()
    return samples


def measure(
    rate: float,
    views: int,
    seconds: float,
    folder: Path,
    *,
    meta: bool = False,
    browser: bool = True,
) -> dict[str, Any]:
    port = _free_port()
    env = {**os.environ, "RDA_DIRECTORY_FILE": str(folder / "directory.json")}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--rate", str(rate)]
        + (["--meta"] if meta else []),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    panel = None
    try:
        assert server.stdout is not None
        server.stdout.readline()
        panel = subprocess.Popen(
            [sys.executable, "-m", "rda._cli", "--endpoint", f"tcp://127.0.0.1:{port}",
             "panel", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        assert panel.stdout is not None
        url = panel.stdout.readline().split()[2]
        run = _panel_views(url, views, seconds)
        cpu0, t0 = _cpu_seconds(panel.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = _cpu_seconds(panel.pid), time.monotonic()
        run["stop"].set()
        for t in run["threads"]:
            t.join(10)
        elapsed = t1 - t0
        counts = np.array(run["counts"], dtype=np.float64)
        latency = np.array(_browser_latency(url, seconds) if browser else [np.nan])
        frames = counts[:, 1].sum()
        return {
            "rate_hz": rate,
            "views": views,
            "panel_cpu_per_s": (cpu1 - cpu0) / elapsed,
            "ws_bytes_per_s_total": counts[:, 0].sum() / elapsed,
            "ws_bytes_per_s_per_view": counts[:, 0].sum() / elapsed / views,
            "frames_per_s_per_view": frames / elapsed / views,
            "updates_folded_per_frame": counts[:, 2].sum() / frames if frames else None,
            "browser_latency_ms_p50": float(np.percentile(latency, 50)),
            "browser_latency_ms_p99": float(np.percentile(latency, 99)),
            "browser_latency_samples": len(latency),
        }
    finally:
        for proc in (panel, server):
            if proc is not None:
                proc.terminate()
                proc.wait(10)
                if proc.stdout is not None:
                    proc.stdout.close()


# -- issue 33: metadata and alarms on vs off, and 200 views on one page -----------------------


def subscriber(endpoint: str, seconds: float) -> None:
    """``--sub``: one rda subscriber of FAST/Value (the notify part's peer); prints its count."""
    import rda

    count = [0]

    def listener(n: Any) -> None:
        count[0] += 1

    with rda.ClientService(directory=rda.StaticDirectory({"*": endpoint})) as client:
        sub = client.access_point("FAST", "Value").subscribe(listener=listener)
        print("ready", flush=True)
        time.sleep(seconds)
        sub.close()
    print(json.dumps({"received": count[0]}), flush=True)


def _notify_turn(meta: bool, rate: float, seconds: float) -> dict[str, Any]:
    """One turn: an in-process server publishing FAST/Value at ``rate`` to one subscriber."""
    import rda

    device = _device_class(meta)()
    builder = rda.ServerBuilder("NotifyBench").endpoint("tcp://127.0.0.1:0").directory(None)
    with builder.device("FAST", device).build() as server:
        sub = subprocess.Popen(
            [sys.executable, __file__, "--sub", server.endpoint, "--seconds", str(seconds + 4)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sub.stdout is not None
        sub.stdout.readline()
        inside = [0.0, 0.0]  # wall time, then the publishing thread's CPU, inside publish
        bursts = [0, 0.0]  # bursts (sends after a pause of > 0.5 ms), time of the last send

        def publish(i: int) -> None:
            now = time.time_ns()
            value = float(np.sin(i / 100))
            data = rda.AcquiredData(
                rda.Data(value=value, count=i), rda.DataContext("B", now, now, "")
            )
            t0, c0 = time.perf_counter(), time.thread_time()
            device.publish("Value", data)
            t1 = time.perf_counter()
            inside[1] += time.thread_time() - c0
            inside[0] += t1 - t0
            if t0 - bursts[1] > 0.0005:
                bursts[0] += 1
            bursts[1] = t1

        stop = threading.Event()
        _paced(rate, 1.0, stop, publish)  # warm-up: the subscription is live
        inside[:] = [0.0, 0.0]
        bursts[0] = 0
        cpu0 = time.process_time()
        sent = _paced(rate, seconds, stop, publish)
        cpu = time.process_time() - cpu0
        received = json.loads(sub.stdout.readlines()[-1])["received"]
        sub.wait(10)
    return {
        "meta": meta,
        "published": sent,
        "received_by_subscriber": received,
        "server_cpu_us_per_notify": cpu / sent * 1e6,
        "publish_call_us": inside[0] / sent * 1e6,
        # The notify path's own CPU (encoding, the alarm, the hand-over to the transport), in
        # the publishing thread: the process figure above also carries the pacing loop's and
        # the I/O thread's wake-ups, whose cost per notification falls as more notifications
        # share a wake-up (under load): notifications_per_burst says how many did.
        "publish_thread_cpu_us": inside[1] / sent * 1e6,
        "notifications_per_burst": sent / max(bursts[0], 1),
    }


def _raw_pub_turn(rate: float, seconds: float) -> dict[str, Any]:
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    payload = b"\0" * 24
    stop = threading.Event()
    cpu0 = time.process_time()
    sent = _paced(
        rate, seconds, stop, lambda i: pub.send(time.time_ns().to_bytes(8, "little") + payload)
    )
    cpu = time.process_time() - cpu0
    sub.close()
    pub.close()
    ctx.term()
    return {"published": sent, "cpu_us_per_send": cpu / sent * 1e6}


def notify_part(rate: float, seconds: float, turns: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(turns):  # alternating turns: the machine's load drifts between them
        for meta in (False, True):
            runs["on" if meta else "off"].append(_notify_turn(meta, rate, seconds))
    raw = _raw_pub_turn(rate, seconds)

    def median(key: str, which: str) -> float:
        return float(np.median([r[key] for r in runs[which]]))

    off, on = median("server_cpu_us_per_notify", "off"), median("server_cpu_us_per_notify", "on")
    call_off, call_on = median("publish_call_us", "off"), median("publish_call_us", "on")
    thread_off = median("publish_thread_cpu_us", "off")
    thread_on = median("publish_thread_cpu_us", "on")
    return {
        "rate_hz": rate,
        "turns": runs,
        "server_cpu_us_per_notify_off": off,
        "server_cpu_us_per_notify_on": on,
        "publish_call_us_off": call_off,
        "publish_call_us_on": call_on,
        "ratio_cpu_on_vs_off": on / off,
        "ratio_publish_call_on_vs_off": call_on / call_off,
        "publish_thread_cpu_us_off": thread_off,
        "publish_thread_cpu_us_on": thread_on,
        "ratio_publish_thread_cpu_on_vs_off": thread_on / thread_off,
        "raw_pyzmq": raw,
        "ratio_cpu_off_vs_raw": off / raw["cpu_us_per_send"],
        "targets_met": {"notify_cpu_on_le_1.10x_off": on / off <= 1.10},
    }


def update_part(rate: float, seconds: float, turns: int, folder: Path) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"off": [], "on": []}
    detail = []
    for _ in range(turns):
        for meta in (False, True):
            out = measure(rate, 1, seconds, folder, meta=meta, browser=False)
            per_update = out["panel_cpu_per_s"] / rate * 1e6
            runs["on" if meta else "off"].append(per_update)
            detail.append({"meta": meta, **out, "panel_cpu_us_per_update": per_update})
    raw = _raw_baseline(rate, seconds)
    off, on = float(np.median(runs["off"])), float(np.median(runs["on"]))
    raw_per = raw["subscriber_cpu_per_s"] / rate * 1e6
    return {
        "rate_hz": rate,
        "turns": detail,
        "panel_cpu_us_per_update_off": off,
        "panel_cpu_us_per_update_on": on,
        "ratio_on_vs_off": on / off,
        "raw_pyzmq_subscriber_cpu_us_per_update": raw_per,
        "ratio_off_vs_raw": off / raw_per if raw_per else None,
        "targets_met": {"panel_cpu_on_le_1.10x_off": on / off <= 1.10},
    }


def serve_many(port: int, count: int, rate: float) -> None:
    """``--serve-many``: ``count`` devices D000.. with a described Value, each at ``rate``."""
    import signal

    import rda

    cls = _device_class(True)
    devices = [cls() for _ in range(count)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    builder = rda.ServerBuilder("ManyViews").endpoint(f"tcp://127.0.0.1:{port}")
    for i, device in enumerate(devices):
        builder.device(f"D{i:03d}", device)
    with builder.build():
        print("serving", flush=True)
        i = 0
        next_at = time.monotonic()
        while not stop.is_set():
            now = time.time_ns()
            for device in devices:
                data = rda.Data(value=float(np.sin(i / 10)), count=i)
                device.publish("Value", rda.AcquiredData(data, rda.DataContext("B", now, now, "")))
            i += 1
            next_at += 1.0 / rate
            stop.wait(max(0.0, next_at - time.monotonic()))


_FRAME_TIMES = """async (seconds) => {
    const longTasks = [];
    let observer = null;
    try {
        observer = new PerformanceObserver((list) => {
            for (const e of list.getEntries()) longTasks.push(e.duration);
        });
        observer.observe({ type: "longtask", buffered: false });
    } catch (err) { /* not supported: reported as null */ }
    const frames0 = window.rdaFrames;
    const deltas = [];
    const end = performance.now() + seconds * 1000;
    await new Promise((done) => {
        let last = performance.now();
        const step = (t) => {
            deltas.push(t - last);
            last = t;
            if (t < end) requestAnimationFrame(step); else done();
        };
        requestAnimationFrame(step);
    });
    if (observer) observer.disconnect();
    return { deltas, longTasks: observer ? longTasks : null, frames: window.rdaFrames - frames0 };
}"""


def _frame_stats(sample: dict[str, Any], seconds: float) -> dict[str, Any]:
    d = np.array(sample["deltas"][1:])
    return {
        "animation_frames": len(d),
        "frame_ms_p50": float(np.percentile(d, 50)),
        "frame_ms_p99": float(np.percentile(d, 99)),
        "frame_ms_max": float(d.max()),
        "long_tasks": None if sample["longTasks"] is None else len(sample["longTasks"]),
        "view_frames_per_s": sample["frames"] / seconds,
    }


def _layout_link(url: str, count: int) -> str:
    """The panel's shared-link form of a layout with ``count`` views (docs/panel.md)."""
    import base64

    layout = {"views": [{"device": f"D{i:03d}", "property": "Value"} for i in range(count)]}
    encoded = base64.urlsafe_b64encode(json.dumps(layout).encode()).rstrip(b"=").decode()
    return f"{url}?bench#layout={encoded}"


def views_part(count: int, rate: float, seconds: float, folder: Path, turns: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    port = _free_port()
    env = {**os.environ, "RDA_DIRECTORY_FILE": str(folder / "directory.json")}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve-many", str(port), "--count", str(count),
         "--rate", str(rate)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    panel = None
    try:
        assert server.stdout is not None
        server.stdout.readline()
        panel = subprocess.Popen(
            [sys.executable, "-m", "rda._cli", "--endpoint", f"tcp://127.0.0.1:{port}",
             "panel", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        assert panel.stdout is not None
        url = panel.stdout.readline().split()[2]
        idle_turns, loaded_turns, cpu_turns = [], [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
            )
            for _ in range(turns):  # alternating: the shared machine's load drifts
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.goto(url + "?bench")  # baseline: the page with no view open
                page.wait_for_selector('[data-prop="D000/Value"]', timeout=60_000)
                idle_turns.append(_frame_stats(page.evaluate(_FRAME_TIMES, seconds), seconds))
                page.close()
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.goto(_layout_link(url, count))
                # Every view open, and those on screen live (off-screen views get no frames:
                # the panel holds them until they show).
                page.wait_for_function(
                    """(n) => document.querySelectorAll('article[data-view]').length >= n
                        && document.querySelectorAll('.view-head.status-ok').length >= 6""",
                    arg=count,
                    timeout=120_000,
                )
                cpu0, t0 = _cpu_seconds(panel.pid), time.monotonic()
                loaded_turns.append(_frame_stats(page.evaluate(_FRAME_TIMES, seconds), seconds))
                cpu_turns.append((_cpu_seconds(panel.pid) - cpu0) / (time.monotonic() - t0))
                page.close()
            browser.close()
    finally:
        for proc in (panel, server):
            if proc is not None:
                proc.terminate()
                proc.wait(10)
                if proc.stdout is not None:
                    proc.stdout.close()
    idle_p99 = float(np.median([t["frame_ms_p99"] for t in idle_turns]))
    loaded_p99 = float(np.median([t["frame_ms_p99"] for t in loaded_turns]))
    return {
        "views": count,
        "rate_hz_per_view": rate,
        "baseline_no_views": idle_turns,
        "views_open": loaded_turns,
        "frame_ms_p99_median_baseline": idle_p99,
        "frame_ms_p99_median_views": loaded_p99,
        "frame_ms_p50_median_views": float(np.median([t["frame_ms_p50"] for t in loaded_turns])),
        "panel_cpu_per_s": float(np.median(cpu_turns)),
        "ratio_p99_vs_baseline": loaded_p99 / idle_p99,
        "targets_met": {"frame_p99_lt_50ms": loaded_p99 < 50.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", help="notify,update,views,latency or all")
    parser.add_argument("--rates", default="1000,10000", help="latency part: Hz, comma-separated")
    parser.add_argument("--views", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--turns", type=int, default=2, help="on/off turns (notify, update)")
    parser.add_argument("--many", type=int, default=200, help="views part: views on the page")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-many", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--meta", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sub", help=argparse.SUPPRESS)
    parser.add_argument("--raw-sub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=1000.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.rate, args.meta)
        return
    if args.serve_many is not None:
        serve_many(args.serve_many, args.count, args.rate)
        return
    if args.sub is not None:
        subscriber(args.sub, args.seconds)
        return
    if args.raw_sub is not None:
        raw_sub(args.raw_sub, args.seconds)
        return
    parts = (
        {"notify", "update", "views", "latency"}
        if args.part == "all"
        else set(args.part.split(","))
    )
    summary: dict[str, Any] = {
        "benchmark": "panel",
        "seconds": args.seconds,
        "load_average_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="rda-bench-panel-") as folder:
        if "notify" in parts:
            summary["notify"] = notify_part(1000.0, args.seconds, args.turns)
        if "update" in parts:
            summary["update"] = update_part(1000.0, args.seconds, args.turns, Path(folder))
        if "views" in parts:
            summary["views"] = views_part(args.many, 10.0, args.seconds, Path(folder), args.turns)
        if "latency" in parts:
            results = []
            for rate in (float(r) for r in args.rates.split(",")):
                panel = measure(rate, args.views, args.seconds, Path(folder))
                raw = _raw_baseline(rate, args.seconds)
                panel["raw_pyzmq"] = raw
                panel["ratio_cpu_panel_vs_raw_subscriber"] = (
                    panel["panel_cpu_per_s"] / raw["subscriber_cpu_per_s"]
                    if raw["subscriber_cpu_per_s"]
                    else None
                )
                panel["ratio_latency_p50_panel_vs_raw"] = (
                    panel["browser_latency_ms_p50"] / raw["latency_ms_p50"]
                )
                results.append(panel)
            summary["results"] = results
    summary["load_average_after"] = os.getloadavg()
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
