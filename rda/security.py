"""``rda.security``: CURVE keys, encryption and client authentication (docs/security.md).

A facade: the implementation lives in ``rda.business.security``.
"""

from __future__ import annotations

from rda.business.security import (
    ClientSecurity,
    KeyFileError,
    KeyPair,
    ServerSecurity,
    generate_keypair,
    load_clients,
    load_keypair,
    load_public_key,
    save_keypair,
    save_public_key,
)

__all__ = [
    "ClientSecurity",
    "KeyFileError",
    "KeyPair",
    "ServerSecurity",
    "generate_keypair",
    "load_clients",
    "load_keypair",
    "load_public_key",
    "save_keypair",
    "save_public_key",
]
