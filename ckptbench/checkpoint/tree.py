"""A checkpoint directory's files: every regular file below it, in a stable order."""

from __future__ import annotations

import os


def files(directory: str, skipped: list[tuple[str, str]] | None = None) -> list[str]:
    """Paths of regular files (not symlinks) under `directory`, depth-first, names sorted.

    A sub-directory that cannot be entered is appended to `skipped` as (path, reason), so that callers
    report it instead of counting a partial listing as the whole checkpoint."""
    out = []

    def refused(exc: OSError) -> None:
        if skipped is not None:
            skipped.append((str(exc.filename), exc.strerror or str(exc)))

    for root, dirs, names in os.walk(directory, onerror=refused):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(root, n)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(path)
    return out


def rels(directory: str, skipped: list[tuple[str, str]] | None = None) -> list[str]:
    """The same files as "/"-separated paths relative to `directory`."""
    return [os.path.relpath(p, directory).replace(os.sep, "/") for p in files(directory, skipped)]
