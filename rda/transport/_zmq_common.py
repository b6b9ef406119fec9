"""Pieces shared by the ZeroMQ client and server transports.

* :class:`Selector`: the dispatcher's poll over its ZeroMQ sockets and its mailbox
  (``mailbox``: the hand-off from user and worker threads, RDA3 paper "Communication with the
  Business Layer", bounded so that a flooding producer blocks instead of growing memory).
* :func:`decode_monitor_event`: socket-monitor messages, so a closed TCP connection is noticed
  in milliseconds instead of after the heartbeat timeout.
* :func:`close_socket`: linger-bounded close that never raises.
* :class:`DispatcherShell`: what both transports wrap around their dispatcher loop (the
  context, the mailbox, the named thread, the idempotent bounded ``close``).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import select
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import zmq

from rda.serialization.errors import TransportError
from rda.transport import _direct_zmq
from rda.transport.api import TransportSettings
from rda.transport.mailbox import Mailbox

__all__ = [
    "BATCH",
    "COPY_BELOW",
    "GONE_EVENTS",
    "POLLIN",
    "POLLOUT",
    "DispatcherShell",
    "Selector",
    "close_monitored",
    "close_socket",
    "decode_monitor_event",
    "open_monitor",
    "recv_copied",
    "recv_frames",
    "recv_routed",
    "send_frames",
    "send_routed",
]

log = logging.getLogger("rda.transport")

# Messages handled per socket per wake-up before polling again: big enough to amortise the
# poll system call under load (ZeroMQ chapter, "Batching"), small enough that one busy socket
# cannot starve the others or the heartbeat checks.
BATCH = 256

_MONITOR_EVENT = struct.Struct("=hi")

# Monitor events that mean "this TCP/IPC connection is over". CLOSED is what a DEALER with
# reconnection disabled reports when the connect attempt itself failed (connection refused).
GONE_EVENTS = frozenset(
    {
        zmq.EVENT_DISCONNECTED,
        zmq.EVENT_CLOSED,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    }
)
_MONITORED = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


# The critical path calls libzmq through pyzmq's backend socket methods with plain-int flags:
# pyzmq's ``send_multipart``/``recv_multipart`` wrappers cost about half of a whole round
# trip's budget in Python (IntFlag arithmetic, a getsockopt per frame; docs/performance.md,
# "pyzmq's multipart wrappers").
_backend_send = zmq.backend.Socket.send
_backend_recv = zmq.backend.Socket.recv
# Typed once here: a ``typing.cast`` at each call was a Python-level call per check.
_backend_get = cast(Callable[[Any, int], int], zmq.backend.Socket.get)
_EVENTS = int(zmq.EVENTS)
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE)
# Plain ints: ``int & zmq.POLLIN`` goes through ``enum.IntFlag.__rand__`` (a Python-level call
# and a new enum member every time), about an eighth of the client dispatcher's CPU per get.
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)


# Non-blocking sends and receives that keep the GIL (_direct_zmq; None when unavailable).
# Module attributes, read at each call, so that benchmarks/_structure.py can count them.
direct_recv = _direct_zmq.recv
direct_recv_routed = _direct_zmq.recv_routed
direct_send = _direct_zmq.send
# Frames below this size are copied: on send (pyzmq's copy_threshold, zmq.COPY_THRESHOLD:
# the size from which avoiding the copy pays; the direct send copies them too) and on receive
# (no zmq.Frame kept alive behind a queued message); bigger ones travel zero-copy.
COPY_BELOW = 65536


def _direct_error(errno: int) -> zmq.ZMQError:
    """pyzmq's exception for a libzmq errno from a direct call."""
    if errno == zmq.EAGAIN:
        return zmq.Again()
    if errno == zmq.ETERM:
        return zmq.ContextTerminated()
    return zmq.ZMQError(errno)


