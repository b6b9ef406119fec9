"""Role-based access control: the policy model (pydantic, from TOML) and its compiled check.

A :class:`Policy` names roles, gives principals their roles and lists ordered rules
``role x device glob x property glob x operation glob -> allow | deny``; the first rule that
matches decides, and nothing matching means deny. Operations are ``get``, ``set``,
``subscribe`` and ``admin:<command>``; for an admin operation the rule's device glob is matched
against the server name and its property glob against the command name.

:class:`Authorizer` is a policy compiled for checking: the rules compiled once, the rules each
principal meets for each operation joined into one regular expression on first use (see
``_Plan``), and a bounded cache of decisions per (principal, device, property, operation), so a
steady stream of requests costs one dict lookup each and a cache miss one regular-expression
match.

:class:`AccessGate` is the server's RBAC gate, what its dispatcher asks about every request
(docs/security.md, "Authorization"): it holds the Authorizer in force, gives a connecting
client its roles, and answers allow, or deny with the reason (the client's error and the
metric labels), and logs denials at a bounded rate. Swapping policies is a single reference
assignment of a new Authorizer (its caches start empty), which is what makes a reload atomic
for the dispatcher.

The principal ``""`` is the anonymous client (shown as ``anonymous``): it has the policy's
``anonymous_roles``. A principal the policy does not list has ``default_roles``. A rule whose
role is ``"*"`` applies to everybody, the anonymous client included.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import pydantic

from rda.serialization.errors import NotAuthorizedError, RdaError
from rda.transport.ratelog import RateLimitedLog

__all__ = [
    "ANONYMOUS",
    "DENIAL_LOG_INTERVAL",
    "OTHER_PRINCIPAL",
    "AccessGate",
    "Authorizer",
    "Denial",
    "DenialLog",
    "Policy",
    "PolicyError",
    "Rule",
    "Subject",
    "check_lockout",
    "display_principal",
    "lockout_reason",
    "reload_file",
]

# Denials are logged where the server logs its requests.
_denial_log = logging.getLogger("rda.server")

#: How the anonymous principal ("") is shown in messages, statistics and metrics.
ANONYMOUS = "anonymous"
#: The metric label of every principal the policy does not list (Authorizer.principal_label).
OTHER_PRINCIPAL = "other"

# Decisions kept per Authorizer. Cleared wholesale when full: a client cycling through endless
# device names cannot grow the server's memory, and the common case (a few access points
# polled again and again) refills it at once.
_CACHE_MAX = 65536
# Compiled rule sets per (principal, operation); each is one regex, so fewer are kept.
_PLANS_MAX = 4096

_REQUEST_OPERATIONS = ("get", "set", "subscribe")
# What an operation glob must be able to match, so that a typo ("sett") is refused at load.
_OPERATION_SAMPLES = ("get", "set", "subscribe", "admin:ping", "admin:disconnect")
_GLOB_CHARS = frozenset("*?[")


class PolicyError(RdaError, ValueError):
    """A policy file or mapping is malformed; the message names the file and the fault."""


def display_principal(principal: str) -> str:
    return principal or ANONYMOUS


def _check_glob(value: str) -> str:
    # fnmatch turns any text into a valid pattern, but an empty character class (``[z-a]``)
    # becomes "never matches": certainly a typo, and a silent one in an allow rule.
    if "(?!)" in fnmatch.translate(value):
        raise ValueError(f"invalid glob {value!r}: a character class that matches nothing")
    return value


class Rule(pydantic.BaseModel):
    """One rule; ``device``, ``property`` and ``operation`` are fnmatch globs (case-sensitive)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    role: str = pydantic.Field(min_length=1, description='a declared role, or "*" for anyone')
    device: str = pydantic.Field("*", min_length=1)
    property: str = pydantic.Field("*", min_length=1)
    operation: str = pydantic.Field(
        "*", min_length=1, description="get, set, subscribe, admin:<command>; globs allowed"
    )
    effect: Literal["allow", "deny"]

    @pydantic.field_validator("device", "property")
    @classmethod
    def _glob(cls, value: str) -> str:
        return _check_glob(value)

    @pydantic.field_validator("operation")
    @classmethod
    def _operation(cls, value: str) -> str:
        if value in _REQUEST_OPERATIONS or (value.startswith("admin:") and len(value) > 6):
            return _check_glob(value)
        if _GLOB_CHARS & set(value):
            _check_glob(value)
            if any(fnmatch.fnmatchcase(s, value) for s in _OPERATION_SAMPLES):
                return value
        raise ValueError(
            f"unknown operation {value!r}; expected get, set, subscribe or admin:<command> "
            "(globs allowed, e.g. admin:*)"
        )


