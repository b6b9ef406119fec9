"""``rda directory list --check``: whether each registered server answers now (issue 37 item 15).

A killed server's etcd entries outlive it until its lease's ttl runs out; ``rda directory
list`` showed it as registered with no marker. ``--check`` pings every listed server (admin
``ping``, all at once) and shows who answers. On main before the fix (checked with
PYTHONPATH=/work/main) ``--check`` did not exist: ``No such option: --check``, exit 2.

Real etcd (``LocalEtcd``); a live server on 127.0.0.1 registered there, and the entry a
``kill -9``-ed server leaves (its lease still running, nothing at its endpoint).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

import rda
from rda.admin.cli.main import cli
from rda.business.etcd.gateway import EtcdGateway
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.serialization.data import Data
from rda.testing import LocalEtcd

PREFIX = "/check/"


class Plain(Device):
    @Device.property("Value")
    def value(self, request: object) -> Data:
        return Data(x=1)


@pytest.fixture
def live(etcd: LocalEtcd) -> Iterator[Server]:
    registry = rda.EtcdDirectory(etcd.url, prefix=PREFIX, ttl=5.0)
    server = ServerBuilder("LiveServer").device("LIVE1", Plain()).directory(registry).build()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        registry.close()


def _killed_entry(etcd: LocalEtcd) -> str:
    """What a server killed with ``kill -9`` leaves: its keys, under a lease still running."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there
    gateway = EtcdGateway([etcd.url], 2.0)
    try:
        lease = gateway.grant(60)
        entry = {
            "name": "KilledServer", "endpoint": endpoint, "devices": ["GONE1"], "pid": 1,
            "host": "elsewhere", "registered_at": time.time(), "server_key": None,
        }  # fmt: skip
        gateway.put(f"{PREFIX}servers/KilledServer", json.dumps(entry).encode(), lease)
    finally:
        gateway.close()
    return endpoint


def _list(etcd: LocalEtcd, *args: str) -> Result:
    port = etcd.url.rsplit(":", 1)[1]
    env = {"RDA_DIRECTORY_URL": f"etcd://127.0.0.1:{port}", "RDA_DIRECTORY_PREFIX": PREFIX}
    return CliRunner().invoke(cli, ["directory", "list", *args], prog_name="rda", env=env)


def test_check_tells_a_live_server_from_a_killed_ones_entry(
    etcd: LocalEtcd, live: Server, no_thread_leak: None
) -> None:
    dead = _killed_entry(etcd)
    result = _list(etcd, "--check", "--json")
    assert result.exit_code == 0, result.output
    rows = {s["name"]: s for s in json.loads(result.stdout)["servers"]}
    assert rows["LiveServer"]["alive"] is True, rows
    assert rows["LiveServer"]["check"].startswith("yes (")
    assert rows["KilledServer"]["alive"] is False, rows
    # Refused at once (DisconnectedError), or no answer within the ping's timeout.
    assert rows["KilledServer"]["check"] in ("no (DisconnectedError)", "no (TimeoutError)")
    assert rows["KilledServer"]["endpoint"] == dead
    table = _list(etcd, "--check")
    assert table.exit_code == 0, table.output
    lines = {line.split()[0]: line for line in table.stdout.splitlines() if "Server" in line}
    assert " no (" in lines["KilledServer"], table.stdout
    assert " yes (" in lines["LiveServer"], table.stdout
    # Without --check: no pings, no column (listing stays a directory read).
    plain = _list(etcd, "--json")
    assert "alive" not in json.loads(plain.stdout)["servers"][0]
