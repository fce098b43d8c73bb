"""System facts, each a pure reader of a root directory ("/" by default) that fails soft: Unknown, with the reason."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Unknown:
    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"unknown ({self.reason})"


def _read(root: str, rel: str) -> str | Unknown:
    path = os.path.join(root, rel.lstrip("/"))
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        return Unknown(f"{path}: {exc.strerror or exc}")


def _int(root: str, rel: str) -> int | Unknown:
    text = _read(root, rel)
    if isinstance(text, Unknown):
        return text
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return Unknown(f"{rel}: not a number")


def sysctl(name: str, root: str = "/") -> int | Unknown:
    return _int(root, "proc/sys/" + name.replace(".", "/"))


def meminfo(root: str = "/") -> dict[str, int] | Unknown:
    """/proc/meminfo in bytes."""
    text = _read(root, "proc/meminfo")
    if isinstance(text, Unknown):
        return text
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def cpu_model(root: str = "/") -> str | Unknown:
    text = _read(root, "proc/cpuinfo")
    if isinstance(text, Unknown):
        return text
    for line in text.splitlines():
        if line.startswith(("model name", "Model", "cpu model")):
            return line.split(":", 1)[1].strip()
    return Unknown("no model name in /proc/cpuinfo")


def instance_type(root: str = "/") -> str | Unknown:
    """What the machine calls itself (DMI product name: an EC2 instance type on AWS)."""
    text = _read(root, "sys/class/dmi/id/product_name")
    return text.strip() if isinstance(text, str) else text


def kernel() -> str:
    return platform.release()


def ulimit_nofile() -> tuple[int, int] | Unknown:
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError) as exc:
        return Unknown(str(exc))


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fs_type: str
    source: str
    options: str
    device: str  # major:minor


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path: str, root: str = "/") -> Mount | Unknown:
    """The mount holding `path` (longest mount point prefix in mountinfo); options merge per-mount and super."""
    text = _read(root, "proc/self/mountinfo")
    if isinstance(text, Unknown):
        return text
    target = os.path.realpath(path) if root == "/" else path
    best: Mount | None = None
    for line in text.splitlines():
        parts = line.split()
        try:
            sep = parts.index("-")
            mp = _unescape(parts[4])
            m = Mount(mp, parts[sep + 1], parts[sep + 2], parts[5] + "," + parts[sep + 3], parts[2])
        except (ValueError, IndexError):
            continue
        inside = target == mp or target.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = m
    return best or Unknown(f"no mount holds {path}")


def read_ahead_kb(device: str, root: str = "/") -> int | Unknown:
    """read_ahead_kb of the block device major:minor (a partition reports its disk's queue)."""
    base = f"sys/dev/block/{device}"
    direct = _int(root, f"{base}/queue/read_ahead_kb")
    if not isinstance(direct, Unknown):
        return direct
    return _int(root, f"{base}/../queue/read_ahead_kb")
