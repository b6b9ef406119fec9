"""Build of the compiled binary codec (everything else is in pyproject.toml).

The layer folders are reached through the committed symlinks ``rda/<layer> -> ../<layer>``,
so the extension is named and built as ``rda.serialization._cbinary``: ``build_ext`` puts it
in ``rda/serialization/`` (the real ``serialization/``) for an editable install, and inside
the wheel's ``rda/serialization/`` otherwise. When it is missing, rda runs the pure-Python
codec (``rda.serialization.implementation == "python"``).
"""

from __future__ import annotations

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extension = Extension(
    "rda.serialization._cbinary",
    ["rda/serialization/_cbinary.pyx"],
    include_dirs=[np.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-O2"],
)

setup(ext_modules=cythonize([extension], language_level=3, quiet=True))
