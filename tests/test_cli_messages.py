"""What a new user of the ``rda`` command hit (issue 37, "What a new user hit"): an error in
their own server module, option placement, messages that named the wrong thing, not-found
errors that did not help, backfilled lines stamped with the receipt time.

Each test's docstring quotes the issue's evidence and says how it was checked to fail on main
(the test run against main's code, or before the fix in this branch).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from rda._cli import build
from rda.admin import install
from rda.admin.cli.options import ExitCode
from rda.business.common import AcquiredData
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest
from rda.demo import demo_builder
from rda.serialization.data import Data
from rda.serialization.header import DataContext
from rda.testing import free_port


def run_rda(*args: str, cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``rda ARGS`` as a process (the exit code and stderr a user sees)."""
    return subprocess.run(
        [sys.executable, "-m", "rda._cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- 13: an error in the user's server module --------------------------------------------------

BAD_MODULES = {
    "bad_syntax": ("import rda\n\ndef build(:\n    pass\n", "SyntaxError: invalid syntax", 3),
    "bad_name": (
        "import rda\n\n\ndef helper():\n    return Missing()\n\n\ndef build():\n"
        "    return helper()\n",
        "NameError: name 'Missing' is not defined",
        5,
    ),
}


@pytest.mark.parametrize("module", sorted(BAD_MODULES))
def test_an_error_in_the_users_module_shows_their_frames_and_exits_2(
    tmp_path: Path, module: str
) -> None:
    """Issue 37, item 13: ``rda serve bad_server:build`` with a SyntaxError, or a NameError in
    ``build()``, printed a 38-45 line traceback through click, rda and importlib and exited 1
    (checked with the fix reverted: exit 1, "Traceback" and importlib frames),
    while docs/cli.md promises exit 2 and never a traceback. Now: one ``rda:`` line naming the
    error, then the user's own frames (file, line, the code), exit 2."""
    source, error, line = BAD_MODULES[module]
    (tmp_path / f"{module}.py").write_text(source)
    done = run_rda("serve", f"{module}:build", cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("rda: error in your code (") and lines[0].endswith(error)
    assert f'File "{tmp_path / module}.py", line {line}' in done.stderr
    assert "Traceback" not in done.stderr and "importlib" not in done.stderr
    assert "/rda/" not in done.stderr.replace(str(tmp_path), "")  # none of rda's frames
    assert len(lines) <= 8, done.stderr


def test_a_missing_module_is_still_one_line(tmp_path: Path) -> None:
    done = run_rda("serve", "no_such_module_here:build", cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE
    assert (
        done.stderr == "rda: cannot import 'no_such_module_here': No module named "
        "'no_such_module_here'\n"
    )


# -- 19: every global option before and after the subcommand -----------------------------------


@pytest.fixture(scope="module")
def demo() -> Iterator[Server]:
    """The demo server with the admin commands, registered nowhere (``--endpoint`` finds it)."""
    with install(demo_builder(directory=None)).build().start() as server:
        yield server


def rda_in(*args: str) -> Result:
    """``rda ARGS`` in this process (click's runner), with every command the package has."""
    return CliRunner().invoke(build(), list(args), prog_name="rda")


def _same(before: Result, after: Result) -> None:
    assert (before.exit_code, before.stdout, before.stderr) == (
        after.exit_code,
        after.stdout,
        after.stderr,
    )


@pytest.mark.parametrize(
    "options",
    [
        ["--json"],
        ["--timeout", "5"],
        ["--key", "no-such.key_secret"],
        ["--server-key", "Z" * 40],
        ["--json", "--timeout", "5"],
    ],
)
def test_every_global_option_works_before_and_after_the_subcommand(
    demo: Server, options: list[str]
) -> None:
    """Issue 37, item 19: ``--endpoint`` worked in both positions but ``--json``, ``--key``,
    ``--server-key`` and ``--timeout`` only after the subcommand: ``rda --json get X`` failed
    with ``Error: No such option: --json`` (exit 2; checked with the fix
    reverted). Now each means the same before the subcommand as after it."""
    for command in (["get", "PS1/Setting", "-f", "current"], ["admin", demo.endpoint, "devices"]):
        before = rda_in(*options, *command, "-e", demo.endpoint)
        after = rda_in(*command, *options, "-e", demo.endpoint)
        assert "No such option" not in before.stderr, before.stderr
        _same(before, after)
    plain = rda_in("get", "PS1/Setting", "-e", demo.endpoint)
    assert plain.exit_code == 0 and plain.stdout.startswith("PS1/Setting  ")
    as_json = json.loads(rda_in("--json", "get", "PS1/Setting", "-e", demo.endpoint).stdout)
    assert as_json["address"] == "PS1/Setting"


def test_after_the_subcommand_wins_and_a_foreign_option_is_refused(demo: Server) -> None:
    ok = rda_in(
        "--timeout", "0.000001", "get", "PS1/Setting", "--timeout", "10", "-e", demo.endpoint
    )
    assert ok.exit_code == 0, ok.stderr
    refused = rda_in("--timeout", "2", "subscribe", "PS1/Setting", "-e", demo.endpoint)
    assert refused.exit_code == ExitCode.USAGE
    assert "Error: --timeout does not apply to `rda subscribe`" in refused.stderr
    nested = rda_in("--json", "directory", "list")
    assert nested.exit_code == 0 and json.loads(nested.stdout).keys() >= {"servers"}


# -- 16: a subscription's lines show the acquisition stamp --------------------------------------

# 2026-09-21 at 12:34:56.789 local time: a stamp far from the time the test runs.
ACQUIRED = _dt.datetime(2026, 9, 21, 12, 34, 56, 789000)


class Recorded(Device):
    """``OLD/Value``: answers (and so a subscription's FIRST) with a value acquired long ago,
    as a recorder's backfilled HISTORY value is; ``OLD/Broken`` fails."""

    @Device.property("Value")
    def value(self, request: GetRequest) -> AcquiredData:
        stamp = int(ACQUIRED.timestamp()) * 1_000_000_000 + 789_000_000
        return AcquiredData(Data(x=1.5), DataContext(acq_stamp=stamp))

    @Device.property("Broken")
    def broken(self, request: GetRequest) -> Data:
        raise RuntimeError("no value")


@pytest.fixture(scope="module")
def recorded() -> Iterator[Server]:
    with ServerBuilder("OldServer").device("OLD", Recorded()).directory(None).build() as server:
        yield server


def test_a_subscriptions_lines_show_the_acquisition_stamp_and_say_so(recorded: Server) -> None:
    """Issue 37, item 16: all 300 HISTORY lines of ``rda subscribe --backfill 30s`` printed
    ``20:28:26.262``, the time they were received, though acquired over 30 s (checked with
    the fix reverted, it prints the time of the run, not 12:34:56.789). The time column
    is the value's acquisition stamp, and a line on stderr says which time it is; an error line
    (no stamp) shows when it arrived, marked ``*``, and is labelled ERROR, not with the
    update type it came under."""
    result = rda_in("subscribe", "OLD/Value", "-n", "1", "-e", recorded.endpoint)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("12:34:56.789  FIRST     seq=1  x=1.5"), result.stdout
    assert result.stderr.splitlines()[0] == (
        "time = acquisition stamp (acq_stamp), local; * = time received (errors, no stamp)"
    )
    failed = rda_in("subscribe", "OLD/Broken", "-n", "1", "-d", "1", "-e", recorded.endpoint)
    assert failed.exit_code == ExitCode.REMOTE_ERROR
    (line,) = failed.stdout.splitlines()
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3}\* ERROR     seq=1  RemoteError: RuntimeError: .*no value", line
    ), line


# -- 18: not-found errors suggest close names ---------------------------------------------------


def test_not_found_errors_suggest_close_names(demo: Server) -> None:
    """Issue 37, item 18: ``rda get PS11/Acquisition`` listed where it looked, not what exists,
    and ``rda set PS1/Setting curent=3`` pointed to ``--no-read`` instead of ``current``
    (checked with the fix reverted: prints ``rda: not found: PS11: no such
    device`` and ``rda: PS1/Setting has no field 'curent' (fields: current); --no-read sends
    it as given``). Close names are suggested: devices from the directory (and, with
    ``--endpoint``, the server's ``devices``), fields from the value read."""
    ep = ("-e", demo.endpoint)
    device = rda_in("get", "PS11/Acquisition", *ep)
    assert device.exit_code == ExitCode.NO_SUCH_DEVICE
    assert device.stderr == "rda: not found: PS11: no such device; did you mean 'PS1'?\n"
    field = rda_in("set", "PS1/Setting", "curent=3", *ep)
    assert field.exit_code == ExitCode.NO_SUCH_DEVICE
    assert field.stderr == (
        "rda: PS1/Setting has no field 'curent': did you mean 'current'? "
        "(fields: current; --no-read sends it as given)\n"
    )
    one = rda_in("get", "PS1/Setting", "-f", "curent", *ep)
    assert one.stderr == (
        "rda: PS1/Setting has no field 'curent': did you mean 'current'? (fields: current)\n"
    )
    sub = rda_in("subscribe", "PS11/Acquisition", "-d", "1", *ep)
    assert sub.exit_code == ExitCode.NO_SUCH_DEVICE
    assert sub.stderr.splitlines()[-1].endswith("PS11: no such device; did you mean 'PS1'?")
    nothing_close = rda_in("get", "XYZ/Acquisition", *ep)
    assert nothing_close.stderr == "rda: not found: XYZ: no such device\n"


def test_device_names_come_from_the_directory() -> None:
    with install(demo_builder()).build().start():  # in this test's directory file
        result = rda_in("get", "PS11/Acquisition")
        assert result.exit_code == ExitCode.NO_SUCH_DEVICE
        assert result.stderr.startswith("rda: not found: PS11: no such device (looked in ")
        assert result.stderr.endswith("); did you mean 'PS1'?\n")
        late = rda_in("subscribe", "BPM/Orbit", "-d", "1")
        assert late.stderr.splitlines()[-1].endswith("did you mean 'BPM1'?")


# -- 20: messages that named the wrong thing ---------------------------------------------------


def test_a_refused_connection_is_not_called_lost() -> None:
    """Issue 37, item 20: a port where nothing listens gave ``connection to tcp://127.0.0.1:P
    lost (connection refused or closed)`` for a connection that never existed (checked with
    the fix reverted, it prints "lost"). It says it could not connect."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    got = rda_in("get", "PS1/Setting", "-e", endpoint, "--timeout", "5")
    assert got.exit_code == ExitCode.DISCONNECTED
    assert got.stderr == (
        f"rda: disconnected: get PS1/Setting: could not connect to {endpoint} "
        "(connection refused or closed)\n"
    )
    sub = rda_in("subscribe", "PS1/Setting", "-e", endpoint, "-d", "1")
    assert sub.exit_code == ExitCode.DISCONNECTED
    assert f"PS1/Setting: could not connect to {endpoint} (connection refused" in sub.stdout
    assert " lost " not in sub.stdout + sub.stderr


def test_admin_output_is_plain_text(demo: Server) -> None:
    """Issue 37, item 20: ``rda admin SRV info`` printed ``float64[0]`` for an empty
    ``blocking_properties``, and ``commands`` showed raw reST (````Device````) and help cut at
    the docstring's first line break (checked with the fix reverted)."""
    info = rda_in("admin", demo.endpoint, "info")
    assert info.exit_code == 0, info.stderr
    assert re.search(r"^  blocking_properties +\[\]$", info.stdout, re.M), info.stdout
    assert "float64[0]" not in info.stdout
    listed = rda_in("admin", demo.endpoint, "commands")
    assert "``" not in listed.stdout
    assert "for Device objects, their properties." in listed.stdout
    assert "is refused and the old policy stays." in listed.stdout  # the whole first paragraph


def test_directory_list_under_etcd_names_no_unrelated_file(
    etcd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, item 20: under etcd, ``rda directory list`` also printed ``directory file:
    ...``, a file it did not read (checked with the fix reverted). The file is
    named only when it is asked (no etcd, or as etcd's configured fallback)."""
    monkeypatch.setenv("RDA_DIRECTORY_URL", etcd.url.replace("http://", "etcd://"))
    listed = rda_in("directory", "list")
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout.startswith("etcd: ")
    assert "directory file" not in listed.stdout
    monkeypatch.delenv("RDA_DIRECTORY_URL")
    assert rda_in("directory", "list").stdout.startswith("directory file: ")


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_a_timeout_must_be_more_than_zero(timeout: str) -> None:
    """Issue 37, item 20: ``--timeout 0`` was accepted and timed out at once (checked against
    main before item 19: any float was taken, and the issue saw 0 time out at once). It is a usage error, before or after
    the subcommand."""
    for args in (
        ["--timeout", timeout, "get", "PS1/Setting"],
        ["get", "PS1/Setting", "--timeout", timeout],
    ):
        result = rda_in(*args, "-e", "tcp://127.0.0.1:1")
        assert result.exit_code == ExitCode.USAGE, result.output
        assert "Invalid value for '--timeout'" in result.stderr


def test_history_serve_refuses_a_bad_duration_without_a_traceback(tmp_path: Path) -> None:
    """``rda history serve STORE --duration 1`` printed a 30-line traceback (``ValueError:
    duration: '1' is not a duration ...``, exit 1): the value was parsed before the command's
    error handling. Found by trying it while closing issue 37; now a usage error, exit 2."""
    result = CliRunner().invoke(
        build(), ["history", "serve", str(tmp_path), "--duration", "1"], catch_exceptions=False
    )
    assert result.exit_code == ExitCode.USAGE
    assert "Invalid value for --duration" in result.output
    assert "is not a duration like '10s'" in result.output
