"""Shared fixtures for the fastio tests.

Reference digests come from hashlib and the independent `crc32c` / `xxhash` PyPI packages, never
from fastio itself.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import crc32c as crc32c_pkg
import pytest
import xxhash

REPO = Path(__file__).resolve().parents[2]


def ref_raw(alg: str, data: bytes) -> bytes:
    """Raw reference digest (crc32c and xxh64 big-endian, as the packages' hexdigest)."""
    if alg in ("md5", "sha256"):
        return hashlib.new(alg, data).digest()
    if alg == "crc32c":
        return crc32c_pkg.crc32c(data).to_bytes(4, "big")
    if alg == "xxh64":
        return xxhash.xxh64(data).digest()
    raise ValueError(alg)


def ref_hex(alg: str, data: bytes) -> str | None:
    if alg == "none":
        return None
    return ref_raw(alg, data).hex()


class Files:
    """Makes files of random bytes under one directory and remembers their contents."""

    def __init__(self, root: Path, seed: int = 1234):
        self.root = root
        self.rng = random.Random(seed)
        self.data: dict[str, bytes] = {}
        self._n = 0

    def make(self, size: int, name: str | None = None, fsync: bool = False) -> str:
        self._n += 1
        path = str(self.root / (name or f"f{self._n:04d}_{size}.bin"))
        data = self.rng.randbytes(size)
        with open(path, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        self.data[path] = data
        return path

    def expect(self, path: str, alg: str) -> str | None:
        return ref_hex(alg, self.data[path])


@pytest.fixture
def files(tmp_path) -> Files:
    return Files(tmp_path)


@pytest.fixture
def ref():
    """The reference hex digest function: ref(alg, data)."""
    return ref_hex


def poll_until(pred, timeout: float = 10.0, interval: float = 0.0005) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()


@pytest.fixture
def poll():
    return poll_until


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 60, **kw):
    """Runs `code` in a fresh interpreter of this venv with the repo on sys.path."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=str(REPO), env=full_env, capture_output=True, text=True, timeout=timeout, **kw,
    )


@pytest.fixture
def pyrun():
    return run_python


class Gate:
    """A small file listed first in a run with concurrency 1, started with `_faults={path: "hold"}`: the only
    worker waits before opening it until release(handle), which gives the test a race-free window between
    start() (which stats and plans every file) and the moment the later files are opened."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "wb") as f:
            f.write(b"gate")
        self.faults = {path: "hold"}

    def release(self, handle) -> None:
        handle._release()


@pytest.fixture
def gate(tmp_path):
    return Gate(str(tmp_path / "gate.bin"))


@pytest.fixture
def ref_digest_raw():
    """The reference raw digest function: ref_digest_raw(alg, data) -> bytes."""
    return ref_raw