def send_frames(
    sock: zmq.Socket[bytes], frames: Sequence[Any], block: bool = False, handle: int = 0
) -> None:
    """``send_multipart(frames, copy=False)`` without the wrapper's overhead.

    ``handle``: ``sock.underlying`` when the caller keeps it (read once per socket: every
    attribute read on a pyzmq ``Socket`` goes through its ``__getattr__`` hook); 0 to have it
    read here.

    Frames below pyzmq's ``copy_threshold`` (64 KiB) are copied, bigger ones and ``zmq.Frame``
    objects are handed to libzmq without a copy. Only the first frame can fail with EAGAIN or
    EHOSTUNREACH (ZeroMQ queues a multipart message whole), so a failure never sends half.

    Small frames go first through the GIL-keeping direct send, also when ``block`` (a
    lane): a pipe with room takes them at once; only a full one (``EAGAIN``) makes a
    blocking send wait in pyzmq, with the GIL released.
    """
    if direct_send is not None:
        rc = direct_send(handle or sock.underlying, None, frames, COPY_BELOW)
        if rc == 0:
            return
        if rc > 0 and not (block and rc == zmq.EAGAIN):
            raise _direct_error(rc)
    more = _MORE if block else _MORE_NOBLOCK
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _backend_send(sock, frame, more if i < last else (0 if block else _NOBLOCK), False)


def send_routed(
    sock: zmq.Socket[bytes], rid: bytes, frames: Sequence[Any], handle: int = 0
) -> None:
    """Non-blocking ROUTER send of ``[rid, *frames]`` without building a new list;
    ``handle`` as in ``send_frames``."""
    if direct_send is not None:
        rc = direct_send(handle or sock.underlying, rid, frames, COPY_BELOW)
        if rc == 0:
            return
        if rc > 0:
            raise _direct_error(rc)
    _backend_send(sock, rid, _MORE_NOBLOCK, True)
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _backend_send(sock, frame, _MORE_NOBLOCK if i < last else _NOBLOCK, False)


def recv_frames(sock: zmq.Socket[bytes], flags: int = _NOBLOCK) -> list[zmq.Frame] | None:
    """One whole message as ``zmq.Frame`` objects (no copy), or None when none is waiting.

    No ``ZMQ_EVENTS`` check first: libzmq answers it with a system call every time, while a
    receive that finds a message makes none; the one failed receive that ends a drained batch
    is cheaper than a check per message. With ``flags=0`` it waits up to the socket's
    ``RCVTIMEO``: raw pyzmq's own way to wait (libzmq sleeps on the socket's signal descriptor
    inside the call, with no ``zmq_poll`` and its ``EVENTS`` checks around it).
    """
    try:
        frame: zmq.Frame = _backend_recv(sock, flags, False)
    except zmq.Again:
        return None
    frames = [frame]
    while frame.more:
        frame = _backend_recv(sock, _NOBLOCK, False)
        frames.append(frame)
    return frames


def recv_routed(router: zmq.Socket[bytes], connect_kind: int) -> Any:
    """``_czmq.recv_routed`` through pyzmq, for the server's ROUTER: the frames, and for a
    message of ``connect_kind`` (CONNECT) ``(frames, srcfd, user_id)``; None when nothing is
    waiting."""
    raw = recv_frames(router)
    if raw is None:
        return None
    frames = [raw[0].bytes, *[f.buffer for f in raw[1:]]]
    if len(raw) < 2 or raw[1].buffer[:1] != bytes([connect_kind]):
        return frames
    try:
        fd = int(raw[1].get(zmq.SRCFD))
    except zmq.ZMQError:
        fd = -1
    try:
        user_id: str | None = str(raw[1].get("User-Id"))
    except zmq.ZMQError:
        user_id = None
    return frames, fd, user_id


