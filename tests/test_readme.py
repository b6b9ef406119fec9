"""The README's Python example runs as written (against this machine's per-test directory),
also beside a running ``rda serve demo``; docs/deployment.md's local etcd command names every
port it binds."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import httpx

from rda.demo import demo_builder
from rda.testing import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEPLOYMENT = ROOT / "docs" / "deployment.md"


def _run_example() -> list[str]:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README has no python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme"})
    return out.getvalue().splitlines()


def test_readme_example_runs_and_prints_what_it_says(no_thread_leak: None) -> None:
    assert _run_example() == ["Data(current: float64 = 2.5)", "FIRST"]


def test_readme_example_runs_while_the_demo_runs(no_thread_leak: None) -> None:
    """Issue 37, item 21: the first thing a new user has running is ``rda serve demo``; the
    example registered ``PS1`` too and failed with ``NameTakenError: device 'PS1' is already
    served by 'RdaDemoServer'`` (checked with the fix reverted).
    It uses names of its own."""
    with demo_builder().build().start():  # registered in this test's directory file
        assert _run_example() == ["Data(current: float64 = 2.5)", "FIRST"]


def _local_etcd_command() -> list[str]:
    text = DEPLOYMENT.read_text()
    block = re.search(r"## On this machine.*?```sh\n(.*?)```", text, re.S)
    assert block is not None, "docs/deployment.md has no local etcd block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    (command,) = [line for line in lines if line.strip().startswith("etcd ")]
    return shlex.split(command.split("#")[0].rstrip().rstrip("&"))


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_local_etcd_command_names_both_of_its_ports(tmp_path: Path) -> None:
    """Issue 37, item 21: the command lacked ``--listen-peer-urls``, so its etcd took the default
    peer port 2380 and a second etcd on the machine clashed there. Run as a user changing the
    ports it shows would (each to a free one), it must listen on both (on main: nothing on the
    peer port given, since the command named none)."""
    etcd = shutil.which("etcd")
    assert etcd is not None, "needs etcd: run `make etcd`"
    client, peer = free_port(), free_port()
    args = [
        arg.replace("2379", str(client))
        .replace("2380", str(peer))
        .replace("/tmp/etcd-demo", str(tmp_path / "data"))
        for arg in _local_etcd_command()
    ]
    assert args[0] == "etcd"
    with (tmp_path / "etcd.log").open("wb") as log:
        proc = subprocess.Popen([etcd, *args[1:]], stdout=log, stderr=log)
        try:

            def healthy() -> bool:
                assert proc.poll() is None, (tmp_path / "etcd.log").read_text()[-2000:]
                with contextlib.suppress(httpx.HTTPError):
                    reply = httpx.get(f"http://127.0.0.1:{client}/health", timeout=2.0)
                    return bool(reply.json().get("health") == "true")
                return False

            wait_until(healthy, "the docs' etcd to answer /health", timeout=30.0)
            assert _listening(peer), "the etcd command does not bind the peer port it shows"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
