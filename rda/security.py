"""rda.security: authorization (RBAC) policies.

``Policy.from_toml(path)`` loads a policy (docs/security.md, "Authorization (RBAC)");
``rda.ServerBuilder(...).policy(path_or_policy)`` puts it in force, ``Server.reload_policy()``
(admin ``reload-policy``, SIGHUP under ``rda serve``) re-reads its file atomically.
"""

from rda.business.policy import ANONYMOUS, Authorizer, Policy, PolicyError, Rule

__all__ = ["ANONYMOUS", "Authorizer", "Policy", "PolicyError", "Rule"]
