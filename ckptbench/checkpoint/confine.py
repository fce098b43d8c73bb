"""Paths that come from a checkpoint's content (manifest entries, pack names and members, DCP storage paths,
the index's weight map) are hostile until checked: this is the one place that checks them.

A member must be a relative path that resolves inside the checkpoint directory after following symlinks, be
opened without blocking and without following a final symlink, be a regular file on the open descriptor
(before any read), and be read no further than its declared size.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat

from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError

MAX_MEMBER_PATH = 4096
_BENEATH: contextvars.ContextVar[str | None] = contextvars.ContextVar("ckptbench_beneath", default=None)


def _bad(root: str, rel, why: str) -> CkptbenchError:
    return CkptbenchError(f"{root}: the checkpoint names {quote(rel)}, which {why}; refusing it (the checkpoint may "
                          "be crafted: check where it came from)", exit_code=1)


def is_plain(rel) -> bool:
    """A relative, canonical "/"-separated name ("a/b": no empty, "." or ".." part), no NUL, backslash or
    drive, that a file name can hold: joined to any directory, it names something below it."""
    return (isinstance(rel, str) and 0 < len(rel) <= MAX_MEMBER_PATH and "\0" not in rel and "\\" not in rel
            and not rel.startswith("/") and ":" not in rel.split("/")[0]
            and not any(part in ("", ".", "..") for part in rel.split("/")) and _encodable(rel))


def _encodable(rel: str) -> bool:
    """A name the filesystem can hold: JSON's "\\ud800" is a lone surrogate no file name has (os.fsencode raised
    UnicodeEncodeError, a traceback); a listing's undecodable bytes (surrogateescape) still encode."""
    try:
        os.fsencode(rel)
    except UnicodeEncodeError:
        return False
    return True


def resolve(root: str, rel, *, links: bool = True) -> str:
    """The real path of member `rel` of `root`; one clear error when it is not a plain path inside root. With
    `links` False, a member that is a symlink or lies under one is refused too, even one pointing inside: the
    listing never reads one, and N links to one shard would count (and load) its bytes N times."""
    if not is_plain(rel):
        raise _bad(root, rel, "is not a plain relative path and could point outside the checkpoint directory")
    base = os.path.realpath(root)
    real = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, real]) != base or real == base:
        raise _bad(root, rel, "resolves outside the checkpoint directory")
    if not links and real != os.path.join(base, rel):
        raise _bad(root, rel, "is a symbolic link or lies under one (never followed: only the checkpoint's regular "
                   "files are read)")
    return real


def open_member(root: str, rel, size: int | None = None, *, links: bool = True) -> int:
    """A read-only descriptor on a regular file inside root; `size`, when given, must be its size; `links` as
    resolve takes it."""
    path = resolve(root, rel, links=links)
    base = os.path.realpath(root)
    try:
        fd = _open_beneath(base, path[len(base):].lstrip("/"))
    except OSError as exc:
        raise CkptbenchError(f"{os.path.join(root, rel)}: cannot open ({exc.strerror})", exit_code=1) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(root, rel, "is not a regular file")
        if size is not None and st.st_size != size:
            raise CkptbenchError(f"{os.path.join(root, rel)}: {st.st_size} bytes, the checkpoint says {size}",
                                 exit_code=1)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_beneath(base: str, rel: str) -> int:
    """`rel` (resolve's real path, relative to the real `base`) opened one component at a time, none followed when it
    is a symbolic link: resolve saw no link there, so a folder swapped for one since (to /etc) fails (ELOOP) instead
    of being read through. O_NOFOLLOW on the whole path guards its last component only; fastio's engine walks the
    same way (`beneath`)."""
    at = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        *folders, name = rel.split("/")
        for part in folders:
            try:
                below = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
            except NotADirectoryError:  # O_PATH|O_NOFOLLOW takes a link as itself: not a directory
                if stat.S_ISLNK(os.stat(part, dir_fd=at, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
                raise
            os.close(at)
            at = below
        return os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=at)
    finally:
        os.close(at)


@contextlib.contextmanager
def beneath(root: str | None):
    """Within it, open_listed opens a path below `root` as open_member does, one folder at a time from root. The
    outermost root holds: the folder a user named, whose names the listing joined, guards the sub-folder it picked
    (checkpoint-5 swapped for a link is refused too, where its own real path would follow the link)."""
    if root is None or _BENEATH.get() is not None:
        yield
        return
    token = _BENEATH.set(os.path.abspath(root))
    try:
        yield
    finally:
        _BENEATH.reset(token)


def open_listed(path: str) -> int:
    """A listed file opened read-only without blocking or following a final link; below the root `beneath` names,
    none of its folders followed either: the listing holds no link, so a folder swapped for one since (the
    checkpoint's own, for another checkpoint or /etc) fails (ELOOP) instead of being read through."""
    root = _BENEATH.get()
    if root is not None:
        rel = os.path.relpath(os.path.abspath(path), root)
        if is_plain(rel):
            return _open_beneath(os.path.realpath(root), rel)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)


def read_member(root: str, rel, size: int | None = None, *, offset: int = 0, length: int | None = None,
                most: tuple[int, str] | None = None) -> bytes:
    """Bytes of a member (or of [offset, offset+length) inside it), never past its declared or actual size; with
    `most` (bytes, what the file is), one longer than that is refused before any of it is read."""
    fd = open_member(root, rel, size)
    try:
        end = os.fstat(fd).st_size if size is None else size
        if length is None:
            length = end - offset
        if offset < 0 or length < 0 or offset + length > end:
            raise _bad(root, rel, f"is read at {offset}+{length}, past its {end} bytes")
        if most is not None and length > most[0]:
            raise CkptbenchError(f"{os.path.join(root, rel)}: {length} bytes, more than {most[1]} ever holds (at most "
                                 f"{most[0] >> 20} MiB); the file is damaged or crafted: check where the checkpoint "
                                 "came from")
        out = bytearray()
        while len(out) < length:
            chunk = os.pread(fd, min(length - len(out), 16 << 20), offset + len(out))
            if not chunk:
                raise CkptbenchError(f"{os.path.join(root, rel)}: shorter than the checkpoint says", exit_code=1)
            out += chunk
        return bytes(out)
    finally:
        os.close(fd)