def recv_copied(sock: zmq.Socket[bytes], flags: int = _NOBLOCK) -> list[Any] | None:
    """:func:`recv_frames` as buffers: a frame below ``COPY_BELOW`` leaves its ``zmq.Frame``
    at once (a memoryview over a copied ``bytes``: a Frame kept alive behind every queued
    notification cost more than the copy, in allocation and in garbage-collector work), a
    bigger one stays zero-copy, read-only as the direct receive's (a ``zmq.Frame``'s own
    ``buffer`` is writable: a reader could change a received message under another)."""
    raw = recv_frames(sock, flags)
    if raw is None:
        return None
    return [memoryview(f.bytes) if len(f) < COPY_BELOW else f.buffer.toreadonly() for f in raw]


class Selector:
    """A ``zmq.Poller`` replacement that makes fewer system calls per wake-up.

    ``zmq_poll`` asks every socket for ``ZMQ_EVENTS`` twice per call (before and after
    sleeping), and libzmq answers each with a system call: with three sockets, eight calls per
    wake-up, which made up most of the transports' CPU cost per message (strace). A ZeroMQ
    socket's file descriptor only signals *new* commands, so a socket needs the ``EVENTS``
    check only if its descriptor fired or if this thread used it since its last check (a send
    or receive may have consumed a signal). Everything else is left to one ``poll(2)``.
    The dispatcher must call :meth:`touch` after sending on a socket; sockets reported ready
    are re-checked automatically.

    The dispatcher's :class:`Mailbox` (``attach``) is reported ready, as ``(mailbox,
    POLLIN)``, whenever it holds items; its ``sleeping`` flag is set only around the one
    ``poll(2)`` that may sleep, so producers signal only then.
    """

    def __init__(self) -> None:
        self._flags: dict[zmq.Socket[bytes], int] = {}
        self._by_fd: dict[int, zmq.Socket[bytes]] = {}
        self._fd: dict[zmq.Socket[bytes], int] = {}
        self._dirty: set[zmq.Socket[bytes]] = set()
        self._poll = select.poll()
        self._mailbox: Mailbox | None = None
        self._mailbox_on = False

    def attach(self, mailbox: Mailbox) -> None:
        """Watch ``mailbox`` (one per selector)."""
        self._mailbox = mailbox
        self.watch_mailbox(True)

    def watch_mailbox(self, on: bool) -> None:
        """Stop (back-pressure: the producers block on the full mailbox) or resume taking
        from the mailbox."""
        mailbox = self._mailbox
        if mailbox is None or on == self._mailbox_on:
            return
        self._mailbox_on = on
        if on:
            self._poll.register(mailbox.fd, select.POLLIN)
        else:
            self._poll.unregister(mailbox.fd)

    @property
    def watching_mailbox(self) -> bool:
        """False while the producers are held back (``watch_mailbox(False)``)."""
        return self._mailbox_on

    def register(self, sock: zmq.Socket[bytes], flags: int) -> None:
        fd: int = sock.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int for FD
        self._fd[sock] = fd
        self._by_fd[fd] = sock
        self._flags[sock] = 0
        self.modify(sock, flags)

    def modify(self, sock: zmq.Socket[bytes], flags: int) -> None:
        flags = int(flags)
        old = self._flags[sock]
        self._flags[sock] = flags
        fd = self._fd[sock]
        if flags and not old:
            self._poll.register(fd, select.POLLIN)
        elif old and not flags:
            # Not watched at all: its descriptor must not wake the dispatcher for nothing.
            self._poll.unregister(fd)
        self._dirty.add(sock)

    def unregister(self, sock: zmq.Socket[bytes]) -> None:
        if self._flags.pop(sock, 0):
            self._poll.unregister(self._fd[sock])
        self._by_fd.pop(self._fd.pop(sock), None)
        self._dirty.discard(sock)

    def touch(self, sock: zmq.Socket[bytes]) -> None:
        self._dirty.add(sock)

    def settle(self, sock: zmq.Socket[bytes]) -> None:
        """A receive on ``sock`` just failed with EAGAIN: libzmq processed its pending commands
        then, so it needs no ``EVENTS`` check for POLLIN (one system call less per wake-up).
        A socket waiting for POLLOUT keeps its check: that receive may have consumed the
        signal that said it became writable."""
        if not self._flags.get(sock, 0) & POLLOUT:
            self._dirty.discard(sock)

    def _ready(self, socks: Iterable[zmq.Socket[bytes]]) -> list[tuple[Any, int]]:
        ready = []
        flags = self._flags
        for sock in socks:
            wanted = flags.get(sock, 0)
            if wanted:
                events = _backend_get(sock, _EVENTS) & wanted
                if events:
                    ready.append((sock, events))
        return ready

    def poll(self, timeout_ms: int) -> list[tuple[Any, int]]:
        """Sockets (and the mailbox) with wanted events; waits up to ``timeout_ms`` (-1:
        forever) for one."""
        mailbox = self._mailbox if self._mailbox_on else None
        ready: list[tuple[Any, int]] = []
        if self._dirty:
            checked = list(self._dirty)
            self._dirty.clear()
            ready = self._ready(checked)
            self._dirty.update(s for s, _ in ready)
        if mailbox is not None:
            if not ready:
                # Set the flag, THEN look at the queue (see mailbox.py for why that order).
                mailbox.sleeping = True
            if mailbox.items:
                mailbox.sleeping = False
                ready.append((mailbox, POLLIN))
        if ready:
            return ready
        fired = self._poll.poll(None if timeout_ms < 0 else timeout_ms)
        by_fd = self._by_fd
        flags = self._flags
        dirty = self._dirty
        for fd, _ in fired:
            sock = by_fd.get(fd)
            if sock is None:
                continue
            wanted = flags.get(sock, 0)
            if wanted == POLLIN:
                # Reported without an ``EVENTS`` check: the handler receives until EAGAIN,
                # which processes the same commands, and ``settle`` s it; a receive that
                # finds nothing is as cheap as the check.
                ready.append((sock, POLLIN))
                dirty.add(sock)
            elif wanted:
                events = _backend_get(sock, _EVENTS) & wanted
                if events:
                    ready.append((sock, events))
                    dirty.add(sock)
        if mailbox is not None:
            mailbox.sleeping = False
            if any(fd == mailbox.fd for fd, _ in fired):
                mailbox.clear_signal()
            if mailbox.items:
                ready.append((mailbox, POLLIN))
        return ready


