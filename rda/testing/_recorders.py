"""Transport handlers that record every call, for tests that wait on what a transport did.

Both recorders implement the handler protocols of ``rda.transport.api``; each call is stored
in order and wakes :meth:`wait_for`, a bounded wait for a condition (never a sleep). An
optional ``on_message`` hook runs on the dispatcher thread, e.g. to echo a request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rda.serialization.message import Message

__all__ = ["RecordingClientHandler", "RecordingServerHandler"]


class _Recorder:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.threads: set[str] = set()  # names of the threads that called the handler

    def _record(self, action: Callable[[], None]) -> None:
        with self._cond:
            self.threads.add(threading.current_thread().name)
            action()
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = ""
    ) -> None:
        """Wait until ``predicate()`` holds (checked under the recorder's lock after each
        call); ``AssertionError`` naming ``what`` if it does not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout} s waiting for {what or predicate}"
                    )
                self._cond.wait(min(left, 0.05))


class RecordingClientHandler(_Recorder):
    """A ``ClientHandler`` keeping ``connected``, ``messages`` and ``disconnected`` lists."""

    def __init__(self, on_message: Callable[[int, Message], None] | None = None) -> None:
        super().__init__()
        self.connected: list[tuple[int, dict[str, Any]]] = []
        self.messages: list[tuple[int, Message]] = []
        self.disconnected: list[tuple[int, str]] = []
        self._hook = on_message

    def on_connected(self, connection: int, server_info: dict[str, Any]) -> None:
        self._record(lambda: self.connected.append((connection, server_info)))

    def on_message(self, connection: int, message: Message) -> None:
        self._record(lambda: self.messages.append((connection, message)))
        if self._hook is not None:
            self._hook(connection, message)

    def on_disconnected(self, connection: int, reason: str) -> None:
        self._record(lambda: self.disconnected.append((connection, reason)))

    def is_connected(self, connection: int) -> bool:
        with self._cond:
            return any(c == connection for c, _ in self.connected) and not any(
                c == connection for c, _ in self.disconnected
            )

    def messages_on(self, connection: int) -> list[Message]:
        with self._cond:
            return [m for c, m in self.messages if c == connection]

    def reasons(self, connection: int) -> list[str]:
        with self._cond:
            return [r for c, r in self.disconnected if c == connection]


class RecordingServerHandler(_Recorder):
    """A ``ServerHandler`` keeping ``connected``, ``messages`` and ``disconnected`` lists."""

    def __init__(self, on_message: Callable[[bytes, Message], None] | None = None) -> None:
        super().__init__()
        self.connected: list[tuple[bytes, dict[str, Any]]] = []
        self.messages: list[tuple[bytes, Message]] = []
        self.disconnected: list[tuple[bytes, str]] = []
        self._hook = on_message

    def on_peer_connected(self, peer: bytes, client_info: dict[str, Any]) -> None:
        self._record(lambda: self.connected.append((peer, client_info)))

    def on_message(self, peer: bytes, message: Message) -> None:
        self._record(lambda: self.messages.append((peer, message)))
        if self._hook is not None:
            self._hook(peer, message)

    def on_peer_disconnected(self, peer: bytes, reason: str) -> None:
        self._record(lambda: self.disconnected.append((peer, reason)))

    def peers(self) -> list[bytes]:
        """Peers connected and not disconnected, in connection order."""
        with self._cond:
            gone = {p for p, _ in self.disconnected}
            return [p for p, _ in self.connected if p not in gone]

    def reasons(self, peer: bytes) -> list[str]:
        with self._cond:
            return [r for p, r in self.disconnected if p == peer]
