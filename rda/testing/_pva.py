"""Throwaway pvAccess processes on 127.0.0.1: a real EPICS IOC and the rda pvAccess gateway.

Each :class:`PvaIsland` is one set of EPICS address variables (server and broadcast ports
taken free, every address 127.0.0.1, no automatic address list), so nothing searches or
answers beyond loopback and two tests never see each other's PVs. :class:`LocalIoc` runs
``python -m pvxslibs.ioc -d FILE.db`` (EPICS base with QSRV2, from PyPI's pvxslibs) and
:class:`GatewayProcess` runs ``rda gateway pva``; both wait for the process to say it is
ready, keep its output in a log file, and stop it by its pid (SIGTERM, then SIGKILL after
the timeout). :class:`PvaMonitor` watches PVs from a p4p client without losing a first
update. p4p is imported only by :class:`PvaMonitor`, when used.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rda.testing._ports import free_port

__all__ = ["GatewayProcess", "LocalIoc", "PvaIsland", "PvaMonitor", "PvaProcess"]


def free_pva_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (pvAccess serves and searches on both)."""
    for _ in range(100):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free for both TCP and UDP")


@dataclass(frozen=True)
class PvaIsland:
    """The EPICS variables of one loopback-only pvAccess neighbourhood."""

    server_port: int = field(default_factory=free_pva_port)
    broadcast_port: int = field(default_factory=free_pva_port)

    def environment(self) -> dict[str, str]:
        """What a server process of this island runs with (clients use :meth:`client_conf`)."""
        return {
            "EPICS_PVA_ADDR_LIST": "127.0.0.1",
            "EPICS_PVA_AUTO_ADDR_LIST": "NO",
            "EPICS_PVAS_INTF_ADDR_LIST": "127.0.0.1",
            "EPICS_PVA_SERVER_PORT": str(self.server_port),
            "EPICS_PVA_BROADCAST_PORT": str(self.broadcast_port),
        }

    def client_conf(self) -> dict[str, str]:
        """A p4p client ``Context(conf=..., useenv=False)`` that searches this island only."""
        env = self.environment()
        del env["EPICS_PVAS_INTF_ADDR_LIST"]
        return env


class PvaProcess:
    """A child process with its output in ``log``, ready when a line contains ``ready``."""

    ready = ""

    def __init__(self, args: Sequence[str], island: PvaIsland, log: Path) -> None:
        self.args = list(args)
        self.island = island
        self.log = log
        self._out: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0, env: dict[str, str] | None = None) -> PvaProcess:
        environment = {**os.environ, **self.island.environment(), **(env or {})}
        self._out = self.log.open("ab")
        self.process = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE,  # the IOC's shell reads it; closed, it exits
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,  # a Ctrl-C of the test run is for the test, not for it
        )
        deadline = time.monotonic() + timeout
        while self.ready not in self.output():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.args[:4]} exited ({self.process.returncode}) before it was ready:\n"
                    + self.output()[-3000:]
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.args[:4]} not ready after {timeout} s:\n{self.output()}")
            time.sleep(0.05)
        return self

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the process (SIGTERM, SIGKILL after ``timeout``); its exit status."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        if process.stdin is not None:
            process.stdin.close()
        if self._out is not None:
            self._out.close()
            self._out = None
        return process.returncode

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalIoc(PvaProcess):
    """A real EPICS IOC serving ``database`` over pvAccess (QSRV2)."""

    ready = "iocRun: All initialization complete"

    def __init__(self, database: Path, island: PvaIsland, log: Path) -> None:
        super().__init__([sys.executable, "-m", "pvxslibs.ioc", "-d", str(database)], island, log)


class GatewayProcess(PvaProcess):
    """``rda [--endpoint ENDPOINT] gateway pva ARGS`` in a process of its own."""

    ready = "rda gateway pva: serving"

    def __init__(
        self,
        island: PvaIsland,
        log: Path,
        args: Sequence[str] = (),
        endpoint: str | None = None,
    ) -> None:
        command = [sys.executable, "-m", "rda._cli"]
        if endpoint is not None:
            command += ["--endpoint", endpoint]
        super().__init__([*command, "gateway", "pva", *args], island, log)


class PvaMonitor:
    """Monitors of a p4p client ``Context`` without p4p's first-update race.

    p4p's threaded ``Context.monitor`` drops the wake-up of an update that arrives before the
    call has returned (it logs "Lost Subscription update"), and that subscription is never
    woken again: against a fast server (an IOC) a monitor can stay silent for ever. Here one
    thread (``rda-test-pva-monitor``) pops every subscription's queue when any of them wakes,
    and at least every half second, so no wake-up can be lost. ``callback(name, update)`` gets
    each ``Value`` or error in order, on that thread.
    """

    def __init__(self, ctx: Any) -> None:
        import threading

        self._ctx = ctx
        self._lock = threading.Lock()
        self._subs: list[tuple[str, Any, Any]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rda-test-pva-monitor", daemon=True)
        self._thread.start()

    def watch(self, name: str, callback: Any, request: Any = None) -> None:
        from p4p.client import raw

        sub = raw.Context.monitor(self._ctx, name, lambda *_: self._wake.set(), request)
        with self._lock:
            self._subs.append((name, sub, callback))
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            with self._lock:
                subs = list(self._subs)
            for name, sub, callback in subs:
                while not self._stop.is_set():
                    update = sub.pop()
                    if update is None:
                        break
                    callback(name, update)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
        with self._lock:
            subs, self._subs = self._subs, []
        for _, sub, _ in subs:
            sub.close()

    def __enter__(self) -> PvaMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
