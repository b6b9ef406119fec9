"""A demo equipment server with simulated devices (``make demo``, ``rda serve demo``).

Devices:

- ``PS1``..``PS3``: power converters. ``Setting`` (get/set ``current`` in A, validated to
  -100..100 by a pydantic schema); ``Acquisition`` (the measured current: follows the setting
  with a first-order lag plus noise, published at 10 Hz for the cycles of a simulated
  super-cycle, stamped in ns).
- ``BPM1``: a beam position monitor. ``Orbit``: a 2x64 float64 array (horizontal and vertical
  positions in mm) with the monitor ``positions`` along the ring, published with the cycle.
- ``FAULTY``: its ``Status`` property fails on purpose, to show an error reaching a client.

Every property declares its fields' metadata (docs/server.md, "Property metadata"): units,
precision, the converters' control limits, and alarm limits, so that every tool shows them.
The measured current is in a MINOR alarm beyond +-90 A and in a MAJOR one beyond +-95 A: set
``current=97`` and watch ``Acquisition`` go MINOR, then MAJOR as it follows.

``rda serve demo --secure DIR`` serves it with CURVE encryption and client authentication
(:func:`demo_security`, docs/security.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, Field

from rda.business import metadata
from rda.business.common import AcquiredData
from rda.business.config import Config
from rda.business.directory import FileDirectory
from rda.business.security import (
    ServerSecurity,
    generate_keypair,
    load_keypair,
    save_keypair,
    save_public_key,
)
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device, prop
from rda.business.server.requests import GetRequest, SetRequest
from rda.serialization.data import Data
from rda.serialization.header import DataContext

__all__ = [
    "ACQUISITION_FIELDS",
    "CYCLES",
    "ORBIT_FIELDS",
    "BeamPositionMonitor",
    "Faulty",
    "PowerConverter",
    "SettingModel",
    "build_demo_server",
    "demo_builder",
    "demo_security",
    "main",
]

log = logging.getLogger("rda.demo")

# A simulated PS super-cycle: one cycle name per 100 ms basic period.
CYCLES: tuple[str, ...] = (
    "CPS.USER.SFTPRO",
    "CPS.USER.SFTPRO",
    "CPS.USER.MD1",
    "CPS.USER.TOF",
    "CPS.USER.LHC1",
)
MONITORS = 64


class SettingModel(BaseModel):
    """What a power converter accepts as ``Setting``."""

    current: Annotated[float, metadata.Field(units="A", precision=3, limits=(-100.0, 100.0))] = (
        Field(ge=-100.0, le=100.0, description="Current set point, A")
    )


# What the converters' and the monitor's acquisitions declare (the Setting's is in its model).
ACQUISITION_FIELDS = {
    "current": metadata.Field(
        units="A",
        precision=4,
        description="Measured current",
        warning=(-90.0, 90.0),
        alarm=(-95.0, 95.0),
    ),
    "set_point": metadata.Field(units="A", precision=3, description="Set point it follows"),
}
ORBIT_FIELDS = {
    "orbit": metadata.Field(
        units="mm",
        precision=3,
        description="Closed orbit, rows H and V",
        warning=(-2.5, 2.5),
        alarm=(-4.0, 4.0),
    ),
    "positions": metadata.Field(
        units="m", precision=1, description="Monitor positions along the ring"
    ),
}


class PowerConverter(Device):
    """A power converter whose measured current follows the set point."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self.set_point = 0.0
        self.measured = 0.0
        # The last acquisition, which a get answers as it was (stamp and cycle included): a
        # get or a subscription's FIRST is not a new measurement (docs/server.md).
        self._last = self._acquired("CPS.USER.ALL", 0.0)

    # The demo's handlers only read or write memory under a short lock: non-blocking, so the
    # server answers them on its dispatcher (no worker hop) when the device is idle.
    @prop(
        "Setting",
        schema=SettingModel,
        blocking=False,
        description="The current the converter is asked to give",
    )
    def setting(self, request: GetRequest) -> Data:
        with self._lock:
            return Data(current=self.set_point)

    @setting.setter
    def write_setting(self, value: SettingModel, request: SetRequest) -> None:
        with self._lock:
            self.set_point = value.current

    @prop(
        "Acquisition",
        blocking=False,
        fields=ACQUISITION_FIELDS,
        description="The measured current, published every basic period",
    )
    def acquisition(self, request: GetRequest) -> AcquiredData:
        with self._lock:
            return self._last

    def step(self, cycle: str, cycle_stamp: int) -> AcquiredData:
        """Advance the simulation by one cycle and return the new acquisition."""
        with self._lock:
            # First-order lag towards the set point (time constant ~3 cycles) plus 5 mA noise.
            self.measured += (self.set_point - self.measured) * 0.3
            self.measured += float(self._rng.normal(0.0, 0.005))
            self._last = self._acquired(cycle, self.measured, cycle_stamp)
            return self._last

    def _acquired(self, cycle: str, measured: float, cycle_stamp: int = 0) -> AcquiredData:
        data = Data(current=measured, set_point=self.set_point, unit="A")
        stamp = time.time_ns()
        return AcquiredData(data, DataContext(cycle, cycle_stamp or stamp, stamp, cycle))


