"""CURVE keys and the security settings of servers and clients (docs/security.md).

* :func:`generate_keypair`, :func:`save_keypair`, :func:`load_keypair`: a key pair as Z85 text
  (pyzmq's ``zmq.curve_keypair``) in a TOML file that only its owner may read (mode 0600,
  checked on load: a secret key readable by others is no secret);
* :func:`save_public_key`, :func:`load_public_key`, :func:`load_clients`: public key files
  ``NAME.key``; a directory of them is the list of clients a server accepts, the principal
  being the file stem;
* :class:`ServerSecurity` / :class:`ClientSecurity`: what ``ServerBuilder.security`` and
  ``ClientService(security=...)`` take; they hand the transports plain key material
  (``rda.transport.curve``), which cannot import this layer.

Every fault in a key file is one :class:`KeyFileError` naming the file and the fault.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.utils.z85

from rda.business.config import ConfigError
from rda.transport.curve import ClientCurve, ServerCurve

__all__ = [
    "ClientSecurity",
    "KeyFileError",
    "KeyPair",
    "ServerSecurity",
    "generate_keypair",
    "load_clients",
    "load_keypair",
    "load_public_key",
    "parse_server_key",
    "save_keypair",
    "save_public_key",
]

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_KEY_LENGTH = 40


class KeyFileError(ConfigError):
    """A key file that is missing, unreadable, readable by others or malformed."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A CURVE key pair as Z85 text (40 characters each); the secret is kept out of ``repr``."""

    public: str
    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("public", "secret"):
            fault = _key_fault(getattr(self, name))
            if fault is not None:
                raise ValueError(f"the {name} key {fault}")
        if zmq.curve_public(self.secret.encode()).decode() != self.public:
            raise ValueError("the public key does not belong to the secret key")


def generate_keypair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public.decode("ascii"), secret.decode("ascii"))


def _key_fault(key: object) -> str | None:
    """Why ``key`` is not a Z85 CURVE key, or None."""
    if not isinstance(key, str):
        return f"must be a string, not {type(key).__name__}"
    if len(key) != _KEY_LENGTH:
        return f"must be {_KEY_LENGTH} Z85 characters, not {len(key)}"
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError, IndexError):
        return "is not valid Z85 text"
    return None


# -------------------------------------------------------------------------- key files


def save_keypair(keypair: KeyPair, path: Path | str) -> None:
    """Write ``keypair`` to ``path`` with mode 0600 (created so: never readable by others,
    not even for a moment) and its public half to ``path`` minus ``.key_secret`` plus
    ``.key`` when ``path`` ends in ``.key_secret``."""
    path = Path(path)
    text = (
        "# rda CURVE key pair: keep this file secret (mode 0600)\n"
        f'public = "{keypair.public}"\nsecret = "{keypair.secret}"\n'
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            os.fchmod(fh.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
            fh.write(text)
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror or exc}") from exc
    if path.name.endswith(SECRET_SUFFIX):
        save_public_key(keypair.public, path.with_name(path.name[: -len(SECRET_SUFFIX)] + ".key"))


def save_public_key(public: str, path: Path | str) -> None:
    """Write a public key file (``NAME.key``, world-readable: it is public)."""
    path = Path(path)
    fault = _key_fault(public)
    if fault is not None:
        raise ValueError(f"the public key {fault}")
    try:
        path.write_text(f'# rda CURVE public key\npublic = "{public}"\n', encoding="ascii")
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror or exc}") from exc


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise KeyFileError(f"key file {path}: no such file") from exc
    except OSError as exc:
        raise KeyFileError(f"key file {path}: cannot read it: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise KeyFileError(f"key file {path}: malformed: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"key file {path}: malformed: not text") from exc


def _key_from(content: Mapping[str, object], name: str, path: Path) -> str:
    if name not in content:
        raise KeyFileError(f"key file {path}: malformed: no '{name}' key")
    value = content[name]
    fault = _key_fault(value)
    if fault is not None:
        raise KeyFileError(f"key file {path}: malformed: '{name}' {fault}")
    assert isinstance(value, str)
    return value


