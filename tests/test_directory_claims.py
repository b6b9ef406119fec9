"""Who may claim a device name: overlaps and liveness (issue 37, items 6 and 7).

Item 6, overlapping names: with a live server holding ``D*``, another registering exactly
``D1`` (or ``*``) was accepted silently: on etcd live subscriptions to D1 and D5 moved to the
newcomer at once; with the file directory new clients resolved to it. Now an overlap is refused
like an exact clash, naming both names, unless ``replace``.

Item 7, liveness: a server started with the same name from another PID namespace on the same
host name (a container with host networking) took the entry without ``--replace``, because "its
pid is not alive here". Now a pid that is gone here is confirmed by the owner's endpoint: if
something answers there the owner is alive. A PID namespace is simulated by an entry whose pid
this host cannot see (a reaped child's) and whose endpoint is a live server's, and, where the
machine allows it, made for real (``unshare --pid``: the last test).

Each was checked failing on main before the fix by running this file with PYTHONPATH=/work/main
(the overlaps registered without error; the invisible-pid entry was taken over). Real etcd
(``LocalEtcd``) and real servers on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rda
from rda.business.directory import FileDirectory
from rda.business.entries import globs_intersect, overlap
from rda.business.etcd.gateway import EtcdGateway
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.serialization.data import Data
from rda.testing import LocalEtcd

TTL = 3.0


class Plain(Device):
    @Device.property("Value")
    def value(self, request: object) -> Data:
        return Data(x=1)


@pytest.fixture
def listener() -> Iterator[Server]:
    """A live rda server on 127.0.0.1, registered nowhere: the endpoint an entry points to."""
    server = ServerBuilder("Listener").device("L1", Plain()).directory(None).build()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def dead_pid() -> int:
    """A pid no process has here (a reaped child's): what another PID namespace's pid is."""
    proc = subprocess.Popen(["true"])
    proc.wait(30)
    return proc.pid


def silent_endpoint() -> str:
    """A tcp endpoint where nothing listens (bound, never listening, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


# -- the overlap rule itself ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("D*", "D1", True), ("D*", "*", True), ("D[12]", "?2", True), ("D[12]", "?3", False),
        ("A*", "B*", False), ("*A", "B*", True), ("PS?", "PS10", False), ("x[!a]", "xa", False),
        ("x[a-c]", "x[d-f]", False), ("x[a-d]", "x[d-f]", True), ("PS*1", "PS1*", True),
    ],
)  # fmt: skip
def test_globs_intersect_examples(a: str, b: str, expected: bool) -> None:
    assert globs_intersect(a, b) is expected
    assert globs_intersect(b, a) is expected


_GLOB = st.text(alphabet="ab*?[]!-", max_size=5)


@given(_GLOB, _GLOB)
def test_globs_intersect_agrees_with_every_short_name(a: str, b: str) -> None:
    """Against brute force: every name of up to 5 characters over the patterns' alphabet plus
    one other character. When the two patterns have at most 6 characters together, a shortest
    name both match has at most 5: as many characters as the tokens of a pattern without '*',
    or, when both have one, at most as many as their other tokens together."""
    import fnmatch
    import itertools

    names = ("".join(p) for n in range(6) for p in itertools.product("ab[]!-z", repeat=n))
    found = any(fnmatch.fnmatchcase(n, a) and fnmatch.fnmatchcase(n, b) for n in names)
    if found:
        assert globs_intersect(a, b)
    elif len(a) + len(b) <= 6:  # short enough that the brute force saw every case
        assert not globs_intersect(a, b)


def test_overlap_names_the_pair() -> None:
    assert overlap(["D1"], ["D*"]) == ("D1", "D*")
    assert overlap(["*"], ["X", "D1"]) == ("*", "D1")
    assert overlap(["E1", "E*"], ["D*", "D1"]) is None


# -- item 6: the file directory -------------------------------------------------------------


