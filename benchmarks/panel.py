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

    .venv/bin/python benchmarks/panel.py --seconds 5
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


def serve(port: int, rate: float) -> None:
    """``--serve``: a server whose FAST/Value is published at ``rate`` until SIGTERM."""
    import signal

    import rda
    from rda.business.server.requests import GetRequest

    class Fast(rda.Device):
        @rda.prop("Value", blocking=False)
        def value(self, request: GetRequest) -> rda.Data:
            return rda.Data(value=0.0, count=0)

    device = Fast()
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


def measure(rate: float, views: int, seconds: float, folder: Path) -> dict[str, Any]:
    port = _free_port()
    env = {**os.environ, "RDA_DIRECTORY_FILE": str(folder / "directory.json")}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--rate", str(rate)],
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
        latency = np.array(_browser_latency(url, seconds))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,10000", help="comma-separated, Hz")
    parser.add_argument("--views", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--raw-sub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=1000.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.rate)
        return
    if args.raw_sub is not None:
        raw_sub(args.raw_sub, args.seconds)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="rda-bench-panel-") as folder:
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
    summary = {
        "benchmark": "panel",
        "seconds": args.seconds,
        "load_average": os.getloadavg(),
        "results": results,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