def load_keypair(path: Path | str) -> KeyPair:
    """Read a key pair written by :func:`save_keypair` (or ``rda keys generate``).

    Refused when the file is readable or writable by anyone but its owner."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError as exc:
        raise KeyFileError(f"key file {path}: no such file") from exc
    except OSError as exc:
        raise KeyFileError(f"key file {path}: cannot read it: {exc.strerror or exc}") from exc
    content = _read_toml(path)
    if "secret" not in content and "public" in content:
        # Checked before the mode: a public key file is world-readable by design, and telling
        # its owner to chmod it (then that it lacks 'secret') sends them the wrong way.
        raise KeyFileError(f"key file {path}: {_public_instead(path)}")
    if mode & 0o077:
        raise KeyFileError(
            f"key file {path}: holds a secret key but has mode {mode:04o}; "
            f"only its owner may read it (chmod 600 {path})"
        )
    public, secret = _key_from(content, "public", path), _key_from(content, "secret", path)
    try:
        return KeyPair(public, secret)
    except ValueError as exc:
        raise KeyFileError(f"key file {path}: malformed: {exc}") from exc


def _public_instead(path: Path) -> str:
    """Why a public key file cannot be ``--key``, and which file to pass instead."""
    text = "this is a public key file, not a key pair: pass the key pair file"
    if path.name.endswith(PUBLIC_SUFFIX):
        pair = path.with_name(path.name + SECRET_SUFFIX[len(PUBLIC_SUFFIX) :])
        found = "" if pair.exists() else ", not found here"
        return f"{text} ({pair}{found}; `rda keys generate NAME` writes both)"
    return f"{text} (NAME{SECRET_SUFFIX}, written by `rda keys generate NAME` beside NAME{PUBLIC_SUFFIX})"


def load_public_key(path: Path | str) -> str:
    """The public key in ``path`` (a ``.key`` file; a key pair file works too)."""
    path = Path(path)
    return _key_from(_read_toml(path), "public", path)


def load_clients(directory: Path | str) -> dict[str, str]:
    """principal -> public key from every ``NAME.key`` file in ``directory``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise KeyFileError(f"clients directory {directory}: not a directory")
    clients = {
        p.name[: -len(PUBLIC_SUFFIX)]: load_public_key(p) for p in sorted(directory.glob("*.key"))
    }
    return clients


def parse_server_key(value: str) -> str:
    """``--server-key``: a Z85 key as such, else a file holding one."""
    if Path(value).exists():
        return load_public_key(value)
    fault = _key_fault(value)
    if fault is not None:
        raise KeyFileError(f"server key {value!r}: no such key file, and the text {fault}")
    return value


# ------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """CURVE for a server: its key pair and the clients it accepts.

    ``clients`` maps principal names to public keys, or names a directory of ``NAME.key``
    files (read once, when the server is built). Only these clients can connect; each one's
    principal reaches the handlers (``request.client``) and the authorization policy.
    """

    keypair: KeyPair
    clients: Mapping[str, str] | Path | str = field(default_factory=dict)

    def curve(self) -> ServerCurve:
        clients = self.clients
        if isinstance(clients, str | Path):
            clients = load_clients(clients)
        for name, key in clients.items():
            fault = _key_fault(key)
            if fault is not None:
                raise ValueError(f"the public key of client {name!r} {fault}")
        return ServerCurve(self.keypair.public, self.keypair.secret, dict(clients))


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """CURVE for a client: its key pair and the server key.

    Without ``server_key`` the key comes from the directory entry of each server (a server
    with security registers its public key there); with it, it is used wherever the
    directory has none.
    """

    keypair: KeyPair
    server_key: str | None = None

    def curve(self, server_key_for: Callable[[str], str | None] | None = None) -> ClientCurve:
        if self.server_key is not None:
            fault = _key_fault(self.server_key)
            if fault is not None:
                raise ValueError(f"the server key {fault}")
        return ClientCurve(
            self.keypair.public, self.keypair.secret, self.server_key, server_key_for
        )