def test_file_refuses_a_name_or_pattern_overlapping_a_live_servers(tmp_path: Path) -> None:
    files = FileDirectory(tmp_path / "d.json")
    files.register("Wide", "tcp://127.0.0.1:1", ["D*"])
    with pytest.raises(rda.NameTakenError) as exact:
        files.register("One", "tcp://127.0.0.1:2", ["D1"])
    message = str(exact.value)
    assert "device 'D1' (of server 'One') overlaps 'D*'" in message, message
    assert "server 'Wide'" in message and "--replace" in message
    with pytest.raises(rda.NameTakenError, match=r"device '\*' \(of server 'All'\) overlaps 'D\*'"):
        files.register("All", "tcp://127.0.0.1:3", ["*"])
    # Nothing moved: new clients still find Wide for D1 and D5.
    assert files.resolve("D1") == files.resolve("D5") == "tcp://127.0.0.1:1"
    assert [e.name for e in files.servers()] == ["Wide"]
    # Disjoint names are fine.
    files.register("Other", "tcp://127.0.0.1:4", ["E*", "F1"])
    # On purpose: the exact name wins for D1; D5 stays Wide's.
    files.register("One", "tcp://127.0.0.1:2", ["D1"], replace=True)
    assert files.resolve("D1") == "tcp://127.0.0.1:2"
    assert files.resolve("D5") == "tcp://127.0.0.1:1"
    # A pattern covering Wide's takes it over whole.
    files.register("All", "tcp://127.0.0.1:3", ["*"], replace=True)
    assert files.resolve("D5") == "tcp://127.0.0.1:3"
    assert "D*" not in {d for e in files.servers() for d in e.devices}


# -- item 6: etcd ----------------------------------------------------------------------------


def test_etcd_refuses_a_name_or_pattern_overlapping_a_live_servers(etcd: LocalEtcd) -> None:
    with (
        rda.EtcdDirectory(etcd.url, prefix="/ov/", ttl=TTL) as wide,
        rda.EtcdDirectory(etcd.url, prefix="/ov/", ttl=TTL) as second,
    ):
        wide.register("Wide", "tcp://10.0.0.1:1", ["D*"])
        with pytest.raises(rda.NameTakenError) as exact:
            second.register("One", "tcp://10.0.0.2:2", ["D1"])
        message = str(exact.value)
        assert "device 'D1' (of server 'One') overlaps 'D*'" in message, message
        assert "server 'Wide'" in message
        with pytest.raises(rda.NameTakenError, match=r"'\*' \(of server 'All'\) overlaps 'D\*'"):
            second.register("All", "tcp://10.0.0.3:3", ["*"])
        # Nothing of the refused registrations is left: clients still resolve to Wide.
        assert second.devices() == {"D*": "tcp://10.0.0.1:1"}
        assert [e.name for e in second.servers()] == ["Wide"]
        second.register("Other", "tcp://10.0.0.4:4", ["E*", "F1"])
        second.register("One", "tcp://10.0.0.2:2", ["D1"], replace=True)
        assert second.resolve("D1") == "tcp://10.0.0.2:2"
        assert second.resolve("D5") == "tcp://10.0.0.1:1"


def test_etcd_two_overlapping_registrations_at_once_leave_one_owner(etcd: LocalEtcd) -> None:
    """Of two servers registering overlapping patterns together, exactly one keeps its claim
    (the one whose keys were written first); the other is refused and leaves nothing."""
    for round_ in range(5):
        _race(etcd.url, f"/race{round_}/")


