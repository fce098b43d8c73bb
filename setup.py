"""Declares the native extension explicitly; metadata lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

CSRC = "fastio/csrc/"
HEADERS = [CSRC + h for h in ("hashes.h", "digest.h", "engine.h", "cache.h", "finite.h", "memory.h")]
SOURCES = [CSRC + c for c in ("engine.c", "digest.c", "cache.c", "crc32c.c", "xxh64.c", "finite.c", "memory.c")]

engine = Extension(
    "fastio._engine",
    sources=["fastio/_engine.pyx"] + SOURCES,
    depends=HEADERS + ["fastio/_cfastio.pxd"],
    include_dirs=["fastio"],
    extra_compile_args=["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"],
    libraries=["pthread", "dl"],
)

# The code's packages are discovered; the profiles (TOML data at the top of the repository, where the design
# puts them) are mapped into the package so an installed ckptbench finds them without a checkout.
PROFILE_DATA = "ckptbench.profile_data"

setup(
    packages=find_packages(include=["fastio", "fastio.*", "ckptbench", "ckptbench.*", "tui", "tui.*"])
    + [PROFILE_DATA],
    package_dir={PROFILE_DATA: "profiles"},
    ext_modules=cythonize([engine], language_level=3, compiler_directives={"embedsignature": True}),
)
