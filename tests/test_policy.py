"""The RBAC policy engine alone (rda.business.policy): the model, TOML loading and its error
messages, rule order, globs over every operation, roles of known/unknown/anonymous principals,
and the bounded decision cache. The server-side check is in test_authz.py."""

from __future__ import annotations

import fnmatch
import itertools
from pathlib import Path
from typing import Any

import pytest

import rda
import rda.business.policy as policy_module
from rda.business.policy import ANONYMOUS, Authorizer, Policy, PolicyError, display_principal

# One policy exercising every feature; the table below is read against it.
TABLE_POLICY: dict[str, Any] = {
    "roles": ["operator", "expert", "admin", "viewer"],
    "principals": {
        "olga": ["operator"],
        "eric": ["operator", "expert"],
        "ada": ["admin"],
    },
    "anonymous_roles": ["viewer"],
    "default_roles": ["viewer"],
    "rules": [
        # 0: nobody touches the interlock, whatever comes later
        {"role": "*", "device": "ILK*", "operation": "set", "effect": "deny"},
        # 1: experts may set anything else
        {"role": "expert", "operation": "set", "effect": "allow"},
        # 2: operators may set the Current of power supplies PS1..PS9 only
        {"role": "operator", "device": "PS[1-9]", "property": "Current", "operation": "set",
         "effect": "allow"},
        # 3: operators may read and subscribe everything
        {"role": "operator", "operation": "get", "effect": "allow"},
        {"role": "operator", "operation": "subscribe", "effect": "allow"},
        # 5: viewers read Acquisition-like properties only, no subscribe
        {"role": "viewer", "property": "Acq*", "operation": "get", "effect": "allow"},
        # 6: admins: every admin command; read-only admin commands for operators
        {"role": "admin", "operation": "admin:*", "effect": "allow"},
        {"role": "operator", "property": "p?ng", "operation": "admin:p?ng", "effect": "allow"},
        {"role": "operator", "operation": "admin:info", "effect": "allow"},
    ],
}  # fmt: skip

TABLE = [
    # principal, device, property, operation, allowed, deciding rule
    ("olga", "ILK1", "Current", "set", False, 0),  # rule order: the deny comes first
    ("eric", "ILK1", "Current", "set", False, 0),
    ("eric", "MAG7", "Anything", "set", True, 1),
    ("olga", "PS3", "Current", "set", True, 2),
    ("olga", "PS10", "Current", "set", False, None),  # [1-9] is one character
    ("olga", "PS3", "Voltage", "set", False, None),
    ("olga", "PS3", "Voltage", "get", True, 3),
    ("olga", "PS3", "Voltage", "subscribe", True, 4),
    ("ada", "PS3", "Current", "get", False, None),  # admin has no data access
    ("", "PS3", "Acquisition", "get", True, 5),  # anonymous -> anonymous_roles
    ("", "PS3", "Acquisition", "subscribe", False, None),
    ("", "PS3", "Setting", "get", False, None),
    ("stranger", "PS3", "AcqRaw", "get", True, 5),  # unknown -> default_roles
    ("stranger", "ILK2", "x", "set", False, 0),
    ("ada", "Srv", "disconnect", "admin:disconnect", True, 6),
    ("ada", "Srv", "reload-policy", "admin:reload-policy", True, 6),
    ("olga", "Srv", "disconnect", "admin:disconnect", False, None),
    ("olga", "Srv", "ping", "admin:ping", True, 7),
    ("olga", "Srv", "info", "admin:info", True, 8),
    ("olga", "Srv", "log-level", "admin:log-level", False, None),
    ("", "Srv", "ping", "admin:ping", False, None),
    ("eric", "Srv", "stats", "admin:stats", False, None),
]


@pytest.mark.parametrize(("principal", "device", "prop", "operation", "allowed", "rule"), TABLE)
def test_rbac_table(
    principal: str, device: str, prop: str, operation: str, allowed: bool, rule: int | None
) -> None:
    authorizer = Authorizer(Policy.from_dict(TABLE_POLICY))
    assert authorizer.decide(principal, device, prop, operation) == (allowed, rule)
    # The cached path says the same, twice (miss, then hit).
    assert authorizer.allowed(principal, device, prop, operation) is allowed
    assert authorizer.allowed(principal, device, prop, operation) is allowed


