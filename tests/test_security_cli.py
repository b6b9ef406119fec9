"""The security side of the ``rda`` CLI: ``rda keys``, key flags, ``serve --key/--clients``,
``serve demo --secure``, and docs/security.md's walk-through run as written in real processes.

Every server process is stopped by its pid at the end; the directory file is the per-test one
from conftest (``RDA_DIRECTORY_FILE``, inherited by the child processes).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import rda.security as security
from rda.admin.cli.common import ExitCode
from rda.admin.cli.main import cli
from rda.business.config import Config
from rda.demo import demo_security

BIN = Path(sys.executable).parent
DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"


def rda_cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def background(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def start(command: str, cwd: Path, started: list[subprocess.Popen[str]]) -> list[str]:
    """Run ``command`` in the background (``exec``: the pid is rda's) and return its stdout
    lines up to the server key line, which it prints once it serves and is registered."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(
        f"exec {command}",
        shell=True,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(proc)
    assert proc.stdout is not None
    lines: list[str] = []
    # readline blocks until the server speaks or exits (then ''), bounded by the test timeout.
    while not lines or not lines[-1].startswith("CURVE"):
        line = proc.stdout.readline()
        assert line, f"{command!r} ended: {proc.stderr.read() if proc.stderr else ''}"
        lines.append(line.rstrip("\n"))
    return lines


def walkthrough() -> tuple[str, list[str]]:
    """The walk-through's policy file and its commands, as docs/security.md shows them."""
    section = DOC.read_text().split("## Walk-through", 1)[1]
    policy = re.search(r"```toml\n(.*?)```", section, re.S)
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert policy is not None and block is not None, "docs/security.md has no walk-through"
    return policy.group(1), [line[2:] for line in block.group(1).splitlines() if line[:2] == "$ "]


def test_walkthrough_runs_as_written(
    tmp_path: Path, background: list[subprocess.Popen[str]]
) -> None:
    policy, commands = walkthrough()
    assert len(commands) == 5
    (tmp_path / "policy.toml").write_text(policy)
    outputs = []
    for command in commands:
        if command.endswith("&"):
            outputs.append("\n".join(start(command[:-1].strip(), tmp_path, background)))
            continue
        done = shell(command, tmp_path)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        outputs.append(done.stdout)
    assert (tmp_path / "server.key_secret").stat().st_mode & 0o777 == 0o600
    assert security.load_clients(tmp_path / "clients") == {
        "operator": security.load_public_key(tmp_path / "operator.key")
    }
    server_key = security.load_public_key(tmp_path / "server.key")
    assert f"CURVE    server key {server_key}" in outputs[3]
    assert outputs[4].startswith("PS1/Setting") and "current" in outputs[4]

    # What the policy grants the operator, and what it refuses before anything runs (exit 5).
    allowed = shell("rda set PS1/Setting current=3 --key operator.key_secret", tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    refused = shell(
        "rda admin RdaDemoServer log-level level=DEBUG --key operator.key_secret", tmp_path
    )
    assert refused.returncode == ExitCode.NOT_AUTHORIZED, refused.stderr
    assert "operator (roles: operator) may not admin:log-level" in refused.stderr

    # What the text after the block says: no key, or an unknown key, exit 5 at once.
    plain = shell("rda get PS1/Setting", tmp_path)
    assert plain.returncode == ExitCode.NOT_AUTHORIZED, plain.stderr
    assert "security handshake refused" in plain.stderr
    mallory = shell(
        "rda keys generate mallory && rda get PS1/Setting --key mallory.key_secret", tmp_path
    )
    assert mallory.returncode == ExitCode.NOT_AUTHORIZED, mallory.stderr
    assert "does not accept this client's key" in mallory.stderr
    # --endpoint bypasses the directory: the server key then comes from --server-key.
    endpoint = next(
        line.split()[1] for line in outputs[3].splitlines() if line.startswith("endpoint")
    )
    for given in ("server.key", server_key):
        direct = shell(
            f"rda --endpoint {endpoint} set PS1/Setting current=3 --key operator.key_secret "
            f"--server-key '{given}'",
            tmp_path,
        )
        assert direct.returncode == 0, direct.stderr
    keyless = shell(
        f"rda --endpoint {endpoint} get PS1/Setting --key operator.key_secret", tmp_path
    )
    assert keyless.returncode == ExitCode.NOT_AUTHORIZED
    assert "no CURVE server key known" in keyless.stderr
    # The environment works like the flags.
    env = shell(
        f"RDA_KEY_FILE=operator.key_secret RDA_SERVER_KEY=server.key rda --endpoint {endpoint} "
        "admin RdaDemoServer stats --json",
        tmp_path,
    )
    assert env.returncode == 0, env.stderr
    assert json.loads(env.stdout)["transport"]["auth_failures"] >= 2


def test_keys_generate_and_show(tmp_path: Path) -> None:
    made = rda_cli("keys", "generate", "op", "--dir", str(tmp_path / "k"), "--json")
    assert made.exit_code == 0, made.output
    info = json.loads(made.stdout)
    pair = security.load_keypair(info["secret_file"])
    assert pair.public == info["public"]
    assert (tmp_path / "k" / "op.key_secret").stat().st_mode & 0o777 == 0o600
    shown = rda_cli("keys", "show", str(tmp_path / "k" / "op.key"))
    assert shown.stdout.strip() == pair.public
    again = rda_cli("keys", "generate", "op", "--dir", str(tmp_path / "k"))
    assert again.exit_code == ExitCode.USAGE
    assert "exists (--force replaces it)" in again.stderr
    assert security.load_keypair(tmp_path / "k" / "op.key_secret") == pair
    forced = rda_cli("keys", "generate", "op", "--dir", str(tmp_path / "k"), "--force")
    assert forced.exit_code == 0
    assert security.load_keypair(tmp_path / "k" / "op.key_secret") != pair
    bad = rda_cli("keys", "generate", "../op")
    assert bad.exit_code == ExitCode.USAGE


def test_bad_key_flags_are_one_line_errors(tmp_path: Path) -> None:
    security.save_keypair(security.generate_keypair(), tmp_path / "op.key_secret")
    os.chmod(tmp_path / "op.key_secret", 0o640)
    loose = rda_cli("get", "PS1/Setting", "--key", str(tmp_path / "op.key_secret"))
    assert loose.exit_code == ExitCode.USAGE
    assert "mode 0640" in loose.stderr and len(loose.stderr.splitlines()) == 1
    os.chmod(tmp_path / "op.key_secret", 0o600)
    garbage = rda_cli(
        "get", "PS1/Setting", "--key", str(tmp_path / "op.key_secret"), "--server-key", "nope"
    )
    assert garbage.exit_code == ExitCode.USAGE
    assert "no such key file" in garbage.stderr
    alone = rda_cli("get", "PS1/Setting", "--server-key", "x")
    assert alone.exit_code == ExitCode.USAGE and "--server-key needs --key" in alone.stderr
    half = rda_cli("serve", "demo", "--key", str(tmp_path / "op.key_secret"))
    assert half.exit_code == ExitCode.USAGE and "--key and --clients go together" in half.stderr
    other = rda_cli("serve", "x:y", "--secure", str(tmp_path))
    assert other.exit_code == ExitCode.USAGE and "--secure is for `rda serve demo`" in other.stderr


def test_serve_demo_secure_creates_keys_once(tmp_path: Path) -> None:
    folder = tmp_path / "demo-keys"
    served = rda_cli("serve", "demo", "--secure", str(folder), "--duration", "0.05", "--json")
    assert served.exit_code == 0, served.output
    info = json.loads(served.stdout.splitlines()[0])
    assert info["server_key"] == security.load_keypair(folder / "server.key_secret").public
    operator = security.load_keypair(folder / "operator.key_secret")
    assert security.load_clients(folder / "clients") == {"operator": operator.public}
    assert folder.stat().st_mode & 0o777 == 0o700
    # A second start keeps the keys (clients added meanwhile stay accepted).
    security.save_public_key(security.generate_keypair().public, folder / "clients" / "bob.key")
    again = demo_security(folder)
    assert again.keypair.public == info["server_key"]
    assert set(again.curve().clients) == {"operator", "bob"}


def test_config_carries_the_key_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_KEY_FILE", "~/op.key_secret")
    monkeypatch.setenv("RDA_SERVER_KEY", "server.key")
    config = Config()
    assert config.key_file == Path.home() / "op.key_secret"
    assert config.server_key == "server.key"
