"""The ``rda`` CLI through click's CliRunner, against a real server in this process.

The server registers in the per-test directory file (``RDA_DIRECTORY_FILE`` from conftest),
so ``rda get`` finds it with no configuration, as on a developer's machine.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

import rda.admin
from rda.admin.cli.common import ExitCode, exit_code_for
from rda.admin.cli.main import cli
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.devices import Device
from rda.business.server.requests import GetRequest, SetRequest
from rda.serialization.data import Data, DataType
from rda.serialization.errors import (
    DisconnectedError,
    NoSuchDeviceError,
    RemoteError,
    TimeoutError,
)


class Corrector(Device):
    def __init__(self) -> None:
        super().__init__()
        self.current = 1.5
        self.mode = 3
        self.hold = threading.Event()

    @Device.property("Setting")
    def setting(self, request: GetRequest) -> Data:
        data = Data(current=self.current, wave=np.linspace(-1.0, 2.0, 128).reshape(2, 64))
        data.append("mode", self.mode, type=DataType.INT32)
        return data

    @setting.setter  # type: ignore[no-redef]
    def setting(self, value: Data, request: SetRequest) -> None:
        self.current = float(value["current"])
        self.mode = int(value["mode"])
        assert value.type_of("mode") is DataType.INT32

    @Device.property("Stuck")
    def stuck(self, request: GetRequest) -> Data:
        self.hold.wait(10.0)
        return Data(ok=True)


@pytest.fixture
def server() -> Iterator[tuple[Server, Corrector]]:
    device = Corrector()
    srv = rda.admin.install(ServerBuilder("CorrServer").device("CORR1", device)).build().start()
    yield srv, device
    device.hold.set()
    srv.stop()


def rda_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rda", env=env)


def assert_one_line_error(result: Result, code: ExitCode, text: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("rda: ")
    assert text in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output + result.stderr


def test_get_human_output_summarises_arrays(server: tuple[Server, Corrector]) -> None:
    result = rda_cli("get", "CORR1/Setting")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("CORR1/Setting  acquired ")
    assert "current  1.5" in result.stdout
    assert "wave     float64[2x64] min=-1.0 max=2.0" in result.stdout
    assert "mode     3" in result.stdout


def test_get_json_and_field(server: tuple[Server, Corrector]) -> None:
    result = rda_cli("get", "CORR1/Setting", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["data"]["current"] == 1.5
    assert len(doc["data"]["wave"]) == 2 and len(doc["data"]["wave"][0]) == 64
    assert doc["context"]["acq_stamp"] > 0
    assert rda_cli("get", "CORR1/Setting", "--field", "mode").stdout.strip() == "3"
    assert rda_cli("get", "CORR1/Setting", "-f", "current", "--json").stdout.strip() == "1.5"
    missing = rda_cli("get", "CORR1/Setting", "--field", "nope")
    assert_one_line_error(missing, ExitCode.NO_SUCH_DEVICE, "no field 'nope'")


def test_get_with_explicit_endpoint(server: tuple[Server, Corrector]) -> None:
    result = rda_cli("--endpoint", server[0].endpoint, "get", "CORR1/Setting", "-f", "mode")
    assert result.stdout.strip() == "3"


def test_expected_failures_exit_with_codes(server: tuple[Server, Corrector]) -> None:
    assert_one_line_error(
        rda_cli("get", "NOPE/Setting"), ExitCode.NO_SUCH_DEVICE, "not found: NOPE"
    )
    assert_one_line_error(rda_cli("get", "CORR1/Nope"), ExitCode.NO_SUCH_DEVICE, "no such property")
    assert_one_line_error(
        rda_cli("get", "CORR1/Stuck", "--timeout", "0.3"), ExitCode.TIMEOUT, "timed out"
    )
    bad = rda_cli("get", "CORR1")
    assert bad.exit_code == ExitCode.USAGE
    assert "expected DEVICE/PROPERTY" in bad.stderr


def test_unreachable_server_fails_cleanly() -> None:
    result = rda_cli("--endpoint", "tcp://127.0.0.1:1", "get", "X/Y", "--timeout", "0.5")
    assert result.exit_code in (ExitCode.TIMEOUT, ExitCode.DISCONNECTED), result.output
    assert "Traceback" not in result.output + result.stderr


def test_set_converts_to_the_field_types(server: tuple[Server, Corrector]) -> None:
    _, device = server
    result = rda_cli("set", "CORR1/Setting", "current=2.5", "mode=0x10")
    assert result.exit_code == 0, result.output
    assert (device.current, device.mode) == (2.5, 16)
    result = rda_cli("set", "CORR1/Setting", "--json", '{"current": 3, "mode": 7}')
    assert result.exit_code == 0, result.output
    assert (device.current, device.mode) == (3.0, 7)


def test_set_refuses_unparseable_values(server: tuple[Server, Corrector]) -> None:
    _, device = server
    assert_one_line_error(
        rda_cli("set", "CORR1/Setting", "mode=fast"),
        ExitCode.BAD_VALUE,
        "field 'mode': cannot parse 'fast' as int32",
    )
    assert_one_line_error(
        rda_cli("set", "CORR1/Setting", "mode=99999999999"), ExitCode.BAD_VALUE, "int32"
    )
    assert_one_line_error(
        rda_cli("set", "CORR1/Setting", "mode"), ExitCode.BAD_VALUE, "expected name=value"
    )
    assert_one_line_error(
        rda_cli("set", "CORR1/Setting", "--json", "{nope"), ExitCode.BAD_VALUE, "not valid JSON"
    )
    assert device.mode == 3  # nothing was sent


def test_subscribe_count_prints_lines_and_summary(server: tuple[Server, Corrector]) -> None:
    _, device = server
    stop = threading.Event()

    def publish() -> None:
        while not stop.wait(0.02):
            device.publish("Setting", Data(current=device.current + 1))

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        result = rda_cli("subscribe", "CORR1/Setting", "--count", "3", "--json")
    finally:
        stop.set()
        publisher.join()
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    updates, summary = lines[:-1], lines[-1]["summary"]
    assert len(updates) == 3
    assert updates[0]["update"] == "FIRST"
    assert updates[0]["data"]["mode"] == 3
    assert all(u["update"] in ("FIRST", "NORMAL") for u in updates)
    assert summary["updates"] == 3 and summary["errors"] == 0
    assert summary["reconnects"] == 0  # the connection held


def test_subscribe_human_lines_and_duration(server: tuple[Server, Corrector]) -> None:
    result = rda_cli("subscribe", "CORR1/Setting", "--duration", "0.5")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert " FIRST " in first and "seq=" in first
    assert "wave=float64[2x64] min=-1.0 max=2.0" in first
    assert "1 updates in" in result.stderr


def test_admin_by_server_name_and_errors(server: tuple[Server, Corrector]) -> None:
    ping = rda_cli("admin", "CorrServer", "ping", "echo=hi", "--json")
    assert ping.exit_code == 0, ping.output
    assert json.loads(ping.stdout)["echo"] == "hi"
    devices = rda_cli("admin", "CORR1", "devices")  # by device name
    assert "CORR1" in devices.stdout
    clients = rda_cli("admin", server[0].endpoint, "clients")
    assert "PEER" in clients.stdout  # a table header
    assert_one_line_error(
        rda_cli("admin", "CorrServer", "nope"), ExitCode.NO_SUCH_DEVICE, "unknown admin command"
    )
    assert_one_line_error(
        rda_cli("admin", "CorrServer", "log-level", "level=LOUD"),
        ExitCode.REMOTE_ERROR,
        "unknown level",
    )


def test_directory_list(server: tuple[Server, Corrector]) -> None:
    human = rda_cli("directory", "list")
    assert "CorrServer" in human.stdout and "CORR1" in human.stdout
    doc = json.loads(rda_cli("directory", "list", "--json").stdout)
    assert [s["name"] for s in doc["servers"]] == ["CorrServer"]
    assert doc["servers"][0]["endpoint"] == server[0].endpoint


SERVED = textwrap.dedent(
    """
    from rda.business.server.devices import Device
    from rda.serialization.data import Data

    class Thermometer(Device):
        @Device.property("Reading")
        def reading(self, request):
            return Data(celsius=21.5)

    def make():
        return Thermometer()

    from rda.business.server.builder import ServerBuilder

    builder = ServerBuilder("UserBuilt").device("TB1", Thermometer())
    prebuilt = ServerBuilder("Prebuilt").device("TS1", Thermometer()).directory(None).build()
    """
)


@pytest.mark.parametrize(
    ("target", "extra", "device"),
    [
        ("served_mod:Thermometer", [], "Thermometer"),
        ("served_mod:make", ["--device", "TH1"], "TH1"),
        ("served_mod:builder", [], "TB1"),
        ("served_mod:prebuilt", [], "TS1"),
    ],
)
def test_serve_module_object(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    extra: list[str],
    device: str,
) -> None:
    (tmp_path / "served_mod.py").write_text(SERVED)
    # A fresh import per case: a built Server starts only once.
    monkeypatch.delitem(sys.modules, "served_mod", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = rda_cli("serve", target, *extra, "--duration", "0.3", "--json", "--metrics-port", "0")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout.splitlines()[0])
    assert info["devices"] == [device]
    assert info["endpoint"].startswith("tcp://127.0.0.1:")
    assert info["metrics_url"].startswith("http://127.0.0.1:")
    assert "stopped" in result.stderr


def test_serve_built_server_cannot_be_rebound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "served_mod.py").write_text(SERVED)
    monkeypatch.delitem(sys.modules, "served_mod", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = rda_cli("serve", "served_mod:prebuilt", "--bind", "tcp://127.0.0.1:0")
    assert_one_line_error(result, ExitCode.USAGE, "already built Server")


def test_serve_bad_target() -> None:
    assert_one_line_error(rda_cli("serve", "nomodule_xyz:thing"), ExitCode.USAGE, "cannot import")
    assert_one_line_error(rda_cli("serve", "os:sep"), ExitCode.USAGE, "expected a ServerBuilder")
    assert_one_line_error(rda_cli("serve", "nocolon"), ExitCode.USAGE, "MODULE:OBJECT")


def test_bench_runs_scripts_and_prints_json(tmp_path: Path) -> None:
    (tmp_path / "quick.py").write_text('import json\nprint(json.dumps({"ops": 42}))\n')
    (tmp_path / "broken.py").write_text("raise SystemExit('boom')\n")
    ok = rda_cli("bench", "--dir", str(tmp_path), "quick", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout) == {"quick": {"ops": 42}}
    failed = rda_cli("bench", "--dir", str(tmp_path))
    assert failed.exit_code == ExitCode.ERROR
    assert "broken" in failed.stderr and '"ops": 42' in failed.stdout
    missing = rda_cli("bench", "--dir", str(tmp_path), "nope")
    assert missing.exit_code == ExitCode.NO_SUCH_DEVICE


def test_shell_completion_script() -> None:
    result = rda_cli(env={"_RDA_COMPLETE": "bash_source"})
    assert result.exit_code == 0
    assert "_rda_completion" in result.stdout


def test_config_errors_are_usage_errors() -> None:
    result = rda_cli("get", "A/B", env={"RDA_WORKERS": "zero"})
    assert_one_line_error(result, ExitCode.USAGE, "workers")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TimeoutError("t"), ExitCode.TIMEOUT),
        (NoSuchDeviceError("x"), ExitCode.NO_SUCH_DEVICE),
        (DisconnectedError("x"), ExitCode.DISCONNECTED),
        (RemoteError("ValueError", "x"), ExitCode.REMOTE_ERROR),
        (ValueError("not rda"), ExitCode.ERROR),
    ],
)
def test_exit_code_table(error: Any, code: ExitCode) -> None:
    assert exit_code_for(error) is code


def test_shell_completion_of_device_names(server: tuple[Server, Corrector]) -> None:
    from click.shell_completion import ShellComplete

    complete = ShellComplete(cli, {}, "rda", "_RDA_COMPLETE")
    assert [c.value for c in complete.get_completions(["get"], "CO")] == ["CORR1/"]
    assert complete.get_completions(["subscribe"], "XYZ") == []


def test_serve_name_renames_a_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `rda serve mod:build --name X` used to serve under the builder's own name, silently.
    from rda.admin.cli.run import load_server

    (tmp_path / "named_server.py").write_text(
        "import rda\n\ndef build() -> rda.ServerBuilder:\n    return rda.ServerBuilder('OwnName')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    built = load_server("named_server:build", name="Renamed")
    assert isinstance(built, ServerBuilder)
    assert built.name == "Renamed"
    assert load_server("named_server:build").name == "OwnName"