def open_monitor(sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
    """A PAIR socket receiving ``sock``'s connection-loss events."""
    monitor: zmq.Socket[bytes] = sock.get_monitor_socket(_MONITORED)
    monitor.setsockopt(zmq.LINGER, 0)
    return monitor


def decode_monitor_event(frames: Sequence[bytes]) -> tuple[int, int]:
    """``(event, value)`` of one monitor message; value is the fd for connection events."""
    if len(frames) != 2 or len(frames[0]) != _MONITOR_EVENT.size:
        raise TransportError(f"malformed socket monitor message of {len(frames)} frames")
    event, value = _MONITOR_EVENT.unpack(frames[0])
    return event, value


def close_monitored(
    sock: zmq.Socket[bytes], monitor: zmq.Socket[bytes] | None, linger: int = 0
) -> None:
    """Stop the monitor (if any) and close both sockets."""
    if monitor is not None:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        close_socket(monitor)
    close_socket(sock, linger)


def close_socket(sock: zmq.Socket[bytes], linger: int = 0) -> None:
    """Close with a bounded linger; closing is best effort and must never raise."""
    if sock.closed:
        return
    try:
        sock.close(linger=linger)
    except zmq.ZMQError as exc:
        log.debug("closing a socket failed: %s", exc)


class DispatcherShell:
    """The part of a ZeroMQ transport around its dispatcher loop, the same for both sides.

    A subclass supplies ``_run`` (the loop, which must set ``_thread_id`` first and call
    :meth:`_close_mailbox` and :meth:`_term_context` on its way out); its protocol rules and
    counters are a session core's (``client_session`` / ``server_session``). ``side`` is
    "client" or "server": it names the thread ``rda-<side>-dispatcher`` and the log messages.
    """

    def __init__(
        self,
        side: str,
        settings: TransportSettings,
        context: zmq.Context[zmq.Socket[bytes]] | None,
        clock: Callable[[], float],
        logger: logging.Logger,
    ) -> None:
        self._side = side
        self._settings = settings
        self._own_context = context is None
        self._context = context
        self._clock = clock
        self._log = logger
        self._mailbox: Mailbox | None = None
        self._poller = Selector()
        self._thread: threading.Thread | None = None
        self._thread_id: int | None = None
        self._closing = False
        self._closed = False
        self._close_lock = threading.Lock()
        # Unexpected exceptions the dispatcher survived (logged; not in the statistics).
        self._internal_errors = 0

    def close(self, timeout: float | None = None) -> None:
        with self._close_lock:
            first, self._closed = not self._closed, True
        self._closing = True
        thread, mailbox = self._thread, self._mailbox
        if thread is None:  # never started
            if first:
                self._term_context()
            return
        if self._on_dispatcher():
            # A handler asked: the dispatcher cannot join itself; it cleans up on its way out.
            return
        assert mailbox is not None
        limit = self._settings.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        if first:
            mailbox.mark_closed()  # producers blocked on a full mailbox give up within 50 ms
            mailbox.wake(min(limit, 0.1))
        # Joined on every call from outside: after a handler's close (which cannot wait for
        # its own thread) the owner's close() still returns once the threads have ended.
        if not self._join_dispatcher(thread, deadline):
            self._log.warning(
                "%s dispatcher did not stop within %.1f s (a handler blocks?)", self._side, limit
            )

    def _join_dispatcher(self, thread: threading.Thread, deadline: float) -> bool:
        """Wait for the dispatcher to end (until the ``time.monotonic`` deadline); False when
        it is still running."""
        thread.join(max(0.0, deadline - time.monotonic()))
        return not thread.is_alive()

    def _begin_start(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The context to open sockets in; refuses a second start or a start after close."""
        if self._thread is not None or self._closed:
            raise TransportError("a transport can be started once")
        if self._context is None:
            self._context = zmq.Context()
        return self._context

    def _open_mailbox(self) -> Mailbox:
        """The producers' hand-off, watched by the poller. It holds ``2 * send_hwm``
        messages: what the inproc PUSH -> PULL pipe it replaced held (an HWM at each end)."""
        self._mailbox = mailbox = Mailbox(2 * max(1, self._settings.send_hwm))
        self._poller.attach(mailbox)
        return mailbox

    def _start_thread(self) -> None:
        name = f"rda-{self._side}-dispatcher"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @abc.abstractmethod
    def _run(self) -> None:
        """The dispatcher loop (each transport has its own: it is the hot path)."""
        raise NotImplementedError

    def _on_dispatcher(self) -> bool:
        return threading.get_ident() == self._thread_id

    def wait_for_room(self) -> None:
        """Block while the mailbox is full (api.ServerTransport.wait_for_room); at once on the
        dispatcher thread, which never waits for itself, and once closed."""
        mailbox = self._mailbox
        # Fullness first: the usual answer, and cheaper than asking which thread this is.
        if mailbox is None or len(mailbox.items) < mailbox.capacity or self._on_dispatcher():
            return
        mailbox.wait_for_room()

    def _timeout_ms(self, deadline: float) -> int:
        """The poll timeout that wakes the dispatcher at ``deadline`` (``inf``: never)."""
        if deadline == float("inf"):
            return -1
        # Round up so that the wake-up finds the deadline passed, not 1 ms short of it.
        return max(0, int((deadline - self._clock()) * 1000.0) + 1)

    def _close_mailbox(self) -> None:
        if self._mailbox is not None:
            self._mailbox.close()

    def _term_context(self) -> None:
        if self._own_context and self._context is not None:
            self._context.term()
