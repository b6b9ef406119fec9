"""The installed ``rda`` console script in real processes: serve, get, subscribe, SIGTERM.

Each test's directory file comes from conftest (``RDA_DIRECTORY_FILE`` in the environment the
child processes inherit), so nothing leaks into the machine-wide directory; every server
process is stopped by its pid at the end.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RDA = str(Path(sys.executable).with_name("rda"))

SERVED = textwrap.dedent(
    """
    import threading
    from rda.business.device import Device
    from rda.serialization._data import Data

    class Counter(Device):
        def __init__(self):
            super().__init__()
            self.n = 0
            threading.Thread(target=self._tick, daemon=True).start()

        def _tick(self):
            while True:
                threading.Event().wait(0.05)
                self.n += 1
                self.publish("Count", Data(n=self.n))

        @Device.property("Count")
        def count(self, request):
            return Data(n=self.n)
    """
)


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next stdout line of ``proc``, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no output from {proc.args!r} within {timeout} s")
    return proc.stdout.readline()


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RDA, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[dict[str, Any], subprocess.Popen[str]]]:
    (tmp_path / "counter_mod.py").write_text(SERVED)
    proc = subprocess.Popen(
        [RDA, "serve", "counter_mod:Counter", "--device", "CNT1", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(proc, 30.0)
        assert line, proc.stderr.read() if proc.stderr else ""
        yield json.loads(line), proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_serve_get_subscribe_and_sigterm(
    served: tuple[dict[str, Any], subprocess.Popen[str]], tmp_path: Path
) -> None:
    info, proc = served
    assert info["devices"] == ["CNT1"]
    assert info["pid"] == proc.pid

    got = run("get", "CNT1/Count", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["data"]["n"] >= 0

    sub = run("subscribe", "CNT1/Count", "--count", "3", cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    lines = sub.stdout.splitlines()
    assert len(lines) == 3
    assert " FIRST " in lines[0]
    assert all("n=" in line for line in lines)
    assert sub.stderr.strip().startswith("3 updates in")

    listed = run("directory", "list", "--json", cwd=tmp_path)
    assert [s["endpoint"] for s in json.loads(listed.stdout)["servers"]] == [info["endpoint"]]

    missing = run("get", "NOPE/Count", cwd=tmp_path)
    assert missing.returncode == 4
    assert missing.stderr.startswith("rda: not found")
    assert "Traceback" not in missing.stderr

    # SIGTERM: a clean stop (exit 0) that unregisters from the directory.
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    deadline = time.monotonic() + 10
    while json.loads(run("directory", "list", "--json", cwd=tmp_path).stdout)["servers"]:
        assert time.monotonic() < deadline, "server still registered after SIGTERM"
        time.sleep(0.05)


def test_serve_demo_get_subscribe(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [RDA, "serve", "demo", "--json", "--metrics-port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(read_line(proc, 30.0))
        assert {"PS1", "BPM1", "FAULTY"} <= set(info["devices"])
        assert info["metrics_url"].startswith("http://127.0.0.1:")

        got = run("get", "PS1/Acquisition", "--json", cwd=tmp_path)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["data"]["unit"] == "A"

        sub = run("subscribe", "BPM1/Orbit", "--count", "3", cwd=tmp_path)
        assert sub.returncode == 0, sub.stderr
        lines = sub.stdout.splitlines()
        assert len(lines) == 3
        assert "float64[2x64] min=" in lines[0]

        faulty = run("get", "FAULTY/Status", cwd=tmp_path)
        assert faulty.returncode == 7
        assert "interlock chain open" in faulty.stderr

        refused = run("set", "PS1/Setting", "current=1000", cwd=tmp_path)
        assert refused.returncode == 7, refused.stderr
        assert "current" in refused.stderr

        stats = run("admin", "RdaDemoServer", "stats", "--json", cwd=tmp_path)
        assert stats.returncode == 0, stats.stderr
        requests = json.loads(stats.stdout)["requests"]
        assert requests["get"]["ok"] >= 1 and requests["get"]["error"] >= 1
        assert requests["set"]["error"] >= 1
        clients = run("admin", "PS1", "clients", cwd=tmp_path)  # by device name
        assert clients.returncode == 0, clients.stderr
        assert "PEER" in clients.stdout and " ago)" in clients.stdout
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
