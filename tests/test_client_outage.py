"""The client's figures of an outage and of its round trips, without a network (issue 25)."""

from __future__ import annotations

from rda.business.client.endpoints import Endpoint
from rda.business.client.reconnect import Backoff
from rda.business.histogram import OTHER, CappedHistograms


def _endpoint() -> Endpoint:
    return Endpoint("tcp://127.0.0.1:1", Backoff())


def test_time_disconnected_adds_up_the_outages() -> None:
    ep = _endpoint()
    ep.lost(5.0)  # never connected yet: a first connection attempt is no outage
    assert ep.snapshot(9.0).disconnected_seconds == 0.0
    ep.was_connected = True
    ep.lost(9.0)  # only admin requests used it: nothing wants it back, no outage
    assert ep.snapshot(10.0).disconnected_seconds == 0.0
    ep.devices.add("PS1")  # wanted: it reconnects by itself
    ep.lost(10.0)
    ep.lost(11.0)  # a second report of the same outage does not restart it
    assert ep.snapshot(12.5).disconnected_seconds == 2.5  # still out: counted up to now
    assert ep.snapshot(12.5).state == "reconnecting"
    ep.back(14.0)
    assert ep.snapshot(100.0).disconnected_seconds == 4.0  # back: fixed
    ep.lost(200.0)
    ep.back(201.5)
    assert ep.snapshot(300.0).disconnected_seconds == 5.5


def test_round_trips_per_type_and_per_device_up_to_the_cap() -> None:
    trips = CappedHistograms(("get", "set"), limit=2)
    for device in ("A", "B", "C", "D"):
        trips.observe("get", device, 0.001)
    trips.observe("set", "A", 0.2)
    trips.observe("subscribe", "A", -1.0)  # not a timed type; a negative time counts as 0
    per_type, per_device = trips.snapshot()
    assert {k: h.count for k, h in per_type.items()} == {"get": 4, "set": 1}
    assert {k: h.count for k, h in per_device.items()} == {"A": 3, "B": 1, OTHER: 2}
    assert per_device["A"].counts[0] == 1  # the 0 s observation, in the first bucket
    assert per_type["set"].sum == 0.2
