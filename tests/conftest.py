"""Fixtures shared by every test module.

Every test gets its own directory file (``RDA_DIRECTORY_FILE``) so no test reads or writes the
machine-wide one, and ``no_thread_leak`` lets a test assert that what it started has stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from rda.testing import wait_until

# Property tests must not depend on wall-clock speed: on a loaded 2-core machine one example
# can take far longer than Hypothesis' default 200 ms deadline (issue 26). Every property test
# runs under this profile; a test's own @settings keeps it unless it sets a deadline itself.
settings.register_profile("rda", deadline=None)
settings.load_profile("rda")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item (``item.rep_call``...): a fixture's teardown reads
    it to save evidence (screenshots, logs) only when the test failed."""
    outcome: Any = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(autouse=True)
def _isolated_directory_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_DIRECTORY_FILE", str(tmp_path / "rda-directory.json"))


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Fail the test if it leaves behind threads it started (waits up to 10 s for them to end)."""
    before = set(threading.enumerate())
    yield

    def leaked() -> list[str]:
        return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]

    wait_until(lambda: not leaked(), "the threads the test started to end", probe=leaked)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Any]:
    """A real etcd on 127.0.0.1 (free ports, data under tmp_path), healthy before the test
    starts, stopped by pid after it (``rda.testing.LocalEtcd``; its log is in tmp_path)."""
    from rda.testing import LocalEtcd

    with LocalEtcd(tmp_path / "etcd") as server:
        yield server


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (UI off, UTC, 2 shuffle partitions).

    Built by ``rda.pipeline.spark_session.local_session`` so tests run with exactly the
    settings ``History.local`` gives users. Imported lazily: only Spark tests pay for the JVM.
    """
    from rda.pipeline.spark_session import local_session

    session = local_session(master="local[2]", app_name="rda-tests")
    yield session
    session.stop()