class Policy(pydantic.BaseModel):
    """An authorization policy; build it with :meth:`from_toml`, :meth:`from_dict` or directly.

    ``source`` is where it was loaded from (for messages; not part of the format).
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    roles: list[str] = pydantic.Field(default_factory=list)
    principals: dict[str, list[str]] = pydantic.Field(default_factory=dict)
    anonymous_roles: list[str] = pydantic.Field(default_factory=list)
    default_roles: list[str] = pydantic.Field(default_factory=list)
    rules: list[Rule] = pydantic.Field(default_factory=list)
    source: str = pydantic.Field("", exclude=True)

    @pydantic.model_validator(mode="after")
    def _declared_roles(self) -> Policy:
        # Every role used must be declared: a misspelt role would silently grant nothing
        # (or, in a deny rule, deny nothing).
        declared = set(self.roles)
        for name, roles in self.principals.items():
            if not name:
                raise ValueError(
                    "principals: the empty name is the anonymous client; use anonymous_roles"
                )
            _known(declared, roles, f"principals.{name}")
        _known(declared, self.anonymous_roles, "anonymous_roles")
        _known(declared, self.default_roles, "default_roles")
        for index, rule in enumerate(self.rules):
            if rule.role != "*":
                _known(declared, [rule.role], f"rules[{index}].role")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Policy:
        """Validate a mapping (e.g. parsed TOML); errors raise :class:`PolicyError`."""
        try:
            return cls.model_validate({**data, "source": source})
        except pydantic.ValidationError as exc:
            raise PolicyError(f"{source}: {_readable(exc, None)}") from None

    @classmethod
    def from_toml(cls, path: str | Path) -> Policy:
        """Load a TOML file. A syntax error names its line and column; a validation error
        names the field (``rules[3].effect``) and the line of that rule's ``[[rules]]``."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{path}: cannot read the policy: {exc}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{path}: not valid TOML: {exc}") from None
        try:
            return cls.model_validate({**data, "source": str(path)})
        except pydantic.ValidationError as exc:
            raise PolicyError(f"{path}: {_readable(exc, text)}") from None

    def roles_of(self, principal: str) -> tuple[str, ...]:
        if not principal:
            return tuple(self.anonymous_roles)
        roles = self.principals.get(principal)
        return tuple(self.default_roles if roles is None else roles)


def _known(declared: set[str], roles: list[str], where: str) -> None:
    unknown = [r for r in roles if r not in declared]
    if unknown:
        raise ValueError(
            f"{where}: undeclared role(s) {', '.join(map(repr, unknown))}; "
            f"declared: {', '.join(sorted(declared)) or 'none'}"
        )


def _readable(exc: pydantic.ValidationError, text: str | None) -> str:
    """One line per problem: ``rules[2].effect (line 14): Input should be 'allow' or 'deny'``."""
    rule_lines = _rule_lines(text) if text is not None else []
    problems = []
    for error in exc.errors():
        loc = error["loc"]
        where = ""
        for part in loc:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        message = str(error["msg"]).removeprefix("Value error, ")
        index: int | None = None
        if not where:
            # A model-level check: its message already says where (e.g. "rules[2].role: ...").
            found = re.match(r"rules\[(\d+)\]\.(\w+)", message)
            if found:
                index = int(found.group(1))
                loc = ("rules", index, found.group(2))
        elif len(loc) > 1 and loc[0] == "rules" and isinstance(loc[1], int):
            index = loc[1]
        if index is not None and index < len(rule_lines):
            key = loc[2] if len(loc) > 2 and isinstance(loc[2], str) else None
            line = _field_line(text or "", rule_lines, index, key)
            where = f"{where} (line {line})" if where else f"line {line}"
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def _field_line(text: str, rule_lines: list[int], index: int, key: str | None) -> int:
    """The line of ``key = ...`` inside the ``index``-th ``[[rules]]`` table, else the line of
    its header (a missing field, or a rule-level problem)."""
    start = rule_lines[index]
    if key is not None:
        pattern = re.compile(rf"\s*\"?{re.escape(key)}\"?\s*=")
        for number, line in enumerate(text.splitlines()[start:], start + 1):
            if line.lstrip().startswith("["):
                break
            if pattern.match(line):
                return number
    return start


