"""The history server in a process of its own: ``rda history serve STORE``.

It answers the same history gets as the server a recorder runs beside itself (``serve.py``),
from the disk alone: the recorder's journal segments and Parquet files, so a reader's work
never shares a GIL with the recorder's ingest.

**How far the journal is durable.** A segment becomes visible under its final name
``seg-<first>-<last>.arrow`` only by the rename that follows its fsync (``journal.py``), and the
recorder acknowledges its rows only after that rename is durable: the segments a listing finds
are exactly the acknowledged rows, up to the ``last`` seq of the newest one, and nothing that
is not acknowledged is ever listed. So the reader needs no message from the recorder: each chunk
lists the directory (after reading the converter's ``max_seq`` from ``progress.json``, replaced
atomically, as the in-process reader reads it from memory; see ``query.py``, "Each row once"),
and an answer holds every row acknowledged before the request was read. A seam wait (``until``)
is answered once a listed segment holds a row of the signal stamped at or after ``until``:
a watcher thread lists the journal every :data:`POLL` seconds while waits are parked.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from rda.business.server.builder import Server, ServerBuilder
from rda.pipeline.recorder.converter import journal_root
from rda.pipeline.recorder.journal import Journal, read_segment
from rda.pipeline.recorder.query import HistoryReader
from rda.pipeline.recorder.serve import HistoryHandler, start_history_server
from rda.pipeline.recorder.store import Store

__all__ = ["POLL", "DiskRecorder", "StoreHistoryServer", "serve_store"]

log = logging.getLogger("rda.pipeline.recorder.standalone")

POLL = 0.02  # seconds between journal listings while seam waits are parked


class DiskRecorder:
    """What the history handler asks of a recorder, answered from its journal on disk."""

    def __init__(self, store: Store, journal: Journal, patterns: list[str]) -> None:
        self.store = store
        self.journal = journal
        self.recorder_id = journal.recorder_id
        self.patterns: list[tuple[str, str, str | None]] = [(g, "*", None) for g in patterns]
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # segments whose stamps are counted below
        self._acked: dict[tuple[str, str], int] = {}

    def converted_seq(self) -> int:
        """The converter's ``max_seq`` (0 before any conversion): rows up to it are in Parquet."""
        try:
            progress = json.loads((self.journal.directory / "progress.json").read_text())
        except FileNotFoundError:
            return 0
        return int(progress.get("max_seq", 0))

    def scan(self) -> bool:
        """Count the stamps of segments not seen yet; True when there were any."""
        fresh = [s for s in self.journal.segments() if s.name not in self._seen]
        for segment in fresh:
            try:
                keys = list(read_segment(segment.path))
            except FileNotFoundError:  # converted and deleted since the listing
                continue
            with self._lock:
                for (device, prop, _), meta, _ in keys:
                    if len(meta):
                        stamps = meta.column("acq_stamp").to_numpy()
                        top = int(stamps.max())
                        key = (device, prop)
                        self._acked[key] = max(self._acked.get(key, -1), top)
                self._seen.add(segment.name)
        return bool(fresh)

    def records(self, device: str, prop: str) -> bool:
        with self._lock:
            if (device, prop) in self._acked:
                return True
        self.scan()  # rows of a signal new since the last listing
        with self._lock:
            return (device, prop) in self._acked

    def acked_stamp(self, device: str, prop: str) -> int:
        self.scan()
        with self._lock:
            return self._acked.get((device, prop), -1)

    def units_of(self, device: str, prop: str) -> dict[str, str]:
        return {}  # the store's files carry them (HistoryReader.units)


class StoreHistoryServer:
    """A history server over a store on disk, its watcher thread, and their stop."""

    def __init__(self, server: Server, handler: HistoryHandler, recorder: DiskRecorder) -> None:
        self.server = server
        self.handler = handler
        self.recorder = recorder
        self._stop = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, name=f"rda-history-watch-{recorder.recorder_id}", daemon=True
        )
        self._watcher.start()

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def _watch(self) -> None:
        while not self._stop.wait(POLL):
            if self.handler.statistics().seam_waits and self.recorder.scan():
                self.handler.acked()

    def stop(self) -> None:
        self._stop.set()
        self._watcher.join(10)
        self.handler.close()
        self.server.stop()


def serve_store(
    root: Path | str,
    recorder_id: str | None = None,
    builder: ServerBuilder | None = None,
    journal: Path | str | None = None,
    devices: tuple[str, ...] = ("*",),
) -> StoreHistoryServer:
    """Serve the history of ``root`` (the journal of ``recorder_id``: default the only one
    under ``_journal/``) as ``history:<device>`` for ``devices`` (globs)."""
    store = Store.open(root)
    base = journal_root(store, journal) / "_journal"
    if recorder_id is None:
        found = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        if len(found) != 1:
            raise ValueError(
                f"{base}: name the recorder (--recorder): found {', '.join(found) or 'none'}"
            )
        recorder_id = found[0]
    elif not (base / recorder_id).is_dir():
        raise ValueError(f"{base}: no journal of recorder {recorder_id!r}")
    disk_journal = Journal(base.parent, recorder_id)
    recorder = DiskRecorder(store, disk_journal, list(devices))
    recorder.scan()
    reader = HistoryReader(store, disk_journal, recorder.converted_seq, recorder_id)
    if builder is None:
        from rda.admin import install

        builder = install(ServerBuilder(f"history-{recorder_id}"))
    server, handler = start_history_server(recorder, reader, builder)
    log.info("history of recorder %s (store %s) served at %s", recorder_id, root, server.endpoint)
    return StoreHistoryServer(server, handler, recorder)
