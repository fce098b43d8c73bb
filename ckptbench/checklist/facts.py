"""The facts the checklist judges, gathered once from probes, the source, the results file (a knee, a save on record)
and (optionally) a quick sweep."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import fastio

from ckptbench.checklist import efficiency, loads
from ckptbench.core import concurrency as conc
from ckptbench.core import options as o
from ckptbench.system import pagecache as conditions
from ckptbench.system import fuse as fuse_probes
from ckptbench.system import probes
from ckptbench.system import storage
from ckptbench.sources import open_source
from ckptbench.restore.sweep import MeasuredKnee, measured_knee, recorded_knee

SAMPLE_S = 1.0  # the window for rates (disk %util, TCP retransmits)


@dataclass
class Facts:
    source: str
    scheme: str | None = None
    page_cache: bool = True  # False for an object store: nothing local to evict, every read goes to the server
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
    concurrency: int = conc.DEFAULT
    sweep: dict | None = None  # SweepResult.to_json()
    knee: MeasuredKnee | None = None  # this check's quick sweep, else the newest knee recorded for the source
    thp: str | probes.Unknown | None = None
    unreadable: list = field(default_factory=list)  # (path, why): files and directories this user cannot read
    fuse: dict | probes.Unknown | None = None  # fuse_probes.fuse_daemon of a FUSE mount: kind, pid, its options
    measured_save: dict | None = None  # plan.measured_save: the newest save recorded in the results file
    floor_facts: efficiency.FloorFacts | None = None  # the floor and a short restore; None: not asked for
    results: str | None = None  # the results file knees and saves are read from: the advice names it
    headers: loads.Headers = field(default_factory=loads.Headers)  # read as inspect reads them: does it load
    layout: dict | None = None  # which checkpoint of the folder was checked, and why (as run and inspect say it)
    checkpoint: str | None = None  # its directory (the folder given, or the one chosen in it)
    packable: int | None = None  # small files `ckptbench pack` would pack; None: not told (no files on disk)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


def unknown(x) -> bool:
    """A fact that could not be had: not gathered (None), or a probe's Unknown."""
    return x is None or isinstance(x, probes.Unknown)


def reason(x) -> str:
    """Why a fact is unknown: the probe's own reason, else that it was not measured."""
    return x.reason if isinstance(x, probes.Unknown) else "not measured"


def _open_probe(paths: list[str], limit: int = 2000) -> tuple[float | None, list[tuple[str, str]]]:
    """Every file opened, stat'ed and closed once: the rate over the first `limit` (the metadata cost each
    small file adds) and the files this user cannot open, with the reason."""
    failed: list[tuple[str, str]] = []
    rate = None
    t0 = time.perf_counter()
    for i, p in enumerate(paths):
        if i == limit:
            rate = limit / (time.perf_counter() - t0)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            os.fstat(fd)
            os.close(fd)
        except OSError as exc:
            failed.append((p, exc.strerror or str(exc)))
    if paths and rate is None:
        dt = time.perf_counter() - t0
        rate = len(paths) / dt if dt > 0 else None
    return rate, failed


def sweep_options():
    """The read options `ckptbench sweep` takes when none are given (core/options' defaults; the sweep's hash is
    none): the quick sweep measured pread while sweep read direct, and the two advised different knees."""
    from ckptbench.sources import ReadOptions

    return ReadOptions(read=o.READ.default, hash=o.OFF, block_size=o.BLOCK_SIZE.default,
                       part_size=o.PART_SIZE.default, s3_client=o.S3_CLIENT.default)