def _rule_lines(text: str) -> list[int]:
    """1-based line numbers of each ``[[rules]]`` table header, in order."""
    return [
        number
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip().replace(" ", "").startswith("[[rules]]")
    ]


Matcher = Callable[[str], object]


class _Compiled:
    __slots__ = (
        "allow",
        "device",
        "device_glob",
        "index",
        "operation",
        "property",
        "property_glob",
        "role",
    )

    def __init__(self, index: int, rule: Rule) -> None:
        self.index = index
        self.role = rule.role
        self.allow = rule.effect == "allow"
        self.device_glob = rule.device
        self.property_glob = rule.property
        self.device = _matcher(rule.device)
        self.property = _matcher(rule.property)
        self.operation = _matcher(rule.operation)


def _matcher(glob: str) -> Matcher:
    if glob == "*":
        return _always
    if not _GLOB_CHARS & set(glob):
        return glob.__eq__
    return re.compile(fnmatch.translate(glob)).match


def _always(_: str) -> bool:
    return True


def _body(glob: str) -> str:
    """The regex of an fnmatch glob without its end anchor, to embed in a larger pattern."""
    return fnmatch.translate(glob).removesuffix(r"\Z")


class _Plan:
    """The rules one principal meets for one operation, joined into one regular expression.

    Each rule becomes the alternative ``(?P<rN>DEVICE NUL PROPERTY end)``, matched against
    ``device + NUL + property``: Python's ``re`` tries alternatives in order and stops at the
    first that matches, which is exactly "first matching rule wins", in one C-level scan instead
    of a Python loop over up to three matchers per rule.
    """

    __slots__ = ("match", "rules")

    def __init__(self, rules: list[_Compiled]) -> None:
        self.rules = rules
        alternatives = [
            f"(?P<r{k}>{_body(r.device_glob)}\x00{_body(r.property_glob)}\\Z)"
            for k, r in enumerate(rules)
        ]
        self.match = re.compile("|".join(alternatives)).match if rules else None

    def first(self, device: str, prop: str) -> _Compiled | None:
        if self.match is None:
            return None
        if "\x00" in device or "\x00" in prop:
            # The joined key would be ambiguous: check rule by rule (never on a sane request).
            return next((r for r in self.rules if r.device(device) and r.property(prop)), None)
        found = self.match(f"{device}\x00{prop}")
        return None if found is None else self.rules[int(str(found.lastgroup)[1:])]


