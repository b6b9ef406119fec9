"""``rda describe`` and what ``rda get`` shows of property metadata, through click's CliRunner
against the demo server (which declares units, precision, limits and alarm limits) in this
process, registered in the per-test directory file."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

import rda.admin
from rda.admin.cli.common import ExitCode
from rda.admin.cli.main import cli
from rda.business.server.builder import Server
from rda.demo import demo_builder
from rda.testing import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def demo() -> Iterator[Server]:
    server = rda.admin.install(demo_builder(rate_hz=20.0)).build().start()
    yield server
    server.stop()


def rda_cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rda")


def test_describe_prints_the_fields_table(demo: Server) -> None:
    result = rda_cli("describe", "PS1/Acquisition")
    assert result.exit_code == 0, result.output + result.stderr
    lines = result.output.splitlines()
    assert lines[0] == "PS1/Acquisition  read-only"
    assert lines[1] == "  The measured current, published every basic period"
    assert lines[2].split() == [
        "FIELD",
        "UNITS",
        "PRECISION",
        "LIMITS",
        "WARNING",
        "ALARM",
        "DESCRIPTION",
    ]
    assert lines[3].split()[:6] == ["current", "A", "4", "-", "-90..90", "-95..95"]
    setting = rda_cli("describe", "PS1/Setting")
    assert setting.output.splitlines()[0] == "PS1/Setting  settable"
    assert "-100..100" in setting.output


def test_describe_json_is_the_property_description(demo: Server) -> None:
    result = rda_cli("describe", "BPM1/Orbit", "--json")
    assert result.exit_code == 0, result.stderr
    parsed = rda.PropertyDescription.from_dict(json.loads(result.output))
    assert parsed == demo.describe("BPM1", "Orbit")
    assert parsed.fields["orbit"].units == "mm"


def test_describe_of_an_unknown_property_exits_not_found(demo: Server) -> None:
    result = rda_cli("describe", "PS1/Nope")
    assert result.exit_code == ExitCode.NO_SUCH_DEVICE
    assert result.stderr.startswith("rda: ") and "PS1/Nope: no such property" in result.stderr


def test_get_shows_precision_units_and_the_alarm(demo: Server) -> None:
    result = rda_cli("get", "PS1/Acquisition")
    assert result.exit_code == 0, result.stderr
    current = next(line for line in result.output.splitlines() if "current" in line)
    # Four digits after the point, then the units (rather than 17 significant digits).
    number, units = current.split()[1:]
    assert units == "A" and len(number.split(".")[1]) == 4
    assert "ALARM" not in result.output
    with ps1_at(97.0):
        shown = rda_cli("get", "PS1/Acquisition")
        assert "  ALARM MAJOR: current " in shown.output
        assert "A above high alarm 95" in shown.output
        as_json = json.loads(rda_cli("get", "PS1/Acquisition", "--json").output)
        assert as_json["alarm"]["severity"] == "MAJOR" and as_json["alarm"]["field"] == "current"
        assert as_json["units"] == {"current": "A", "set_point": "A"}
        assert isinstance(as_json["data"]["current"], float)  # the value itself, unformatted


@contextlib.contextmanager
def ps1_at(current: float) -> Iterator[None]:
    """Set PS1's current with ``rda set``, wait until the measured current has followed past
    the MAJOR limit (the demo's first-order lag), and set it back to 0 after."""
    assert rda_cli("set", "PS1/Setting", f"current={current}").exit_code == 0

    def followed() -> bool:
        shown = json.loads(rda_cli("get", "PS1/Acquisition", "--json").output)
        return bool(shown["data"]["current"] > 95.5)

    wait_until(followed, "the measured current to pass 95.5 A", timeout=30)
    try:
        yield
    finally:
        rda_cli("set", "PS1/Setting", "current=0")