class BeamPositionMonitor(Device):
    """Closed-orbit readings of 64 monitors, horizontal and vertical."""

    def __init__(self, seed: int = 1) -> None:
        super().__init__()
        self._rng = np.random.default_rng(seed)
        self._positions = np.linspace(0.0, 628.3, MONITORS)
        self._lock = threading.Lock()
        stamp = time.time_ns()
        # As for the converter: a get answers the last acquisition as it was.
        self._last = AcquiredData(
            self._data(self._measure(0)), DataContext("CPS.USER.ALL", stamp, stamp, "CPS.USER.ALL")
        )

    @prop(
        "Orbit",
        blocking=False,
        fields=ORBIT_FIELDS,
        description="Closed-orbit readings of 64 monitors, published every basic period",
    )
    def orbit(self, request: GetRequest) -> AcquiredData:
        with self._lock:
            return self._last

    def step(self, cycle: str, cycle_stamp: int, turn: int) -> AcquiredData:
        acquired = AcquiredData(
            self._data(self._measure(turn)), DataContext(cycle, cycle_stamp, time.time_ns(), cycle)
        )
        with self._lock:
            self._last = acquired
        return acquired

    def _measure(self, turn: int) -> np.ndarray:
        phase = 2 * math.pi * np.arange(MONITORS) / MONITORS
        betatron = np.vstack([np.sin(6.25 * phase + 0.1 * turn), np.cos(6.18 * phase)])
        noise = self._rng.normal(0.0, 0.02, size=(2, MONITORS))
        return np.ascontiguousarray(betatron * 1.5 + noise, dtype=np.float64)

    def _data(self, orbit: np.ndarray) -> Data:
        return Data(orbit=orbit, positions=self._positions, planes=["H", "V"], unit="mm")


class Faulty(Device):
    """A device whose ``Status`` always fails: the error case of the demo."""

    @prop("Status", description="Fails on purpose: the error case")
    def status(self, request: GetRequest) -> Data:
        raise RuntimeError("interlock chain open: converter in fault state (simulated)")


class _Cycler:
    """Publishes every device's acquisition once per basic period, on its own thread."""

    def __init__(
        self,
        converters: Sequence[PowerConverter],
        bpm: BeamPositionMonitor,
        rate_hz: float,
    ) -> None:
        self._converters = converters
        self._bpm = bpm
        self._period = 1.0 / rate_hz
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rda-demo-cycler", daemon=True)

    def start(self, server: Server) -> None:
        self._thread.start()

    def stop(self, server: Server) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def _run(self) -> None:
        turn = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            cycle = CYCLES[turn % len(CYCLES)]
            stamp = time.time_ns()
            try:
                for converter in self._converters:
                    converter.publish("Acquisition", converter.step(cycle, stamp))
                self._bpm.publish("Orbit", self._bpm.step(cycle, stamp, turn))
            except Exception:
                log.exception("demo cycler: publishing failed")
            turn += 1
            next_at += self._period
            # Keep the cadence (no drift); after a stall, skip ahead rather than burst.
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)


