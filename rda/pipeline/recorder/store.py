"""The history store's root on any ``pyarrow.fs`` filesystem: a local path or a URI.

``Store.open("/data/history")`` and ``Store.open("file:///data/history")`` are the local disk;
``s3://bucket/history``, ``gs://bucket/history`` and ``hdfs://namenode:8020/history`` go through
``pyarrow.fs.FileSystem.from_uri``. Every listing, read and write of the store (the Parquet
files, the schema catalog, the compaction record) goes through ``Store.fs``; only the recorder's
journal stays on the recorder's local disk.

Writes are made durable and visible whole, by the filesystem's own means:

* the local disk: a hidden temporary name, fsync, rename, fsync of the directory (as before);
* object stores (S3, GCS): no rename exists (a "move" is a copy), but one PUT of an object is
  atomic (readers see the whole object or none), so the object is written once under its final
  name. File names derive only from the rows, so a redone conversion rewrites the same names
  with the same rows: idempotence does not need a rename;
* other filesystems (HDFS, ...): a hidden temporary name, then ``move`` (HDFS renames
  atomically).

Spark reads the same store through its own Hadoop connectors: ``spark_path`` maps a store path
to the URI Spark understands (``s3://`` -> ``s3a://``, the query string of a pyarrow URI
dropped: give Spark its endpoint and credentials as ``spark.hadoop.fs.s3a.*`` settings).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["Store", "fsync_directory", "spark_scheme", "write_durably"]

# Object stores: a PUT is atomic and a rename is a copy, so objects are written in place.
_OBJECT_STORES = frozenset({"s3", "gcs"})
# pyarrow's URI scheme -> the Hadoop connector Spark uses for it.
_SPARK_SCHEMES = {"s3": "s3a", "s3a": "s3a", "gs": "gs", "hdfs": "hdfs", "viewfs": "viewfs"}


def spark_scheme(scheme: str) -> str:
    """The Hadoop scheme Spark reads a pyarrow URI scheme with (``s3`` -> ``s3a``)."""
    try:
        return _SPARK_SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"Spark has no connector mapping for {scheme}:// stores") from None


def fsync_directory(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, payload: bytes | memoryview | pa.Buffer) -> None:
    """Write ``payload`` to ``path`` via a hidden tmp file: write, fsync, rename, fsync dir.

    A reader (or a crash) sees either the old content of ``path`` or the new, never a part.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


