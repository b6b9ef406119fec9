"""A configured directory that fails is never silently replaced by another (issue 37 item 14).

With etcd configured (``RDA_DIRECTORY_URL``) and unreachable, ``rda get`` used to resolve a
device from an old entry of this machine's directory file and exit 0, with no word, while
docs/deployment.md says exit 6. Now the chain is static mapping, then etcd; the file stands in
for an unreachable etcd only when configured (``RDA_DIRECTORY_FALLBACK``), and says so.

Real processes (the installed ``rda`` script), a real server on 127.0.0.1 registered in the
test's own directory file, and an etcd address where nothing listens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import rda
from rda.business.directory import ChainDirectory, FileDirectory, StaticDirectory
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.serialization.data import Data
from rda.testing import free_port

RDA = str(Path(sys.executable).with_name("rda"))


class Supply(Device):
    @Device.property("Setting")
    def setting(self, request: object) -> Data:
        return Data(current=1.5)


@pytest.fixture
def file_server() -> Iterator[Server]:
    """``FB1`` served on 127.0.0.1 and registered in the test's directory file only."""
    directory = FileDirectory(os.environ["RDA_DIRECTORY_FILE"])
    server = ServerBuilder("FallbackServer").device("FB1", Supply()).directory(directory).build()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _get(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RDA, "get", "FB1/Setting", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unreachable_etcd_is_the_answer_not_an_old_file_entry(file_server: Server) -> None:
    """On main before the fix (checked with PYTHONPATH=/work/main): exit 0 from the file's
    entry, stderr empty. Now: exit 6, ``directory unavailable`` naming etcd's address."""
    dead = f"127.0.0.1:{free_port()}"
    result = _get({"RDA_DIRECTORY_URL": f"etcd://{dead}"})
    assert result.returncode == 6, (result.returncode, result.stdout, result.stderr)
    assert "directory unavailable" in result.stderr and dead in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_configured_fallback_answers_and_says_so(file_server: Server) -> None:
    dead = f"127.0.0.1:{free_port()}"
    result = _get({"RDA_DIRECTORY_URL": f"etcd://{dead}", "RDA_DIRECTORY_FALLBACK": "true"})
    assert result.returncode == 0, result.stderr
    assert '"current":1.5' in result.stdout
    assert "resolved from the fallback FileDirectory" in result.stderr, result.stderr
    assert dead in result.stderr


def test_chain_counts_fallbacks_and_a_later_directory_never_stands_in() -> None:
    """Without a fallback a later directory in the chain is not asked in an outage's place."""
    dead = rda.EtcdDirectory(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    later = StaticDirectory({"FB1": "tcp://127.0.0.1:1"})
    chain = ChainDirectory(StaticDirectory({}), dead, later)
    spare = ChainDirectory(dead, fallback=StaticDirectory({"FB1": "tcp://127.0.0.1:2"}))
    try:
        with pytest.raises(rda.DirectoryUnavailableError):
            chain.resolve("FB1")
        assert spare.resolve("FB1") == "tcp://127.0.0.1:2"
        assert spare.fallbacks == 1
        with pytest.raises(rda.DirectoryUnavailableError):
            spare.resolve("NOPE")  # the fallback does not know it: the outage is the answer
        assert spare.fallbacks == 1
    finally:
        chain.close()
