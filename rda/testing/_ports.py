"""Free TCP ports for a test's own servers (etcd, Prometheus, the panel) on 127.0.0.1.

A port found by binding port 0 comes from the kernel's ephemeral range, the same range every
outgoing connection (an HTTP client, a ZeroMQ DEALER) takes its local port from: between
closing the probe and the server binding it, another test's connection can take it, and the
server fails with "address already in use" (seen in CI, an etcd on such a port). So the
ports handed out here lie below the ephemeral range, where only an explicit bind lands.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LOWEST = 20000
_TRIES = 200


def _ephemeral_start() -> int:
    try:
        low, _ = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low)
    except (OSError, ValueError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now, outside the ephemeral range when it can."""
    high = _ephemeral_start() - 1
    if high > _LOWEST:
        for _ in range(_TRIES):
            port = random.randint(_LOWEST, high)
            if _bindable(port):
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
