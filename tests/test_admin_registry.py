"""Admin registry and built-in commands against an in-memory fake of the server API.

The end-to-end tests over a real server live in test_admin_server.py; here each command's
logic and every error path is pinned without sockets.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydantic
import pytest

import rda.admin
from rda.admin.builtins import histogram_quantile, plain
from rda.admin.registry import REGISTRY, AdminArgumentsError, AdminContext, CommandRegistry
from rda.business.scheduler import SchedulerStatistics
from rda.business.server.statistics import (
    DURATION_BUCKETS,
    ClientSnapshot,
    HistogramSnapshot,
    ServerStatistics,
    SourceSnapshot,
)
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError
from rda.transport.api import ServerTransportStatistics


class FakeServer:
    """Implements the introspection API with fixed, recognisable values."""

    def __init__(self) -> None:
        self.name = "FakeServer"
        self.endpoint = "tcp://127.0.0.1:5555"
        self.started_at = time.time() - 100.0
        self.disconnected: list[str] = []
        self.requests = {("get", "ok"): 7, ("get", "error"): 2, ("set", "ok"): 1}

    def uptime(self) -> float:
        return 100.0  # the monotonic clock's figure, not time.time() - started_at

    def settings(self) -> dict[str, object]:
        return {"workers": 4, "queue_limit": 1000, "heartbeat_timeout": 10.0}

    def devices(self) -> list[str]:
        return ["PS2", "PS1"]

    def clients(self) -> list[ClientSnapshot]:
        now = time.time()
        return [
            ClientSnapshot("00ab", {"user": "alice", "pid": 12}, now - 30.0, now - 1.0, 2, 30.0),
            ClientSnapshot("00cd", {"user": "bob"}, now - 5.0, now, 0, 5.0),
        ]

    def sources(self) -> list[SourceSnapshot]:
        return [
            SourceSnapshot("PS1", "Acquisition", "", None, 2, 40, 1, time.time()),
            SourceSnapshot("PS2", "Status", "CPS.USER.ALL", {"f": 1}, 1, 0, 0, None),
        ]

    def statistics(self) -> ServerStatistics:
        counts = [0] * (len(DURATION_BUCKETS) + 1)
        counts[3] = 6
        counts[-1] = 1
        return ServerStatistics(
            transport=ServerTransportStatistics(messages_in=10, bytes_in=999, peers=2),
            scheduler=SchedulerStatistics(0, 0, 10, 0, 3, 0, 0, 0, 5),
            requests=dict(self.requests),
            durations={"get": HistogramSnapshot(DURATION_BUCKETS, tuple(counts), 20.5, 7)},
            subscriptions=3,
            sources=2,
            notifications_sent=40,
            handler_errors=2,
            late_completions=0,
            clients=2,
        )

    def disconnect_client(self, peer_hex: str) -> bool:
        if peer_hex in ("00ab", "00cd"):
            self.disconnected.append(peer_hex)
            return True
        return False


def run(command: str, **args: object) -> Data:
    return rda.admin.dispatch(FakeServer(), command, Data(args), None)


def test_every_builtin_is_registered() -> None:
    names = {c.name for c in REGISTRY.commands()}
    builtins = {"ping", "info", "clients", "subscriptions", "stats", "devices"}
    assert builtins | {"log-level", "disconnect", "commands"} <= names


def test_ping_echoes() -> None:
    reply = run("ping", echo="hello")
    assert reply["pong"] is True
    assert reply["echo"] == "hello"
    assert reply["server"] == "FakeServer"


def test_info_reports_identity_uptime_and_settings() -> None:
    reply = run("info")
    assert reply["name"] == "FakeServer"
    assert reply["endpoint"] == "tcp://127.0.0.1:5555"
    assert reply["uptime"] == 100.0  # the server's uptime(), not its wall-clock start
    assert reply["devices"] == 2
    assert reply["settings"]["workers"] == 4
    assert "stats" in reply["commands"]


def test_clients_lists_each_connection() -> None:
    reply = run("clients")
    assert reply["count"] == 2
    rows = reply["clients"]
    assert [r["peer"] for r in rows] == ["00ab", "00cd"]
    assert rows[0]["info"]["user"] == "alice"
    assert rows[0]["subscriptions"] == 2
    assert [r["connected_for"] for r in rows] == [30.0, 5.0]  # the snapshot's own figure


def test_subscriptions_filter_by_glob_and_omit_missing_values() -> None:
    everything = run("subscriptions")
    assert everything["count"] == 2
    first = everything["sources"][0]
    assert (first["device"], first["subscribers"], first["notifications_sent"]) == ("PS1", 2, 40)
    # PS2 never updated: no last_update field rather than a fake zero.
    assert "last_update" not in everything["sources"][1]
    only = run("subscriptions", device="PS2")
    assert [s["device"] for s in only["sources"]] == ["PS2"]


def test_stats_nests_requests_and_summarises_histograms() -> None:
    reply = run("stats")
    assert reply["requests"]["get"]["ok"] == 7
    assert reply["requests"]["get"]["error"] == 2
    get = reply["durations"]["get"]
    assert get["count"] == 7
    assert get["p50"] == pytest.approx(0.001)
    assert get["p99"] == pytest.approx(10.0)  # the +Inf bucket answers the last bound
    assert isinstance(get["counts"], np.ndarray)
    assert reply["transport"]["bytes_in"] == 999
    assert reply["scheduler"]["rejected"] == 3


def test_devices_sorted() -> None:
    assert run("devices")["devices"] == ["PS1", "PS2"]


def test_log_level_reads_and_sets() -> None:
    logger = logging.getLogger("rda.test_admin_level")
    old = logger.level
    try:
        reply = run("log-level", logger="rda.test_admin_level", level="debug")
        assert reply["level"] == "DEBUG"
        assert logger.level == logging.DEBUG
        assert run("log-level", logger="rda.test_admin_level")["level"] == "DEBUG"
    finally:
        logger.setLevel(old)


def test_log_level_rejects_unknown_level() -> None:
    with pytest.raises(AdminArgumentsError, match="unknown level 'LOUD'"):
        run("log-level", level="LOUD")


def test_disconnect_known_and_unknown_peer() -> None:
    server = FakeServer()
    reply = rda.admin.dispatch(server, "disconnect", Data(peer="00ab"), None)
    assert reply["disconnected"] == "00ab"
    assert server.disconnected == ["00ab"]
    with pytest.raises(AdminArgumentsError, match="no connected client"):
        rda.admin.dispatch(server, "disconnect", Data(peer="ffff"), None)


def test_unknown_command_names_the_available_ones() -> None:
    with pytest.raises(NoSuchDeviceError, match=r"unknown admin command 'nope'.*ping"):
        run("nope")


def test_wrong_arguments_give_one_readable_line() -> None:
    with pytest.raises(AdminArgumentsError) as info:
        run("ping", bogus=1)
    assert "ping: bogus: Extra inputs are not permitted" in str(info.value)
    with pytest.raises(AdminArgumentsError, match="disconnect: peer: Field required"):
        run("disconnect")


def test_commands_lists_arguments() -> None:
    rows = {r["name"]: r for r in run("commands")["commands"]}
    assert rows["disconnect"]["arguments"] == "peer=..."
    assert "level=None" in rows["log-level"]["arguments"]


def test_string_arguments_are_converted_by_the_model() -> None:
    registry = CommandRegistry(group=None)

    class Args(pydantic.BaseModel):
        times: int
        factor: float = 1.0

    @registry.command("repeat", Args)
    def repeat(ctx: AdminContext, args: Args) -> dict[str, object]:
        return {"total": args.times * args.factor}

    reply = registry.dispatch(FakeServer(), "repeat", Data(times="3", factor="2.5"), None)
    assert reply["total"] == 7.5
    with pytest.raises(AdminArgumentsError, match="repeat: times: Input should be a valid"):
        registry.dispatch(FakeServer(), "repeat", Data(times="x"), None)


def test_result_must_be_data_or_mapping() -> None:
    registry = CommandRegistry(group=None)

    @registry.command("bad")
    def bad(ctx: AdminContext, args: pydantic.BaseModel) -> Data:
        return 42  # type: ignore[return-value]

    with pytest.raises(TypeError, match="returned int, expected Data or dict"):
        registry.dispatch(FakeServer(), "bad", Data(), None)


def test_name_clash_is_refused() -> None:
    registry = CommandRegistry(group=None)

    @registry.command("twice")
    def first(ctx: AdminContext, args: pydantic.BaseModel) -> dict[str, object]:
        return {}

    with pytest.raises(ValueError, match="already registered by"):

        @registry.command("twice")
        def second(ctx: AdminContext, args: pydantic.BaseModel) -> dict[str, object]:
            return {}


def test_plain_converts_snapshots() -> None:
    assert plain((1, 2)).dtype == np.int64
    assert plain((1, 2.5)).dtype == np.float64
    assert plain({("get", "ok"): 1, "none": None}) == {"get/ok": 1}
    assert plain(b"\x00\xab") == "00ab"


def test_histogram_quantile_edges() -> None:
    assert np.isnan(histogram_quantile(0.5, (1.0, 2.0), (0, 0, 0)))
    assert histogram_quantile(0.5, (1.0, 2.0), (1, 1, 0)) == 1.0
    assert histogram_quantile(0.9, (1.0, 2.0), (1, 1, 0)) == 2.0


PLUGIN = textwrap.dedent(
    '''
    import pydantic
    import rda.admin

    class Args(pydantic.BaseModel):
        word: str

    @rda.admin.command("test-plugin-shout", Args)
    def shout(ctx, args):
        """Say it loud."""
        return {"shout": args.word.upper(), "server": ctx.server.name}

    def whisper(ctx, args):
        """Say it softly."""
        return {"whisper": "psst"}
    '''
)


@pytest.fixture
def plugin_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real installed-looking distribution (dist-info + entry_points.txt) on sys.path."""
    group = "rda.admin.testgroup"
    (tmp_path / "rda_test_admin_plugin.py").write_text(PLUGIN)
    info = tmp_path / "rda_test_admin_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rda-test-admin-plugin\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[{group}]\n"
        "shout = rda_test_admin_plugin:shout\n"
        "whisper = rda_test_admin_plugin:whisper\n"
        "broken = rda_test_admin_plugin_missing:nothing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield group
    sys.modules.pop("rda_test_admin_plugin", None)


def test_plugins_load_through_entry_points_once(plugin_distribution: str) -> None:
    registry = CommandRegistry(group=plugin_distribution)
    server = FakeServer()
    reply = registry.dispatch(server, "test-plugin-shout", Data(word="hi"), None)
    assert reply["shout"] == "HI"
    assert reply["server"] == "FakeServer"
    # A plain function is registered under its entry-point name.
    assert registry.dispatch(server, "whisper", Data(), None)["whisper"] == "psst"
    # The broken plugin is reported, not fatal.
    assert len(registry.load_errors) == 1
    assert registry.load_errors[0].startswith("broken: ModuleNotFoundError")
    registry.load_entry_points()  # loaded once: no second error appended
    assert len(registry.load_errors) == 1
    with pytest.raises(AdminArgumentsError, match="test-plugin-shout: word: Field required"):
        registry.dispatch(server, "test-plugin-shout", Data(), None)