def _race(url: str, prefix: str) -> None:
    outcomes: dict[str, str] = {}
    directories = {name: rda.EtcdDirectory(url, prefix=prefix, ttl=TTL) for name in ("A", "B")}
    start = threading.Barrier(2)

    def claim(name: str, pattern: str) -> None:
        start.wait(30)
        try:
            directories[name].register(name, f"tcp://10.0.0.{ord(name)}:1", [pattern])
            outcomes[name] = "registered"
        except rda.NameTakenError:
            outcomes[name] = "refused"

    threads = [
        threading.Thread(target=claim, args=("A", "X*")),
        threading.Thread(target=claim, args=("B", "*1")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert sorted(outcomes.values()) == ["refused", "registered"], outcomes
        winner = next(n for n, o in outcomes.items() if o == "registered")
        with rda.EtcdDirectory(url, prefix=prefix) as reader:
            assert [e.name for e in reader.servers()] == [winner]
            assert len(reader.devices()) == 1
    finally:
        for d in directories.values():
            d.close()


# -- item 7: liveness is proved by the endpoint, not by a pid alone --------------------------


def test_file_entry_with_an_invisible_pid_and_a_live_endpoint_is_not_taken(
    tmp_path: Path, listener: Server
) -> None:
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    files.register("Same", listener.endpoint, ["C1"])
    content = json.loads(path.read_text())
    content["servers"]["Same"]["pid"] = dead_pid()  # another PID namespace: not visible here
    path.write_text(json.dumps(content))
    assert files.resolve("C1") == listener.endpoint  # still alive for clients
    with pytest.raises(rda.NameTakenError, match="server name 'Same'"):
        files.register("Same", silent_endpoint(), ["C1"])
    # Once its endpoint is silent too, the entry is stale and taken over at once.
    listener.stop()
    files.register("Same", "tcp://127.0.0.1:7", ["C1"])
    assert files.resolve("C1") == "tcp://127.0.0.1:7"


def test_etcd_entry_with_an_invisible_pid_and_a_live_endpoint_is_not_taken(
    etcd: LocalEtcd, listener: Server
) -> None:
    prefix = "/ns/"
    gateway = EtcdGateway([etcd.url], 2.0)
    try:
        # What a server in another PID namespace on this host name writes (registration.py).
        lease = gateway.grant(30)
        entry = {
            "name": "Same", "endpoint": listener.endpoint, "devices": ["C1"],
            "pid": dead_pid(), "host": socket.gethostname(), "registered_at": time.time(),
            "server_key": None,
        }  # fmt: skip
        gateway.put(f"{prefix}servers/Same", json.dumps(entry).encode(), lease)
        device = {"server": "Same", "endpoint": listener.endpoint, "server_key": None}
        gateway.put(f"{prefix}devices/C1", json.dumps(device).encode(), lease)
        with rda.EtcdDirectory(etcd.url, prefix=prefix, ttl=TTL) as newcomer:
            with pytest.raises(rda.NameTakenError, match="server name 'Same'"):
                newcomer.register("Same", silent_endpoint(), ["C1"])
            assert newcomer.resolve("C1") == listener.endpoint
            # Its endpoint silent too: a dead process's stale entry, taken over at once.
            listener.stop()
            newcomer.register("Same", "tcp://127.0.0.1:7", ["C1"])
            assert newcomer.resolve("C1") == "tcp://127.0.0.1:7"
    finally:
        gateway.close()


def test_a_restart_on_the_same_fixed_port_takes_its_own_stale_entry(tmp_path: Path) -> None:
    """A killed server restarted on its fixed port answers at the old entry's endpoint itself:
    that is not the old one alive (the newcomer holds the port)."""
    path = tmp_path / "d.json"
    files = FileDirectory(path)
    endpoint = silent_endpoint()
    files.register("Fixed", endpoint, ["F1"])
    content = json.loads(path.read_text())
    content["servers"]["Fixed"]["pid"] = dead_pid()
    path.write_text(json.dumps(content))
    host, port = endpoint.removeprefix("tcp://").split(":")
    with socket.create_server((host, int(port))):  # the restarted server listens there now
        files.register("Fixed", endpoint, ["F1"])
    assert [e.pid for e in files.servers()] == [os.getpid()]


def _can_unshare() -> bool:
    """Whether this machine lets the test make a PID namespace (root, or user namespaces)."""
    try:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


SERVED = """
from rda.business.server.devices import Device
from rda.serialization.data import Data

class Plain(Device):
    @Device.property("Value")
    def value(self, request):
        return Data(x=1)
"""


@pytest.mark.skipif(not _can_unshare(), reason="no PID namespaces here (unshare not permitted)")
def test_a_server_in_another_pid_namespace_keeps_its_name(tmp_path: Path) -> None:
    """The issue's case itself, where the machine allows it: ``rda serve`` in its own PID
    namespace (``unshare --pid``) registers its namespace pid (1, which on the host is init,
    started at another time: "a recycled pid"). Before the fix (the tree of 3a9a9b6^, built
    apart) the same ``rda serve`` on the host took the name over without ``--replace``; now it
    is refused, since the entry's endpoint answers."""
    import selectors
    import signal
    import sys

    rda_bin = str(Path(sys.executable).with_name("rda"))
    (tmp_path / "plain_mod.py").write_text(SERVED)
    command = [rda_bin, "serve", "plain_mod:Plain", "--device", "NS1", "--json"]
    inside = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    outside: subprocess.Popen[str] | None = None
    try:
        assert inside.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(inside.stdout, selectors.EVENT_READ)
            assert selector.select(60), "the namespaced server printed nothing"
        endpoint = json.loads(inside.stdout.readline())["endpoint"]
        entry = json.loads(Path(os.environ["RDA_DIRECTORY_FILE"]).read_text())["servers"]["NS1"]
        assert entry["pid"] != inside.pid  # its own namespace's pid, not one this host sees
        outside = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert outside.stdout is not None
        # Refused: it exits (stdout ends, ""); taken over: it prints where it serves.
        took = outside.stdout.readline()
        assert took == "", f"the host's server took the namespaced server's name: {took}"
        _, err = outside.communicate(timeout=60)
        assert outside.returncode == 1, err
        assert "name taken" in err and endpoint in err, err
    finally:
        for proc in (outside, inside):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            if proc is not None:
                proc.communicate(timeout=30)
