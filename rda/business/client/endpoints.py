"""The client's view of one server endpoint, and how a lost endpoint's devices are looked up again.

A :class:`Endpoint` holds what a client service knows about one server address: its current
connection, the back-off schedule, the subscriptions on it and the devices access points reach
there. ``Connections`` (connections.py) owns the table of them and guards every field with its
lock; this module holds no lock and starts no thread.

Why devices are tracked per endpoint (issue 12): a server that restarts on another port, or a
failover server that registers the same devices, changes the directory's answer. When a
connection is lost, :func:`resolve_again` asks the directory for each device before the next
attempt: devices now elsewhere move (with their subscriptions), and an address the directory
lists for nothing is not dialled at all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rda.business.client.reconnect import Backoff
from rda.business.client.statistics import ServerConnectionStatistics
from rda.business.client.timer import TimerHandle
from rda.business.directory import ChainDirectory, Directory
from rda.serialization.errors import NoSuchDeviceError

if TYPE_CHECKING:
    from rda.business.client.subscriptions import Subscription

__all__ = ["Endpoint", "admin_endpoint", "resolve_again"]

log = logging.getLogger("rda.business.client.service")


class Endpoint:
    """One server endpoint: its current connection, back-off, subscriptions and the devices
    the service reaches there. The lock of ``Connections`` guards every field."""

    __slots__ = (
        "acked",
        "acked_at",
        "address",
        "backoff",
        "connection",
        "connections",
        "devices",
        "disconnected",
        "last_reason",
        "lost_at",
        "reconnects",
        "refused",
        "retry",
        "subs",
        "was_connected",
    )

    def __init__(self, address: str, backoff: Backoff) -> None:
        self.address = address
        self.backoff = backoff
        self.connection: int | None = None
        self.connections = 0  # connection ids opened so far
        self.acked = False  # the current connection completed its handshake
        self.acked_at = 0.0  # when it did (the service's clock)
        self.was_connected = False
        self.reconnects = 0
        self.last_reason = ""
        # Time without the connection: summed over past outages, plus the current one from
        # ``lost_at`` (the service's clock; None while connected or never connected).
        self.disconnected = 0.0
        self.lost_at: float | None = None
        # The server refused this client's handshake: no retry until a request dials again.
        self.refused = False
        self.retry: TimerHandle | None = None
        self.subs: dict[int, Subscription] = {}
        # Devices resolved to this endpoint: resolved again when the connection is lost, so a
        # device that moved (restart on another port, failover) is followed (issue 12).
        self.devices: set[str] = set()

    def wanted(self) -> bool:
        """Whether the connection comes back by itself after a loss: yes if a subscription or
        an access point uses it; an endpoint only admin requests used reconnects on demand."""
        return bool(self.subs or self.devices)

    def lost(self, now: float) -> None:
        # Only an outage that matters: the connection was up, and something wants it back (an
        # endpoint only admin requests used stays closed until the next one, on purpose).
        if self.lost_at is None and self.was_connected and self.wanted():
            self.lost_at = now

    def back(self, now: float) -> None:
        if self.lost_at is not None:
            self.disconnected += max(0.0, now - self.lost_at)
            self.lost_at = None

    def snapshot(self, now: float) -> ServerConnectionStatistics:
        if self.connection is not None:
            if self.acked:
                state = "connected"
            else:
                state = "reconnecting" if self.was_connected else "connecting"
        elif self.refused:
            state = "refused"
        else:
            state = "reconnecting" if self.wanted() else "disconnected"
        return ServerConnectionStatistics(
            endpoint=self.address,
            state=state,
            reconnects=self.reconnects,
            connects=self.connections,
            devices=tuple(sorted(self.devices)),
            subscriptions=len(self.subs),
            last_reason=self.last_reason,
            disconnected_seconds=self.disconnected
            + (max(0.0, now - self.lost_at) if self.lost_at is not None else 0.0),
        )


def resolve_again(
    directory: Directory, address: str, devices: Sequence[str]
) -> tuple[bool, dict[str, str]]:
    """Ask ``directory`` for each of ``devices`` (reached at ``address`` so far).

    Returns ``(dial, moves)``: ``moves`` maps each device now served elsewhere to its new
    endpoint; ``dial`` is True when ``address`` itself is still worth dialling: a device still
    resolves there, the directory failed (an unreadable file is no news: keep the address we
    know), or there are no devices (an endpoint given directly, e.g. for admin). A device the
    directory lists nowhere (its server stopped and unregistered) neither moves nor dials.
    """
    if not devices:
        return True, {}
    dial = False
    moves: dict[str, str] = {}
    for device in devices:
        try:
            resolved = directory.resolve(device)
        except NoSuchDeviceError:
            continue
        except Exception:
            log.warning("could not resolve %s again; keeping %s", device, address, exc_info=True)
            dial = True
            continue
        if resolved == address:
            dial = True
        else:
            moves[device] = resolved
    return dial, moves


def admin_endpoint(directory: Directory, target: str) -> str:
    """Where admin commands for ``target`` go: an endpoint as given, a device's server, or
    a server registered under that name."""
    if "://" in target:
        return target
    try:
        return directory.resolve(target)
    except NoSuchDeviceError as exc:
        for d in _flatten(directory):
            servers = getattr(d, "servers", None)
            if servers is None:
                continue
            for entry in servers():
                if entry.name == target:
                    return str(entry.endpoint)
        raise NoSuchDeviceError(
            f"admin target {target!r} is neither an endpoint, a known device nor a "
            f"registered server ({exc})"
        ) from exc


def _flatten(directory: Directory) -> list[Directory]:
    if isinstance(directory, ChainDirectory):
        return [inner for d in directory.directories for inner in _flatten(d)]
    return [directory]
