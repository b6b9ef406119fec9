"""What each side says about itself in the handshake, and what a server believes of it.

CONNECT carries the client's info (``connect_info``), CONNECT_ACK the server's
(``connect_ack_info``: who answers and the heartbeat it expects). A server keeps a client's
info for the connection's life and shows it (``rda admin SERVER clients``), so it validates it
first (``invalid_client_info``), and it never believes an identity the client claims for
itself: ``authenticated_info`` puts the one the transport authenticated (CURVE's ZAP User-Id)
in its place. docs/protocol.md, "CONNECT".
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
from importlib import metadata
from typing import Annotated, Any

import pydantic

from rda.transport.api import TransportSettings

__all__ = [
    "AUTHENTICATED_PRINCIPAL",
    "ClientInfoModel",
    "authenticated_info",
    "connect_ack_info",
    "connect_info",
    "invalid_client_info",
    "rda_version",
]

# The client-info key of the identity the transport authenticated (the business layer reads
# it as the peer's principal for RBAC).
AUTHENTICATED_PRINCIPAL = "authenticated_principal"


def rda_version() -> str:
    try:
        return metadata.version("rda")
    except metadata.PackageNotFoundError:
        return "unknown"


def connect_info(version: str) -> dict[str, Any]:
    """What CONNECT tells the server about this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in some containers
        user = str(os.getuid())
    return {
        "application": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
        "user": user,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "version": version,
    }


def connect_ack_info(
    name: str, version: str, settings: TransportSettings, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """What CONNECT_ACK tells a client: who answers and the heartbeat it expects."""
    info: dict[str, Any] = {
        "name": name,
        "version": version,
        "heartbeat_interval": settings.heartbeat_interval,
        "heartbeat_timeout": settings.heartbeat_timeout,
    }
    info.update(extra or {})
    return info


def authenticated_info(info: dict[str, Any], principal: str | None) -> dict[str, Any]:
    """``info`` with ``principal`` (what the transport authenticated, or None) as
    ``authenticated_principal``; a value the client sent under that name is never believed."""
    if AUTHENTICATED_PRINCIPAL not in info and principal is None:
        return info
    info = dict(info)
    info.pop(AUTHENTICATED_PRINCIPAL, None)
    if principal:
        info[AUTHENTICATED_PRINCIPAL] = principal
    return info


# What a client may say about itself: wrong types are refused, and every string and the
# number of extra keys are bounded, so that a client cannot make the server hold (and print)
# 60 kB per connection.
_NAME_MAX = 256
_EXTRA_KEYS_MAX = 16
_Text = Annotated[str, pydantic.StringConstraints(max_length=_NAME_MAX)]
_Key = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]
_Extra = _Text | int | float | bool | None
_EXTRA_VALUE = f"must be a string of at most {_NAME_MAX} characters, a number, a boolean or null"


class ClientInfoModel(pydantic.BaseModel):
    """The CONNECT info object: the standard fields (``connect_info``), the flags the business
    layer and the lanes set, and up to 16 further scalar keys of the application's own."""

    model_config = pydantic.ConfigDict(strict=True, frozen=True, extra="forbid")

    application: _Text = ""
    user: _Text = ""
    host: _Text = ""
    pid: int = pydantic.Field(0, ge=0, le=2**63 - 1)
    version: _Text = ""
    lane: bool = False
    principal: _Text | None = None
    # Never believed (the transport sets it from ZAP); accepted here so that the server can
    # discard it as documented rather than refuse the client.
    authenticated_principal: _Text | None = None
    extra: dict[_Key, _Extra] = pydantic.Field(default_factory=dict, max_length=_EXTRA_KEYS_MAX)

    @classmethod
    def check(cls, info: dict[str, Any]) -> None:
        """Raise ``pydantic.ValidationError`` when ``info`` is not a valid client info."""
        fields = cls.model_fields
        known = {k: v for k, v in info.items() if k in fields and k != "extra"}
        extra = {k: v for k, v in info.items() if k not in known}
        cls.model_validate({**known, "extra": extra})


def invalid_client_info(info: dict[str, Any]) -> str | None:
    """None when ``info`` is a valid CONNECT info; else what is wrong, naming each field at
    fault (at most five), for the refusing CONNECT_ACK."""
    try:
        ClientInfoModel.check(info)
    except pydantic.ValidationError as exc:
        problems: dict[str, str] = {}
        for e in exc.errors():
            loc = e["loc"]
            if loc[0] == "extra" and len(loc) > 2:  # an application key: one line, not four
                problems.setdefault(str(loc[1]), _EXTRA_VALUE)
            else:
                problems.setdefault(".".join(map(str, loc)), e["msg"])
        return "; ".join(f"{k}: {m}" for k, m in list(problems.items())[:5])
    return None
