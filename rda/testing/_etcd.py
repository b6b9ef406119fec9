"""A throwaway etcd for tests and benchmarks: ``with LocalEtcd(tmp_path) as etcd: etcd.url``.

Starts the real ``etcd`` binary (Debian's etcd-server; ``make install`` installs it when
missing) on 127.0.0.1 with free client and peer ports and a data directory under ``folder``,
waits until ``/health`` answers ``true`` (bounded), and stops it by its pid. ``stop()`` and
``start()`` again reuse the same ports and data, which is how a test simulates an outage;
``kill()`` is a ``kill -9``. The log stays in ``folder/etcd.log`` for a failed test's report.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from rda.testing._ports import free_port

__all__ = ["LocalEtcd"]

_BIND_TRIES = 3


class LocalEtcd:
    """One single-member etcd on 127.0.0.1, owned by the caller."""

    def __init__(self, folder: Path | str, *, ready_timeout: float = 20.0) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd not found on PATH: `make install` installs etcd-server")
        self.binary = binary
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log_path = self.folder / "etcd.log"
        self.ready_timeout = ready_timeout
        self.client_port = free_port()
        self.peer_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._started = False  # once healthy, restarts keep the ports

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def __repr__(self) -> str:
        return f"LocalEtcd({self.url}, pid {self.pid})"

    def __enter__(self) -> LocalEtcd:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start (or start again, on the same ports and data) and wait until healthy."""
        if self._process is not None and self._process.poll() is None:
            return
        for attempt in range(_BIND_TRIES):
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._launch()
            if self._wait_healthy():
                self._started = True
                return
            self.stop()
            tail = self.log_path.read_text(errors="replace")[log_start:][-2000:]
            # A port taken between choosing it and etcd binding it: choose again, but only
            # before the first success (a restart must keep the url the test knows).
            if self._started or "address already in use" not in tail:
                break
            if attempt + 1 < _BIND_TRIES:
                self.client_port, self.peer_port = free_port(), free_port()
        raise RuntimeError(f"etcd at {self.url} did not become healthy; its log ends:\n{tail}")

    def _launch(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            self.binary,
            "--name=rda-test",
            f"--data-dir={self.folder / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=rda-test={peer}",
            "--log-level=warn",
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + self.ready_timeout
        process = self._process
        assert process is not None
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    return False
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    if client.get(f"{self.url}/health").json().get("health") == "true":
                        return True
                time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def kill(self) -> None:
        """``kill -9``: no goodbye to anyone."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10.0)
