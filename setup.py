"""Build of the compiled extensions (everything else is in pyproject.toml): the binary codec,
the REQUEST/REPLY frame parser, the dispatchers' direct libzmq calls, and the request path's
Python modules compiled from their own ``.py`` (typed by the ``.pxd`` beside each).

The extensions are named and built as ``rda.serialization._cbinary``,
``rda.transport._cframe`` and ``rda.transport._czmq``: ``build_ext`` puts them in
``rda/serialization/`` and ``rda/transport/`` for an editable install, and inside the wheel
otherwise. When they are missing, rda runs the pure-Python codec
and frame parser and calls libzmq through pyzmq only
(``rda.serialization.implementation == "python"``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# rda/_compiled_python.py names the modules and the file names their builds carry; loaded by
# path, so that building does not import rda.
_spec = importlib.util.spec_from_file_location("_compiled_python", "rda/_compiled_python.py")
assert _spec is not None and _spec.loader is not None
compiled_python = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiled_python)

codec = Extension(
    "rda.serialization._cbinary",
    ["rda/serialization/_cbinary.pyx"],
    include_dirs=[np.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-O2"],
)
# The compiled fast path of the REQUEST/REPLY frame parser (transport/protocol.py falls back
# to its pure-Python parser without it).
frame = Extension(
    "rda.transport._cframe", ["rda/transport/_cframe.pyx"], extra_compile_args=["-O2"]
)

# Receives and sends straight into libzmq (its functions are bound at import with dlopen/dlsym
# from pyzmq's backend and the libzmq it was linked with: nothing to link here). POSIX only
# (dlfcn.h); elsewhere the transports go through pyzmq.
czmq = Extension("rda.transport._czmq", ["rda/transport/_czmq.pyx"], extra_compile_args=["-O2"])
extensions = [codec, frame] if sys.platform == "win32" else [codec, frame, czmq]

# The request path's modules: each built under its own module name (its PyInit_ and its
# classes' __module__ are the canonical ones), from its .py and the augmenting .pxd beside it.
modules = [
    Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=["-O2"])
    for name in compiled_python.MODULES
]


class BuildExt(build_ext):
    """Writes each module of ``compiled_python.MODULES`` as
    ``<module>.compiled-<digest><suffix>``, a name Python's import never finds: only
    ``rda._compiled_python.Finder`` loads it, and only while the sources match the digest.
    (setuptools asks for the name both ways: the full path to build to, the file name to copy.)"""

    def get_ext_filename(self, fullname: str) -> str:
        name: str = super().get_ext_filename(fullname)  # type: ignore[no-untyped-call]
        return _tagged(fullname, name)

    def get_ext_fullpath(self, ext_name: str) -> str:
        return _tagged(ext_name, super().get_ext_fullpath(ext_name))

    def run(self) -> None:
        super().run()
        if not self.inplace:
            return
        # An in-place build leaves the builds of earlier sources behind (never loaded: their
        # digest is not the sources'); remove them.
        for name in compiled_python.MODULES:
            current = Path(self.get_ext_fullpath(name))
            for old in current.parent.glob(current.name.partition(".")[0] + ".compiled-*"):
                if old != current:
                    old.unlink()


def _tagged(module: str, path: str) -> str:
    if module not in compiled_python.MODULES or ".compiled-" in os.path.basename(path):
        return path
    folder, stem = os.path.split(module.replace(".", "/"))
    digest = compiled_python.digest_of(str(Path(folder)), stem)
    head, _, suffix = os.path.basename(path).partition(".")
    return os.path.join(os.path.dirname(path), f"{head}.compiled-{digest}.{suffix}")


setup(
    ext_modules=cythonize(extensions, language_level=3, quiet=True)
    # The modules' annotations are for mypy (list[bytes], Kind...); their C types are the
    # .pxd's alone.
    + cythonize(
        modules,
        language_level=3,
        quiet=True,
        compiler_directives={"annotation_typing": False},
    ),
    cmdclass={"build_ext": BuildExt},
)
