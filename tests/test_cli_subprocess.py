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

from rda.testing import wait_until

RDA = str(Path(sys.executable).with_name("rda"))

SERVED = textwrap.dedent(
    """
    import threading
    from rda.business.server.devices import Device
    from rda.serialization.data import Data

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
    assert sub.stderr.strip().splitlines()[-1].startswith("3 updates in")

    listed = run("directory", "list", "--json", cwd=tmp_path)
    assert [s["endpoint"] for s in json.loads(listed.stdout)["servers"]] == [info["endpoint"]]

    missing = run("get", "NOPE/Count", cwd=tmp_path)
    assert missing.returncode == 4
    assert missing.stderr.startswith("rda: not found")
    assert "Traceback" not in missing.stderr

    # SIGTERM: a clean stop (exit 0) that unregisters from the directory.
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    wait_until(
        lambda: not json.loads(run("directory", "list", "--json", cwd=tmp_path).stdout)["servers"],
        "the server to unregister after SIGTERM",
    )


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
        # FAULTY's handler raised (a server fault); the schema refused 1000 A (the client's).
        assert requests["get"]["ok"] >= 1 and requests["get"]["handler_error"] >= 1
        assert requests["set"]["bad_request"] >= 1
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


POLICY = """\
roles = ["op"]
anonymous_roles = {anonymous}

[principals]
olga = ["op"]

[[rules]]
role = "op"
device = "PS1"
operation = "get"
effect = "allow"
"""


def read_err_until(proc: subprocess.Popen[str], seen: list[str], text: str, timeout: float) -> str:
    """The first new stderr line of ``proc`` containing ``text``; ``seen`` holds the lines read
    so far (raw reads of the fd: a buffered readline could hide a line from the selector)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    start = len(seen)
    pending = ""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(max(0.0, deadline - time.monotonic())):
                continue
            chunk = os.read(fd, 65536).decode()
            assert chunk, "stderr closed"
            pending += chunk
            *lines, pending = pending.split("\n")
            seen.extend(lines)
            for line in seen[start:]:
                if text in line:
                    return line
    raise AssertionError(f"no stderr line with {text!r} within {timeout} s: {seen[start:]}")


def test_serve_refuses_an_empty_policy_unless_allowed(tmp_path: Path) -> None:
    """Issue 27 (1): a zero-byte policy locked everyone out, admin included."""
    empty = tmp_path / "policy.toml"
    empty.write_text("")
    refused = run("serve", "demo", "--policy", str(empty), "--duration", "5", cwd=tmp_path)
    assert refused.returncode == 2
    assert "refused: it has no rules" in refused.stderr and "--allow-empty" in refused.stderr
    allowed = run("serve", "demo", "--policy", str(empty), "--allow-empty", "--duration", "0.1",
                  cwd=tmp_path)  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr


def test_serve_policy_sighup_reload(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.format(anonymous="[]"))
    broken = tmp_path / "broken.toml"
    broken.write_text(POLICY.format(anonymous="[]").replace('effect = "allow"', "effect = allow"))
    refused = run("serve", "demo", "--policy", str(broken), cwd=tmp_path)
    assert refused.returncode == 2
    assert "broken.toml: not valid TOML" in refused.stderr and "line 11" in refused.stderr

    proc = subprocess.Popen(
        [RDA, "serve", "demo", "--json", "--policy", str(policy), "--trust-declared-principals"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    olga = {**os.environ, "RDA_PRINCIPAL": "olga"}
    seen: list[str] = []
    try:
        json.loads(read_line(proc, 30.0))
        as_olga = subprocess.run(
            [RDA, "get", "PS1/Acquisition"], cwd=tmp_path, env=olga, capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert as_olga.returncode == 0, as_olga.stderr
        anonymous = run("get", "PS1/Acquisition", cwd=tmp_path)
        assert anonymous.returncode == 5
        assert "anonymous (roles: none) may not get PS1/Acquisition" in anonymous.stderr

        policy.write_text(POLICY.format(anonymous='["op"]'))
        os.kill(proc.pid, signal.SIGHUP)
        assert "(1 rules)" in read_err_until(proc, seen, "policy reloaded", 20.0)
        assert run("get", "PS1/Acquisition", cwd=tmp_path).returncode == 0

        policy.write_text(broken.read_text())
        os.kill(proc.pid, signal.SIGHUP)
        line = read_err_until(proc, seen, "policy NOT reloaded", 20.0)
        assert "the old one stays" in line and "line 11" in line
        assert run("get", "PS1/Acquisition", cwd=tmp_path).returncode == 0  # old policy
        assert run("get", "BPM1/Orbit", cwd=tmp_path).returncode == 5
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
