"""PV names of the gateway: ``DEV/PROP``, ``DEV/PROP.field`` and a ``@SELECTOR`` suffix.

One rda property is one structure PV, ``DEV/PROP``; each field of it is a PV of its own,
``DEV/PROP.field`` (a nested field ``DEV/PROP.outer.inner``), the way EPICS tools already
address a record's fields (``REC.EGU``). A cycle selector is a suffix, ``DEV/PROP@SELECTOR``
or ``DEV/PROP.field@SELECTOR``: one PV per (field, selector), since all subscribers of one PV
see the same values (a p4p ``SharedPV``; the pvRequest of a monitor never reaches the
provider).

The parse is the inverse of :func:`pv_name`: the selector is everything after the first
``@``, the device everything before the first ``/``, the property runs to the first ``.``
after it. So a device name cannot hold ``/`` or ``@``, and a property or field name cannot
hold ``.`` or ``@``: such names are not served (docs/gateway.md, "Naming").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_NAME", "PvName", "parse_pv_name", "pv_name"]

# pvAccess itself accepts longer names; a name longer than this is no rda name anyone made.
MAX_NAME = 512
_FORBIDDEN = frozenset(" \t\r\n\"'")


@dataclass(frozen=True, slots=True)
class PvName:
    """A parsed gateway PV name."""

    device: str
    prop: str
    field: tuple[str, ...] = ()
    selector: str = ""

    @property
    def feed(self) -> tuple[str, str, str]:
        """The rda subscription this PV shows: (device, property, selector)."""
        return (self.device, self.prop, self.selector)

    @property
    def whole(self) -> bool:
        """True for the structure PV of the whole property."""
        return not self.field

    def __str__(self) -> str:
        return pv_name(self.device, self.prop, self.field, self.selector)


def pv_name(device: str, prop: str, field: tuple[str, ...] = (), selector: str = "") -> str:
    """The PV name of ``device/prop`` (its ``field`` path, for cycle ``selector``)."""
    name = f"{device}/{prop}"
    if field:
        name += "." + ".".join(field)
    if selector:
        name += "@" + selector
    return name


def parse_pv_name(name: str) -> PvName:
    """Parse a PV name; ``ValueError`` says what is wrong with a name that is not one."""
    if len(name) > MAX_NAME:
        raise ValueError(f"PV name longer than {MAX_NAME} characters")
    if any(c in _FORBIDDEN for c in name):
        raise ValueError("PV name with white space or quotes")
    base, at, selector = name.partition("@")
    if at and not selector:
        raise ValueError("empty selector after '@'")
    device, slash, rest = base.partition("/")
    if not slash or not device:
        raise ValueError("a gateway PV is named DEV/PROP")
    prop, *field = rest.split(".")
    if not prop:
        raise ValueError("empty property name")
    if any(not part for part in field):
        raise ValueError("empty field name")
    return PvName(device, prop, tuple(field), selector)
