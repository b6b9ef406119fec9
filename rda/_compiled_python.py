"""The request path's Python modules, compiled by Cython from the same ``.py`` files.

``setup.py`` compiles each module of ``MODULES`` from its own source (Cython's pure-Python
mode, typed by the augmenting ``.pxd`` beside it: extension types, typed attributes and C-level
methods; the ``.py`` stays the one source and runs unchanged without Cython) into an
extension named ``<module>.compiled-<digest><suffix>`` beside it, ``<digest>`` being
``source_digest`` of the ``.py`` and ``.pxd`` it was built from. Python's own import system
never finds that name: only ``Finder`` (installed first thing by ``rda/__init__.py``) loads
it, in place of the ``.py`` and under the module's own name, and only when

- ``RDA_PURE_PYTHON`` is unset (or "0") when rda is imported: otherwise the ``.py`` runs;
- the extension's digest is that of the sources beside it: a module edited after its last
  build runs from its source, never from a stale build.

``rda.implementation()`` reports the result as ``python_modules``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MODULES", "Finder", "compiled_modules", "install", "source_digest"]

# Compiled with types because it pays (callgrind instructions per get, docs/performance.md
# "The request path compiled"); every other module runs as Python on both paths.
MODULES = (
    "rda.transport.protocol",
    "rda.transport.server_session",
    "rda.business.histogram",
    "rda.business.server.statistics",
    "rda.transport.client_session",
    "rda.transport.zmq_client",
    "rda.transport._zmq_common",
    "rda.business.client.lanes",
    "rda.business.client.requests",
    "rda.business.scheduler",
    "rda.business.server.dispatch",
    "rda.business.client.future",
    "rda.business.client.replies",
    "rda.transport.relay",
    "rda.transport.zmq_server",
    "rda.business.server.runner",
    "rda.transport.lanes",
    "rda.transport.zmq_lane",
    "rda.business.client.access",
    "rda.business.client.service",
    "rda.serialization.message",
    "rda.serialization.header",
    "rda.business.client.timer",
    "rda.business.common",
    "rda.business.server.requests",
    "rda.business.server.subscriptions",
    "rda.business.client.subscriptions",
    "rda.business.client.subscription_set",
)


def source_digest(py: bytes, pxd: bytes) -> str:
    """The tag a build of a module from ``py`` (its ``.py``) and ``pxd`` (its ``.pxd``, or
    empty) carries in its file name."""
    return hashlib.sha256(py + b"\0" + pxd).hexdigest()[:16]


def digest_of(folder: str, stem: str) -> str | None:
    """``source_digest`` of the module ``stem`` in ``folder``; None when it has no ``.py``."""
    try:
        with open(os.path.join(folder, stem + ".py"), "rb") as f:
            py = f.read()
    except OSError:
        return None
    try:
        with open(os.path.join(folder, stem + ".pxd"), "rb") as f:
            pxd = f.read()
    except OSError:
        pxd = b""
    return source_digest(py, pxd)


def _pure_python_requested() -> bool:
    return os.environ.get("RDA_PURE_PYTHON", "") not in ("", "0")


class Finder:
    """A ``sys.meta_path`` finder: the compiled build of a module of ``MODULES`` when one of
    the sources beside it was built; otherwise nothing (the ``.py`` is found as usual)."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MODULES or path is None:
            return None
        stem = fullname.rpartition(".")[2]
        for folder in path:
            digest = digest_of(folder, stem)
            if digest is None:
                continue
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                built = os.path.join(folder, f"{stem}.compiled-{digest}{suffix}")
                if os.path.exists(built):
                    loader = importlib.machinery.ExtensionFileLoader(fullname, built)
                    self.loaded.add(fullname)
                    return importlib.util.spec_from_file_location(fullname, built, loader=loader)
            return None
        return None


_finder = Finder()


def install() -> None:
    """Put ``Finder`` first on ``sys.meta_path`` unless pure Python was asked for."""
    if not _pure_python_requested() and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def compiled_modules() -> str:
    """ "compiled" when every module of ``MODULES`` runs from its build, "python" when none
    does, else "mixed" (some not built, or edited since their build). Imports them all."""
    for name in MODULES:
        importlib.import_module(name)
    if not _finder.loaded:
        return "python"
    return "compiled" if _finder.loaded >= set(MODULES) else "mixed"
