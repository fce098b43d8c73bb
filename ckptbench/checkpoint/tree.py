"""A checkpoint directory's files: every regular file below it, in a stable order."""

from __future__ import annotations

import os


def files(directory: str, skipped: list[tuple[str, str]] | None = None,
          odd: dict[str, str] | None = None) -> list[str]:
    """Paths of regular files (not symlinks) under `directory`, depth-first, names sorted.

    A sub-directory that cannot be entered is appended to `skipped` as (path, reason), so that callers
    report it instead of counting a partial listing as the whole checkpoint; `odd` gets the folders the list
    cannot show (a symlinked one, an empty one), by relative path, with what they are."""
    out = []

    def refused(exc: OSError) -> None:
        if skipped is not None:
            skipped.append((str(exc.filename), exc.strerror or str(exc)))

    for root, dirs, names in os.walk(directory, onerror=refused):
        dirs.sort()
        if odd is not None:  # what the file list cannot show: folders it does not enter, and empty ones
            rel = os.path.relpath(root, directory).replace(os.sep, "/")
            for d in dirs:
                if os.path.islink(os.path.join(root, d)):
                    odd[d if rel == "." else f"{rel}/{d}"] = "is a symlink (only what lies inside the folder is read)"
            if not dirs and not names and rel != ".":
                odd[rel] = "is empty"
        for n in sorted(names):
            path = os.path.join(root, n)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(path)
    return out


def rels(directory: str, skipped: list[tuple[str, str]] | None = None) -> list[str]:
    """The same files as "/"-separated paths relative to `directory`."""
    return [os.path.relpath(p, directory).replace(os.sep, "/") for p in files(directory, skipped)]
