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


def _read(root: str, rel: str, errors: str = "surrogateescape") -> str | Unknown:
    """A /proc or /sys text, whatever bytes it holds: mountinfo shows a mount point's bytes as they are (one not UTF-8
    on the box made every command a UnicodeDecodeError), kept as os.fsdecode keeps a path so it still matches one."""
    path = os.path.join(root, rel.lstrip("/"))
    try:
        with open(path, encoding="utf-8", errors=errors) as f:
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


def ulimit_nofile(root: str = "/") -> tuple[int, int] | Unknown:
    """(soft, hard) open-file limits of this process, from /proc/self/limits ("unlimited" as -1)."""
    text = _read(root, "proc/self/limits")
    if isinstance(text, Unknown):
        return text
    for line in text.splitlines():
        if line.startswith("Max open files"):
            parts = line.split()
            try:
                return tuple(-1 if v == "unlimited" else int(v) for v in parts[3:5])  # type: ignore[return-value]
            except (ValueError, IndexError):
                break
    return Unknown("no 'Max open files' line in /proc/self/limits")


def fds_in_use(root: str = "/") -> int | Unknown:
    path = os.path.join(root, "proc/self/fd")
    try:
        return len(os.listdir(path))
    except OSError as exc:
        return Unknown(f"{path}: {exc.strerror}")


def own_peak_rss() -> int:
    """This process's peak resident bytes since its exec (VmHWM, its memory map's high-water mark). Not ru_maxrss:
    exec records the map it replaces there, so a child of a 5 GiB parent reports 5 GiB whatever it used (every
    peer in the peers bench read 5367 MiB, the bench's own size). ru_maxrss only where /proc says nothing."""
    import resource

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def loadavg(root: str = "/") -> tuple[float, float, float] | Unknown:
    text = _read(root, "proc/loadavg")
    if isinstance(text, Unknown):
        return text
    try:
        a, b, c = (float(x) for x in text.split()[:3])
        return a, b, c
    except ValueError:
        return Unknown("proc/loadavg: not numbers")


def cpu_count(root: str = "/") -> int | Unknown:
    text = _read(root, "proc/cpuinfo")
    if isinstance(text, Unknown):
        return text
    n = sum(1 for line in text.splitlines() if line.startswith("processor"))
    return n or Unknown("no processor lines in /proc/cpuinfo")


def transparent_hugepages(root: str = "/") -> str | Unknown:
    text = _read(root, "sys/kernel/mm/transparent_hugepage/enabled")
    if isinstance(text, Unknown):
        return text
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return Unknown("no [selected] mode in transparent_hugepage/enabled")


def scheduler(device: str, root: str = "/") -> str | Unknown:
    for rel in (f"sys/dev/block/{device}/queue/scheduler", f"sys/dev/block/{device}/../queue/scheduler"):
        text = _read(root, rel)
        if isinstance(text, str):
            for word in text.split():
                if word.startswith("["):
                    return word.strip("[]")
            return text.strip()
    return Unknown(f"no queue/scheduler for block device {device}")


def mount_options(m: Mount) -> dict[str, str | bool]:
    """Mount options as a dict: flags map to True, key=value to the value."""
    out: dict[str, str | bool] = {}
    for opt in m.options.split(","):
        if not opt:
            continue
        key, eq, value = opt.partition("=")
        out[key] = value if eq else True
    return out


def nfs_server(m: Mount) -> str | None:
    """The server of an NFS mount source ("host:/export" → "host")."""
    if not m.fs_type.startswith("nfs") or ":" not in m.source:
        return None
    return m.source.rsplit(":", 1)[0].strip("[]")


@dataclass(frozen=True)
class DiskStats:
    ios: int  # reads + writes completed
    ticks_ms: int  # time the device had I/O in flight
    wait_ms: int  # sum of time reads and writes waited


def diskstats_line(device: str, root: str = "/") -> list[int] | Unknown:
    """The counters of the /proc/diskstats line of major:minor, from field 3 on (reads completed, merged, sectors
    read, ms reading, writes completed, merged, sectors written, ms writing, in flight, ms busy, weighted ms...)."""
    text = _read(root, "proc/diskstats")
    if isinstance(text, Unknown):
        return text
    major, _, minor = device.partition(":")
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 14 and f[0] == major and f[1] == minor:
            try:
                return [int(x) for x in f[3:]]
            except ValueError:
                break
    return Unknown(f"no diskstats line for {device}")


def diskstats(device: str, root: str = "/") -> DiskStats | Unknown:
    """Reads, writes, busy and wait time of major:minor (a partition's numbers count toward its disk)."""
    c = diskstats_line(device, root)
    return c if isinstance(c, Unknown) else DiskStats(c[0] + c[4], c[9], c[3] + c[7])


def disk_util(before: DiskStats, after: DiskStats, seconds: float) -> dict[str, float]:
    """%util and await (ms) between two diskstats samples, as iostat -x computes them."""
    ios = after.ios - before.ios
    return {"util_pct": min(100.0, (after.ticks_ms - before.ticks_ms) / (seconds * 1000) * 100) if seconds > 0 else 0.0,
            "await_ms": (after.wait_ms - before.wait_ms) / ios if ios else 0.0, "iops": ios / seconds if seconds else 0.0}


