"""``rda.security``: CURVE keys, encryption, client authentication and authorization (RBAC).

A facade (docs/security.md): keys and CURVE/ZAP live in ``rda.business.security``, policies in
``rda.business.policy``. ``Policy.from_toml(path)`` loads a policy;
``rda.ServerBuilder(...).policy(path_or_policy)`` puts it in force, ``Server.reload_policy()``
(admin ``reload-policy``, SIGHUP under ``rda serve``) re-reads its file atomically.
"""

from __future__ import annotations

from rda.business.policy import ANONYMOUS, Authorizer, Policy, PolicyError, Rule
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
    "ANONYMOUS",
    "Authorizer",
    "ClientSecurity",
    "KeyFileError",
    "KeyPair",
    "Policy",
    "PolicyError",
    "Rule",
    "ServerSecurity",
    "generate_keypair",
    "load_clients",
    "load_keypair",
    "load_public_key",
    "save_keypair",
    "save_public_key",
]
