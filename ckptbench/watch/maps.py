"""The checkpoint files a job maps (/proc/PID/maps) and how much of each its page tables hold (/proc/PID/smaps).

A loader that maps its files (safetensors, torch.load(mmap=True)) reads them by page faults, not read() calls: they
show in no descriptor once it has closed it, and in no rchar. Its mappings name them; a mapping's Rss is the part of
the file the job has touched, whether the page came from the disk (a major fault) or from the page cache (a minor
one), so Rss growth is the bytes the loader brought in through the mapping. read_bytes counts only the first kind
(and read-ahead it never touched); the page cache's residency says nothing about this process. No ptrace: maps and
smaps need the job's user, as /proc/PID/io does.
"""

from __future__ import annotations

import os
import re
import stat

CHECKPOINT_EXT = (".safetensors", ".pt", ".pth", ".bin", ".distcp", ".ckpt", ".metadata", ".gguf", ".npz")
_LIBRARY = ("/usr/", "/lib", "/proc/", "/sys/", "/dev/")
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")
_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def is_checkpoint_file(path: str, size: int) -> bool:
    """A file the job has open or maps that may be checkpoint data: a checkpoint's extension, or a large file
    outside the system and library trees (a Python job also has its modules and logs open); nothing in an installed
    package (a site-packages .pth is a path file Python reads at start, not a torch checkpoint)."""
    if "/site-packages/" in path or "/dist-packages/" in path:
        return False
    return path.endswith(CHECKPOINT_EXT) or (size >= 1 << 20 and not path.startswith(_LIBRARY))


def _read(path: str) -> str:
    with open(path, errors="surrogateescape") as f:
        return f.read()


def _mappings(text: str) -> dict[str, tuple[str, int, bool]]:
    """File-backed mappings of a maps (or smaps) text: path -> (device, inode, whether any mapping executes)."""
    out: dict[str, tuple[str, int, bool]] = {}
    for line in text.splitlines():
        if not _HEADER.match(line):
            continue
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[4] == "0" or not parts[5].startswith("/"):
            continue  # anonymous, a heap or stack, [vdso]
        path = parts[5]
        if path.endswith(" (deleted)"):
            continue  # its name is gone: nothing to read back or to judge
        dev, inode, execs = out.get(path, (parts[3], int(parts[4]), False))
        out[path] = (dev, inode, execs or "x" in parts[1])
    return out


class MapReader:
    """Reads the checkpoint files a process tree maps, remembering which paths were judged (a Python job maps
    hundreds of libraries; each is looked at once)."""

    def __init__(self):
        self._judged: dict[tuple[str, str, int], int | None] = {}  # (path, dev, inode) -> size, None: not a checkpoint

    def _checkpoint_size(self, path: str, dev: str, inode: int, execs: bool) -> int | None:
        key = (path, dev, inode)
        if key not in self._judged:
            self._judged[key] = None if execs else _judge(path, dev, inode)
        return self._judged[key]

    def sample(self, pids) -> tuple[dict[str, int], dict[tuple[int, str], int]]:
        """(path -> size of every checkpoint file the tree maps, (pid, path) -> bytes of it resident in that
        process's mappings). A process that ended or refuses is skipped: its open files say what they can."""
        files: dict[str, int] = {}
        resident: dict[tuple[int, str], int] = {}
        for pid in pids:
            try:
                maps = _mappings(_read(f"/proc/{pid}/maps"))
            except OSError:
                continue
            mine = {}
            for path, (dev, inode, execs) in maps.items():
                size = self._checkpoint_size(path, dev, inode, execs)
                if size is not None:
                    mine[path] = size
            if not mine:
                continue  # smaps walks every page table: read only while a checkpoint is mapped
            files |= mine
            try:
                resident |= {(pid, p): n for p, n in _rss(_read(f"/proc/{pid}/smaps"), set(mine)).items()}
            except OSError:
                continue
        return files, resident


def _judge(path: str, dev: str, inode: int) -> int | None:
    """The file's size when the mapping names a checkpoint: a regular file still at that path (same device and
    inode), checkpoint-like as an open file must be, and not code (a shared object, or an ELF file by its magic)."""
    if _SHARED_OBJECT.search(path):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    major, _, minor = dev.partition(":")
    try:
        same = st.st_ino == inode and (os.major(st.st_dev), os.minor(st.st_dev)) == (int(major, 16), int(minor, 16))
    except ValueError:
        return None
    if not same or not stat.S_ISREG(st.st_mode):
        return None
    if not is_checkpoint_file(path, st.st_size):
        return None
    try:
        with open(path, "rb") as f:
            if f.read(4) == b"\x7fELF":
                return None
    except OSError:
        return None
    return st.st_size


def _rss(text: str, paths: set[str]) -> dict[str, int]:
    """Rss bytes of every mapping of `paths` in a smaps text, summed per path."""
    out: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        if _HEADER.match(line):
            parts = line.split(maxsplit=5)
            current = parts[5] if len(parts) == 6 and parts[5] in paths else None
        elif current is not None and line.startswith("Rss:"):
            try:
                out[current] = out.get(current, 0) + int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                pass
    return out
