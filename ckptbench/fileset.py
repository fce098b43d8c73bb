"""Sample file sets of random bytes (never zeros), written atomically: for the demo, tests and benchmarks."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass

from ckptbench.errors import CkptbenchError


@dataclass(frozen=True)
class FileSetShape:
    big_files: int
    big_size: int
    small_files: int
    small_size: int

    @property
    def total_bytes(self) -> int:
        return self.big_files * self.big_size + self.small_files * self.small_size


DEMO_SHAPE = FileSetShape(big_files=16, big_size=8 << 20, small_files=200, small_size=64 << 10)


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def write_fileset(directory: str, shape: FileSetShape, *, seed: int = 0) -> list[str]:
    """Writes the set into a temporary sibling and renames it into place, so no half set is ever visible."""
    if os.path.exists(directory) and os.listdir(directory):
        raise CkptbenchError(f"{directory}: not empty; choose an empty directory or remove it")
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    need = shape.total_bytes * 1.05
    free = shutil.disk_usage(parent).free
    if free < need:
        raise CkptbenchError(f"{parent}: {free >> 20} MiB free, the file set needs {int(need) >> 20} MiB")
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(directory))}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = random.Random(seed)
    names = [f"shard-{i:05d}.bin" for i in range(shape.big_files)]
    names += [f"small/part-{i:05d}.bin" for i in range(shape.small_files)]
    try:
        for i, name in enumerate(names):
            size = shape.big_size if i < shape.big_files else shape.small_size
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                left = size
                while left:
                    n = min(left, 8 << 20)
                    f.write(_random_bytes(rng, n))
                    left -= n
                os.fsync(f.fileno())
        if os.path.isdir(directory):
            os.rmdir(directory)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [os.path.join(directory, n) for n in names]
