"""Issue 27 (3): a client paused past the server's heartbeat timeout resumes at once.

Found with SIGSTOP: the server dropped the paused client (unsubscribe called, correct), then
answered its HEARTBEATs with nothing but ``HEARTBEAT before CONNECT`` log lines, and the client
received nothing for its own heartbeat timeout before it reconnected. Now the server answers a
peer it does not know with RECONNECT; the client reports the connection lost at once, connects
again and re-subscribes, so the next FIRST update follows within a round trip plus the first
back-off step.

Separate processes on 127.0.0.1: the client runs in a child that prints one line per
notification; the test pauses it with SIGSTOP until the server has dropped it, resumes it
with SIGCONT and waits for a FIRST line. The child's own heartbeat timeout is 120 s: the old
behaviour cannot pass within the test's bound (20 s), the new one needs about a second.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from rda.business.config import Config
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest
from rda.serialization.data import Data
from rda.testing import wait_until

CHILD = textwrap.dedent(
    """
    import sys, time
    from rda.business.client.service import ClientService
    from rda.business.config import Config
    from rda.business.directory import StaticDirectory

    config = Config(heartbeat_interval=0.2, heartbeat_timeout=120.0, reconnect_initial=0.02)
    with ClientService(StaticDirectory({"*": sys.argv[1]}), config) as client:
        sub = client.access_point("PS1", "Current").subscribe()
        for note in sub:
            kind = "ERROR" if note.error is not None else note.update_type.name
            print(kind, time.monotonic(), flush=True)
    """
)


class Supply(Device):
    @Device.property("Current")
    def current(self, request: GetRequest) -> Data:
        return Data(value=1.0)


def heartbeat_timeouts(srv: Server) -> int:
    transport = srv.statistics().transport
    assert transport is not None
    return transport.heartbeat_timeouts


@pytest.fixture
def server() -> Iterator[tuple[Server, Supply]]:
    supply = Supply()
    # Real time on purpose: the client is a real process, paused by SIGSTOP, that the server
    # must drop by its own clock. A 3 s timeout (six intervals) keeps a merely slow, running
    # client on a loaded machine from being taken for the paused one.
    config = Config(heartbeat_interval=0.5, heartbeat_timeout=3.0)
    srv = ServerBuilder("Paused").config(config).device("PS1", supply).directory(None).build()
    srv.start()
    stop = threading.Event()

    def publish() -> None:  # 50 updates per second, as a real device would
        n = 0
        while not stop.wait(0.02):
            n += 1
            supply.publish("Current", Data(value=float(n)))

    publisher = threading.Thread(target=publish, name="test-publisher")
    publisher.start()
    yield srv, supply
    stop.set()
    publisher.join(5)
    srv.stop()


def test_a_client_paused_past_the_server_heartbeat_timeout_resumes_at_once(
    server: tuple[Server, Supply],
) -> None:
    srv, _ = server
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, srv.endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    fd = child.stdout.fileno()
    lines: list[str] = []
    pending: list[str] = []
    partial = [""]

    def next_line(timeout: float) -> str | None:
        """The child's next stdout line, read unbuffered (os.read), or None after timeout."""
        deadline = time.monotonic() + timeout
        while not pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 65536).decode()
            assert chunk, "the child ended"
            *complete, partial[0] = (partial[0] + chunk).split("\n")
            pending.extend(complete)
        lines.append(pending.pop(0).strip())
        return lines[-1]

    try:
        first = next_line(60.0)
        assert first is not None and first.startswith("FIRST"), (first, child.stderr)
        assert next_line(30.0) is not None  # NORMAL updates flow
        os.kill(child.pid, signal.SIGSTOP)
        try:
            timeouts = heartbeat_timeouts(srv)
            wait_until(
                lambda: heartbeat_timeouts(srv) > timeouts,
                "the server to drop the paused client",
                timeout=30.0,
            )
            assert srv.clients() == []  # dropped: its subscription was ended on the server
        finally:
            os.kill(child.pid, signal.SIGCONT)
        resumed = time.monotonic()
        # Lines the child wrote before its pause may still be read; then an ERROR
        # (DisconnectedError: "the server no longer knew this connection") and a new FIRST.
        deadline = resumed + 20.0
        while True:
            line = next_line(max(0.0, deadline - time.monotonic()))
            assert line is not None, f"no FIRST within 20 s of SIGCONT: {lines[-5:]}"
            if line.startswith("FIRST"):
                break
        elapsed = time.monotonic() - resumed
        assert any(line.startswith("ERROR") for line in lines)
        print(f"FIRST again {elapsed:.2f} s after SIGCONT")
        assert len(srv.clients()) == 1
    finally:
        child.kill()
        child.wait(10)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
