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
  ``wait_ms``: ``end`` is cut to ``until``, and the first chunk is answered only once (at most
  ``wait_ms``, capped at :data:`MAX_WAIT`; parked meanwhile in ``seams.py``, off the device's
  queue) the recorder has acknowledged a row of the signal stamped
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

import contextlib
import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from rda.business.common import AcquiredData
from rda.business.server.builder import Server, ServerBuilder
from rda.business.server.requests import GetRequest, RequestReplyCallback
from rda.pipeline.recorder.query import Chunk, Cursor, HistoryReader
from rda.pipeline.recorder.seams import SeamWait, SeamWaits
from rda.serialization.data import Data, DataType
from rda.serialization.errors import DisconnectedError, NoSuchDeviceError, RdaError
from rda.serialization.header import DataContext

__all__ = [
    "CHUNK_FORMAT",
    "HISTORY_PREFIX",
    "MAX_ROWS",
    "MAX_WAIT",
    "HistoryHandler",
    "HistoryServerStatistics",
    "encode_chunk",
    "preload",
    "start_history_server",
]

log = logging.getLogger("rda.pipeline.recorder.serve")

HISTORY_PREFIX = "history:"
CHUNK_FORMAT = "arrow"  # the request's ``format`` filter: the chunk is an Arrow IPC stream
MAX_ROWS = 1_000_000  # rows per chunk the server sends at most, whatever ``limit`` asks
MAX_BYTES = 16 << 20  # and about this many bytes (Arrow buffers of the rows)
MAX_WAIT = 10.0  # seconds a seam wait may last (parked: it holds no worker)


class _Recorder(Protocol):
    """What the history server needs from the ``Recorder`` (no import of service.py here)."""

    recorder_id: str
    patterns: list[tuple[str, str, str | None]]

    def records(self, device: str, prop: str) -> bool: ...

    def acked_stamp(self, device: str, prop: str) -> int: ...

    def units_of(self, device: str, prop: str) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class HistoryServerStatistics:
    queries: int  # chunks answered
    rows: int  # rows sent
    seam_timeouts: int  # waits for ``until`` that ran out (chunk marked incomplete)
    departed: int = 0  # requests not run because their client had gone (queued or parked)
    seam_waits: int = 0  # requests parked at a seam now
    relists: int = 0  # chunks that listed the store again: a listed file was gone (compaction)
    failed: int = 0  # chunks answered with an error (e.g. the store kept changing under them)
    cache_hits: int = 0  # Parquet files/row groups found decoded (HistoryReader.cache)
    cache_misses: int = 0  # and decoded
    cache_bytes: int = 0  # decoded bytes held (bounded)


@dataclass(frozen=True, slots=True)
class _Query:
    request: GetRequest
    device: str
    prop: str
    start: int
    end: int
    after: Cursor | None
    limit: int


def _int(filters: Data, name: str, default: int | None = None) -> int | None:
    if name not in filters:
        return default
    value = filters[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"history query: {name!r} must be an integer, got {value!r}")
    return value


def encode_chunk(chunk: Chunk, complete: bool) -> Data:
    """The reply Data of one chunk: its rows as one Arrow IPC stream (module docstring)."""
    table = chunk.table
    # Sized first (a pass that writes nothing), then written once into a buffer of that size:
    # a growing output stream would copy the rows again each time it reallocates.
    size = pa.MockOutputStream()
    with pa.ipc.new_stream(size, table.schema) as writer:
        writer.write_table(table)
    stream = pa.allocate_buffer(size.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(stream), table.schema) as writer:
        writer.write_table(table)
    out = Data()
    # A read-only view of the stream's bytes: a big one travels as its own frame, uncopied
    # (binary.encode copies a writable array into the DATA frame, as a value that could
    # still change must be).
    view = np.frombuffer(stream, np.int8)
    view.flags.writeable = False
    out.append("arrow", view, DataType.INT8_ARRAY)
    out.append("rows", len(chunk), DataType.INT64)
    out.append("more", chunk.more, DataType.BOOL)
    out.append("complete", complete, DataType.BOOL)
    return out


