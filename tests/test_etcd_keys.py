"""A server's etcd keys are watched by the server itself (issue 37 item 8).

Writing over a live server's ``devices/D*`` key in etcd lost its clients while the server still
reported "registered", and the key outlived the server's clean stop (a plain put has no lease).
Now the lease keeper checks at each refresh that every key is still on its lease: a key that
names another endpoint is reported (state ``overwritten`` naming the key and where it points,
in admin ``info`` and the log), one written again with the server's own entry is put back on
the lease, and at stop a key that still names the server goes with it.

Checked failing on main (a copy of this file outside the repository, PYTHONPATH on main's
tree): the state stayed ``registered`` (``timed out ... waiting for overwritten``) and the
re-written key outlived the stop. Real etcd (``LocalEtcd``); a real server on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging

import pytest

import rda
from rda.business.etcd.gateway import EtcdGateway
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.serialization.data import Data
from rda.testing import LocalEtcd, wait_until

TTL = 3.0  # the keeper looks every second
PREFIX = "/keys/"


class Plain(Device):
    @Device.property("Value")
    def value(self, request: object) -> Data:
        return Data(x=1)


def _state(registry: rda.EtcdDirectory) -> tuple[str, str]:
    reg = registry.state().registrations["KeyServer"]
    return reg.state, reg.last_error


def test_an_overwritten_key_is_reported_a_rewritten_own_key_is_re_leased_and_cleaned(
    etcd: LocalEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rda.directory.etcd")
    registry = rda.EtcdDirectory(etcd.url, prefix=PREFIX, ttl=TTL)
    server = (
        rda.admin.install(ServerBuilder("KeyServer").device("D1", Plain()).devices("D*", "E1"))
        .directory(registry)
        .build()
    )
    gateway = EtcdGateway([etcd.url], 2.0)
    server.start()
    try:
        assert _state(registry)[0] == "registered"
        own = gateway.range(f"{PREFIX}devices/E1")[1][0].value
        # Someone points D* elsewhere by hand: clients of D5 would go there.
        foreign = {"server": "Intruder", "endpoint": "tcp://10.9.9.9:9", "server_key": None}
        gateway.put(f"{PREFIX}devices/D*", json.dumps(foreign).encode())
        # ... and someone writes E1 again with our own entry (no lease).
        gateway.put(f"{PREFIX}devices/E1", own)

        def overwritten() -> bool:
            state, error = _state(registry)
            return state == "overwritten" and "devices/D*" in error

        wait_until(overwritten, "the server to report its overwritten key", timeout=10 * TTL)
        _, error = _state(registry)
        assert error == "devices/D* -> server 'Intruder' at tcp://10.9.9.9:9", error
        assert "devices/E1" not in error  # put back on the lease, not reported
        admin = rda.ClientService()
        try:
            info = admin.admin(server.endpoint, "info", timeout=10).to_dict()
        finally:
            admin.close()
        assert "KeyServer overwritten" in info["directory"], info["directory"]
        assert "devices/D*" in info["directory"]
        # Counted for Prometheus (rda_directory_keys_overwritten; alert RdaDirectoryKeysOverwritten).
        assert server.statistics().directory_keys_overwritten == 1
        assert _overwritten_metric(server) == 1.0
        logged = [r.getMessage() for r in caplog.records]
        assert any("directory keys written over: devices/D*" in m for m in logged), logged
        assert any("devices/E1 put back on its lease" in m for m in logged), logged
        # Giving D* back (our own entry again) ends the report.
        gateway.put(f"{PREFIX}devices/D*", own)
        wait_until(lambda: _state(registry)[0] == "registered", "registered again", timeout=30)
        assert _overwritten_metric(server) == 0.0
    finally:
        server.stop()
        registry.close()
    try:
        # Clean stop: every key that named the server went with it, the re-written ones too.
        _, left = gateway.range(PREFIX, prefix=True)
        assert [kv.key for kv in left] == [], [kv.key for kv in left]
    finally:
        gateway.close()


def _overwritten_metric(server: Server) -> float:
    from rda.admin.metrics import ServerCollector

    values = [
        sample.value
        for family in ServerCollector(server).collect()
        if family.name == "rda_directory_keys_overwritten"
        for sample in family.samples
    ]
    assert len(values) == 1, values
    return values[0]


def test_a_key_taken_by_another_server_stays_its_after_our_stop(etcd: LocalEtcd) -> None:
    """What another owner wrote is not ours to delete at stop."""
    registry = rda.EtcdDirectory(etcd.url, prefix=PREFIX, ttl=TTL)
    gateway = EtcdGateway([etcd.url], 2.0)
    try:
        registry.register("KeyServer", "tcp://10.0.0.1:1", ["F1"])
        foreign = {"server": "Other", "endpoint": "tcp://10.9.9.9:9", "server_key": None}
        gateway.put(f"{PREFIX}devices/F1", json.dumps(foreign).encode())
        wait_until(lambda: _state(registry)[0] == "overwritten", "reported", timeout=10 * TTL)
        registry.unregister("KeyServer")
        _, left = gateway.range(PREFIX, prefix=True)
        assert [kv.key for kv in left] == [f"{PREFIX}devices/F1"]
    finally:
        registry.close()
        gateway.close()