def tcp_counters(root: str = "/") -> dict[str, int] | Unknown:
    """OutSegs and RetransSegs from /proc/net/snmp."""
    text = _read(root, "proc/net/snmp")
    if isinstance(text, Unknown):
        return text
    rows = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        return Unknown("no Tcp lines in /proc/net/snmp")
    try:
        values = dict(zip(rows[0][1:], (int(v) for v in rows[1][1:])))
        return {"OutSegs": values["OutSegs"], "RetransSegs": values["RetransSegs"]}
    except (KeyError, ValueError):
        return Unknown("Tcp counters malformed")


def retransmit_rate(before: dict[str, int], after: dict[str, int]) -> float:
    sent = after["OutSegs"] - before["OutSegs"]
    return (after["RetransSegs"] - before["RetransSegs"]) / sent if sent > 0 else 0.0


def openers(directory: str, root: str = "/", exclude_pid: int | None = None) -> list[tuple[int, str, int]] | Unknown:
    """(pid, command, files) of processes with files open under `directory`: scanners, indexers, agents."""
    proc = os.path.join(root, "proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError as exc:
        return Unknown(f"{proc}: {exc.strerror}")
    target = directory.rstrip("/") + "/"
    found = []
    for pid in pids:
        if exclude_pid is not None and int(pid) == exclude_pid:
            continue
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            links = [os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)]
        except OSError:
            continue  # another user's process, or it exited
        hits = sum(1 for link in links if link.startswith(target))
        if hits:
            comm = _read(root, f"proc/{pid}/comm", errors="replace")  # any bytes (PR_SET_NAME): only shown
            found.append((int(pid), comm.strip() if isinstance(comm, str) else "?", hits))
    return found


def lustre_stripe(path: str) -> dict | Unknown:
    """`lfs getstripe -c -S` of a path when the lfs tool exists."""
    import shutil
    import subprocess

    lfs = shutil.which("lfs")
    if not lfs:
        return Unknown("lfs not installed")
    try:
        out = subprocess.run([lfs, "getstripe", "-c", "-S", path], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Unknown(f"lfs getstripe: {exc}")
    nums = [int(x) for x in out.stdout.split() if x.lstrip("-").isdigit()]
    if out.returncode != 0 or len(nums) < 2:
        return Unknown(f"lfs getstripe failed: {out.stderr.strip()[:100]}")
    return {"stripe_count": nums[0], "stripe_size": nums[1]}


PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


def s3_endpoint(environ: dict[str, str]) -> dict:
    """Endpoint, region, proxies and retry settings an S3 client will use, from the standard AWS variables.

    Never returns credentials; proxy URLs lose any user:password part.
    """
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        from urllib.parse import urlsplit

        host = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}").hostname or endpoint
    else:
        host = f"s3.{region}.amazonaws.com" if region else "s3.amazonaws.com"
    proxies = {}
    for k in PROXY_VARS:
        if environ.get(k):
            v = environ[k]
            scheme, sep, rest = v.partition("://")
            proxies[k] = (scheme + sep if sep else "") + (rest if sep else scheme).rsplit("@", 1)[-1]
    return {
        "endpoint_host": host,
        "region": region,
        "regional": host != "s3.amazonaws.com",
        "vpc_endpoint": ".vpce." in host or host.startswith("bucket.vpce-"),
        "proxies": proxies,
        "retry_mode": environ.get("AWS_RETRY_MODE"),
        "max_attempts": environ.get("AWS_MAX_ATTEMPTS"),
    }


def size_histogram(sizes: list[int]) -> dict[str, int]:
    """File counts by size class: the shape of a checkpoint's small-file tail."""
    edges = [(64 << 10, "<64KiB"), (1 << 20, "64KiB-1MiB"), (16 << 20, "1-16MiB"), (256 << 20, "16-256MiB")]
    out = {label: 0 for _, label in edges} | {">=256MiB": 0}
    for s in sizes:
        for edge, label in edges:
            if s < edge:
                out[label] += 1
                break
        else:
            out[">=256MiB"] += 1
    return out


def gpus() -> dict | Unknown:
    """GPU count and memory from torch.cuda, else nvidia-smi; Unknown when neither tells."""
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return {"count": n, "memory_bytes": [torch.cuda.get_device_properties(i).total_memory for i in range(n)]}
    except Exception as exc:  # a broken CUDA install raises many kinds
        return Unknown(f"torch.cuda: {type(exc).__name__}")
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"count": 0, "memory_bytes": []}
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        mems = [int(x) * (1 << 20) for x in out.stdout.split()]
        return {"count": len(mems), "memory_bytes": mems}
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return Unknown(f"nvidia-smi: {exc}")


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fs_type: str
    source: str
    options: str
    device: str  # major:minor


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def options_once(options: str | None) -> str | None:
    """A mount's options as shown, each once: mount_of keeps mountinfo's per-mount and superblock options joined as
    they are (`rw,relatime,rw,discard`), and `rw` read twice."""
    if not isinstance(options, str):
        return options
    return ",".join(dict.fromkeys(x for x in options.split(",") if x))


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
            m = Mount(mp, parts[sep + 1], _unescape(parts[sep + 2]), parts[5] + "," + parts[sep + 3], parts[2])
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
