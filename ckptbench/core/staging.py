"""The temporary sibling `gen` and `save` write a checkpoint into before one rename publishes it, and the cleanup of
those a killed run left. A folder is ours to remove only when it holds the marker written into it first, naming that
folder, this host, this pid namespace and a process that has ended: a folder under the name without it (an older ckptbench's, or the
user's own) is left as it is."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import uuid

MARKER = ".ckptbench-staging"
_MARKER_MAX = 4096  # the marker is one short JSON line: anything larger is not ours


def host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


def staging_name(target: str, pid: int | None = None) -> str:
    """`.NAME.tmp-HOST-PID` beside `target`. The host keeps two nodes on one shared file system from judging each
    other's pids; the pid tells a dead writer's leftovers from a live one's."""
    pid = os.getpid() if pid is None else pid
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp-{host()}-{pid}")


def pid_space() -> str:
    """This process's pid namespace ('pid:[4026531836]'): containers on one host share its name (host networking
    gives them the host's) and a shared volume, but not their pids; '' where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except (OverflowError, ValueError):
        return False
    return True


def make_staging(target: str) -> str:
    """Creates the staging folder of `target` and marks it ours; returns it. A folder already under the name (a
    killed run's of a repeated container pid, or planted) is left alone: this stages under another name."""
    tmp = staging_name(target)
    try:
        os.mkdir(tmp)
    except FileExistsError:
        tmp = f"{tmp}-{uuid.uuid4().hex[:8]}"
        os.mkdir(tmp)
    try:
        fd = os.open(os.path.join(tmp, MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "w") as f:
            json.dump({"folder": os.path.basename(tmp), "host": host(), "pid": os.getpid(), "pidns": pid_space()}, f)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def unmark(tmp: str) -> None:
    """Takes the marker out before the folder is published: it is no file of the checkpoint."""
    os.unlink(os.path.join(tmp, MARKER))


def _writer(path: str) -> int | None:
    """The pid of the ckptbench process that made the staging folder `path`, from its marker; None when the folder
    is not provably one of ours on this host (no marker, a link, or a marker naming another folder, host or pid
    namespace)."""
    name = os.path.basename(path)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        fd = os.open(os.path.join(path, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read(_MARKER_MAX + 1)
        doc = json.loads(data) if len(data) <= _MARKER_MAX else None
    except (OSError, ValueError):
        return None
    # a pid is judged only in the namespace it was given in: another container's live writer is no dead one here
    if not isinstance(doc, dict) or doc.get("folder") != name or doc.get("host") != host() \
            or not pid_space() or doc.get("pidns") != pid_space():
        return None
    pid = doc.get("pid")
    return pid if type(pid) is int and pid > 0 else None


def reap_stale(parent: str, base: str) -> list[str]:
    """Removes the staging folders in `parent` of targets whose names fullmatch the regex `base` that a ckptbench
    process on this host made and that process has ended (a kill -9, a power cut); returns their paths. A live
    process's, another host's, and any folder without our marker stay."""
    pattern = re.compile(rf"\.(?:{base})\.tmp-.+")
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for n in sorted(names):
        path = os.path.join(parent, n)
        if not pattern.fullmatch(n) or n.endswith(".old"):
            continue
        pid = _writer(path)
        if pid is None or alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed
