"""A checkpoint directory's files: every regular file below it, in a stable order."""

from __future__ import annotations

import os


def files(directory: str) -> list[str]:
    """Paths of regular files (not symlinks) under `directory`, depth-first, names sorted."""
    out = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(root, n)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(path)
    return out


def rels(directory: str) -> list[str]:
    """The same files as "/"-separated paths relative to `directory`."""
    return [os.path.relpath(p, directory).replace(os.sep, "/") for p in files(directory)]
