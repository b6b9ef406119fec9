"""rda.EtcdDirectory against a real etcd (the ``etcd`` fixture: 127.0.0.1, free ports, tmp dir).

In one process: registration and resolution, patterns, CURVE keys beside endpoints, the lease
(clean stop removes at once), one live server per name and ``replace``, the watch reporting
moves, the etcd outage (typed error, stale cache, re-registration), configuration and the
default chain. Several processes and ``kill -9``: tests/test_etcd_processes.py.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import rda
from rda._cli import build
from rda.business.config import Config, ConfigError, etcd_endpoints
from rda.business.directory import ChainDirectory, default_directory, default_registry
from rda.business.etcd.gateway import EtcdGateway, Event, KeyValue, WatchStream
from rda.testing import LocalEtcd, free_port, wait_until

TTL = 3.0


@pytest.fixture
def directory(etcd: LocalEtcd) -> Iterator[rda.EtcdDirectory]:
    with rda.EtcdDirectory(etcd.url, prefix="/test/", ttl=TTL) as d:
        yield d


def other(etcd: LocalEtcd) -> rda.EtcdDirectory:
    return rda.EtcdDirectory(etcd.url, prefix="/test/", ttl=TTL)


def test_register_resolve_patterns_keys_and_clean_unregister(
    etcd: LocalEtcd, directory: rda.EtcdDirectory, no_thread_leak: None
) -> None:
    directory.register("S1", "tcp://10.0.0.1:5000", ["PS1", "BPM*"], server_key="K" * 40)
    with other(etcd) as client:
        assert client.resolve("PS1") == "tcp://10.0.0.1:5000"
        assert client.resolve("BPM7") == "tcp://10.0.0.1:5000"
        assert client.server_key("tcp://10.0.0.1:5000") == "K" * 40
        assert client.devices() == {"PS1": "tcp://10.0.0.1:5000", "BPM*": "tcp://10.0.0.1:5000"}
        [entry] = client.servers()
        assert (entry.name, entry.devices, entry.server_key) == ("S1", ("PS1", "BPM*"), "K" * 40)
        with pytest.raises(rda.NoSuchDeviceError, match="NOPE"):
            client.resolve("NOPE")
        assert client.state().watching == "synced"
        # A clean stop revokes the lease: the watch sees the keys go at once.
        directory.unregister("S1")
        wait_until(lambda: not client.devices(), "entries removed by unregister")
        with pytest.raises(rda.NoSuchDeviceError):
            client.resolve("PS1")
        assert client.servers() == []


def test_a_process_reads_its_own_registration_before_the_watch_delivers_it(
    monkeypatch: pytest.MonkeyPatch, directory: rda.EtcdDirectory
) -> None:
    directory.register("S0", "tcp://10.0.0.1:1", ["PS0"])
    assert directory.resolve("PS0") == "tcp://10.0.0.1:1"  # the watch runs from here on
    # The watch thread delivers nothing more: only reading back our own writes can help.
    monkeypatch.setattr(directory, "_apply", lambda events: None)
    directory.register("S2", "tcp://10.0.0.2:2", ["PS2"])
    assert directory.resolve("PS2") == "tcp://10.0.0.2:2"
    directory.unregister("S2")
    with pytest.raises(rda.NoSuchDeviceError, match="PS2"):
        directory.resolve("PS2")
    directory.register("S2", "tcp://10.0.0.3:3", ["PS2"])
    assert directory.devices() == {"PS0": "tcp://10.0.0.1:1", "PS2": "tcp://10.0.0.3:3"}


def test_a_watch_event_older_than_the_cache_is_not_applied_again(
    directory: rda.EtcdDirectory,
) -> None:
    directory.register("S", "tcp://10.0.0.1:1", ["PS1"])
    assert directory.resolve("PS1") == "tcp://10.0.0.1:1"
    revision = directory.state().revision
    key = f"{directory.prefix}devices/PS1"
    stale = Event(deleted=True, kv=KeyValue(key, b"", 0, 0, revision - 1))
    directory._apply([stale])
    assert directory.resolve("PS1") == "tcp://10.0.0.1:1"
    newer = Event(deleted=True, kv=KeyValue(key, b"", 0, 0, revision + 1))
    directory._apply([newer])
    assert "PS1" not in directory.devices()  # a newer one is


def test_a_change_made_while_the_watch_opens_is_replayed_not_skipped(
    monkeypatch: pytest.MonkeyPatch, etcd: LocalEtcd, directory: rda.EtcdDirectory
) -> None:
    """The watch opens from the loaded revision; etcd first answers "created" with its current
    revision, then replays the changes made since. Those must be applied (seen in a full run
    under load: a removal made while the watch opened was never seen)."""
    directory.register("S", "tcp://10.0.0.1:1", ["PS1"])
    with other(etcd) as reader:
        go = threading.Event()
        opening = reader._gateway.watch

        def late_watch(prefix: str, start: int, idle: float) -> WatchStream:
            stream = opening(prefix, start, idle)
            events = stream.events

            def late_events() -> Iterator[tuple[int, list[Event]]]:
                go.wait(10)  # the stream opens only now, from the revision asked above
                yield from events()

            monkeypatch.setattr(stream, "events", late_events)
            return stream

        monkeypatch.setattr(reader._gateway, "watch", late_watch)
        assert reader.resolve("PS1") == "tcp://10.0.0.1:1"  # loaded; the watch not open yet
        directory.unregister("S")
        go.set()
        wait_until(lambda: "PS1" not in reader.devices(), "the removal replayed")
        with pytest.raises(rda.NoSuchDeviceError):
            reader.resolve("PS1")


def test_a_snapshot_older_than_what_the_watch_applied_does_not_undo_it(
    monkeypatch: pytest.MonkeyPatch, directory: rda.EtcdDirectory
) -> None:
    directory.register("S", "tcp://10.0.0.1:1", ["PS1"])
    assert directory.resolve("PS1") == "tcp://10.0.0.1:1"
    newest = directory.state().revision
    # A load whose range was answered before the newest change, finishing after the watch
    # applied it: it must leave the cache as it is.
    monkeypatch.setattr(directory._gateway, "range", lambda key, prefix=False: (newest - 1, []))
    directory._load()
    assert directory.resolve("PS1") == "tcp://10.0.0.1:1"
    assert directory.state().revision == newest


def test_exact_name_wins_over_a_pattern(etcd: LocalEtcd, directory: rda.EtcdDirectory) -> None:
    directory.register("WIDE", "tcp://10.0.0.1:1", ["PS*"])
    # PS7 overlaps the live PS*: only on purpose (issue 37); PS* stays WIDE's for the others.
    directory.register("ONE", "tcp://10.0.0.2:2", ["PS7"], replace=True)
    with other(etcd) as client:
        assert client.resolve("PS7") == "tcp://10.0.0.2:2"
        assert client.resolve("PS8") == "tcp://10.0.0.1:1"


def test_a_second_server_with_a_taken_name_or_device_is_refused_naming_the_owner(
    etcd: LocalEtcd, directory: rda.EtcdDirectory
) -> None:
    directory.register("PSServer", "tcp://10.0.0.1:5000", ["PS1", "PS2"])
    with other(etcd) as second:
        with pytest.raises(rda.NameTakenError) as name_taken:
            second.register("PSServer", "tcp://10.0.0.9:9", ["PS9"])
        message = str(name_taken.value)
        assert "'PSServer'" in message and "tcp://10.0.0.1:5000" in message
        assert "pid" in message and "since" in message and "--replace" in message
        assert name_taken.value.owner.endpoint == "tcp://10.0.0.1:5000"
        with pytest.raises(rda.NameTakenError, match="device 'PS2'"):
            second.register("Other", "tcp://10.0.0.9:9", ["PS3", "PS2"])
        # Nothing of the refused registrations is left behind.
        assert directory.devices() == {
            "PS1": "tcp://10.0.0.1:5000",
            "PS2": "tcp://10.0.0.1:5000",
        }
        assert [e.name for e in directory.servers()] == ["PSServer"]


def test_replace_takes_over_and_tells_the_old_owner(
    etcd: LocalEtcd, directory: rda.EtcdDirectory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rda.directory.etcd")
    directory.register("PSServer", "tcp://10.0.0.1:5000", ["PS1"])
    with other(etcd) as newcomer:
        newcomer.register("PSServer", "tcp://10.0.0.2:6000", ["PS1"], replace=True)
        assert newcomer.resolve("PS1") == "tcp://10.0.0.2:6000"
        # The old owner's lease keeper notices within ttl/3 and says so in its log.
        wait_until(
            lambda: directory.state().registrations["PSServer"].state == "replaced",
            "old owner told",
            timeout=3 * TTL,
        )
        assert any("taken over by" in r.getMessage() for r in caplog.records)
        # ... and its lease is revoked, but the newcomer's entries stay.
        assert newcomer.resolve("PS1") == "tcp://10.0.0.2:6000"
        assert [e.endpoint for e in newcomer.servers()] == ["tcp://10.0.0.2:6000"]


def test_registration_of_10k_devices_is_batched_under_etcds_txn_limit(
    etcd: LocalEtcd, directory: rda.EtcdDirectory
) -> None:
    names = [f"DEV{i:05d}" for i in range(1000)]
    directory.register("BIG", "tcp://10.0.0.1:1", names)
    with other(etcd) as client:
        assert len(client.devices()) == 1000
        assert client.resolve("DEV00999") == "tcp://10.0.0.1:1"
        # A clash in the last batch leaves nothing of the refused server behind.
        with pytest.raises(rda.NameTakenError, match="DEV00999"):
            client.register(
                "BIG2", "tcp://10.0.0.2:2", [f"NEW{i}" for i in range(250)] + ["DEV00999"]
            )
        # (The revocation reaches this client's cache through its watch.)
        wait_until(
            lambda: not any(name.startswith("NEW") for name in client.devices()),
            "refused devices gone",
        )
        assert [e.name for e in client.servers()] == ["BIG"]


def test_watch_reports_a_moved_device(etcd: LocalEtcd, directory: rda.EtcdDirectory) -> None:
    seen: list[tuple[str, str | None]] = []
    with other(etcd) as client:
        stop = client.watch(lambda name, endpoint: seen.append((name, endpoint)))
        directory.register("S", "tcp://10.0.0.1:1", ["PS1"])
        wait_until(lambda: ("PS1", "tcp://10.0.0.1:1") in seen, "registration seen")
        directory.unregister("S")
        wait_until(lambda: ("PS1", None) in seen, "removal seen")
        directory.register("S", "tcp://10.0.0.1:2", ["PS1"])
        wait_until(lambda: ("PS1", "tcp://10.0.0.1:2") in seen, "move seen")
        stop()
        count = len(seen)
        directory.unregister("S")
        wait_until(lambda: not client.devices(), "removed")
        assert len(seen) == count


def test_outage_keeps_resolved_devices_fails_new_ones_typed_and_re_registers(
    etcd: LocalEtcd, directory: rda.EtcdDirectory
) -> None:
    directory.register("S", "tcp://10.0.0.1:1", ["PS1"])
    client = rda.EtcdDirectory(etcd.url, prefix="/test/", ttl=TTL, timeout=1.0)
    try:
        assert client.resolve("PS1") == "tcp://10.0.0.1:1"
        etcd.stop()
        wait_until(lambda: client.state().watching == "stale", "watch marked stale")
        # Known devices keep resolving; an unknown one fails fast, typed, naming the cause.
        assert client.resolve("PS1") == "tcp://10.0.0.1:1"
        started = time.monotonic()
        with pytest.raises(rda.DirectoryUnavailableError) as unavailable:
            client.resolve("PS2")
        assert not isinstance(unavailable.value, rda.NoSuchDeviceError)
        assert etcd.url in str(unavailable.value) and "PS2" in str(unavailable.value)
        assert time.monotonic() - started < 10.0  # bounded by the timeout, not hung
        # The server's keeper notices (and keeps serving: nothing here stops it).
        wait_until(
            lambda: directory.state().registrations["S"].state == "unreachable",
            "registration unreachable",
            timeout=3 * TTL,
        )
        assert "unreachable" in directory.state().summary()
        # Down longer than the ttl: the lease is gone when etcd is back; the keeper
        # registers again and the client's watch resynchronises.
        time.sleep(TTL + 1.0)  # the outage itself, not a timing assertion
        etcd.start()
        wait_until(
            lambda: directory.state().registrations["S"].state == "registered",
            "re-registered",
            timeout=5 * TTL,
        )
        wait_until(lambda: client.state().watching == "synced", "watch synced again")
        with other(etcd) as fresh:
            assert fresh.resolve("PS1") == "tcp://10.0.0.1:1"
    finally:
        client.close()


def test_chain_reports_an_outage_rather_than_no_such_device(tmp_path: object) -> None:
    dead = rda.EtcdDirectory("http://127.0.0.1:9", timeout=0.5)  # nothing listens on port 9
    chain = ChainDirectory(rda.StaticDirectory({"S1": "tcp://127.0.0.1:1"}), dead)
    try:
        assert chain.resolve("S1") == "tcp://127.0.0.1:1"
        with pytest.raises(rda.DirectoryUnavailableError, match=r"127\.0\.0\.1:9"):
            chain.resolve("PS1")
    finally:
        chain.close()


def test_url_forms_and_config(monkeypatch: pytest.MonkeyPatch, etcd: LocalEtcd) -> None:
    assert etcd_endpoints("etcd://h1:2379,h2:2379") == ["http://h1:2379", "http://h2:2379"]
    assert etcd_endpoints("etcds://h1:2379") == ["https://h1:2379"]
    assert etcd_endpoints("http://127.0.0.1:2379") == ["http://127.0.0.1:2379"]
    for bad in ("h1:2379", "etcd://h1", "redis://h1:1", "etcd://h1:2379,"):
        with pytest.raises(ConfigError, match="directory_url"):
            Config(directory_url=bad)
    port = etcd.url.rsplit(":", 1)[1]
    monkeypatch.setenv("RDA_DIRECTORY_URL", f"etcd://127.0.0.1:{port}")
    monkeypatch.setenv("RDA_DIRECTORY_PREFIX", "/cfg/")
    config = Config()
    registry = default_registry(config)
    assert isinstance(registry, rda.EtcdDirectory)
    chain = default_directory(config)
    try:
        assert isinstance(chain, ChainDirectory)
        kinds = [type(d).__name__ for d in chain.directories]
        # The file is no later step of the chain: only a configured fallback (issue 37).
        assert kinds == ["StaticDirectory", "EtcdDirectory"] and chain.fallback is None
        with_file = default_directory(Config(directory_fallback=True))
        assert isinstance(with_file, ChainDirectory)
        assert type(with_file.fallback).__name__ == "FileDirectory"
        with_file.close()
        registry.register("CFG", "tcp://10.0.0.3:3", ["CFG1"])
        assert chain.resolve("CFG1") == "tcp://10.0.0.3:3"
        registry.unregister("CFG")
    finally:
        assert isinstance(chain, ChainDirectory) and isinstance(registry, rda.EtcdDirectory)
        chain.close()
        registry.close()


def test_gateway_fails_over_to_the_next_endpoint(etcd: LocalEtcd) -> None:
    gateway = EtcdGateway(["http://127.0.0.1:9", etcd.url], timeout=1.0)
    try:
        gateway.put("/x/k", b"v")
        _, [kv] = gateway.range("/x/k")
        assert kv.value == b"v"
    finally:
        gateway.close()


def test_a_server_does_not_start_unregistered_when_etcd_is_unreachable(
    no_thread_leak: None,
) -> None:
    dead = rda.EtcdDirectory("http://127.0.0.1:9", timeout=0.5)  # nothing listens on port 9
    server = rda.ServerBuilder("Lonely").devices("L1").directory(dead).build()
    with pytest.raises(rda.DirectoryUnavailableError, match=r"127\.0\.0\.1:9"):
        server.start()
    assert not server.running
    assert "Lonely" not in server.directory_state()
    dead.close()


def test_a_server_closes_the_etcd_directory_it_made_but_not_one_it_was_given(
    monkeypatch: pytest.MonkeyPatch, etcd: LocalEtcd, no_thread_leak: None
) -> None:
    port = etcd.url.rsplit(":", 1)[1]
    monkeypatch.setenv("RDA_DIRECTORY_URL", f"etcd://127.0.0.1:{port}")
    monkeypatch.setenv("RDA_DIRECTORY_PREFIX", "/own/")
    server = rda.ServerBuilder("Owner").devices("OWN1").endpoint("tcp://127.0.0.1:0").build()
    made = server._directory
    assert isinstance(made, rda.EtcdDirectory)
    given = rda.EtcdDirectory(etcd.url, prefix="/own/", ttl=TTL)
    try:
        server.start()
        assert given.resolve("OWN1") == server.endpoint
        server.stop()
        # Its own registry (HTTP pool, lease keeper) is closed with it ...
        assert made.state().watching == "closed"
        # The lease was revoked at stop (etcd itself, not a watch, says so) ...
        assert given._gateway.range("/own/devices/OWN1")[1] == []
        # ... and the other directory's watch reports it.
        wait_until(lambda: "OWN1" not in given.devices(), "removal seen by the watch")
        # ... while a directory handed to the builder stays the caller's, open and usable.
        lent = rda.ServerBuilder("Borrower").devices("OWN2").directory(given)
        borrower = lent.endpoint("tcp://127.0.0.1:0").build().start()
        borrower.stop()
        assert given.state().watching != "closed"
        given.register("After", "tcp://10.0.0.9:9", ["OWN3"])
        assert given.resolve("OWN3") == "tcp://10.0.0.9:9"
        given.unregister("After")
    finally:
        server.stop()
        given.close()


def test_rda_record_on_etcd_leaves_no_watch_thread_behind(
    monkeypatch: pytest.MonkeyPatch, etcd: LocalEtcd, tmp_path: Path, no_thread_leak: None
) -> None:
    port = etcd.url.rsplit(":", 1)[1]
    monkeypatch.setenv("RDA_DIRECTORY_URL", f"etcd://127.0.0.1:{port}")
    monkeypatch.setenv("RDA_DIRECTORY_PREFIX", "/rec/")
    monkeypatch.setenv("RDA_DIRECTORY_FILE", str(tmp_path / "directory.json"))
    config = tmp_path / "rda.toml"
    config.write_text("request_timeout = 2.0\n")
    store = str(tmp_path / "store")
    with rda.ServerBuilder("REC").devices("REC1").endpoint("tcp://127.0.0.1:0").build() as server:
        args = ["--config", str(config), "record", store, "REC1/Acq", "--duration", "0.3s"]
        result = CliRunner().invoke(build(), args)
        assert result.exit_code == 0, result.output
    # A recording refused at start (nothing matches) closes its client too.
    refused = CliRunner().invoke(build(), ["--config", str(config), "record", store, "NONE/Acq"])
    assert refused.exit_code == 4, refused.output
    assert "NONE: no such device" in refused.output
    assert server.endpoint  # served the first recording


def test_curve_end_to_end_with_the_server_key_from_etcd(
    etcd: LocalEtcd, no_thread_leak: None
) -> None:
    import rda.security as security

    server_keys, alice, mallory = (security.generate_keypair() for _ in range(3))

    class Text(rda.RequestReplyCallback):
        def get(self, request: rda.GetRequest) -> None:
            principal = request.client.info.get("authenticated_principal")
            request.complete(rda.Data(text="secret", principal=str(principal)))

    registry = rda.EtcdDirectory(etcd.url, prefix="/curve/", ttl=TTL)
    server = (
        rda.ServerBuilder("KEYED")
        .request_reply(Text())
        .devices("KEY1")
        .endpoint("tcp://127.0.0.1:0")
        .directory(registry)
        .security(security.ServerSecurity(server_keys, clients={"alice": alice.public}))
        .build()
        .start()
    )
    # A client that knows only etcd's address: the endpoint and the server's public key come
    # from there; its own key is one the server lists.
    found = rda.EtcdDirectory(etcd.url, prefix="/curve/", ttl=TTL)
    client = rda.ClientService(
        found, rda.Config(request_timeout=5.0), security=security.ClientSecurity(alice)
    )
    stranger = rda.ClientService(
        found, rda.Config(request_timeout=1.0), security=security.ClientSecurity(mallory)
    )
    try:
        assert found.server_key(server.endpoint) == server_keys.public
        reply = client.access_point("KEY1", "Text").get().data
        assert (reply["text"], reply["principal"]) == ("secret", "alice")
        # A key the server does not list is refused in the handshake: a typed error, counted.
        with pytest.raises(rda.NotAuthorizedError, match="does not accept this client's key"):
            stranger.access_point("KEY1", "Text").get()
        wait_until(lambda: server.statistics().transport.auth_failures >= 1, "refusal")
    finally:
        stranger.close()
        client.close()
        found.close()
        server.stop()
        registry.close()


def test_local_etcd_chooses_other_ports_when_its_port_is_taken_before_it_binds(
    tmp_path: Path, no_thread_leak: None
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        etcd = LocalEtcd(tmp_path / "etcd")
        etcd.client_port = taken  # as if another test took it after free_port() chose it
        with etcd:
            assert etcd.client_port != taken
            with rda.EtcdDirectory(etcd.url) as directory:
                assert directory.devices() == {}
            url = etcd.url
            etcd.stop()
            etcd.start()  # a restart keeps the url the test knows
            assert etcd.url == url
    assert "address already in use" in (tmp_path / "etcd" / "etcd.log").read_text()


def test_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 20000 <= port < low
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
