"""A checkpoint directory's files: every regular file below it, in a stable order."""

from __future__ import annotations

import os
import stat

from ckptbench.core.errors import CkptbenchError, printable

# entries (files, folders, links) a listing visits: DeepSpeed's ZeRO shards at 4096 ranks are about 8200 files a step,
# so a folder keeping 100 such steps fits; a million empty files took 90 s to list and are no checkpoint
MAX_ENTRIES = 1 << 20

# what an entry that is not a regular file is, said where it is passed over
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _why(mode: int) -> str | None:
    """not_regular's answer for an entry of this mode."""
    if stat.S_ISLNK(mode):
        return "a symbolic link, not followed: only regular files inside the checkpoint are read"
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "an entry of another kind")
    return f"{kind}, not a regular file: never read"


def not_regular(path: str) -> str | None:
    """Why `path` is passed over (a symlink is never followed, so nothing outside the checkpoint is read through
    one; a FIFO or a device has no size to read), or None for a regular file."""
    try:
        return _why(os.lstat(path).st_mode)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror}): not read"


def _entries(path: str, refused, seen) -> tuple[list[os.DirEntry], list[os.DirEntry]] | None:
    """(sub-directories not entered through a symlink, other entries) of one directory, each sorted by name; None
    when it cannot be listed (`refused` told why). `seen` is called on each entry, as it is read."""
    dirs, others = [], []
    try:
        with os.scandir(path) as it:
            for e in it:  # a symlink to a folder is a folder here (os.walk's sort), listed in `odd`, never entered
                seen()
                (dirs if _is_dir(e, follow=False) or (e.is_symlink() and _is_dir(e, follow=True)) else others).append(e)
    except OSError as exc:
        refused(exc)
        return None
    return sorted(dirs, key=lambda e: e.name), sorted(others, key=lambda e: e.name)


def _is_dir(e: os.DirEntry, follow: bool) -> bool:
    try:
        return e.is_dir(follow_symlinks=follow)
    except OSError:
        return False


def files(directory: str, skipped: list[tuple[str, str]] | None = None,
          odd: dict[str, str] | None = None, passed: list[tuple[str, str]] | None = None) -> list[str]:
    """Paths of regular files (not symlinks) under `directory`, depth-first, names sorted.

    A sub-directory that cannot be entered is appended to `skipped` as (path, reason), so that callers
    report it instead of counting a partial listing as the whole checkpoint; `odd` gets the folders the list
    cannot show (a symlinked one, an empty one), by relative path, with what they are; `passed` gets the entries
    that are not regular files (a symlink, a FIFO), by path, with why they are not read. The walk keeps its own
    stack: a tree nested as deep as paths go (two thousand levels) is listed, not a RecursionError. A tree of more
    than MAX_ENTRIES entries is refused in one line as soon as the walk has read one more than that."""
    out = []
    count = 0

    def refused(exc: OSError) -> None:
        if skipped is not None:
            skipped.append((str(exc.filename), exc.strerror or str(exc)))

    def seen() -> None:
        nonlocal count
        count += 1
        if count > MAX_ENTRIES:
            raise CkptbenchError(f"{printable(directory)}: more than {MAX_ENTRIES} entries (files and folders) below "
                                 f"it; ckptbench reads checkpoints of up to {MAX_ENTRIES} files: point at one "
                                 "checkpoint (one step's folder), not a folder of many")

    stack = [(directory, "")]
    while stack:
        root, rel = stack.pop()
        found = _entries(root, refused, seen)
        if found is None:
            continue
        dirs, names = found
        for e in names:
            try:
                why = _why(e.stat(follow_symlinks=False).st_mode)
            except OSError as exc:
                why = f"cannot be examined ({exc.strerror}): not read"
            if why is None:
                out.append(e.path)
            elif passed is not None:
                passed.append((e.path, why))
        if odd is not None:  # what the file list cannot show: folders it does not enter, and empty ones
            for e in dirs:
                if e.is_symlink():
                    odd[f"{rel}/{e.name}" if rel else e.name] = \
                        "is a symlink (only what lies inside the folder is read)"
            if not dirs and not names and rel:
                odd[rel] = "is empty"
        stack.extend((e.path, f"{rel}/{e.name}" if rel else e.name) for e in reversed(dirs) if not e.is_symlink())
    return out


def rels(directory: str, skipped: list[tuple[str, str]] | None = None,
         passed: list[tuple[str, str]] | None = None) -> list[str]:
    """The same files as "/"-separated paths relative to `directory`."""
    return [os.path.relpath(p, directory).replace(os.sep, "/") for p in files(directory, skipped, passed=passed)]


EMPTY = "empty: the directory holds no files; point at a checkpoint directory"  # every command's line for it


def nothing_to_read(directory: str, passed: list[tuple[str, str]]) -> CkptbenchError:
    """Every command's line for a folder whose listing found no regular file: `passed`, the entries it passed over,
    named when there are any (a folder of FIFOs or of links was called "empty", passing over in silence what is
    there and never read)."""
    links = sum(why.startswith("a symbolic link") for _, why in passed)
    if links and links == len(passed):  # a Hugging Face cache snapshot is links into ../../blobs
        return CkptbenchError(f"{printable(directory)}: holds no regular files, only {links} symbolic link(s), which "
                              "are never followed (nothing outside the checkpoint is read); point at a copy made "
                              "with `cp -rL` (a Hugging Face cache snapshot links into its blobs folder)")
    if passed:  # FIFOs, devices: there, and never read
        path, why = passed[0]
        return CkptbenchError(f"{printable(directory)}: holds no regular files, only {len(passed)} entries that are "
                              f"never read (first: {printable(os.path.relpath(path, directory))}, "
                              f"{why.split(',')[0]}); point at a checkpoint directory of regular files")
    return CkptbenchError(f"{printable(directory)}: {EMPTY}")
