"""A checkpoint directory's files: every regular file below it, in a stable order."""

from __future__ import annotations

import os
import stat

# what an entry that is not a regular file is, said where it is passed over
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def not_regular(path: str) -> str | None:
    """Why `path` is passed over (a symlink is never followed, so nothing outside the checkpoint is read through
    one; a FIFO or a device has no size to read), or None for a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return f"cannot be examined ({exc.strerror}): not read"
    if stat.S_ISLNK(mode):
        return "a symbolic link, not followed: only regular files inside the checkpoint are read"
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "an entry of another kind")
    return f"{kind}, not a regular file: never read"


def files(directory: str, skipped: list[tuple[str, str]] | None = None,
          odd: dict[str, str] | None = None, passed: list[tuple[str, str]] | None = None) -> list[str]:
    """Paths of regular files (not symlinks) under `directory`, depth-first, names sorted.

    A sub-directory that cannot be entered is appended to `skipped` as (path, reason), so that callers
    report it instead of counting a partial listing as the whole checkpoint; `odd` gets the folders the list
    cannot show (a symlinked one, an empty one), by relative path, with what they are; `passed` gets the entries
    that are not regular files (a symlink, a FIFO), by path, with why they are not read."""
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
            why = not_regular(path)
            if why is None:
                out.append(path)
            elif passed is not None:
                passed.append((path, why))
    return out


def rels(directory: str, skipped: list[tuple[str, str]] | None = None) -> list[str]:
    """The same files as "/"-separated paths relative to `directory`."""
    return [os.path.relpath(p, directory).replace(os.sep, "/") for p in files(directory, skipped)]
