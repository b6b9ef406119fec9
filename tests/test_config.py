"""Config: defaults, RDA_* environment, TOML files, precedence, readable errors."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

import pydantic
import pytest

from rda.business.config import Config, ConfigError, default_directory_file
from rda.serialization.errors import RdaError
from rda.transport.protocol import DEFAULT_MAX_MESSAGE_SIZE


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RDA_* variable from the machine (or the shared conftest) leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("RDA_"):
            monkeypatch.delenv(name)


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = Config()
    assert config.heartbeat_interval == 1.0
    assert config.heartbeat_timeout == 10.0
    assert config.request_timeout == 10.0
    assert config.directory_file == tmp_path / "rda" / "directory.json"
    assert config.directory == {}
    assert (config.workers, config.queue_limit, config.overflow_policy) == (4, 1000, "reject")
    assert (config.reconnect_initial, config.reconnect_max) == (0.02, 2.0)
    assert config.metrics_port is None
    assert config.max_message_size == DEFAULT_MAX_MESSAGE_SIZE


def test_directory_file_without_xdg_runtime_dir_is_per_user_under_tmp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    expected = Path("/tmp") / f"rda-{getpass.getuser()}" / "directory.json"
    assert default_directory_file() == expected
    assert Config().directory_file == expected


def test_environment_overrides_every_kind_of_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {
        "RDA_HEARTBEAT_INTERVAL": "0.5",
        "RDA_HEARTBEAT_TIMEOUT": "3",
        "RDA_REQUEST_TIMEOUT": "30",
        "RDA_DIRECTORY_FILE": str(tmp_path / "dir.json"),
        "RDA_DIRECTORY": '{"PS*": "tcp://h:5555", "BPM1": "ipc:///tmp/bpm"}',
        "RDA_WORKERS": "8",
        "RDA_QUEUE_LIMIT": "50",
        "RDA_OVERFLOW_POLICY": "drop_oldest",
        "RDA_RECONNECT_INITIAL": "0.1",
        "RDA_RECONNECT_MAX": "5",
        "RDA_METRICS_PORT": "9100",
        "RDA_MAX_MESSAGE_SIZE": "1048576",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = Config()
    assert config.heartbeat_interval == 0.5
    assert config.heartbeat_timeout == 3.0
    assert config.request_timeout == 30.0
    assert config.directory_file == tmp_path / "dir.json"
    assert config.directory == {"PS*": "tcp://h:5555", "BPM1": "ipc:///tmp/bpm"}
    assert list(config.directory) == ["PS*", "BPM1"]  # order matters for pattern matching
    assert (config.workers, config.queue_limit, config.overflow_policy) == (8, 50, "drop_oldest")
    assert (config.reconnect_initial, config.reconnect_max) == (0.1, 5.0)
    assert config.metrics_port == 9100
    assert config.max_message_size == 1048576


def test_directory_file_expands_the_home_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_DIRECTORY_FILE", "~/rda/directory.json")
    assert Config().directory_file == Path.home() / "rda" / "directory.json"


def test_lowercase_environment_names_work_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("rda_workers", "2")
    assert Config().workers == 2


def test_empty_variable_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_METRICS_PORT", "")
    assert Config().metrics_port is None


def test_arguments_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_WORKERS", "8")
    assert Config(workers=2).workers == 2


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_WORKERS", "0")
    monkeypatch.setenv("RDA_HEARTBEAT_INTERVAL", "fast")
    with pytest.raises(ConfigError) as info:
        Config()
    message = str(info.value)
    assert "workers (env RDA_WORKERS): Input should be greater than or equal to 1" in message
    assert "RDA_HEARTBEAT_INTERVAL" in message and "'fast'" in message
    # Still a ValueError and the pydantic detail is kept as the cause.
    assert isinstance(info.value, ValueError) and isinstance(info.value, RdaError)
    assert isinstance(info.value.__cause__, pydantic.ValidationError)


def test_directory_from_env_must_be_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDA_DIRECTORY", "PS*=tcp://h:5555")
    with pytest.raises(ConfigError, match=r'field "directory".*Expecting value'):
        Config()


def test_directory_endpoints_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"endpoint 'h:5555' for 'PS\*' is not tcp://"):
        Config(directory={"PS*": "h:5555"})
    with pytest.raises(ConfigError, match="must not be empty"):
        Config(directory={" ": "tcp://h:1"})


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"heartbeat_interval": 5, "heartbeat_timeout": 5}, "must exceed heartbeat_interval"),
        ({"reconnect_initial": 3, "reconnect_max": 2}, "must be at least reconnect_initial"),
        ({"request_timeout": 0}, "request_timeout .*greater than 0"),
        ({"metrics_port": 70000}, "metrics_port .*less than or equal to 65535"),
        ({"overflow_policy": "drop_all"}, "'reject', 'drop_oldest' or 'drop_newest'"),
        ({"queue_limit": 0}, "queue_limit"),
        ({"max_message_size": 10}, "max_message_size"),
        ({"wokers": 3}, "wokers: unknown setting; known: heartbeat_interval"),
    ],
)
def test_invalid_values_are_refused_readably(values: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Config(**values)


def test_config_is_immutable_but_copyable() -> None:
    config = Config()
    with pytest.raises(pydantic.ValidationError):
        config.workers = 9
    assert config.model_copy(update={"workers": 9}).workers == 9


def test_from_file(tmp_path: Path) -> None:
    path = tmp_path / "rda.toml"
    path.write_text(
        'workers = 6\noverflow_policy = "drop_newest"\ndirectory_file = "run/dir.json"\n'
        '[directory]\n"PS*" = "tcp://ps-host:5555"\n'
    )
    config = Config.from_file(path)
    assert config.workers == 6
    assert config.overflow_policy == "drop_newest"
    assert config.directory == {"PS*": "tcp://ps-host:5555"}
    # A relative path in the file is relative to the file, not to the working directory.
    assert config.directory_file == tmp_path / "run" / "dir.json"


def test_environment_beats_file_and_arguments_beat_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rda.toml"
    path.write_text("workers = 6\nqueue_limit = 10\nrequest_timeout = 20.0\n")
    monkeypatch.setenv("RDA_WORKERS", "7")
    config = Config.from_file(path, queue_limit=11)
    assert (config.workers, config.queue_limit, config.request_timeout) == (7, 11, 20.0)


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=r"cannot read rda configuration file .*missing\.toml"):
        Config.from_file(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("workers = = 3\n")
    with pytest.raises(ConfigError, match=r"broken\.toml is not valid TOML"):
        Config.from_file(broken)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("wrokers = 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*wrokers"):
        Config.from_file(unknown)
    invalid = tmp_path / "invalid.toml"
    invalid.write_text("workers = -1\n")
    with pytest.raises(ConfigError, match=r"(?s)workers \(env RDA_WORKERS\).*invalid.toml"):
        Config.from_file(invalid)


def test_transport_settings_carry_the_shared_knobs() -> None:
    settings = Config(
        heartbeat_interval=0.2, heartbeat_timeout=2.0, max_message_size=4096
    ).transport_settings()
    assert (settings.heartbeat_interval, settings.heartbeat_timeout) == (0.2, 2.0)
    assert settings.max_message_size == 4096


def test_reference_doc_lists_every_setting_with_its_variable() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    for name in Config.model_fields:
        assert f"| `{name}` | `RDA_{name.upper()}` |" in doc, name


@pytest.mark.timeout(30)
def test_peer_hwm_reaches_the_servers_router(monkeypatch: pytest.MonkeyPatch) -> None:
    import zmq

    from rda.business.server.builder import ServerBuilder

    def router_hwm(builder: ServerBuilder) -> int:
        server = builder.endpoint("tcp://127.0.0.1:0").devices("X").directory(None).build()
        server.start()
        try:
            transport = server._transport
            assert transport is not None
            hwm: int = transport._router.getsockopt(zmq.SNDHWM)  # type: ignore[attr-defined]
            return hwm
        finally:
            server.stop()

    assert Config().peer_hwm == 1000
    assert router_hwm(ServerBuilder("HWM")) == 1000
    assert router_hwm(ServerBuilder("HWM").peer_hwm(5000)) == 5000
    monkeypatch.setenv("RDA_PEER_HWM", "250")
    assert router_hwm(ServerBuilder("HWM")) == 250
    with pytest.raises((ConfigError, pydantic.ValidationError)):
        Config(peer_hwm=0)
