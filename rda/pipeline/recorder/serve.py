"""The history server: an rda server beside the recorder that answers history queries.

``Recorder(..., serve=True)`` (``rda record ... --serve``) starts it. It serves one device per
recorded device pattern, named ``history:<device>`` (``history:PS*`` for the pattern
``PS*/Acquisition``), registered in the directory like any server's devices, so a client finds
the recorder that covers ``PS1/Acquisition`` by resolving ``history:PS1``. Its properties are
the recorded properties. The wire contract (docs/history.md, "History as a service"):

- a **get** on ``history:DEV/PROP`` with the signal's selector (or none) and the query in the
  request's ``filters``: ``start``, ``end`` (ns, ``[start, end)``), optionally the cursor
  ``after_stamp``/``after_recorder``/``after_seq`` (the last row received), ``limit`` (rows per
  chunk, at most :data:`MAX_ROWS`), and for a subscription's seam ``until`` (ns) and
  ``wait_ms``: ``end`` is cut to ``until``, and the server first waits (at most ``wait_ms``,
  capped at :data:`MAX_WAIT`) until the recorder has acknowledged a row of the signal stamped
  at or after ``until``;
- the request's ``format`` filter is ``"arrow"`` (:data:`CHUNK_FORMAT`; an older client's
  request without it is refused with a message that says so);
- the reply is one **chunk**: ``arrow`` (an int8 array: the bytes of one Arrow IPC stream of
  the rows, in order, columns ``acq_stamp``, ``cycle_stamp``, ``cycle_name``, ``selector``,
  ``recorder_id``, ``seq``, ``error`` (null for a value), any other column the store has, and
  ``data``, the value struct as stored), ``rows`` (their count), ``more`` (rows remain after
  the last) and ``complete`` (false when the wait for ``until`` timed out). A stream of 64 KiB
  or more travels as a ZeroMQ frame of its own (an out-of-band array), which the client reads
  without a copy.

The client asks for the next chunk only after it has used the last one, with the last row as
cursor: that is the flow control, and the server keeps no state between chunks.

Access: a history get is authorized by the server's policy like any get, on the device
``history:DEV`` (docs/security.md): a rule for ``history:PS*`` grants reading the history of
``PS*`` devices; ``device = "*"`` grants live and history alike.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from rda.business.common import AcquiredData
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.pipeline.recorder.query import Chunk, Cursor, HistoryReader
from rda.serialization.data import Data, DataType
from rda.serialization.errors import NoSuchDeviceError
from rda.serialization.header import DataContext

__all__ = [
    "CHUNK_FORMAT",
    "HISTORY_PREFIX",
    "MAX_ROWS",
    "MAX_WAIT",
    "HistoryHandler",
    "HistoryServerStatistics",
    "encode_chunk",
    "start_history_server",
]

log = logging.getLogger("rda.pipeline.recorder.serve")

HISTORY_PREFIX = "history:"
CHUNK_FORMAT = "arrow"  # the request's ``format`` filter: the chunk is an Arrow IPC stream
MAX_ROWS = 1_000_000  # rows per chunk the server sends at most, whatever ``limit`` asks
MAX_BYTES = 16 << 20  # and about this many bytes (Arrow buffers of the rows)
MAX_WAIT = 10.0  # seconds a seam wait may hold a worker


class _Recorder(Protocol):
    """What the history server needs from the ``Recorder`` (no import of service.py here)."""

    recorder_id: str
    patterns: list[tuple[str, str, str | None]]

    def records(self, device: str, prop: str) -> bool: ...

    def wait_acked(self, device: str, prop: str, stamp: int, timeout: float) -> bool: ...


@dataclass(frozen=True, slots=True)
class HistoryServerStatistics:
    queries: int  # chunks answered
    rows: int  # rows sent
    seam_timeouts: int  # waits for ``until`` that ran out (chunk marked incomplete)


def _int(filters: Data, name: str, default: int | None = None) -> int | None:
    if name not in filters:
        return default
    value = filters[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"history query: {name!r} must be an integer, got {value!r}")
    return value


def encode_chunk(chunk: Chunk, complete: bool) -> Data:
    """The reply Data of one chunk: its rows as one Arrow IPC stream (module docstring)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, chunk.table.schema) as writer:
        writer.write_table(chunk.table)
    out = Data()
    # A read-only view of the stream's bytes: big ones travel as their own frame, uncopied.
    out.append("arrow", np.frombuffer(sink.getvalue(), np.int8), DataType.INT8_ARRAY)
    out.append("rows", len(chunk), DataType.INT64)
    out.append("more", chunk.more, DataType.BOOL)
    out.append("complete", complete, DataType.BOOL)
    return out