class HistoryHandler(RequestReplyCallback):
    """Answers history gets from the recorder's journal and store (module docstring).

    A seam wait is parked (``seams.py``), not waited for on the device's worker; a request
    whose client has gone by the time it runs is dropped, not read (issue 37, item 3)."""

    def __init__(self, recorder: _Recorder, reader: HistoryReader) -> None:
        self.recorder = recorder
        self.reader = reader
        self._lock = threading.Lock()
        self._queries = 0
        self._rows = 0
        self._seam_timeouts = 0
        self._departed = 0
        self._failed = 0
        self._connected: Callable[[bytes], bool] = lambda peer: True
        self._seams = SeamWaits(
            recorder.recorder_id, recorder.acked_stamp, self._answer, self._gone, self.connected
        )

    def watch_clients(self, connected: Callable[[bytes], bool]) -> None:
        """How to tell whether a request's client is still connected (``Server.connected``)."""
        self._connected = connected

    def connected(self, peer: bytes) -> bool:
        return self._connected(peer)

    def acked(self) -> None:
        """The recorder made rows durable (its writer thread): parked seams re-check."""
        self._seams.acked()

    def close(self) -> None:
        """Answer the parked seam waits now (incomplete) and stop their thread."""
        self._seams.close()

    def statistics(self) -> HistoryServerStatistics:
        with self._lock:
            return HistoryServerStatistics(
                self._queries,
                self._rows,
                self._seam_timeouts,
                self._departed,
                self._seams.parked(),
                self.reader.relists(),
                self._failed,
                *self.reader.cache(),
            )

    def covers(self, device: str, prop: str) -> bool:
        """Recorded now (a pattern names it, or rows came), or before (the store has it)."""
        return self.recorder.records(device, prop) or self.reader.known(device, prop)

    def get(self, request: GetRequest) -> None:
        if not self.connected(request.client.peer):
            # Queued while its client went away (killed, closed): reading for nobody would
            # hold the device's other readers.
            self._gone(request)
            return
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
        until = _int(filters, "until")
        if until is not None:
            end = min(end, until)
        query = _Query(request, device, prop, start, end, after, min(limit, MAX_ROWS))
        # Only the first chunk waits: later ones follow what it saw.
        if until is not None and after is None and self.recorder.acked_stamp(device, prop) < until:
            wait = min((_int(filters, "wait_ms", 2000) or 0) / 1000, MAX_WAIT)
            seam = SeamWait(
                device, prop, until, time.monotonic() + wait, request.client.peer, query
            )
            if wait > 0 and self._seams.park(seam):
                return  # answered by the seam thread
            self._answer(query, False)
            return
        self._answer(query, True)

    def _answer(self, query: _Query, complete: bool) -> None:
        try:
            chunk = self.reader.chunk(
                query.device,
                query.prop,
                query.start,
                query.end,
                after=query.after,
                selector=query.request.selector or None,
                max_rows=query.limit,
                max_bytes=MAX_BYTES,
            )
        except RdaError as exc:
            # Failed here, not raised: a parked seam wait is answered on the seam thread,
            # where a raise would leave its client waiting for its timeout.
            with self._lock:
                self._failed += 1
            query.request.fail(exc)
            return
        units = {
            **self.reader.units(query.device, query.prop),
            **self.recorder.units_of(query.device, query.prop),
        }
        if units:  # the fields' declared units travel in the stream's schema metadata
            metadata = {**(chunk.table.schema.metadata or {}), b"rda.units": json.dumps(units)}
            chunk = Chunk(chunk.table.replace_schema_metadata(metadata), chunk.more)
        with self._lock:
            self._queries += 1
            self._rows += len(chunk)
            self._seam_timeouts += not complete
        query.request.complete(AcquiredData(encode_chunk(chunk, complete), DataContext()))

    def _gone(self, query: _Query | GetRequest) -> None:
        request = query.request if isinstance(query, _Query) else query
        with self._lock:
            self._departed += 1
        request.fail(DisconnectedError("the client went away before its history was read"))


def preload() -> None:
    """Import now what the first read would: pyarrow's conversions to numpy (the journal's
    segments, chunk assembly) import pandas when it is installed, a one-time cost a history
    server pays at start rather than on its first request (docs/performance.md)."""
    with contextlib.suppress(ImportError):
        importlib.import_module("pandas")


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
    preload()
    handler = HistoryHandler(recorder, reader)
    devices = history_devices(recorder.patterns)
    try:
        server = builder.request_reply(handler).devices(*devices).build()
        handler.watch_clients(server.connected)
        server.start()
    except BaseException:
        handler.close()
        raise
    log.info(
        "recorder %s serves history of %s at %s",
        recorder.recorder_id,
        ", ".join(devices) or "nothing",
        server.endpoint,
    )
    return server, handler
