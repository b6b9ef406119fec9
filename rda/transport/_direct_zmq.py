"""Receives and sends straight into libzmq (``_czmq``), bound to pyzmq's own libzmq.

pyzmq releases the GIL around every libzmq call; for a dispatcher's ``ZMQ_DONTWAIT`` receive
or send that release only hands the CPU to another thread of the process and makes the
dispatcher wait to get it back (docs/transport.md, "GIL hand-overs"). ``_czmq`` calls libzmq
directly: without releasing the GIL where the call cannot wait, releasing it only around a
lane's waiting receive. It must be the *same* libzmq as pyzmq's (its sockets are pointers
into it): ``_czmq.bind`` opens pyzmq's backend extension again (``dlopen`` with
``RTLD_NOLOAD``: the loaded copy, never a new one) and looks each function up in it and in
the libraries it was linked with (``dlsym``): pyzmq's bundled ``libzmq``, a system one, or
the backend itself when libzmq was linked statically.

``recv`` and ``send`` are None when any of that is missing (no extension, another libzmq
ABI, ``RDA_PURE_PYTHON=1``): the transports then go through pyzmq, as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import zmq

__all__ = ["recv", "recv_routed", "send"]

log = logging.getLogger("rda.transport")


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
    try:
        import zmq.backend.cython._zmq as backend
    except ImportError:  # pyzmq's CFFI backend (PyPy): no module linked with libzmq to open
        return None
    backend_file = getattr(backend, "__file__", None)
    if isinstance(backend_file, str) and _czmq.bind(backend_file):
        return _czmq
    log.debug("libzmq's functions not found through pyzmq's backend: going through pyzmq")
    return None


_bound = _load()

recv: Callable[..., Any] | None = None if _bound is None else _bound.recv
"""``recv(socket.underlying, copy_below, block=False, spin=0.0)``: a list of frames (``bytes``
below ``copy_below``, else a read-only ``memoryview`` over libzmq's message, no copy), ``None``
when no message is waiting, or libzmq's errno (an ``int``) on another failure. With ``block``
it waits up to the socket's ``RCVTIMEO``, the GIL released, after polling without sleeping for
up to ``spin`` seconds (a lane's ``Config.lane_spin``). None when not available."""

recv_routed: Callable[[int, int, int], Any] | None = None if _bound is None else _bound.recv_routed
"""``recv_routed(socket.underlying, copy_below, handshake_kind)``: ``recv`` for a ROUTER; a
message whose frame 1 starts with ``handshake_kind`` comes as ``(frames, srcfd, user_id)``,
its libzmq properties read before the message was closed. None when not available."""

send: Callable[[int, Any, Any, int], int] | None = None if _bound is None else _bound.send
"""``send(socket.underlying, first_or_None, frames, copy_below)``: 0 when sent, -1 when a
frame is too big for a copy (nothing sent), or libzmq's errno (``EAGAIN``: nothing sent)."""
