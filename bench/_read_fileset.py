"""The read benchmark's file set: big and small files of random bytes, written once and reused while their sizes
match."""

from __future__ import annotations

import os

from _harness import MiB, Shape, log


def fileset_layout(directory: str, shape: Shape) -> list[tuple[str, int]]:
    big = [(os.path.join(directory, f"big-{i:05d}.bin"), shape.big_size) for i in range(shape.big_files)]
    small = [(os.path.join(directory, "small", f"small-{i:05d}.bin"), shape.small_size)
             for i in range(shape.small_files)]
    return big + small


def write_random_file(path: str, size: int) -> None:
    """Random bytes (never a zero page a filesystem could elide), fsynced, renamed into place."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MiB)
            f.write(os.urandom(n))
            left -= n
        os.fsync(f.fileno())
    os.rename(tmp, path)


def ensure_fileset(directory: str, shape: Shape) -> list[tuple[str, int]]:
    """Reuses files already present with the right size; writes only the rest."""
    files = fileset_layout(directory, shape)
    todo = [(p, s) for p, s in files if not (os.path.isfile(p) and os.path.getsize(p) == s)]
    if todo:
        need = sum(s for _, s in todo)
        log(f"writing {len(todo)} files ({need / MiB:.0f} MiB) into {directory}")
        for path, size in todo:
            write_random_file(path, size)
        for d in {os.path.dirname(p) for p, _ in todo}:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)  # make the renames durable too
            finally:
                os.close(fd)
    else:
        log(f"reusing the file set in {directory}")
    return files