def demo_builder(
    endpoint: str = "tcp://127.0.0.1:0",
    *,
    name: str = "RdaDemoServer",
    config: Config | None = None,
    directory: FileDirectory | Literal["default"] | None = "default",
    rate_hz: float = 10.0,
    seed: int = 0,
) -> ServerBuilder:
    """A ``ServerBuilder`` with the demo devices, for callers that add more (e.g. the admin
    commands) before building. ``directory="default"`` registers where ``config`` says (etcd
    with ``RDA_DIRECTORY_URL``, else the file directory; so ``rda get PS1 Setting`` finds it);
    None registers nowhere."""
    converters = [PowerConverter(seed + i) for i in range(3)]
    bpm = BeamPositionMonitor(seed + 10)
    cycler = _Cycler(converters, bpm, rate_hz)
    builder = ServerBuilder(name).endpoint(endpoint)
    if config is not None:
        builder.config(config)
    if directory != "default":
        builder.directory(directory)
    for i, converter in enumerate(converters, start=1):
        builder.device(f"PS{i}", converter)
    builder.device("BPM1", bpm).device("FAULTY", Faulty())
    return builder.on_start(cycler.start).on_stop(cycler.stop)


def build_demo_server(
    endpoint: str = "tcp://127.0.0.1:0",
    *,
    name: str = "RdaDemoServer",
    config: Config | None = None,
    directory: FileDirectory | Literal["default"] | None = "default",
    rate_hz: float = 10.0,
    seed: int = 0,
) -> Server:
    """The demo server, built and not started (arguments as :func:`demo_builder`)."""
    return demo_builder(
        endpoint, name=name, config=config, directory=directory, rate_hz=rate_hz, seed=seed
    ).build()


def demo_security(folder: Path | str) -> ServerSecurity:
    """CURVE for the demo (``rda serve demo --secure DIR``), keys created on first use.

    ``DIR/server.key_secret`` is the server's pair; ``DIR/clients/`` holds the public keys
    of the accepted clients, seeded with ``operator`` whose pair is ``DIR/operator.key_secret``
    (``rda get PS1/Setting --key DIR/operator.key_secret``). Existing files are kept, so
    clients added to ``DIR/clients`` stay accepted across restarts.
    """
    folder = Path(folder)
    server_file, clients = folder / "server.key_secret", folder / "clients"
    if not server_file.exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        save_keypair(generate_keypair(), server_file)
        clients.mkdir(exist_ok=True)
        operator = generate_keypair()
        save_keypair(operator, folder / "operator.key_secret")
        save_public_key(operator.public, clients / "operator.key")
    return ServerSecurity(load_keypair(server_file), clients=clients)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo server until interrupted (Ctrl-C or SIGTERM)."""
    parser = argparse.ArgumentParser(prog="python -m rda.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:0", help="where to bind")
    parser.add_argument("--name", default="RdaDemoServer", help="server name in the directory")
    parser.add_argument("--no-register", action="store_true", help="skip the file directory")
    parser.add_argument("--rate", type=float, default=10.0, help="publications per second")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # httpx logs each request at INFO: with etcd as the directory, a line per lease refresh.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    server = build_demo_server(
        args.endpoint,
        name=args.name,
        directory=None if args.no_register else "default",
        rate_hz=args.rate,
    )
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    with server:
        print(f"{server.name} serving {', '.join(server.devices())} on {server.endpoint}")
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
