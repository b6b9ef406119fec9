"""Non-blocking receives and sends that keep the GIL (``_czmq``), bound to pyzmq's libzmq.

pyzmq releases the GIL around every libzmq call; for a dispatcher's ``ZMQ_DONTWAIT`` receive
or send that release only hands the CPU to another thread of the process and makes the
dispatcher wait to get it back (docs/transport.md, "GIL hand-overs"). ``_czmq`` calls libzmq
directly. It must be the *same* libzmq as pyzmq's (its sockets are pointers into it): the
library file is found in ``/proc/self/maps`` (pyzmq's wheels bundle ``libzmq-<hash>.so``) or
is pyzmq's backend extension itself (a static build), opened with ctypes (``dlopen`` of a
loaded file returns the loaded copy) to read the functions' addresses.

``recv`` and ``send`` are None when any of that is missing (no extension, not Linux, another
libzmq ABI, ``RDA_PURE_PYTHON=1``): the transports then go through pyzmq, as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

__all__ = ["recv", "recv_routed", "send"]

log = logging.getLogger("rda.transport")

_FUNCTIONS = (
    "zmq_msg_init",
    "zmq_msg_recv",
    "zmq_msg_data",
    "zmq_msg_size",
    "zmq_msg_more",
    "zmq_msg_close",
    "zmq_msg_move",
    "zmq_errno",
    "zmq_send",
    "zmq_msg_get",
    "zmq_msg_gets",
)


def _candidates() -> list[str]:
    """Files that may hold pyzmq's libzmq: a mapped ``libzmq*.so*``, then pyzmq's backend."""
    found: list[str] = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if "/" in line else ""
            if "libzmq" in Path(path).name and path not in found:
                found.append(path)
    except OSError:
        pass
    # A static build: libzmq's symbols live in pyzmq's compiled backend itself.
    try:
        import zmq.backend.cython._zmq as compiled_backend
    except ImportError:
        return found
    backend_file = getattr(compiled_backend, "__file__", None)
    if isinstance(backend_file, str) and backend_file not in found:
        found.append(backend_file)
    return found


def _addresses(path: str) -> dict[str, int] | None:
    try:
        lib = ctypes.CDLL(path)
        found = {
            name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _FUNCTIONS
        }
    except (OSError, AttributeError):
        return None
    out: dict[str, int] = {}
    for name, addr in found.items():
        if not addr:
            return None
        out[name] = addr
    return out


def _load() -> Any:
    """The bound ``_czmq`` module, or None."""
    if os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0"):
        return None
    if zmq.zmq_version_info() < (4, 0, 0):  # zmq_msg_t is 64 bytes from 4.0 on
        return None
    try:
        from rda.transport import _czmq
    except ImportError:
        return None
    for path in _candidates():
        addresses = _addresses(path)
        if addresses is not None:
            _czmq.bind(addresses)
            return _czmq
    log.debug("libzmq not found among the loaded files: receiving through pyzmq")
    return None


_bound = _load()

recv: Callable[[int, int], Any] | None = None if _bound is None else _bound.recv
"""``recv(socket.underlying, copy_below)``: a list of frames (``bytes`` below ``copy_below``,
else a read-only ``memoryview`` over libzmq's message, no copy), ``None`` when no message is
waiting, or libzmq's errno (an ``int``) on another failure. None when not available."""

recv_routed: Callable[[int, int, int], Any] | None = None if _bound is None else _bound.recv_routed
"""``recv_routed(socket.underlying, copy_below, handshake_kind)``: ``recv`` for a ROUTER; a
message whose frame 1 starts with ``handshake_kind`` comes as ``(frames, srcfd, user_id)``,
its libzmq properties read before the message was closed. None when not available."""

send: Callable[[int, Any, Any, int], int] | None = None if _bound is None else _bound.send
"""``send(socket.underlying, first_or_None, frames, copy_below)``: 0 when sent, -1 when a
frame is too big for a copy (nothing sent), or libzmq's errno (``EAGAIN``: nothing sent)."""
