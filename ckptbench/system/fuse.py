"""FUSE mounts: which daemon serves one (s3fs, goofys, mountpoint-s3, gcsfuse, rclone) and the options it was
started with, read from its command line because /proc/mounts shows only user_id/group_id for FUSE."""

from __future__ import annotations

import os

from ckptbench.core.errors import redact
from ckptbench.system.probes import Mount, Unknown, _read

FUSE_DAEMONS = ("s3fs", "goofys", "mountpoint-s3", "gcsfuse", "rclone")
DAEMON_COMMANDS = {"mountpoint-s3": "mount-s3"}  # kinds whose program has another name
_SECRET_KEYS = ("secret", "password", "passwd", "token", "access_key", "credential")


def fuse_kind(m: Mount) -> str | Unknown:
    """The FUSE daemon behind a mount: the fstype's subtype (fuse.s3fs → s3fs), else a known name in the source
    (mountpoint-s3 mounts as plain `fuse` with source `mountpoint-s3`)."""
    if not m.fs_type.startswith("fuse"):
        return Unknown(f"{m.fs_type} is not a FUSE mount")
    sub = m.fs_type.partition(".")[2]
    if sub:
        return sub
    named = [d for d in FUSE_DAEMONS if d in m.source]
    return named[0] if named else Unknown(f"fstype {m.fs_type} carries no subtype and the source {m.source!r} names "
                                          "no known daemon")


def daemon_options(argv: list[str], positionals: tuple[str, ...] = ()) -> dict[str, str | bool]:
    """A FUSE daemon's settings from its command line: `-o a=b,c` pairs and `--flag [value]` / `--flag=value`.

    `positionals` (the mount point) are never taken as a flag's value. Values of keys that look like secrets
    are hidden, so the result can go into a report."""
    out: dict[str, str | bool] = {}
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-o" and args or arg.startswith("-o") and len(arg) > 2:
            for opt in (args.pop(0) if arg == "-o" else arg[2:]).split(","):
                key, eq, value = opt.partition("=")
                if key:
                    out[key] = value if eq else True
        elif arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq and args and not args[0].startswith("-") and args[0].rstrip("/") not in positionals:
                value, eq = args.pop(0), "="
            out[key] = value if eq else True
    for key, value in out.items():
        if isinstance(value, str) and any(w in key.lower() for w in _SECRET_KEYS) and "file" not in key.lower():
            out[key] = "(hidden)"
        elif isinstance(value, str):
            out[key] = redact(value)  # an endpoint URL's user:password (s3fs -o url=http://user:pw@host)
    return out


def fuse_daemon(m: Mount, root: str = "/") -> dict | Unknown:
    """The daemon serving a FUSE mount: its kind, pid and the options on its command line (a FUSE mount hides
    them from /proc/mounts, which shows only user_id/group_id). The process is the one whose arguments name the
    mount point, else the only process of that kind."""
    kind = fuse_kind(m)
    proc = os.path.join(root, "proc")
    try:
        pids = sorted((p for p in os.listdir(proc) if p.isdigit()), key=int)
    except OSError as exc:
        return Unknown(f"{proc}: {exc.strerror}")
    mp = m.mount_point.rstrip("/") or "/"
    command = DAEMON_COMMANDS.get(kind, kind) if isinstance(kind, str) else None
    by_mount, by_kind = [], []
    for pid in pids:
        text = _read(root, f"proc/{pid}/cmdline")
        argv = [a for a in text.split("\0") if a] if isinstance(text, str) else []
        if not argv:
            continue  # a kernel thread, or it exited
        name = os.path.basename(argv[0])
        known = name == command or name in FUSE_DAEMONS or name in DAEMON_COMMANDS.values()
        if known and any(a.rstrip("/") == mp for a in argv[1:]):
            by_mount.append((int(pid), name, argv))
        elif name == command:
            by_kind.append((int(pid), name, argv))
    found = by_mount or (by_kind if len(by_kind) == 1 else [])
    if not found:
        why = f"no {command} process names {mp}" if command else kind.reason
        return Unknown(f"daemon not found: {why} (another user's or another namespace's process?)")
    pid, name, argv = found[0]
    return {"kind": kind if isinstance(kind, str) else name, "pid": pid, "command": name,
            "options": daemon_options(argv, (mp,))}
