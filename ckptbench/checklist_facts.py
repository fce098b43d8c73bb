"""The facts the checklist judges, gathered once from probes, the source and (optionally) a quick sweep."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import fastio

from ckptbench import manifest as mf
from ckptbench import probes, storage, tree
from ckptbench.errors import CkptbenchError

SAMPLE_S = 1.0  # the window for rates (disk %util, TCP retransmits)


@dataclass
class Facts:
    source: str
    scheme: str | None = None
    files: int = 0
    sizes: list[int] = field(default_factory=list)
    open_rate: float | None = None  # files opened and closed per second
    world_size: int | None = None
    mount: probes.Mount | probes.Unknown | None = None
    preset: storage.Preset | None = None
    ulimit: tuple[int, int] | probes.Unknown | None = None
    fds: int | probes.Unknown | None = None
    meminfo: dict | probes.Unknown | None = None
    sysctls: dict = field(default_factory=dict)
    read_ahead_kb: int | probes.Unknown | None = None
    scheduler: str | probes.Unknown | None = None
    disk: dict | probes.Unknown | None = None
    retransmit_rate: float | probes.Unknown | None = None
    openers: list | probes.Unknown | None = None
    gpus: dict | probes.Unknown | None = None
    residency_now: float | None = None
    evict_residency: float | probes.Unknown | None = None
    stripe: dict | probes.Unknown | None = None
    s3: dict | None = None
    concurrency: int = 8
    sweep: dict | None = None  # SweepResult.to_json()
    thp: str | probes.Unknown | None = None

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


def _open_rate(paths: list[str], limit: int = 2000) -> float | None:
    """Files opened, stat'ed and closed per second: the metadata cost each small file adds."""
    sample = paths[:limit]
    if not sample:
        return None
    t0 = time.perf_counter()
    for p in sample:
        try:
            fd = os.open(p, os.O_RDONLY)
            os.fstat(fd)
            os.close(fd)
        except OSError:
            pass
    dt = time.perf_counter() - t0
    return len(sample) / dt if dt > 0 else None


def gather(source: str, *, root: str = "/", concurrency: int = 8, quick_sweep: bool = False,
           environ: dict | None = None, probe_cache: bool = True) -> Facts:
    """Reads every fact; each probe fails soft, so a missing one becomes 'unknown' in its item, not a crash."""
    if source.startswith("s3://"):
        return _gather_s3(source, root, concurrency, quick_sweep, environ)
    if not os.path.isdir(source):
        raise CkptbenchError(f"{source}: no such directory; point at a checkpoint directory")
    paths = tree.files(source)
    if not paths:
        raise CkptbenchError(f"{source}: empty; point at a checkpoint directory")
    f = Facts(source=source, concurrency=concurrency)
    f.files = len(paths)
    f.sizes = [os.path.getsize(p) for p in paths]
    f.open_rate = _open_rate(paths)
    man = mf.read(source)
    f.world_size = man.world_size if man is not None and man.world_size else None
    f.mount = probes.mount_of(source, root)
    presets = storage.load_all()
    if isinstance(f.mount, probes.Mount):
        f.preset = storage.match(presets, scheme=None, fs_type=f.mount.fs_type, source=f.mount.source)
        f.read_ahead_kb = probes.read_ahead_kb(f.mount.device, root)
        f.scheduler = probes.scheduler(f.mount.device, root)
        if f.mount.fs_type == "lustre":
            f.stripe = probes.lustre_stripe(max(paths, key=os.path.getsize))
    f.ulimit = probes.ulimit_nofile(root)
    f.fds = probes.fds_in_use(root)
    f.meminfo = probes.meminfo(root)
    f.thp = probes.transparent_hugepages(root)
    f.sysctls = {k: probes.sysctl(k, root) for k in (
        "vm.dirty_ratio", "vm.dirty_background_ratio", "vm.dirty_bytes", "vm.dirty_background_bytes",
        "vm.dirty_expire_centisecs", "net.core.somaxconn")}
    f.openers = probes.openers(os.path.realpath(source) if root == "/" else source, root, exclude_pid=os.getpid())
    f.gpus = probes.gpus()
    f.s3 = probes.s3_endpoint(dict(environ if environ is not None else os.environ))
    _sample_rates(f, root)
    if probe_cache:
        f.residency_now = fastio.residency(paths).fraction
        f.evict_residency = _evict_probe(paths)
    if quick_sweep:
        from ckptbench.sweep import sweep

        levels = sorted({1, 4, 8, 16, 32, concurrency})
        f.sweep = sweep(source, levels, repeats=1, cache="cold").to_json()
    return f


def _gather_s3(source: str, root: str, concurrency: int, quick_sweep: bool, environ) -> Facts:
    """An S3 prefix: sizes from the listing, the endpoint from the environment, local limits and memory."""
    from ckptbench.pipeline import list_checkpoint

    listing = list_checkpoint(source, concurrency)
    f = Facts(source=source, scheme="s3", concurrency=concurrency)
    f.sizes = [x.size or 0 for x in listing.files]
    f.files = len(f.sizes)
    f.world_size = listing.manifest.world_size if listing.manifest and listing.manifest.world_size else None
    f.preset = storage.match(storage.load_all(), scheme="s3", fs_type=None)
    f.ulimit = probes.ulimit_nofile(root)
    f.fds = probes.fds_in_use(root)
    f.meminfo = probes.meminfo(root)
    f.sysctls = {k: probes.sysctl(k, root) for k in ("vm.dirty_ratio", "vm.dirty_background_ratio", "vm.dirty_bytes")}
    f.openers = []
    f.gpus = probes.gpus()
    f.s3 = probes.s3_endpoint(dict(environ if environ is not None else os.environ))
    f.evict_residency = probes.Unknown("S3 has no local page cache: every read is cold")
    t0 = probes.tcp_counters(root)
    time.sleep(SAMPLE_S if root == "/" else 0)
    t1 = probes.tcp_counters(root)
    f.retransmit_rate = probes.retransmit_rate(t0, t1) if isinstance(t0, dict) and isinstance(t1, dict) else t0
    if quick_sweep:
        from ckptbench.sweep import sweep

        f.sweep = sweep(source, sorted({1, 4, 8, 16, 32, concurrency}), repeats=1).to_json()
    return f


def _sample_rates(f: Facts, root: str) -> None:
    """Disk %util/await and TCP retransmits over one short window."""
    dev = f.mount.device if isinstance(f.mount, probes.Mount) else None
    d0 = probes.diskstats(dev, root) if dev else probes.Unknown("no block device")
    t0 = probes.tcp_counters(root)
    start = time.perf_counter()
    time.sleep(SAMPLE_S if root == "/" else 0)
    dt = time.perf_counter() - start
    d1 = probes.diskstats(dev, root) if dev else d0
    t1 = probes.tcp_counters(root)
    f.disk = probes.disk_util(d0, d1, dt) if isinstance(d0, probes.DiskStats) and isinstance(d1, probes.DiskStats) else d0
    if isinstance(t0, dict) and isinstance(t1, dict):
        f.retransmit_rate = probes.retransmit_rate(t0, t1)
    else:
        f.retransmit_rate = t0 if isinstance(t0, probes.Unknown) else t1


def _evict_probe(paths: list[str]) -> float | probes.Unknown:
    """Residency of the largest file right after evicting it: can this box measure a cold read at all?"""
    target = max(paths, key=os.path.getsize)
    try:
        fastio.evict([target])
        return fastio.residency([target]).fraction
    except fastio.FastIOError as exc:
        return probes.Unknown(f"evict {target}: {exc.strerror}")