def gather(source: str, *, root: str = "/", concurrency: int = conc.DEFAULT, quick_sweep: bool = False,
           environ: dict | None = None, probe_cache: bool = True, results: str | None = None,
           floor: bool = False, measure_floor: bool = True, pick: str | None = None) -> Facts:
    """Reads every fact; each probe fails soft, so a missing one becomes 'unknown' in its item, not a crash.
    A source holding no checkpoint at all raises run's one line (bad input). With `floor` it also measures this
    box's floor (or reads it cached; only cached without `measure_floor`, as the dashboard, which never measures)
    and runs a short cold restore: that evicts the checkpoint, so without `probe_cache` (a screen beside a running
    restore) it is left off, and said.

    What differs between storage kinds comes from the source (its scheme, mount, page cache), never from a
    branch on the URL here."""
    src = open_source(source, pick)
    listing = src.list()
    headers = loads.read(src, listing)  # first: a directory with no checkpoint is refused before any probe
    man = listing.manifest
    paths = [f.path for f in listing.files] if src.files_on_disk else []
    f = Facts(source=source, scheme=src.scheme, concurrency=concurrency, results=results or None, headers=headers,
              layout=listing.layout.describe() if listing.layout is not None else None, checkpoint=listing.source)
    if results:
        from ckptbench.plan.shape import measured_save

        f.measured_save = measured_save(results)
    f.sizes = [x.size or 0 for x in listing.files]
    f.files = len(f.sizes)
    f.open_rate, unopened = _open_probe(paths)
    f.packable = _packable(listing.source) if src.files_on_disk else None  # the checkpoint checked, not its folder
    f.unreadable = list(listing.skipped) + unopened
    f.world_size = man.world_size if man is not None and man.world_size else None
    f.mount = src.mount(root) if src.files_on_disk else None
    mount = f.mount if isinstance(f.mount, probes.Mount) else None
    f.preset = storage.match(storage.load_all(), scheme=src.scheme, fs_type=mount.fs_type if mount else None,
                             source=mount.source if mount else "")
    if mount is not None:
        f.read_ahead_kb = probes.read_ahead_kb(mount.device, root)
        f.scheduler = probes.scheduler(mount.device, root)
        if mount.fs_type.startswith("fuse"):
            f.fuse = fuse_probes.fuse_daemon(mount, root)
        if mount.fs_type == "lustre":
            f.stripe = probes.lustre_stripe(max(paths, key=os.path.getsize))
    f.ulimit = probes.ulimit_nofile(root)
    f.fds = probes.fds_in_use(root)
    f.meminfo = probes.meminfo(root)
    f.thp = probes.transparent_hugepages(root)
    f.sysctls = {k: probes.sysctl(k, root) for k in (
        "vm.dirty_ratio", "vm.dirty_background_ratio", "vm.dirty_bytes", "vm.dirty_background_bytes",
        "vm.dirty_expire_centisecs", "net.core.somaxconn")}
    f.openers = (probes.openers(os.path.realpath(source) if root == "/" else source, root, exclude_pid=os.getpid())
                 if paths else [])
    f.gpus = probes.gpus()
    f.s3 = probes.s3_endpoint(dict(environ if environ is not None else os.environ))
    _sample_rates(f, root)
    f.page_cache = src.has_page_cache
    if not src.has_page_cache:
        f.evict_residency = probes.Unknown(f"{src.scheme or 'this source'} has no local page cache: every read is cold")
    elif headers.error is not None:  # its files are not a checkpoint a restore reads: their pages are walked for
        # nothing (a crafted sparse config.json claiming 256 GiB took 13 s of them), and evicting them proves nothing
        f.evict_residency = probes.Unknown(loads.NOT_PROBED)
    elif probe_cache:
        f.residency_now = conditions.residency_of(paths)
        f.evict_residency = _evict_probe(paths)
    if quick_sweep:
        from ckptbench.restore.sweep import sweep

        levels = sorted({1, 4, 8, 16, 32, concurrency})
        res = sweep(src, levels, repeats=1, cache="cold", opts=sweep_options())
        f.knee = measured_knee(listing.source, {lv: s["median"] for lv, s in res.gbps.items()}, "quick sweep")
        f.sweep = res.to_json() | {"date": f.knee.date}
    elif results:
        # the checkpoint a resume loads, as sweep records it: a trainer's folder named here was no knee of its
        # checkpoint-N that `sweep FOLDER --results` had just recorded; else the folder's (an older auto-tune's)
        f.knee = recorded_knee(results, listing.source) or recorded_knee(results, source)
    if floor:
        f.floor_facts = _floor_facts(f, src, listing, root, probe_cache, measure_floor)
    return f


LEFT_OFF = ("the short cold restore was left off: it evicts the checkpoint's files, which a restore running beside "
            "it reads; run the item again when nothing reads them")


def _floor_facts(f: Facts, src, listing, root: str, probe_cache: bool, measure: bool) -> efficiency.FloorFacts:
    """The floor and a short restore, unless the checkpoint cannot be restored at all (then there is nothing to
    hold against the floor, and no concurrency to advise) or the files must not be evicted now."""
    if f.headers.error is not None:
        return efficiency.FloorFacts(why=loads.NOT_LOADED)
    if not probe_cache:
        return efficiency.FloorFacts(why=LEFT_OFF)
    return efficiency.gather(src, listing, f.concurrency, root, frozenset(p for p, _ in f.unreadable),
                             measure=measure)


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


def _packable(source: str) -> int | None:
    """How many files `ckptbench pack SOURCE` would pack (the small-files item advised it where it packs nothing)."""
    from ckptbench.checkpoint import packs
    from ckptbench.core.errors import CkptbenchError

    try:
        return len(packs.packable(source))
    except (CkptbenchError, OSError):
        return None


def _evict_probe(paths: list[str]) -> float | probes.Unknown:
    """Residency of the largest file right after evicting it: can this box measure a cold read at all?"""
    target = max(paths, key=os.path.getsize)
    try:
        fastio.evict([target])
        return fastio.residency([target]).fraction
    except fastio.FastIOError as exc:
        return probes.Unknown(f"evict {target}: {exc.strerror}")