class Authorizer:
    """A policy compiled for checking; immutable apart from its caches (safe to share)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._rules = [_Compiled(i, r) for i, r in enumerate(policy.rules)]
        self._plans: dict[tuple[str, str], _Plan] = {}
        self._decisions: dict[tuple[str, str, str, str], bool] = {}

    def roles_of(self, principal: str) -> tuple[str, ...]:
        return self.policy.roles_of(principal)

    # Metric labels bounded by this policy and the server's admin commands: a client cannot
    # mint new series by declaring names or sending made-up commands (docs/metrics.md).

    def principal_label(self, principal: str) -> str:
        """A declared or anonymous principal as a label: listed in the policy, ``anonymous``,
        or ``other`` (an authenticated one is bounded by the clients directory: the gate
        keeps it)."""
        if not principal:
            return ANONYMOUS
        return principal if principal in self.policy.principals else OTHER_PRINCIPAL

    @staticmethod
    def operation_label(operation: str, commands: Callable[[str], bool] | None = None) -> str:
        """``admin:<command>`` for a command ``commands(name)`` says exists, else
        ``admin:unknown``; request operations as they are."""
        if operation.startswith("admin:"):
            known = commands is not None and commands(operation[6:])
            return operation if known else "admin:unknown"
        return operation if operation in _REQUEST_OPERATIONS else "unknown"

    def allowed(self, principal: str, device: str, prop: str, operation: str) -> bool:
        """The decision for one request: a cache hit is one dict lookup."""
        key = (principal, device, prop, operation)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self.decide(principal, device, prop, operation)[0]
            if len(self._decisions) >= _CACHE_MAX:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def decide(
        self, principal: str, device: str, prop: str, operation: str
    ) -> tuple[bool, int | None]:
        """(allowed, index of the deciding rule or None for the default deny); uncached."""
        plan = self._plans.get((principal, operation))
        if plan is None:
            roles = set(self.policy.roles_of(principal))
            plan = _Plan(
                [
                    r
                    for r in self._rules
                    if (r.role == "*" or r.role in roles) and r.operation(operation)
                ]
            )
            # Bounded like the decisions: principals and admin command names come from clients.
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            self._plans[(principal, operation)] = plan
        rule = plan.first(device, prop)
        return (False, None) if rule is None else (rule.allow, rule.index)


# At most one denial line per this many seconds; the next line says how many were not logged.
DENIAL_LOG_INTERVAL = 1.0


class DenialLog:
    """Logs denials at WARNING, at most one line per :data:`DENIAL_LOG_INTERVAL` seconds.

    A misconfigured client retrying a forbidden set in a loop must not flood the log (nor
    slow the dispatcher thread with I/O): the first denial is logged at once, later ones within
    the interval only counted, and the next logged line says how many were suppressed
    (``rda.transport.ratelog``, shared by every line a remote peer can cause). The exact
    figures per (principal, operation) are in the statistics.
    """

    def __init__(self, clock: Callable[[], float], interval: float = DENIAL_LOG_INTERVAL) -> None:
        self.log = RateLimitedLog(_denial_log, interval, clock)

    def denied(self, error: NotAuthorizedError, peer: bytes) -> None:
        self.log.log("denials", "denied: %s (peer %s)", error, peer.hex())


class Subject(Protocol):
    """Who asks, as the gate sees it (the server's ``ClientInfo`` is one)."""

    @property
    def principal(self) -> str:
        """The identity rules are checked for; ``""`` is the anonymous client."""
        ...

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles it was given when it connected (for the denial's message)."""
        ...

    @property
    def authenticated(self) -> bool:
        """Whether the transport authenticated the principal (a CURVE key), rather than the
        client declaring it."""
        ...


@dataclass(frozen=True, slots=True)
class Denial:
    """Why the gate refused a request: the client's error and the labels it is counted under
    (both bounded by the server's configuration, docs/metrics.md)."""

    error: NotAuthorizedError
    principal: str
    operation: str


class AccessGate:
    """The RBAC gate of one server: allow, or deny with the reason.

    A client's roles are fixed when it connects (:meth:`roles_of`, from the policy in force
    then) and recomputed for every connected client when the policy changes (the server's
    ``set_policy``/``reload_policy`` swap the policy here, then have the peer table ask
    again). A request is judged by the principal alone, through the Authorizer's decision
    cache; the policy in force is read once per check, so a request is judged by one whole
    policy, old or new. Without a policy everything is allowed and nothing is asked
    (:attr:`authorizer` is None: the dispatcher skips the gate).
    """

    def __init__(
        self,
        server_name: str,
        policy: Policy | None = None,
        admin_commands: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server_name = server_name
        # Whether an admin command exists: only those get an ``operation`` label of their own.
        self._admin_commands = admin_commands
        # Read once per check; set_policy assigns a new one (never mutates it).
        self.authorizer: Authorizer | None = None if policy is None else Authorizer(policy)
        self._denials = DenialLog(clock)

    @property
    def policy(self) -> Policy | None:
        """The policy in force (None: everything is allowed)."""
        authorizer = self.authorizer
        return None if authorizer is None else authorizer.policy

    def set_policy(self, policy: Policy | None) -> None:
        """Put ``policy`` in force: one reference assignment (its decision cache starts
        empty). The caller gives connected clients their new roles."""
        self.authorizer = None if policy is None else Authorizer(policy)

    def roles_of(self, principal: str) -> tuple[str, ...]:
        """The roles ``principal`` has under the policy in force (none without a policy)."""
        authorizer = self.authorizer
        return () if authorizer is None else authorizer.roles_of(principal)

    def check(self, subject: Subject, operation: str, device: str, prop: str) -> Denial | None:
        """None when ``subject`` may ``operation`` (``get``, ``set``, ``subscribe``) on
        ``device``/``prop``; else the :class:`Denial`."""
        authorizer = self.authorizer
        if authorizer is None:
            return None
        principal = subject.principal
        if authorizer.allowed(principal, device, prop, operation):
            return None
        roles = ", ".join(subject.roles) or "none"
        error = NotAuthorizedError(
            f"{display_principal(principal)} (roles: {roles}) may not {operation} {device}/{prop}"
        )
        # Labels the server's configuration names, never strings from the request as such.
        name = principal if subject.authenticated else authorizer.principal_label(principal)
        return Denial(error, name, authorizer.operation_label(operation, self._admin_commands))

    def check_admin(self, subject: Subject, command: str) -> Denial | None:
        """:meth:`check` of an admin command: the operation is ``admin:<command>``, and rules
        see the server name as the device and the command as the property."""
        return self.check(subject, "admin:" + command, self.server_name, command)

    def log_denial(self, denial: Denial, peer: bytes) -> None:
        """Log a denial (rate-limited: :class:`DenialLog`)."""
        self._denials.denied(denial.error, peer)


# The admin operation whose loss leaves a server that can no longer be repaired remotely.
_RELOAD_COMMAND = "reload-policy"
_RELOAD_OPERATION = "admin:" + _RELOAD_COMMAND


def _reload_grantees(policy: Policy, server: str) -> list[str]:
    """Who may ``admin:reload-policy`` on ``server`` under ``policy``: listed principals,
    ``anonymous``, and ``unlisted principals`` (those with ``default_roles``)."""
    groups: dict[str, list[str]] = {
        ANONYMOUS: policy.anonymous_roles,
        "unlisted principals": policy.default_roles,
        **policy.principals,
    }
    grantees = []
    for who, roles in groups.items():
        for rule in policy.rules:
            if (
                (rule.role == "*" or rule.role in roles)
                and fnmatch.fnmatchcase(_RELOAD_OPERATION, rule.operation)
                and fnmatch.fnmatchcase(server, rule.device)
                and fnmatch.fnmatchcase(_RELOAD_COMMAND, rule.property)
            ):
                if rule.effect == "allow":
                    grantees.append(who)
                break  # the first matching rule decides
    return grantees


def lockout_reason(policy: Policy, server: str, previous: Policy | None = None) -> str | None:
    """Why putting ``policy`` in force on ``server`` would lock everyone out, or None.

    A policy without rules denies every request, ``admin:reload-policy`` included: what an
    empty or truncated file (a non-atomic write read half-way) loads as. And a policy that
    grants ``admin:reload-policy`` to nobody while ``previous`` granted it to someone leaves a
    server that can no longer be repaired remotely. Both are refused like a syntax error
    unless forced (``allow_empty``); a first policy without any admin grant is a choice, not
    an accident, and is accepted.
    """
    if not policy.rules:
        return (
            "it has no rules, so it would deny every request, admin:reload-policy included "
            "(an empty or truncated file?)"
        )
    if previous is None or not (before := _reload_grantees(previous, server)):
        return None
    if _reload_grantees(policy, server):
        return None
    return (
        f"no principal could {_RELOAD_OPERATION} any more (the policy in force grants it to "
        f"{', '.join(before[:3])}{' ...' if len(before) > 3 else ''}), so the server could no "
        "longer be repaired remotely"
    )


def check_lockout(
    policy: Policy, server: str, previous: Policy | None = None, allow_empty: bool = False
) -> Policy:
    """``policy`` if :func:`lockout_reason` finds nothing (or ``allow_empty``), else
    PolicyError naming the file, the reason and how to force it."""
    reason = None if allow_empty else lockout_reason(policy, server, previous)
    if reason is not None:
        raise PolicyError(
            f"{policy.source or '<policy>'}: refused: {reason}; put it in force anyway with "
            "allow_empty (rda serve --allow-empty, rda admin SERVER reload-policy allow_empty=true)"
        )
    return policy


def reload_file(
    path: Path | None, server: str, previous: Policy | None = None, allow_empty: bool = False
) -> Policy:
    """``Policy.from_toml(path)`` for a server's reload, refused (PolicyError) when it was given
    no file or when the new policy would lock everyone out (:func:`lockout_reason`)."""
    if path is None:
        raise PolicyError(
            f"server {server!r} has no policy file to reload "
            "(ServerBuilder.policy(path) / rda serve --policy FILE)"
        )
    return check_lockout(Policy.from_toml(path), server, previous, allow_empty)