class HistoryHandler(RequestReplyCallback):
    """Answers history gets from the recorder's journal and store (module docstring)."""

    def __init__(self, recorder: _Recorder, reader: HistoryReader) -> None:
        self.recorder = recorder
        self.reader = reader
        self._lock = threading.Lock()
        self._queries = 0
        self._rows = 0
        self._seam_timeouts = 0

    def statistics(self) -> HistoryServerStatistics:
        return HistoryServerStatistics(self._queries, self._rows, self._seam_timeouts)

    def covers(self, device: str, prop: str) -> bool:
        """Recorded now (a pattern names it, or rows came), or before (the store has it)."""
        return self.recorder.records(device, prop) or self.reader.known(device, prop)

    def get(self, request: GetRequest) -> None:
        name = request.device
        if not name.startswith(HISTORY_PREFIX):
            raise NoSuchDeviceError(f"{name}: a history server serves history:<device> only")
        device, prop = name[len(HISTORY_PREFIX) :], request.property
        if not self.covers(device, prop):
            raise NoSuchDeviceError(
                f"{device}/{prop}: not recorded by recorder {self.recorder.recorder_id!r}"
            )
        filters = request.filters or Data()
        if filters.get("format", "") != CHUNK_FORMAT:
            raise ValueError(
                f"history query: this history server answers Arrow IPC chunks (filters "
                f"format={CHUNK_FORMAT!r}); the client is older than the server"
            )
        start = _int(filters, "start")
        end = _int(filters, "end")
        if start is None or end is None:
            raise ValueError("history query: 'start' and 'end' (ns since the epoch) are required")
        limit = _int(filters, "limit", MAX_ROWS)
        assert limit is not None
        if limit < 1:
            raise ValueError(f"history query: 'limit' must be at least 1, got {limit}")
        after: Cursor | None = None
        after_stamp = _int(filters, "after_stamp")
        if after_stamp is not None:
            recorder = filters.get("after_recorder", "")
            after = Cursor(after_stamp, str(recorder), _int(filters, "after_seq", 0) or 0)
        complete = True
        until = _int(filters, "until")
        if until is not None:
            end = min(end, until)
            if after is None:  # only the first chunk waits: later ones follow what it saw
                wait = (_int(filters, "wait_ms", 2000) or 0) / 1000
                complete = self.recorder.wait_acked(device, prop, until, min(wait, MAX_WAIT))
        chunk = self.reader.chunk(
            device,
            prop,
            start,
            end,
            after=after,
            selector=request.selector or None,
            max_rows=min(limit, MAX_ROWS),
            max_bytes=MAX_BYTES,
        )
        with self._lock:
            self._queries += 1
            self._rows += len(chunk)
            self._seam_timeouts += not complete
        request.complete(AcquiredData(encode_chunk(chunk, complete), DataContext()))


def history_devices(patterns: Sequence[tuple[str, str, str | None]]) -> list[str]:
    """The device names (globs allowed) the history server registers: one per device pattern."""
    return list(dict.fromkeys(f"{HISTORY_PREFIX}{glob}" for glob, _, _ in patterns))


def start_history_server(
    recorder: _Recorder, reader: HistoryReader, builder: ServerBuilder | None
) -> tuple[Server, HistoryHandler]:
    """Build and start the history server of ``recorder`` (``builder``: endpoint, directory,
    policy, security as the caller wants; default: ``recorder-<id>`` on a free local port,
    registered in the default directory, with the admin commands installed)."""
    if builder is None:
        from rda.admin import install

        builder = ServerBuilder(f"recorder-{recorder.recorder_id}")
        install(builder)
    handler = HistoryHandler(recorder, reader)
    devices = history_devices(recorder.patterns)
    server = builder.request_reply(handler).devices(*devices).build()
    server.start()
    log.info(
        "recorder %s serves history of %s at %s",
        recorder.recorder_id,
        ", ".join(devices) or "nothing",
        server.endpoint,
    )
    return server, handler
