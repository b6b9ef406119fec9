"""Endpoints that move and idle connections (issue 12, defects 3 and 4), over ZeroMQ on tcp
loopback with a real file directory.

3. On reconnection the client resolves the device again: a server restarted on another port
   (or a failover server) is found, subscriptions resume there with a FIRST update, and gets
   follow.
4. A connection with no pending request and no subscription notices the loss and reconnects in
   the background, so the first get after a restart does not open a connection; the state is
   in ``ClientService.statistics().servers`` and the client metrics.

Every wait is on a state (bounded), never a sleep standing in for one.
"""

from __future__ import annotations

from pathlib import Path

from rda.admin.metrics import ClientCollector
from rda.business.client.service import ClientService
from rda.business.client.statistics import ServerConnectionStatistics
from rda.business.config import Config
from rda.business.directory import FileDirectory, StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError
from rda.serialization.header import UpdateType
from rda.testing import wait_until

CONFIG = Config(request_timeout=5.0, reconnect_initial=0.02, reconnect_max=0.5)


class Named(RequestReplyCallback):
    """Answers with the name of the server that answered."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, request: GetRequest) -> None:
        request.complete(Data(server=self.name))


def serve(
    name: str,
    directory: FileDirectory | None,
    port: int = 0,
    answer: str = "",
    replace: bool = False,
) -> Server:
    return (
        ServerBuilder(name)
        .endpoint(f"tcp://127.0.0.1:{port}")
        .request_reply(Named(answer or name))
        .devices("PS1")
        .directory(directory)
        .replace(replace)
        .build()
        .start()
    )


def server_state(client: ClientService, endpoint: str) -> ServerConnectionStatistics | None:
    for server in client.statistics().servers:
        if server.endpoint == endpoint:
            return server
    return None


def test_restart_on_a_new_port_is_followed_through_the_file_directory(
    no_thread_leak: None, tmp_path: Path
) -> None:
    directory = FileDirectory(tmp_path / "servers.json")
    first = serve("PS", directory, answer="first")
    old = first.endpoint
    client = ClientService(directory, CONFIG)
    second: Server | None = None
    try:
        point = client.access_point("PS1", "Acquisition")
        sub = point.subscribe()
        note = sub.poll(10)
        assert note is not None and note.update_type is UpdateType.FIRST
        assert note.data == Data(server="first")
        assert point.get().data == Data(server="first")
        first.stop()  # unregisters: the directory no longer lists PS1
        lost = sub.poll(10)
        assert lost is not None and isinstance(lost.error, DisconnectedError)
        second = serve("PS", directory, answer="second")  # the same server, restarted
        assert second.endpoint != old
        note = sub.poll(20)
        assert note is not None and note.error is None, note
        assert note.update_type is UpdateType.FIRST and note.gap == 0
        assert note.data == Data(server="second")
        assert point.get().data == Data(server="second")
        assert point.endpoint == second.endpoint
        moved = server_state(client, second.endpoint)
        assert moved is not None and moved.state == "connected"
        assert moved.subscriptions == 1 and moved.devices == ("PS1",)
        # The old address is no longer dialled: nothing there is wanted any more.
        wait_until(lambda: server_state(client, old) is None, timeout=20.0)
        sub.close()
    finally:
        client.close()
        first.stop()
        if second is not None:
            second.stop()


def test_failover_to_a_newer_registration_while_the_first_server_still_runs(
    no_thread_leak: None, tmp_path: Path
) -> None:
    directory = FileDirectory(tmp_path / "servers.json")
    primary = serve("PS-primary", directory)
    client = ClientService(directory, CONFIG)
    backup: Server | None = None
    try:
        sub = client.access_point("PS1", "Acquisition").subscribe()
        note = sub.poll(10)
        assert note is not None and note.data == Data(server="PS-primary")
        # One live server per device: the backup takes PS1 over on purpose.
        backup = serve("PS-backup", directory, replace=True)
        primary.stop()
        lost = sub.poll(10)
        assert lost is not None and isinstance(lost.error, DisconnectedError)
        note = sub.poll(20)
        assert note is not None and note.update_type is UpdateType.FIRST
        assert note.data == Data(server="PS-backup")
        sub.close()
    finally:
        client.close()
        primary.stop()
        if backup is not None:
            backup.stop()


def test_idle_connection_reconnects_in_the_background(no_thread_leak: None) -> None:
    server = serve("Idle", None)
    endpoint = server.endpoint
    port = int(endpoint.rsplit(":", 1)[1])
    client = ClientService(StaticDirectory({"PS*": endpoint}), CONFIG)
    restarted: Server | None = None
    try:
        point = client.access_point("PS1", "Acquisition")
        assert point.get().data == Data(server="Idle")
        state = server_state(client, endpoint)
        assert state is not None and (state.state, state.reconnects) == ("connected", 0)
        assert state.devices == ("PS1",) and state.subscriptions == 0
        server.stop()  # no request pending, no subscription: the client notices by itself
        wait_until(
            lambda: getattr(server_state(client, endpoint), "state", "") == "reconnecting",
            timeout=20.0,
        )
        restarted = serve("Idle", None, port)
        wait_until(
            lambda: getattr(server_state(client, endpoint), "state", "") == "connected",
            timeout=20.0,
        )
        before = server_state(client, endpoint)
        assert before is not None and before.reconnects == 1
        assert client.statistics().reconnects == 1
        # The first get after the restart finds the connection already up: it opens none.
        assert point.get().data == Data(server="Idle")
        after = server_state(client, endpoint)
        assert after is not None and (after.state, after.connects) == ("connected", before.connects)
        metrics = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in ClientCollector(client, name="c").collect()
            for sample in family.samples
        }
        labels = (("client", "c"), ("endpoint", endpoint))
        assert metrics[("rda_client_server_connected", labels)] == 1.0
        assert metrics[("rda_client_server_reconnects_total", labels)] == 1.0
        # The outage is over: its length is fixed, and the metric says the same.
        outage = server_state(client, endpoint)
        assert outage is not None and outage.disconnected_seconds > 0
        assert metrics[("rda_client_server_disconnected_seconds_total", labels)] == (
            outage.disconnected_seconds
        )
        # Round trips of the gets, one histogram per type and per device (capped).
        get_count = metrics[
            ("rda_client_round_trip_seconds_count", (("client", "c"), ("type", "get")))
        ]
        assert get_count == client.statistics().replies == 2
        device = (("client", "c"), ("device", "PS1"))
        assert metrics[("rda_client_device_round_trip_seconds_count", device)] == 2
    finally:
        client.close()
        server.stop()
        if restarted is not None:
            restarted.stop()
