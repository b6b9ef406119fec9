"""The demo equipment server (rda.demo), exercised with ClientService over tcp loopback."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.directory import StaticDirectory
from rda.business.server.requests import GetRequest
from rda.demo import CYCLES, BeamPositionMonitor, PowerConverter, build_demo_server
from rda.serialization.errors import RemoteError
from rda.serialization.header import UpdateType
from rda.testing import wait_until

CONFIG = Config(heartbeat_interval=0.2, heartbeat_timeout=5.0)


def test_a_get_answers_the_last_acquisition_as_it_was() -> None:
    """Issue 37, item 17: the demo's get answered a fresh stamp for the value it last
    published, so a subscription's FIRST looked like a new acquisition (and the recorder stored
    it again). Checked against main at d880094: each get had a new stamp, and none was the
    published acquisition's. Now a get (and so FIRST) is the last acquisition: same stamp,
    cycle and value, for the converters and the orbit alike."""
    converter, bpm = PowerConverter(), BeamPositionMonitor()
    request = cast(GetRequest, None)  # the demo's getters do not read the request
    published = converter.step("CPS.USER.SFT", 123)
    orbit = bpm.step("CPS.USER.SFT", 123, 1)
    for got in (PowerConverter.acquisition.getter(converter, request),) * 2:
        assert got.context == published.context and got.data == published.data
    assert BeamPositionMonitor.orbit.getter(bpm, request).context == orbit.context
    assert PowerConverter.acquisition.getter(converter, request).context.cycle_name == (
        "CPS.USER.SFT"
    )


def test_demo_devices_end_to_end() -> None:
    before = set(threading.enumerate())
    server = build_demo_server(directory=None, config=CONFIG, rate_hz=50.0)
    with server:
        assert server.devices() == ["PS1", "PS2", "PS3", "BPM1", "FAULTY"]
        directory = StaticDirectory({"*": server.endpoint})
        with ClientService(directory=directory, config=CONFIG) as client:
            setting = client.access_point("PS2", "Setting")
            setting.set({"current": -40.0}, timeout=5)
            assert setting.get(timeout=5).data["current"] == -40.0
            with pytest.raises(RemoteError, match="current: Input should be greater than"):
                setting.set({"current": -101.0}, timeout=5)
            sub = client.access_point("PS2", "Acquisition").subscribe()
            first = sub.poll(10)
            assert first is not None and first.update_type is UpdateType.FIRST
            cycles = set()
            last = None
            for _ in range(30):
                n = sub.poll(10)
                assert n is not None and n.update_type is UpdateType.NORMAL
                assert n.context.acq_stamp > 0
                cycles.add(n.context.cycle_name)
                last = n.data["current"]
            assert cycles <= set(CYCLES) and len(cycles) > 1
            assert last is not None and abs(last + 40.0) < 1.0  # followed the setting
            sub.close()
            orbit = client.access_point("BPM1", "Orbit").get(timeout=5).data
            assert orbit.get_array("orbit").shape == (2, 64)
            assert str(orbit.get_array("orbit").dtype) == "float64"
            with pytest.raises(RemoteError, match="interlock chain open") as info:
                client.access_point("FAULTY", "Status").get(timeout=5)
            assert info.value.type == "RuntimeError"
    wait_until(
        lambda: not [t for t in threading.enumerate() if t not in before],
        "the threads the demo started to end",
        probe=lambda: [t.name for t in threading.enumerate() if t not in before],
    )
