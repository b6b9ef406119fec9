"""Build of the compiled extensions (everything else is in pyproject.toml): the binary codec,
the REQUEST/REPLY frame parser and the dispatchers' direct libzmq calls.

The extensions are named and built as ``rda.serialization._cbinary``,
``rda.transport._cframe`` and ``rda.transport._czmq``: ``build_ext`` puts them in
``rda/serialization/`` and ``rda/transport/`` for an editable install, and inside the wheel
otherwise. When they are missing, rda runs the pure-Python codec
and frame parser and calls libzmq through pyzmq only
(``rda.serialization.implementation == "python"``).
"""

from __future__ import annotations

import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

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

setup(ext_modules=cythonize(extensions, language_level=3, quiet=True))