def test_first_match_wins_in_both_orders() -> None:
    allow = {"role": "r", "device": "D*", "operation": "get", "effect": "allow"}
    deny = {"role": "r", "device": "DEV", "operation": "get", "effect": "deny"}
    base = {"roles": ["r"], "principals": {"p": ["r"]}}
    deny_first = Authorizer(Policy.from_dict({**base, "rules": [deny, allow]}))
    allow_first = Authorizer(Policy.from_dict({**base, "rules": [allow, deny]}))
    assert not deny_first.allowed("p", "DEV", "X", "get")
    assert deny_first.allowed("p", "DEV2", "X", "get")
    assert allow_first.allowed("p", "DEV", "X", "get")


def test_empty_policy_denies_everything() -> None:
    authorizer = Authorizer(Policy.from_dict({}))
    for operation in ("get", "set", "subscribe", "admin:ping"):
        assert authorizer.decide("anyone", "D", "P", operation) == (False, None)


def test_star_role_applies_to_the_anonymous_client_too() -> None:
    policy = Policy.from_dict(
        {"rules": [{"role": "*", "operation": "admin:ping", "effect": "allow"}]}
    )
    assert Authorizer(policy).allowed("", "S", "ping", "admin:ping")
    assert Authorizer(policy).allowed("who", "S", "ping", "admin:ping")
    assert not Authorizer(policy).allowed("", "S", "info", "admin:info")


def test_operation_globs() -> None:
    rules = [{"role": "*", "operation": "[gs]et", "effect": "allow"}]
    a = Authorizer(Policy.from_dict({"rules": rules}))
    assert a.allowed("x", "D", "P", "get") and a.allowed("x", "D", "P", "set")
    assert not a.allowed("x", "D", "P", "subscribe")
    assert not a.allowed("x", "D", "P", "admin:set")


def _reference(policy: Policy, principal: str, device: str, prop: str, op: str) -> bool:
    """The specification, naively: the first rule of the principal's roles that matches."""
    roles = set(policy.roles_of(principal))
    for rule in policy.rules:
        if (rule.role == "*" or rule.role in roles) and all(
            fnmatch.fnmatchcase(value, glob)
            for value, glob in ((device, rule.device), (prop, rule.property), (op, rule.operation))
        ):
            return rule.effect == "allow"
    return False


def test_joined_pattern_agrees_with_the_naive_reading() -> None:
    rules = [
        {"role": "*", "device": "a*b*c", "property": "x?", "effect": "deny"},
        {"role": "*", "device": "a*", "property": "*x*", "effect": "allow"},
        {"role": "*", "device": "[!a]*", "property": "[xy]", "operation": "get", "effect": "allow"},
        {"role": "*", "device": "*", "property": "z", "operation": "s*", "effect": "allow"},
    ]
    policy = Policy.from_dict({"rules": rules})
    a = Authorizer(policy)
    names = ["", "a", "abc", "aXbYc", "abcx", "b", "ax", "x", "xx", "y", "z", "a\x00x", "c"]
    for device, prop, op in itertools.product(names, names, ("get", "set", "subscribe")):
        expected = _reference(policy, "p", device, prop, op)
        assert a.decide("p", device, prop, op)[0] is expected, (device, prop, op)
    # a NUL inside a name cannot smuggle a property past the joined pattern
    assert not a.allowed("p", "a\x00x", "q", "get")
    assert not a.allowed("p", "b", "\x00x", "set")


def test_globs_are_case_sensitive() -> None:
    a = Authorizer(Policy.from_dict({"rules": [{"role": "*", "device": "ps*", "effect": "allow"}]}))
    assert a.allowed("x", "ps1", "P", "get")
    assert not a.allowed("x", "PS1", "P", "get")


def test_roles_of() -> None:
    policy = Policy.from_dict(TABLE_POLICY)
    assert policy.roles_of("eric") == ("operator", "expert")
    assert policy.roles_of("") == ("viewer",)
    assert policy.roles_of("nobody-listed") == ("viewer",)
    assert display_principal("") == ANONYMOUS == "anonymous"
    assert display_principal("eric") == "eric"


def test_the_facade_exports_the_engine() -> None:
    assert rda.security.Policy is Policy
    assert rda.security.PolicyError is PolicyError
    assert issubclass(PolicyError, rda.RdaError)


