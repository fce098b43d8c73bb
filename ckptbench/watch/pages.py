"""What came into the page cache of the checkpoint's files while a job was watched: the evidence that counts a cold
load whatever way it read, when its own counters do not.

A loader that maps its files and lets go of each between two samples shows in no descriptor, no mapping and no
rchar, and the kernel's read_bytes for it counts only part of what read-ahead brings in: a cold safetensors load of
1008 MiB was counted as 576 MiB, one shard of four never listed. The page cache holds every page the storage
delivered, whoever asked: the bytes of each file resident when the watch first knew of it (the --source files before
the first sample; any other when the job was first seen to hold it) against those resident when it ended are what
came in meanwhile. A mincore of each file at both ends, nothing read. Pages the box let go of again under memory
pressure are not seen (an undercount, never a double count); another program reading the same files meanwhile
would be counted as the job's. A file written meanwhile (its size or modification time changed: a checkpoint the
job saves) is left out: its pages came from the job's writes, not from the storage.
"""

from __future__ import annotations

import os

from ckptbench.system import pagecache

MAX_FILES = 10000  # files under a --source walked for their pages: a directory of more is not one checkpoint


def files_under(root: str | None) -> list[str]:
    """The regular files under `root` (a file, or a directory walked without following links), at most MAX_FILES."""
    if not root:
        return []
    if os.path.isfile(root):
        return [root]
    out: list[str] = []
    for top, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(top, name)
            if not os.path.islink(path) and os.path.isfile(path):
                out.append(path)
                if len(out) >= MAX_FILES:
                    return out
    return out


def _version(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class PageLedger:
    """Each known file's bytes in the page cache when the watch first knew of it, and its size."""

    def __init__(self, paths: list[str] = ()):
        self.first: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self._versions: dict[str, tuple[int, int] | None] = {}
        self._tried: set[str] = set()  # asked once each: one that cannot be opened is not asked every sample
        self.add(paths)

    def add(self, paths) -> None:
        """Files not known yet, with their residency now (one that cannot be opened is left out: fail soft)."""
        new = [p for p in dict.fromkeys(paths) if p not in self._tried]
        self._tried.update(new)
        if new:
            for path, resident, total in pagecache.residency_of_each(new):
                self.first[path], self.sizes[path] = resident, total
                self._versions[path] = _version(path)

    def share_first(self, path: str) -> float | None:
        """The file's share resident when first known; None if it is not known."""
        if path not in self.first:
            return None
        return self.first[path] / self.sizes[path] if self.sizes[path] else 1.0

    def arrived(self) -> dict[str, int]:
        """path -> bytes of it that came into the page cache since it was first known (files that gained none, or
        were written meanwhile, are left out)."""
        now = pagecache.residency_of_each(list(self.first))
        return {p: n - self.first[p] for p, n, _ in now
                if p in self.first and n > self.first[p] and _version(p) == self._versions[p]}
