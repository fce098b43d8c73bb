"""What /proc says about a process tree someone else started: bytes read, CPU per thread, faults, memory and
the files it has open with how far it is in each. No ptrace: /proc/PID/io and fdinfo need the same user (or
root), which the kernel checks; a refusal is one line saying so.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field

from ckptbench.core.errors import CkptbenchError, redact

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
PID = re.compile(r"[0-9]+")  # a /proc entry that is a process (ASCII digits only)
MAX_TREE = 4096  # processes followed under one watched root: a fork bomb is not a restore
PID_MAX_LIMIT = 1 << 22  # the kernel's bound on /proc/sys/kernel/pid_max: no PID is larger


class ProcessGone(CkptbenchError):
    exit_code = 2  # a PID that is not running is bad input, as the README says (the job's own failure is 1)


@dataclass(frozen=True)
class OpenFile:
    path: str
    pos: int  # the descriptor's offset now (pread and mmap readers do not move it: 0)
    size: int


@dataclass(frozen=True)
class ProcSample:
    t: float  # monotonic seconds
    pids: tuple[int, ...]  # the watched process and its descendants, alive at this sample
    rchar: int  # bytes returned by read-like calls (page cache included)
    read_bytes: int  # bytes the block layer fetched for them (0 on NFS/FUSE/tmpfs, where nothing is "read" from a disk)
    threads: dict[int, float] = field(default_factory=dict)  # tid -> CPU seconds so far
    waits: dict[int, float] = field(default_factory=dict)  # tid -> seconds runnable but waiting for a CPU (schedstat)
    rss_bytes: int = 0
    majflt: int = 0
    minflt: int = 0
    files: tuple[OpenFile, ...] = ()
    state: str = "R"  # the watched process's state letter: "Z" once it has exited and awaits its parent
    sockets: int = 0  # sockets the tree has open

    @property
    def cpu_s(self) -> float:
        return sum(self.threads.values())


CMDLINE_MAX = 128 << 10  # of a command line searched for --match: a process can point its argument area at any
# amount of its memory (prctl PR_SET_MM), and --match walks every process on the box


def _read_bytes(path: str, most: int = -1) -> bytes:
    with open(path, "rb") as f:
        return f.read(most)


def _read(path: str) -> str:
    """A /proc text file, whatever bytes it holds: a process names itself (its comm in stat, its command line) with
    any bytes, and one that is not UTF-8 must not crash a watch of another process (replaced, never raised)."""
    return _read_bytes(path).decode("utf-8", "replace")


def _stat_fields(text: str) -> list[str]:
    """The fields after the command name (which may hold spaces and parentheses)."""
    return text.rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """Direct children of every thread of `pid` (/proc/PID/task/TID/children)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out += [int(c) for c in _read(f"/proc/{pid}/task/{tid}/children").split()]
        except (OSError, ValueError):
            continue
    return out


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (torchrun's workers, a loader's helper processes), at most MAX_TREE."""
    seen, todo = [], [pid]
    while todo and len(seen) < MAX_TREE:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += children(p)
    return seen


def _io(pid: int) -> dict[str, int]:
    out = {}
    for line in _read(f"/proc/{pid}/io").splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = int(v)
    return out


def io_now(pids) -> tuple[float, int, int]:
    """(monotonic seconds, rchar, read_bytes) summed over `pids`, nothing else read: cheap enough to take between two
    full samples (a process gone since is left out)."""
    now, rchar, disk = time.monotonic(), 0, 0
    for p in pids:
        try:
            io = _io(p)
        except OSError:
            continue
        rchar += io.get("rchar", 0)
        disk += io.get("read_bytes", 0)
    return now, rchar, disk


def _open_files(pid: int, under: tuple[str, ...]) -> tuple[list[OpenFile], int]:
    """Regular files open by `pid`, with their offsets (only those under `under` when it is given), and how many
    sockets it has open (a loader reading over the network has some; a local one may have none)."""
    out, sockets = [], 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out, sockets
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
            if path.startswith("socket:"):
                sockets += 1
                continue
            if not path.startswith("/") or (under and not path.startswith(under)):
                continue
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if not stat.S_ISREG(st.st_mode):
                continue
            pos = 0
            for line in _read(f"/proc/{pid}/fdinfo/{fd}").splitlines():
                if line.startswith("pos:"):
                    pos = int(line.split()[1])
                    break
            out.append(OpenFile(path, pos, st.st_size))
        except (OSError, ValueError):
            continue  # closed between listing and reading: it is simply not open any more
    return out, sockets


def sample(pid: int, under: tuple[str, ...] = ()) -> ProcSample:
    """One reading of the process tree rooted at `pid`. Raises ProcessGone when `pid` no longer exists, and
    CkptbenchError when the kernel refuses its counters (another user's process, without root)."""
    now = time.monotonic()
    pids = tree(pid)
    rchar = read_bytes = rss = majflt = minflt = 0
    threads: dict[int, float] = {}
    waits: dict[int, float] = {}
    files: list[OpenFile] = []
    sockets = 0
    state = "R"
    for i, p in enumerate(pids):
        try:
            io = _io(p)
            f = _stat_fields(_read(f"/proc/{p}/stat"))
        except PermissionError:
            raise CkptbenchError(f"process {p}: /proc/{p}/io is not readable (permission denied); watch as the "
                                 "job's user or as root") from None
        except (FileNotFoundError, ProcessLookupError):
            if i == 0:
                raise ProcessGone(f"process {pid} is not running (it exited, or the PID is wrong)") from None
            continue  # a child that ended between listing and reading
        if i == 0:
            state = f[0]
        rchar += io.get("rchar", 0)
        read_bytes += io.get("read_bytes", 0)
        minflt += int(f[7])
        majflt += int(f[9])
        rss += int(f[21]) * _PAGE
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            tids = []
        for tid in tids:
            try:
                tf = _stat_fields(_read(f"/proc/{p}/task/{tid}/stat"))
                threads[int(tid)] = (int(tf[11]) + int(tf[12])) / _TICK
            except (OSError, ValueError, IndexError):
                continue
            try:  # a thread that wants the CPU but shares it with other work shows here, not in its CPU time
                waits[int(tid)] = int(_read(f"/proc/{p}/task/{tid}/schedstat").split()[1]) / 1e9
            except (OSError, ValueError, IndexError):
                pass
        opened, n = _open_files(p, under)
        files += opened
        sockets += n
    return ProcSample(now, tuple(pids), rchar, read_bytes, threads, waits, rss, majflt, minflt, tuple(files), state,
                      sockets)


def zombie_error(pid: int) -> ProcessGone:
    return ProcessGone(f"process {pid} has exited and is a zombie (its parent has not reaped it): nothing to watch; "
                       "give the PID of a running job")


def watchable(pid: int) -> ProcSample:
    """The first sample of a job someone else started: one line now when it is gone, unreadable or a zombie
    (whose counters never move again: watching it would record an empty restore)."""
    first = sample(pid)
    if first.state in ("Z", "X"):
        raise zombie_error(pid)
    return first


def ancestors(pid: int) -> list[int]:
    """`pid`'s parent, its parent's parent, ... up to PID 1 (the shell and terminal that started a watcher)."""
    out: list[int] = []
    while pid > 1 and len(out) < MAX_TREE:
        try:
            pid = int(_stat_fields(_read(f"/proc/{pid}/stat"))[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 0 or pid in out:
            break
        out.append(pid)
    return out


def find(pattern: str, *, exclude: int | None = None) -> int:
    """The one process whose command line contains `pattern`; one line when none or several match.

    The watcher (`exclude`, else this process) is left out by identity: itself, its ancestors (the shell whose
    command line holds the pattern too) and its descendants; never by what a command line says."""
    me = exclude or os.getpid()
    mine = set(tree(me)) | set(ancestors(me))
    found = []
    for name in os.listdir("/proc"):
        if not PID.fullmatch(name) or int(name) in mine:
            continue
        try:
            raw = _read_bytes(f"/proc/{name}/cmdline", CMDLINE_MAX).replace(b"\0", b" ").strip()
        except OSError:
            continue
        # matched as the pattern was decoded from argv (bytes kept as surrogates), shown with the bytes replaced
        if pattern in raw.decode("utf-8", "surrogateescape"):
            found.append((int(name), raw.decode("utf-8", "replace")))
    if not found:
        raise CkptbenchError(f"--match {pattern!r}: no running process has it in its command line; give a PID")
    if len(found) > 1:
        listed = "; ".join(f"{p}: {redact(c)[:60]}" for p, c in found[:4])  # redacted whole: a cut hides the @
        raise CkptbenchError(f"--match {pattern!r}: {len(found)} processes match ({listed}); narrow it or give a PID")
    return found[0][0]


def _start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (stat field 22): with the boot, it tells a PID used again apart."""
    return _state_and_start(pid)[1]


def _state_and_start(pid: int) -> tuple[str | None, int | None]:
    """(state letter, start ticks) of `pid` (stat fields 3 and 22), read once; (None, None) where /proc hides it."""
    try:
        fields = _stat_fields(_read(f"/proc/{pid}/stat"))
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None, None


def _boot_id() -> str | None:
    try:
        return _read("/proc/sys/kernel/random/boot_id").strip() or None
    except OSError:
        return None


def identity(pid: int | None = None) -> dict:
    """What names a process (this one by default) for as long as it lives, across hosts and reboots: host, boot,
    PID and start time. A run on record carries it so that a reader can tell it still running from cut short."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": os.uname().nodename, "boot_id": _boot_id(), "start_ticks": _start_ticks(pid)}


def still_running(ident) -> bool | None:
    """Whether the process `identity()` named is alive: False once it is gone (or its PID names another process, or
    the box rebooted since), None where this host cannot tell (another host, or /proc hides it)."""
    if not isinstance(ident, dict) or type(ident.get("pid")) is not int or not 0 < ident["pid"] <= PID_MAX_LIMIT:
        return None  # no process's (a hand-edited record): os.kill raised OverflowError past a C int
    if ident.get("host") != os.uname().nodename:
        return None  # a results file on shared storage: that host's processes are not this one's to see
    boot = _boot_id()
    if boot is None or ident.get("boot_id") is None:
        return None
    if boot != ident["boot_id"]:
        return False
    state, ticks = _state_and_start(ident["pid"])
    if ticks is not None:  # a zombie (Z) or one being reaped (X) has ended: only its exit status is left
        return ticks == ident.get("start_ticks") and state not in ("Z", "X")
    try:
        os.kill(ident["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:
        return None
    return None  # there but its /proc hidden (hidepid): its start time cannot be compared
