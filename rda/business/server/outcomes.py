"""How a request ended, as a closed set of outcomes: the ``outcome`` label of the metrics.

An operator alarms on these, so they must say whose fault a failure is: a client's
typo (``not_found``), a value the schema refused (``bad_request``), a policy refusal
(``denied``), a full queue (``overload``), a passed deadline (``timeout``), a lost client
(``disconnected``), and only what is left, an exception nobody typed, is the server's fault
(``handler_error``). A decode or protocol error is the client's (``bad_request``) only when it
is remote (``RemoteDecodeError``: the request's own bytes do not decode); a local one, or one
of unknown origin (a handler that fed the codec bytes of its own), is the server's
``handler_error`` (docs/protocol.md, "Whose fault"). :func:`outcome_of` maps an exception to
one of them; the mapping follows the exception's class hierarchy, and applications (or
rda.admin) add their own typed errors with :func:`register_client_error`.
"""

from __future__ import annotations

import threading

from pydantic import ValidationError

from rda.business.server.devices import PropertyValidationError, ReadOnlyPropertyError
from rda.business.server.requests import SubscriptionRejected
from rda.business.server.statistics import FAILURES, OUTCOMES, REQUEST_TYPES
from rda.serialization.errors import (
    DisconnectedError,
    NoSuchDeviceError,
    NotAuthorizedError,
    OverloadError,
    RemoteDecodeError,
    RemoteProtocolError,
    TimeoutError,
)

__all__ = [
    "FAILURES",
    "OUTCOMES",
    "REQUEST_TYPES",
    "is_handler_fault",
    "outcome_of",
    "register_client_error",
]

# Exception class -> outcome; looked up along the raised class's MRO, so a subclass of a
# registered class gets its outcome unless registered itself.
_KINDS: dict[type[BaseException], str] = {
    NotAuthorizedError: "denied",
    NoSuchDeviceError: "not_found",
    OverloadError: "overload",
    TimeoutError: "timeout",
    DisconnectedError: "disconnected",
    # What the client sent was refused as it stands: a body or header that does not decode, a
    # value a property's schema rejects, a set of a read-only property, a subscription the
    # handler rejected with a reason. Only the remote decode and protocol errors: the base
    # classes and the local ones fall through to handler_error, the server's fault.
    RemoteDecodeError: "bad_request",
    RemoteProtocolError: "bad_request",
    PropertyValidationError: "bad_request",
    ReadOnlyPropertyError: "bad_request",
    ValidationError: "bad_request",
    SubscriptionRejected: "bad_request",
}
_KINDS_LOCK = threading.Lock()


def register_client_error(error_type: type[BaseException], outcome: str) -> None:
    """Count ``error_type`` (and its subclasses) as ``outcome`` instead of ``handler_error``.

    For an application's own typed errors ("this value is out of range" raised on purpose is a
    ``bad_request``, not a fault to page someone about). ``outcome`` must be one of
    :data:`OUTCOMES` other than ``ok``.
    """
    if outcome not in FAILURES:
        raise ValueError(f"outcome must be one of {sorted(FAILURES)}, not {outcome!r}")
    with _KINDS_LOCK:
        _KINDS[error_type] = outcome


def outcome_of(error: BaseException) -> str:
    """The outcome a request answered with ``error`` counts as (never ``ok``)."""
    kinds = _KINDS
    for cls in type(error).__mro__:
        outcome = kinds.get(cls)
        if outcome is not None:
            return outcome
    return "handler_error"


def is_handler_fault(error: BaseException) -> bool:
    """True when ``error`` is the server's fault (counted in ``rda_handler_errors_total``)."""
    return outcome_of(error) == "handler_error"