def test_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_module, "_CACHE_MAX", 8)
    monkeypatch.setattr(policy_module, "_PLANS_MAX", 8)
    a = Authorizer(Policy.from_dict({"rules": [{"role": "*", "device": "A*", "effect": "allow"}]}))
    for i in range(100):
        assert a.allowed("x", f"A{i}", "P", "get")
        assert not a.allowed("x", f"B{i}", "P", "get")
        assert len(a._decisions) <= 8
    for i in range(100):
        assert a.allowed(f"user{i}", "A", "P", "get")
        assert len(a._plans) <= 8


# -- loading and its errors ------------------------------------------------------------------

GOOD_TOML = """\
roles = ["operator", "admin"]
anonymous_roles = []

[principals]
olga = ["operator"]
"CN=ada,O=lab" = ["admin"]

[[rules]]
role = "operator"
device = "PS*"
operation = "get"
effect = "allow"

[[rules]]
role = "admin"
operation = "admin:*"
effect = "allow"
"""


def test_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(GOOD_TOML)
    policy = Policy.from_toml(path)
    assert policy.source == str(path)
    assert policy.roles_of("CN=ada,O=lab") == ("admin",)
    assert [r.effect for r in policy.rules] == ["allow", "allow"]
    assert policy.rules[0].property == "*"  # omitted globs match everything
    a = Authorizer(policy)
    assert a.allowed("olga", "PS1", "Acq", "get")
    assert not a.allowed("olga", "PS1", "Acq", "set")
    assert a.allowed("CN=ada,O=lab", "S", "disconnect", "admin:disconnect")


def _error_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        Policy.from_toml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message


def test_toml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    text = GOOD_TOML.replace('effect = "allow"\n\n[[rules]]', "effect = allow\n\n[[rules]]")
    message = _error_of(tmp_path, text)
    assert "not valid TOML" in message and "line 12" in message and "column" in message


def test_bad_effect_names_rule_field_and_line(tmp_path: Path) -> None:
    text = GOOD_TOML.replace('operation = "admin:*"\neffect = "allow"', 'operation = "admin:*"\n'
                             'effect = "permit"')  # fmt: skip
    message = _error_of(tmp_path, text)
    assert "rules[1].effect (line 17)" in message
    assert "'allow' or 'deny'" in message


def test_unknown_operation_is_refused(tmp_path: Path) -> None:
    message = _error_of(tmp_path, GOOD_TOML.replace('operation = "get"', 'operation = "sett"'))
    assert "rules[0].operation (line 11)" in message and "unknown operation 'sett'" in message


def test_undeclared_role_names_the_rule_and_line(tmp_path: Path) -> None:
    message = _error_of(tmp_path, GOOD_TOML.replace('role = "admin"', 'role = "admni"'))
    assert "rules[1].role: undeclared role(s) 'admni'" in message and "line 15:" in message


def test_undeclared_role_of_a_principal(tmp_path: Path) -> None:
    message = _error_of(tmp_path, GOOD_TOML.replace('olga = ["operator"]', 'olga = ["oper"]'))
    assert "principals.olga: undeclared role(s) 'oper'" in message


def test_unknown_key_and_missing_effect(tmp_path: Path) -> None:
    message = _error_of(tmp_path, GOOD_TOML.replace('device = "PS*"', 'devise = "PS*"'))
    assert "rules[0].devise (line 10)" in message
    message = _error_of(tmp_path, GOOD_TOML.replace('effect = "allow"\n', "", 1))
    assert "rules[0].effect (line 8)" in message and "required" in message.lower()


def test_bad_glob_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"rules\[0\]\.device: invalid glob '\[z-a\]'"):
        Policy.from_dict({"rules": [{"role": "*", "device": "[z-a]", "effect": "allow"}]})
    # "[" alone is a literal bracket for fnmatch, not an error
    a = Authorizer(Policy.from_dict({"rules": [{"role": "*", "device": "[", "effect": "allow"}]}))
    assert a.allowed("x", "[", "P", "get") and not a.allowed("x", "D", "P", "get")


def test_empty_principal_name_is_refused() -> None:
    with pytest.raises(PolicyError, match="anonymous_roles"):
        Policy.from_dict({"roles": ["r"], "principals": {"": ["r"]}})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy"):
        Policy.from_toml(tmp_path / "missing.toml")
