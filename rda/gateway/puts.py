"""pvAccess puts as rda sets: refused unless the gateway runs with ``--allow-put``, then
allowed per PV by a rule file naming pvAccess peers, and every one logged with its peer.

The rule file (TOML, ``--put-rules FILE``) lists what may be put; anything it does not allow
is refused::

    [[allow]]
    account = "operator"           # the pvAccess account, a glob ("*": any)
    host = "10.0.1.*"              # the peer's address as pvAccess reports it, a glob
    pvs = ["PS*/Setting", "PS*/Setting.*"]

The peer's account is what its pvAccess client declares (the user name of the process: it is
not authenticated); the host is the peer's IP address. The set then runs under the gateway's
own rda principal, so the rda server's policy still decides (docs/gateway.md, "Security").

Every put is logged with its peer (``account@host``): an allowed one and its outcome always,
a refused one at most once a second (anyone who reaches the port can cause those; the next
line says how many were not logged, and ``PutGate.refused`` counts each).

A put on a field PV sets that one field, typed as the property's current value types it; a
put on the property PV sets the fields of ``value`` the client marked changed. A refused put
is answered with the reason, an rda error with its text.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from rda.business.client.service import ClientService
from rda.gateway.metadata import error_text
from rda.gateway.pvs import GatewayPv
from rda.serialization.data import NUMERIC_DTYPES, Data, DataType
from rda.transport.ratelog import RateLimitedLog

__all__ = ["PutGate", "PutRule", "PutRules", "load_rules", "peer_host"]

log = logging.getLogger("rda.gateway.puts")


class PutRule(pydantic.BaseModel):
    """One ``[[allow]]`` entry: these peers may put these PVs."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    account: str = pydantic.Field("*", description="glob on the pvAccess account")
    host: str = pydantic.Field("*", description="glob on the peer's IP address")
    pvs: tuple[str, ...] = pydantic.Field(description="globs on gateway PV names")

    def allows(self, account: str, host: str, pv: str) -> bool:
        return (
            fnmatch.fnmatchcase(account, self.account)
            and fnmatch.fnmatchcase(host, self.host)
            and any(fnmatch.fnmatchcase(pv, glob) for glob in self.pvs)
        )


class PutRules(pydantic.BaseModel):
    """The rule file: a put is allowed when one rule allows it."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    allow: tuple[PutRule, ...] = ()

    def allows(self, account: str, host: str, pv: str) -> bool:
        return any(rule.allows(account, host, pv) for rule in self.allow)


def load_rules(path: Path) -> PutRules:
    """Read a rule file; ``ValueError`` says what is wrong with it."""
    try:
        raw = tomllib.loads(path.read_text())
        return PutRules.model_validate(raw)
    except (OSError, tomllib.TOMLDecodeError, pydantic.ValidationError) as exc:
        raise ValueError(f"put rules {path}: {exc}") from exc


def peer_host(peer: str) -> str:
    """The address of a pvAccess peer ``host:port`` (``[v6]:port`` too)."""
    host = peer.rpartition(":")[0] if ":" in peer else peer
    return host.strip("[]")


class PutRefused(Exception):
    """A put the gateway answers with an error without asking rda."""


class PutGate:
    """Decides, converts, sets and logs the puts of every PV of one gateway."""

    def __init__(
        self,
        client: ClientService,
        *,
        allow_put: bool = False,
        rules: PutRules | None = None,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.allow_put = allow_put
        self.rules = rules
        self._timeout = timeout
        self._lock = threading.Lock()
        self.allowed = 0
        self.refused = 0
        self.failed = 0
        self._refusals = RateLimitedLog(log, clock=clock)

    def _count(self, outcome: str) -> None:
        with self._lock:
            setattr(self, outcome, getattr(self, outcome) + 1)

    def __call__(self, pv: GatewayPv, op: Any) -> None:
        """p4p's put handler (the gateway's work queue): never blocks on rda."""
        account, host = str(op.account()), peer_host(str(op.peer()))
        who = f"{account or '(anonymous)'}@{host}"
        try:
            data = self._check(pv, account, host, op.value())
        except PutRefused as exc:
            self._count("refused")
            # Anyone who reaches the port can cause these: at most a line a second, the
            # next saying how many were not logged (every one is counted in ``refused``).
            self._refusals.log("refused puts", "put %s by %s refused: %s", pv.text, who, exc)
            op.done(error=str(exc))
            return
        name = pv.name
        log.info("put %s %s by %s", pv.text, dict(data.items()), who)
        future = self._client.access_point(name.device, name.prop).set_async(
            data, selector=name.selector or None, timeout=self._timeout
        )
        future.add_done_callback(lambda f: self._finish(pv, who, op, f))

    def _finish(self, pv: GatewayPv, who: str, op: Any, future: Future[None]) -> None:
        error = future.exception()
        if error is None:
            self._count("allowed")
            op.done()
            return
        self._count("failed")
        text = error_text(error)
        log.warning("put %s by %s failed: %s", pv.text, who, text)
        op.done(error=text)

    def _check(self, pv: GatewayPv, account: str, host: str, value: Any) -> Data:
        if not self.allow_put:
            raise PutRefused("puts are disabled (the gateway runs without --allow-put)")
        if self.rules is None or not self.rules.allows(account, host, pv.text):
            raise PutRefused(f"put to {pv.text} not allowed for {account or '(anonymous)'}@{host}")
        last = pv.last
        if last is None or last.data is None:
            raise PutRefused(f"{pv.text}: no value yet to take the field types from")
        return to_set(pv.name.field, last.data, value)


def to_set(path: Sequence[str], current: Data, value: Any) -> Data:
    """The ``Data`` to set for a put of ``value`` (a p4p ``Value``) on the PV of field
    ``path`` (empty: the property PV), typed after ``current``."""
    data = Data()
    if path:
        if len(path) > 1:
            raise PutRefused("a put sets a top-level field or the property, not a nested field")
        field = path[0]
        if field not in current:
            raise PutRefused(f"no field {field}")
        data.append(
            field, _convert(value["value"], current.type_of(field), field), current.type_of(field)
        )
        return data
    changed = sorted(
        {name.split(".")[1] for name in value.changedSet() if name.startswith("value.")}
    )
    if not changed:
        raise PutRefused("the put changes no field of value")
    for field in changed:
        if field not in current:
            raise PutRefused(f"no field {field}")
        kind = current.type_of(field)
        data.append(field, _convert(value["value." + field], kind, field), kind)
    return data


def _convert(value: Any, kind: DataType, field: str) -> Any:
    """A pvAccess value as the Python value of an rda field of type ``kind``."""
    try:
        if kind in (DataType.DATA, DataType.DATA_ARRAY):
            raise PutRefused(f"{field}: nested values cannot be put")
        if kind is DataType.STRING:
            return str(value)
        if kind is DataType.STRING_ARRAY:
            return [str(v) for v in value]
        if kind.is_array:
            array = np.asarray(value, dtype=NUMERIC_DTYPES[kind.element])
            if array.ndim != 1:
                raise PutRefused(f"{field}: only 1-D arrays can be put")
            return array
        if kind is DataType.BOOL:
            return bool(value)
        if kind in (DataType.FLOAT32, DataType.FLOAT64):
            return float(value)
        if isinstance(value, float) and not value.is_integer():
            raise PutRefused(f"{field}: {value!r} is not an integer")
        return int(value)
    except (TypeError, ValueError) as exc:
        raise PutRefused(f"{field}: {exc}") from None
