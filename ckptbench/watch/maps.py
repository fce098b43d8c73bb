"""Which files a job holds are its checkpoint's, and the ones it maps (/proc/PID/maps) with how much of each its
page tables hold (/proc/PID/smaps).

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

from ckptbench.checkpoint import resume

# the checkpoint's own names (DeepSpeed's and Megatron's are torch.save .pt files among them), and GGUF, which
# llama.cpp-style loaders map: ckptbench loads none, but a job it watches may
CHECKPOINT_EXT = (*resume.WEIGHT_EXT, ".gguf")
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")
_ELF = b"\x7fELF"
_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def source_root(source: str | None) -> str | None:
    """The checkpoint named with --source as /proc names its files (symbolic links resolved); None when it is no
    local path (an S3 URL): then the names alone decide."""
    if not source or not os.path.exists(source):
        return None
    return os.path.realpath(source)


def is_checkpoint_file(path: str, size: int | None = None, source: str | None = None) -> bool:
    """Whether a file the job has open or maps is checkpoint data by its name and place: under `source` (a
    source_root), or a checkpoint format's extension. Its size says nothing: a job maps and opens databases and
    data sets (cache.db, index.sqlite, a datasets .arrow, an .npy memmap) as large as any shard, and counting them put
    their bytes in the restore's, its floor and the verdict's re-read (`size` is taken for callers that pass it).
    Never a shared object, nor anything in an installed package (a site-packages .pth is a path file Python reads at
    start, not a torch checkpoint). The bytes are not looked at here: FileJudge does, once per file."""
    if "/site-packages/" in path or "/dist-packages/" in path or _SHARED_OBJECT.search(path):
        return False
    if source and (path == source or path.startswith(source.rstrip("/") + "/")):
        return True
    return path.endswith(CHECKPOINT_EXT)


def _held(pids, paths: set[str]) -> dict[str, set[tuple[int, int]]]:
    """(device, inode) of each of `paths` as the tree holds it, through its /proc/PID/fd links: a link's name is the
    job's, and a job in another mount namespace (a container) names files this namespace has elsewhere, or not at
    all, or as a FIFO whose open blocks."""
    out: dict[str, set[tuple[int, int]]] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                path = os.readlink(link)
                if path in paths:
                    st = os.stat(link)
                    out.setdefault(path, set()).add((st.st_dev, st.st_ino))
            except OSError:
                continue  # closed between listing and reading
    return out


def _same(st: os.stat_result, ident: set[tuple[int, int]] | None) -> bool:
    return stat.S_ISREG(st.st_mode) and (ident is None or (st.st_dev, st.st_ino) in ident)


def _data_size(path: str, ident: set[tuple[int, int]] | None = None) -> int | None:
    """The file's size when it is data: a regular file, readable, not an ELF object by its magic (a library or an
    executable copied under a checkpoint's name: weights.bin, exe.ckpt), and, with `ident`, one of those (device,
    inode) pairs: the job's own file, not whatever its name reaches here. None otherwise, and what is not the job's
    is never opened (a FIFO's open blocks, a device's acts) nor read."""
    try:
        if not _same(os.lstat(path), ident):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not _same(st, ident):  # replaced between the look and the open
            return None
        try:  # one page, not a read-ahead window: the watch counts what comes into the page cache as the job's
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        except OSError:
            pass
        return None if os.pread(fd, 4, 0) == _ELF else st.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


class FileJudge:
    """Which of the files a job holds are its checkpoint's: by name and place (is_checkpoint_file), then by their
    first bytes, read once per file (a job holds the same files interval after interval), and only where the name
    reaches the very file the job holds: the verdict re-reads these files by name."""

    def __init__(self, source: str | None = None):
        self.source = source_root(source)
        self._open: dict[tuple[str, int], bool] = {}  # (path, size) -> a checkpoint file
        self._mapped: dict[tuple[str, str, int], int | None] = {}  # (path, dev, inode) -> size, None: not one

    def open_files(self, files, pids) -> list:
        """Of the files (procstat.OpenFile) the tree `pids` has open, the checkpoint's: named or placed as one, the
        same file here as the job's (device and inode), readable and not code (what cannot be read cannot be judged,
        nor re-read by the verdict)."""
        new = {f.path for f in files
               if (f.path, f.size) not in self._open and is_checkpoint_file(f.path, source=self.source)}
        held = _held(pids, new) if new else {}
        for f in files:
            if f.path in held and (f.path, f.size) not in self._open:
                self._open[f.path, f.size] = _data_size(f.path, held[f.path]) is not None
        # one closed before its link was read is judged when next seen held, or at the end among the unseen
        return [f for f in files if self._open.get((f.path, f.size), False)]

    def open_file(self, path: str, size: int) -> bool:
        """A file under the checkpoint (the job was never seen to hold it) is the checkpoint's: named or placed as
        one, and a regular file, readable and not code."""
        if not is_checkpoint_file(path, source=self.source):
            return False
        key = (path, size)
        if key not in self._open:
            self._open[key] = _data_size(path) is not None
        return self._open[key]

    def mapped_file(self, path: str, dev: str, inode: int, execs: bool) -> tuple[str, int] | None:
        """(its name, its size) of a mapped file that is the checkpoint's, else None; an executable mapping is code.
        `path` is as maps writes it (see _names)."""
        key = (path, dev, inode)
        if key not in self._mapped:
            self._mapped[key] = None if execs else self._judge_mapping(path, dev, inode)
        return self._mapped[key]

    def _judge_mapping(self, path: str, dev: str, inode: int) -> tuple[str, int] | None:
        """(name, size) when the mapping names a checkpoint: the mapped file itself still at that name (same device
        and inode, checked on what was opened), checkpoint-like as an open file must be, and not code."""
        major, _, minor = dev.partition(":")
        try:
            ident = {(os.makedev(int(major, 16), int(minor, 16)), inode)}
        except (ValueError, OverflowError):
            return None
        for name in _names(path):
            size = _data_size(name, ident) if is_checkpoint_file(name, source=self.source) else None
            if size is not None:
                return name, size
        return None


def _names(path: str) -> tuple[str, ...]:
    """The names a maps path can stand for: the kernel writes a newline in a name as \\012 and a backslash as it is,
    so a literal backslash-012 reads the same; the device and inode tell which file it is."""
    real = path.replace("\\012", "\n")
    return (path,) if real == path else (path, real)


def _lines(text: str) -> list[str]:
    """A maps (or smaps) text's lines: only a newline ends one (splitlines, and open's universal newlines, also broke
    a name at \\r, \\x1c-\\x1e or \\x85, which the kernel writes as they are)."""
    return text.split("\n")


def _read(path: str) -> str:
    with open(path, errors="surrogateescape", newline="") as f:  # a \r in a name is no line end
        return f.read()


def _mappings(text: str) -> dict[str, tuple[str, int, bool]]:
    """File-backed mappings of a maps (or smaps) text: path -> (device, inode, whether any mapping executes)."""
    out: dict[str, tuple[str, int, bool]] = {}
    for line in _lines(text):
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
    """Reads the checkpoint files a process tree maps; its judge looks at each mapped path once (a Python job maps
    hundreds of libraries)."""

    def __init__(self, judge: FileJudge | None = None):
        self.judge = judge or FileJudge()

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
            mine = {}  # the path as maps writes it -> (the file's name, its size)
            for path, (dev, inode, execs) in maps.items():
                found = self.judge.mapped_file(path, dev, inode, execs)
                if found is not None:
                    mine[path] = found
            if not mine:
                continue  # smaps walks every page table: read only while a checkpoint is mapped
            files |= dict(mine.values())
            try:
                resident |= {(pid, mine[p][0]): n for p, n in _rss(_read(f"/proc/{pid}/smaps"), set(mine)).items()}
            except OSError:
                continue
        return files, resident


def _rss(text: str, paths: set[str]) -> dict[str, int]:
    """Rss bytes of every mapping of `paths` in a smaps text, summed per path."""
    out: dict[str, int] = {}
    current = None
    for line in _lines(text):
        if _HEADER.match(line):
            parts = line.split(maxsplit=5)
            current = parts[5] if len(parts) == 6 and parts[5] in paths else None
        elif current is not None and line.startswith("Rss:"):
            try:
                out[current] = out.get(current, 0) + int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                pass
    return out
