"""Directories: static mapping with globs, the machine-local file registry, chaining."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rda.business import directory as directory_module
from rda.business import entries as entries_module
from rda.business.config import Config
from rda.business.directory import (
    ChainDirectory,
    Directory,
    FileDirectory,
    NameTakenError,
    ServerEntry,
    StaticDirectory,
    default_directory,
)
from rda.serialization.errors import NoSuchDeviceError, TimeoutError

WAIT = 10.0


# -- StaticDirectory ---------------------------------------------------------------------------


def test_static_exact_name_wins_over_patterns_and_patterns_go_in_order() -> None:
    static = StaticDirectory(
        {"PS*": "tcp://a:1", "PS1*": "tcp://b:2", "PS17": "tcp://c:3", "BPM?": "tcp://d:4"}
    )
    assert static.resolve("PS17") == "tcp://c:3"  # exact, although two patterns match
    assert static.resolve("PS12") == "tcp://a:1"  # first matching pattern in insertion order
    assert static.resolve("BPM1") == "tcp://d:4"
    assert isinstance(static, Directory)


def test_static_matching_is_case_sensitive_and_whole_name() -> None:
    static = StaticDirectory({"PS*": "tcp://a:1", "BPM1": "tcp://b:1"})
    for unknown in ("ps1", "XPS1", "BPM10", "bpm1", ""):
        with pytest.raises(NoSuchDeviceError):
            static.resolve(unknown)


def test_static_unknown_device_error_names_the_device() -> None:
    with pytest.raises(NoSuchDeviceError, match=r"^PS9: no such device in StaticDirectory"):
        StaticDirectory({"BPM1": "tcp://h:1"}).resolve("PS9")


def test_static_devices_and_validation() -> None:
    mapping = {"PS*": "tcp://a:1", "BPM1": "ipc:///tmp/x"}
    assert StaticDirectory(mapping).devices() == mapping
    with pytest.raises(ValueError, match="endpoint 'a:1'"):
        StaticDirectory({"PS*": "a:1"})
    with pytest.raises(ValueError, match="non-empty"):
        StaticDirectory({"": "tcp://a:1"})


# -- ChainDirectory ----------------------------------------------------------------------------


def test_chain_asks_in_order_and_merges_devices() -> None:
    first = StaticDirectory({"PS1": "tcp://first:1"})
    second = StaticDirectory({"PS*": "tcp://second:1", "BPM1": "tcp://second:2"})
    chain = ChainDirectory(first, second)
    assert chain.resolve("PS1") == "tcp://first:1"
    assert chain.resolve("PS2") == "tcp://second:1"
    assert chain.devices() == {
        "PS1": "tcp://first:1",
        "PS*": "tcp://second:1",
        "BPM1": "tcp://second:2",
    }
    with pytest.raises(NoSuchDeviceError, match=r"^XYZ: no such device \(looked in Static"):
        chain.resolve("XYZ")
    with pytest.raises(ValueError):
        ChainDirectory()


# -- FileDirectory -----------------------------------------------------------------------------


def test_register_then_resolve_exact_and_glob(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "directory.json"  # parent folders are created
    files = FileDirectory(path)
    files.register("PowerServer", "tcp://127.0.0.1:5555", ["PS1", "PS2"])
    files.register("RawServer", "tcp://127.0.0.1:6666", ["BPM*"])
    assert files.resolve("PS1") == "tcp://127.0.0.1:5555"
    assert files.resolve("BPM42") == "tcp://127.0.0.1:6666"
    with pytest.raises(NoSuchDeviceError, match=r"^PS3: no such device registered in FileDir"):
        files.resolve("PS3")
    assert files.devices() == {
        "PS1": "tcp://127.0.0.1:5555",
        "PS2": "tcp://127.0.0.1:5555",
        "BPM*": "tcp://127.0.0.1:6666",
    }
    # Another instance on the same path (another process, in real life) sees the same.
    assert FileDirectory(path).resolve("PS2") == "tcp://127.0.0.1:5555"
    assert isinstance(files, Directory)


def test_servers_describe_each_registration(tmp_path: Path) -> None:
    files = FileDirectory(tmp_path / "d.json")
    before = time.time()
    files.register("S1", "tcp://127.0.0.1:1", ("PS1",))
    [entry] = files.servers()
    assert entry == ServerEntry(
        "S1", "tcp://127.0.0.1:1", ("PS1",), os.getpid(), socket.gethostname(), entry.registered_at
    )
    assert before <= entry.registered_at <= time.time()


def test_reregistering_replaces_the_entry(tmp_path: Path) -> None:
    files = FileDirectory(tmp_path / "d.json")
    files.register("S1", "tcp://127.0.0.1:1", ["PS1", "PS2"])
    files.register("S1", "tcp://127.0.0.1:2", ["PS2"])
    assert [e.name for e in files.servers()] == ["S1"]
    assert files.resolve("PS2") == "tcp://127.0.0.1:2"
    with pytest.raises(NoSuchDeviceError):
        files.resolve("PS1")


def test_a_device_held_by_a_live_server_is_refused_unless_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = FileDirectory(tmp_path / "d.json")
    files.register("Old", "tcp://127.0.0.1:1", ["PS1", "PS*"])
    with pytest.raises(NameTakenError) as taken:
        files.register("New", "tcp://127.0.0.1:2", ["PS1", "PS*"])
    assert taken.value.owner.name == "Old" and taken.value.owner.pid == os.getpid()
    assert "tcp://127.0.0.1:1" in str(taken.value) and "--replace" in str(taken.value)
    assert files.resolve("PS1") == "tcp://127.0.0.1:1"  # nothing changed
    assert [e.name for e in files.servers()] == ["Old"]
    caplog.set_level(logging.WARNING, logger="rda.business.directory")
    files.register("New", "tcp://127.0.0.1:2", ["PS1", "PS*"], replace=True)
    assert files.resolve("PS1") == "tcp://127.0.0.1:2"
    assert files.resolve("PS7") == "tcp://127.0.0.1:2"
    assert files.devices()["PS1"] == "tcp://127.0.0.1:2"
    assert any("taken over from server 'Old'" in r.getMessage() for r in caplog.records)


def test_a_server_name_held_by_another_live_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("PSServer", "tcp://127.0.0.1:1", ["PS1"])
    # Our parent process stands in for another live instance of the same server.
    content = json.loads(path.read_text())
    content["servers"]["PSServer"]["pid"] = os.getppid()
    content["servers"]["PSServer"]["start"] = entries_module.process_start(os.getppid())
    path.write_text(json.dumps(content))
    with pytest.raises(NameTakenError, match=f"pid {os.getppid()}") as taken:
        files.register("PSServer", "tcp://127.0.0.1:2", ["PS9"])
    assert "server name 'PSServer'" in str(taken.value)
    # A killed instance (dead pid) is no owner: its entry is stale and simply replaced.
    content["servers"]["PSServer"]["pid"] = dead_pid()
    path.write_text(json.dumps(content))
    files.register("PSServer", "tcp://127.0.0.1:3", ["PS1"])
    assert files.resolve("PS1") == "tcp://127.0.0.1:3"


def test_unregister_removes_only_our_own_entry(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("S1", "tcp://127.0.0.1:1", ["PS1"])
    files.register("S2", "tcp://127.0.0.1:2", ["PS2"])
    files.unregister("S1")
    files.unregister("never-registered")  # harmless
    assert [e.name for e in files.servers()] == ["S2"]
    # An entry owned by another live process (our parent stands in for it) is left alone.
    content = json.loads(path.read_text())
    content["servers"]["S2"]["pid"] = os.getppid()
    content["servers"]["S2"]["start"] = entries_module.process_start(os.getppid())
    path.write_text(json.dumps(content))
    files.unregister("S2")
    assert [e.name for e in files.servers()] == ["S2"]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(WAIT)
    return proc.pid


def test_entries_of_dead_processes_are_ignored_then_pruned(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("Killed", "tcp://127.0.0.1:1", ["PS1", "PS*"])
    content = json.loads(path.read_text())
    content["servers"]["Killed"]["pid"] = dead_pid()
    path.write_text(json.dumps(content))
    with pytest.raises(NoSuchDeviceError):
        files.resolve("PS1")
    assert files.servers() == [] and files.devices() == {}
    assert "Killed" in json.loads(path.read_text())["servers"]  # readers never write
    files.register("Alive", "tcp://127.0.0.1:2", ["BPM1"])
    assert list(json.loads(path.read_text())["servers"]) == ["Alive"]


def test_a_dead_exact_claim_falls_through_to_a_live_pattern(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("Raw", "tcp://127.0.0.1:1", ["PS*"])
    # PS1 overlaps the live PS*: only on purpose (issue 37); PS* stays Raw's for the others.
    files.register("Exact", "tcp://127.0.0.1:2", ["PS1"], replace=True)
    assert files.resolve("PS1") == "tcp://127.0.0.1:2"
    assert files.resolve("PS2") == "tcp://127.0.0.1:1"
    content = json.loads(path.read_text())
    content["servers"]["Exact"]["pid"] = dead_pid()  # and nothing answers at port 2
    path.write_text(json.dumps(content))
    assert files.resolve("PS1") == "tcp://127.0.0.1:1"


def test_a_recycled_pid_does_not_revive_a_dead_entry(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("S1", "tcp://127.0.0.1:1", ["PS1"])
    content = json.loads(path.read_text())
    if content["servers"]["S1"]["start"] is None:
        pytest.skip("no /proc process start times on this system")
    # Same pid (alive: it is us), but a different start time: another process's pid.
    content["servers"]["S1"]["start"] += 1
    path.write_text(json.dumps(content))
    assert files.servers() == []


def test_entries_from_another_host_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("S1", "tcp://127.0.0.1:1", ["PS1"])
    content = json.loads(path.read_text())
    content["servers"]["S1"].update(host="elsewhere.example", pid=dead_pid())
    path.write_text(json.dumps(content))
    assert files.resolve("PS1") == "tcp://127.0.0.1:1"


def test_wildcard_bind_address_is_registered_as_loopback(tmp_path: Path) -> None:
    files = FileDirectory(tmp_path / "d.json")
    files.register("S1", "tcp://*:5555", ["PS1"])
    files.register("S2", "tcp://0.0.0.0:5556", ["PS2"])
    assert files.resolve("PS1") == "tcp://127.0.0.1:5555"
    assert files.resolve("PS2") == "tcp://127.0.0.1:5556"


def test_register_validates_its_arguments(tmp_path: Path) -> None:
    files = FileDirectory(tmp_path / "d.json")
    with pytest.raises(ValueError, match="server name"):
        files.register("", "tcp://127.0.0.1:1", ["PS1"])
    with pytest.raises(ValueError, match="endpoint 'localhost:1'"):
        files.register("S1", "localhost:1", ["PS1"])
    with pytest.raises(ValueError, match="device names"):
        files.register("S1", "tcp://127.0.0.1:1", ["PS1", ""])
    with pytest.raises(ValueError, match="not a str"):
        files.register("S1", "tcp://127.0.0.1:1", "PS1")
    assert not (tmp_path / "d.json").exists()


def test_missing_or_damaged_file_reads_as_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    assert files.devices() == {} and files.servers() == []
    path.write_text('{"servers": {"S1": {"endpoint": "tcp://h:1"')  # hand-damaged
    with caplog.at_level(logging.WARNING, logger="rda.business.directory"):
        assert files.devices() == {}
    assert "not valid JSON" in caplog.text
    path.write_text('{"servers": {"S1": {"endpoint": 5}}}')  # malformed record
    assert files.servers() == []
    files.register("S2", "tcp://127.0.0.1:2", ["PS2"])  # a writer repairs the file
    assert list(json.loads(path.read_text())["servers"]) == ["S2"]


def test_concurrent_registrations_all_land(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    n = 8
    barrier = threading.Barrier(n, timeout=WAIT)
    errors: list[BaseException] = []

    def register(i: int) -> None:
        try:
            files = FileDirectory(path)  # one instance each, as separate processes would
            barrier.wait()
            for round_ in range(5):
                files.register(f"S{i}", f"tcp://127.0.0.1:{1000 + i}", [f"DEV{i}-{round_}"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert errors == []
    files = FileDirectory(path)
    assert sorted(e.name for e in files.servers()) == sorted(f"S{i}" for i in range(n))
    for i in range(n):
        assert files.resolve(f"DEV{i}-4") == f"tcp://127.0.0.1:{1000 + i}"
    # Nothing but the file and its lock file is left in the folder (no stray temp files).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "d.json.lock"]


def test_readers_never_see_a_torn_file(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("S0", "tcp://127.0.0.1:1", ["PS0"])
    stop = threading.Event()
    bad: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            text = path.read_text()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)
            reads += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(100):
            files.register(f"S{i % 5}", "tcp://127.0.0.1:1", [f"DEVICE-{i}-" + "x" * 200])
    finally:
        stop.set()
        thread.join(WAIT)
    assert reads > 0 and bad == []


def test_lock_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = FileDirectory(tmp_path / "d.json")
    files.register("S1", "tcp://127.0.0.1:1", ["PS1"])
    monkeypatch.setattr(directory_module, "_LOCK_TIMEOUT", 0.05)
    fd = os.open(tmp_path / "d.json.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match=r"could not lock .*d\.json\.lock"):
            files.register("S2", "tcp://127.0.0.1:2", ["PS2"])
        assert files.resolve("PS1") == "tcp://127.0.0.1:1"  # readers need no lock
    finally:
        os.close(fd)
    files.register("S2", "tcp://127.0.0.1:2", ["PS2"])
    assert files.resolve("PS2") == "tcp://127.0.0.1:2"


# -- default_directory -------------------------------------------------------------------------


def test_default_directory_prefers_static_config_then_the_file(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    FileDirectory(path).register("S1", "tcp://127.0.0.1:1", ["PS1", "PS2"])
    config = Config(directory={"PS2": "tcp://static:9"}, directory_file=path)
    chain = default_directory(config)
    assert chain.resolve("PS2") == "tcp://static:9"
    assert chain.resolve("PS1") == "tcp://127.0.0.1:1"
    with pytest.raises(NoSuchDeviceError, match=r"PS3: no such device \(looked in .*d\.json"):
        chain.resolve("PS3")


def test_default_directory_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env.json"
    monkeypatch.setenv("RDA_DIRECTORY_FILE", str(path))
    monkeypatch.setenv("RDA_DIRECTORY", '{"BPM*": "tcp://bpm-host:5555"}')
    FileDirectory(path).register("S1", "tcp://127.0.0.1:1", ["PS1"])
    chain = default_directory()
    assert chain.resolve("BPM3") == "tcp://bpm-host:5555"
    assert chain.resolve("PS1") == "tcp://127.0.0.1:1"