class Store:
    """A store root: ``fs`` (a ``pyarrow.fs.FileSystem``) and ``base`` (the root's path in it).

    Paths handed out and taken by the methods are the filesystem's own paths (``base/...``),
    joined with ``/`` whatever the filesystem.
    """

    __slots__ = ("_prefix", "base", "fs", "uri")

    def __init__(self, fs: pafs.FileSystem, base: str, uri: str | None = None) -> None:
        self.fs = fs
        self.base = base.rstrip("/") or "/"
        self.uri = uri if uri is not None else self.base
        # What Spark puts before a store path: "" for the local disk, "s3a://" for S3 (the
        # bucket is the path's first part), "hdfs://namenode:8020" for HDFS.
        self._prefix: str | None = "" if self.local else None
        if uri is not None and "://" in uri and not self.local:
            parts = urlsplit(uri)
            scheme = spark_scheme(parts.scheme) if parts.scheme in _SPARK_SCHEMES else None
            if scheme in ("s3a", "gs"):
                self._prefix = f"{scheme}://"
            elif scheme is not None:
                self._prefix = f"{scheme}://{parts.netloc}"

    @classmethod
    def open(cls, root: Store | Path | str) -> Store:
        """A store from a local path, a URI ``pyarrow.fs`` resolves, or a Store (returned)."""
        if isinstance(root, Store):
            return root
        if isinstance(root, Path) or "://" not in root:
            return cls(pafs.LocalFileSystem(), str(Path(root).absolute()))
        try:
            fs, path = pafs.FileSystem.from_uri(root)
        except Exception as exc:  # an unknown scheme, a filesystem missing from this pyarrow
            raise ValueError(f"store: {root!r} is not a URI pyarrow.fs can open: {exc}") from None
        return cls(fs, path, root)

    @property
    def local(self) -> bool:
        """True on the local disk (fsync and rename are available; so is ``flock``)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def object_store(self) -> bool:
        return self.fs.type_name in _OBJECT_STORES

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def path(self, *parts: str) -> str:
        """``base/part/part...``."""
        return "/".join([self.base.rstrip("/"), *parts]) if parts else self.base

    def relative(self, path: str) -> str:
        """A store path relative to the root (for records kept outside the store)."""
        prefix = self.base.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not under the store root {self.base!r}")
        return path[len(prefix) :]

    # --- reading --------------------------------------------------------------------------------

    def info(self, path: str) -> pafs.FileInfo:
        info: pafs.FileInfo = self.fs.get_file_info(path)
        return info

    def is_dir(self, path: str) -> bool:
        return bool(self.info(path).type == pafs.FileType.Directory)

    def exists(self, path: str) -> bool:
        return bool(self.info(path).type != pafs.FileType.NotFound)

    def listdir(self, path: str) -> list[str]:
        """The names in a directory, sorted ([] when it does not exist)."""
        return sorted(info.base_name for info in self._entries(path))

    def files(self, path: str) -> list[pafs.FileInfo]:
        """The files of a directory (name, size, mtime), sorted by name."""
        entries = [e for e in self._entries(path) if e.type == pafs.FileType.File]
        return sorted(entries, key=lambda e: str(e.base_name))

    def _entries(self, path: str) -> Iterator[pafs.FileInfo]:
        selector = pafs.FileSelector(path, allow_not_found=True)
        try:
            yield from self.fs.get_file_info(selector)
        except (FileNotFoundError, NotADirectoryError):
            return

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as stream:
            data: bytes = stream.read()
        return data

    # --- writing --------------------------------------------------------------------------------

    def makedirs(self, path: str) -> None:
        if not self.object_store:  # object stores have no directories, only key prefixes
            self.fs.create_dir(path, recursive=True)

    def tmp_name(self, path: str) -> str:
        """The hidden temporary name a write goes through (ignored by Spark and pyarrow)."""
        head, _, name = path.rpartition("/")
        return f"{head}/.{name}.tmp"

    def write(self, path: str, payload: Any) -> None:
        """Write ``payload`` (bytes or a pyarrow Buffer) whole at ``path`` (see module doc)."""
        head = path.rpartition("/")[0]
        if self.local:
            Path(head).mkdir(parents=True, exist_ok=True)
            write_durably(Path(path), payload)
            return
        self.makedirs(head)
        target = path if self.object_store else self.tmp_name(path)
        with self.fs.open_output_stream(target) as stream:
            stream.write(payload)
        if target != path:
            self.fs.move(target, path)

    def delete(self, path: str) -> None:
        """Delete a file; a missing one is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)

    # --- Spark ----------------------------------------------------------------------------------

    def spark_path(self, path: str) -> str:
        """The URI Spark's Hadoop connectors read ``path`` with (``s3://`` -> ``s3a://``)."""
        if self._prefix is None:
            if isinstance(self.fs, pafs.SubTreeFileSystem) and isinstance(
                self.fs.base_fs, pafs.LocalFileSystem
            ):
                base: str = self.fs.base_path
                return base.rstrip("/") + "/" + path.lstrip("/")
            raise ValueError(
                f"store {self.uri!r}: Spark cannot read a {self.fs.type_name} filesystem; "
                "use a local path, file://, s3://, gs:// or hdfs:// store"
            )
        if self._prefix.endswith("://"):  # s3a:// and gs://: the bucket is the path's head
            return self._prefix + path.lstrip("/")
        return self._prefix + path
