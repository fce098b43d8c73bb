"""Declares the native extension explicitly; metadata lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

CSRC = "fastio/csrc/"
HEADERS = [CSRC + h for h in ("hashes.h", "digest.h", "engine.h", "cache.h")]

engine = Extension(
    "fastio._engine",
    sources=["fastio/_engine.pyx"] + [CSRC + c for c in ("engine.c", "digest.c", "cache.c", "crc32c.c", "xxh64.c")],
    depends=HEADERS + ["fastio/_cfastio.pxd"],
    include_dirs=["fastio"],
    extra_compile_args=["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"],
    libraries=["pthread", "dl"],
)

setup(ext_modules=cythonize([engine], language_level=3, compiler_directives={"embedsignature": True}))
