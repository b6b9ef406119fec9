"""The device every simulated server serves, and the handler faults it can be told to make.

``Acq`` is published with a counter ``k`` (the ``received-plus-gaps`` invariant compares
updates with it); ``Setting`` holds ``v`` (``set-then-get``). Its state outlives a server
crash: it stands for the hardware, which a restarted server finds as it was.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest, SetRequest
from rda.serialization.data import Data
from rda.testing.simulation._invariants import InjectedFault

__all__ = ["HandlerFaults", "SimDevice"]


class HandlerFaults:
    """Decides, from the seed, whether a handler raises or completes after its deadline."""

    def __init__(
        self,
        rng: random.Random,
        error_rate: float,
        overrun_rate: float,
        later: Callable[[float, Callable[[], None], str], None],
    ) -> None:
        self.rng = rng
        self.error_rate = error_rate
        self.overrun_rate = overrun_rate
        self.later = later
        self.errors = 0
        self.overruns = 0
        self.late_gets = False  # SimSettings.late_gets

    def before(self, what: str) -> None:
        if self.error_rate and self.rng.random() < self.error_rate:
            self.errors += 1
            raise InjectedFault(f"injected handler error in {what}")

    def late(self, request: GetRequest, value: Data) -> bool:
        """True when the get, its value read now, will be completed a little later."""
        if not self.late_gets:
            return False
        delay = self.rng.uniform(0.0, 0.02)
        self.later(delay, lambda: request.complete(value), f"late get {request.id}")
        return True

    def overrun(self, request: GetRequest, value: Callable[[], Data]) -> bool:
        """True when the get will be completed later than its client's deadline."""
        if not self.overrun_rate or self.rng.random() >= self.overrun_rate:
            return False
        self.overruns += 1
        timeout = request.timeout or 1.0
        delay = timeout * self.rng.uniform(1.01, 2.0)
        self.later(delay, lambda: request.complete(value()), f"late answer to {request.id}")
        return True


class SimDevice(Device):
    """See the module docstring."""

    def __init__(self, faults: HandlerFaults) -> None:
        super().__init__()
        self.faults = faults
        self.k = 0
        self.v = 0
        # The simulation's RBAC check of each set that reaches the handler.
        self.authorize: Callable[[SetRequest], None] | None = None
        # Told of each set applied (set-then-get knows which value is in force, and when).
        self.applied: Callable[[SetRequest, int], None] | None = None

    @Device.property("Acq")
    def acq(self, request: GetRequest) -> Any:
        self.faults.before("Acq get")
        if self.faults.overrun(request, lambda: Data(k=self.k)):
            return None  # completed later, past the deadline
        if self.faults.late(request, Data(k=self.k)):
            return None  # read now, completed a little later
        return Data(k=self.k)

    @Device.property("Setting")
    def setting(self, request: GetRequest) -> Any:
        self.faults.before("Setting get")
        return Data(v=self.v)

    @setting.setter
    def write_setting(self, value: Data, request: SetRequest) -> None:
        if self.authorize is not None:
            self.authorize(request)
        self.faults.before("Setting set")
        self.v = int(value["v"])
        if self.applied is not None:
            self.applied(request, self.v)
