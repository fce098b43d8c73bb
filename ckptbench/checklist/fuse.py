"""What the checklist knows about FUSE mounts of object stores: each daemon's tuning and cache options, how its
options compare with the recommended ones, and what such a mount does to a checkpoint (the FUSE item's verdict,
evidence and fix). checklist.py turns these into items."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.system import fuse as fuse_probes
from ckptbench.system import probes
from ckptbench.checklist.facts import Facts
from ckptbench.core.units import human_bytes

WHY = ("a FUSE mount of an object store is not a filesystem underneath: rename is a copy and a delete, every file is "
       "at least one request, O_DIRECT does not reach the storage, and caching is the daemon's choice")


@dataclass(frozen=True)
class FuseTraits:
    """What a FUSE daemon over an object store does to a checkpoint, and the options that tune it."""
    tuning: dict  # option → recommended value when no storage preset names one (numbers: at least this)
    cache: str  # the option that keeps fetched data on local disk between restores
    endpoint: str | None  # the option naming the object store's endpoint
    flag_style: str  # how the daemon takes options: "-o" (key=value list) or "--" (flags)


DAEMONS = {
    "s3fs": FuseTraits({"parallel_count": 16, "multipart_size": 64, "max_stat_cache_size": 100000}, "use_cache",
                       "url", "-o"),
    "mountpoint-s3": FuseTraits({"max-threads": 64, "read-part-size": 16 << 20}, "cache", "endpoint-url", "--"),
    "goofys": FuseTraits({"stat-cache-ttl": "1h", "type-cache-ttl": "1h"}, "cache", "endpoint", "--"),
    "gcsfuse": FuseTraits({"max-conns-per-host": 100, "file-cache-max-size-mb": -1}, "cache-dir", "custom-endpoint",
                          "--"),
    "rclone": FuseTraits({"vfs-read-chunk-size": "64M", "buffer-size": "64M", "transfers": 16}, "vfs-cache-mode",
                         None, "--"),
}


def on_fuse(f: Facts) -> bool:
    return f.scheme != "s3" and isinstance(f.mount, probes.Mount) and f.mount.fs_type.startswith("fuse")


def daemon(f: Facts) -> tuple[str | None, FuseTraits | None, dict]:
    """The FUSE daemon's kind, what is known of it, and its command-line options ({} when not found)."""
    kind = fuse_probes.fuse_kind(f.mount) if isinstance(f.mount, probes.Mount) else None
    kind = kind if isinstance(kind, str) else None
    opts = f.fuse["options"] if isinstance(f.fuse, dict) else {}
    return kind, DAEMONS.get(kind or ""), opts


def endpoint(f: Facts) -> tuple[str | None, str | None]:
    """(daemon kind, the endpoint its options name)."""
    kind, traits, opts = daemon(f)
    return kind, (opts.get(traits.endpoint) if traits and traits.endpoint else None)


def option_line(traits: FuseTraits, want: dict) -> str:
    if traits.flag_style == "-o":
        return "-o " + ",".join(k if v is True else f"{k}={v}" for k, v in want.items())
    return " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in want.items())


def _short_of(have, want) -> bool:
    """Whether a daemon's option value falls short of the recommended one (numbers: at least; others: set)."""
    if have is None:
        return True
    if isinstance(want, bool) or not isinstance(want, int):
        return False
    try:
        value = int(have)
    except (TypeError, ValueError):
        return False  # "64M", a path: set by hand, trusted
    return want >= 0 and 0 <= value < want


def option_problems(f: Facts, ev: dict, problems: list, fixes: list) -> str | None:
    """Adds a FUSE daemon's option problems (against the preset, else the daemon's own tuning) to the mount-options
    item; returns that item's fix when nothing can be judged (an unknown daemon, or its command line unreadable)."""
    kind, traits, opts = daemon(f)
    ev["daemon"] = kind
    if traits is None:
        return (f"{f.mount.fs_type} is served by a daemon ckptbench does not know: check its read-ahead, parallel "
                "requests and part size (`ps -o args -C DAEMON`)")
    if not isinstance(f.fuse, dict):
        ev["reason"] = f.fuse.reason if isinstance(f.fuse, probes.Unknown) else "not probed"
        return f"{kind}'s options are on its command line, not in /proc/mounts: read them with `ps -o args -C {kind}`"
    want = dict(f.preset.mount_options) if f.preset and f.preset.mount_options else dict(traits.tuning)
    ev["daemon_options"] = opts
    ev["recommended"] = want
    short = [k for k, v in want.items() if _short_of(opts.get(k), v)]
    for k in short:
        problems.append(f"{k}={opts[k]} is below {want[k]}" if k in opts else f"{k} not set ({kind}'s default)")
    if short:
        fixes.append(f"remount {kind} with {option_line(traits, want)}")
    return None


def _cache_hint(kind: str, traits: FuseTraits) -> str:
    value = "full" if kind == "rclone" else "/local/nvme/" + kind + "-cache"
    return f"-o {traits.cache}={value}" if traits.flag_style == "-o" else f"--{traits.cache} {value}"


def judge(f: Facts, small_limit: int) -> tuple[str, dict, str]:
    """(verdict, evidence, fix) of the FUSE item for a source on a FUSE mount."""
    kind, traits, opts = daemon(f)
    ev = {"fs_type": f.mount.fs_type, "mount_source": f.mount.source, "daemon": kind}
    if isinstance(f.fuse, dict):
        ev |= {"daemon_pid": f.fuse["pid"], "daemon_options": opts}
    else:
        ev["daemon_options"] = f.fuse.reason if isinstance(f.fuse, probes.Unknown) else "not probed"
    if traits is None:
        return "unknown", ev, ("find the daemon (`findmnt -T SOURCE`, `ps -ef`); if it fronts an object store, do not "
                               "commit saves by rename and pack small files")
    small = sum(1 for s in f.sizes if s < small_limit)
    cache = opts.get(traits.cache) if isinstance(f.fuse, dict) else None
    ev |= {"rename": "copy + delete (not atomic)", "o_direct": "handled by the daemon's buffers, not the storage",
           "requests_per_small_file": "at least one (HEAD + GET)", "small_files": small, "small_limit_bytes": small_limit,
           "cache": cache if cache is not None else (None if isinstance(f.fuse, dict) else "unknown")}
    fixes = ["rename here copies every byte and then deletes: a save that commits by renaming a temporary directory "
             "is neither atomic nor cheap, so save to local disk and upload, or write through the S3 API",
             "read with --read pread: --read direct measures the daemon's buffers, not a cold read of the store"]
    if small and f.packable != 0:  # 0: pack would refuse it ("nothing to pack"), as the small-files item says
        fixes.append(f"{small} files under {human_bytes(small_limit)} cost a request each: "
                     f"ckptbench pack {f.source} PACKED --target-files 4")
    elif small:
        fixes.append(f"{small} files under {human_bytes(small_limit)} cost a request each, and all are ones a loader "
                     "opens by name (so `ckptbench pack` has nothing it may pack): save fewer, larger files")
    if isinstance(f.fuse, dict) and cache is None:
        fixes.append(f"no {traits.cache}: every restore fetches from the object store again; a node that restores "
                     f"more than once can keep a local copy ({kind}: {_cache_hint(kind, traits)})")
    return "warn", ev, "; ".join(fixes)
