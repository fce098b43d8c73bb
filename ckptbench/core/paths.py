"""Where the packaged data lies: the profiles (checkpoint shapes, storage presets) read by every layer."""

from __future__ import annotations

import os


def _profiles_dir() -> str:
    """Installed: ckptbench/profile_data inside the package (setup.py maps it); in a checkout: profiles/."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # ckptbench/
    installed = os.path.join(here, "profile_data")
    return installed if os.path.isdir(installed) else os.path.join(os.path.dirname(here), "profiles")


PROFILES_DIR = _profiles_dir()


def require_checkpoint_dir(where: str) -> None:
    """One line when `where` is not a directory, the same from every command that takes one: a shard named in
    place of its folder was "no such directory" from verify, load, pack and upload, though it is there."""
    from ckptbench.core.errors import CkptbenchError

    if not os.path.exists(where):
        raise CkptbenchError(f"{where}: no such directory; point at a checkpoint directory")
    if os.path.isfile(where):  # a new user's `run model.safetensors`: the folder is what a restore loads
        import shlex

        raise CkptbenchError(f"{where}: a file, not a directory; point at the checkpoint directory that "
                             f"holds it ({shlex.quote(os.path.dirname(where) or '.')})")
    if not os.path.isdir(where):
        raise CkptbenchError(f"{where}: not a directory; point at a checkpoint directory")


def new_file_beside(path: str, mode: int = 0o666) -> tuple[int, str]:
    """(fd, name) of a new file beside `path` under a name nobody could have planted a link at: random, created here
    (O_EXCL), never through a symlink (a predictable `results.csv.tmp-PID` or `floor.json.tmp-PID` linked to another
    file had root truncate that file). Only a file made here is the caller's to remove."""
    import secrets

    for _ in range(16):
        tmp = f"{path}.tmp-{secrets.token_hex(8)}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: no free temporary name beside it")


def replace_whole(path: str, text: str, mode: int = 0o644) -> str | None:
    """`path` replaced whole by `text` (a reader sees the old file or the new one, never half of one; a link at `path`
    is replaced, not written through); why it could not be, or None. Only the temporary file made here is removed."""
    try:
        fd, tmp = new_file_beside(path, mode)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        with open(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return None
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return exc.strerror or str(exc)


def read_small(path: str, limit: int) -> bytes | None:
    """A small file's bytes (a profile, a preset), opened without blocking (a FIFO swapped in after a check) and never
    read past `limit`; None when it is not a regular file of at most `limit` bytes. OSError when it cannot be opened."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        data = os.read(fd, limit + 1) if stat.S_ISREG(st.st_mode) and st.st_size <= limit else None
    finally:
        os.close(fd)
    return None if data is None or len(data) > limit else data


def read_toml(path: str, limit: int, what: str, hint: str) -> dict:
    """A small TOML file of ours to take from anyone (a profile, a storage preset): read as read_small reads it, and
    every way it can be wrong one line naming it, `what` it should be and the `hint` (a file to compare with)."""
    import tomllib

    from ckptbench.core.errors import CkptbenchError, printable, shown

    try:
        data = read_small(path, limit)
    except OSError as exc:
        raise CkptbenchError(f"{printable(path)}: cannot read the {what} ({exc.strerror})") from None
    if data is None:
        raise CkptbenchError(f"{printable(path)}: not a {what} (a regular file of at most {limit >> 10} KiB); {hint}")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:  # RecursionError: a traceback
        why = "nested too deep" if isinstance(exc, RecursionError) else \
            "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise CkptbenchError(f"{printable(path)}: not a valid {what} ({shown(printable(why), 120)}); {hint}") from None


def source_identity(source: str) -> str:
    """The source as records name it, the same whatever directory it was named from: an object store's URL without
    its trailing slash, a local path that is there resolved (a knee swept as `ckpts/x` was not found by `check
    /abs/ckpts/x`, and compare called the two one checkpoint's runs 'different sources'); anything else (read's
    several paths, joined) as given."""
    if "://" in source:
        return source.rstrip("/")
    return os.path.realpath(source) if source and os.path.exists(source) else source
