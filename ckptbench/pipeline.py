"""The restore as timed stages — list, read, verify, load, device, check — staged or fused, cold or hot."""

from __future__ import annotations

import errno
import gc
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

import fastio
import psutil

from ckptbench import conditions, tree
from ckptbench import manifest as mf
from ckptbench.errors import Cancelled, CkptbenchError

MODES = ("staged", "fused")
PROGRESS_INTERVAL_S = 0.25
Progress = Callable[[str, "fastio.Snapshot | None"], None]


@dataclass(frozen=True)
class RunOptions:
    mode: str = "fused"
    cache: str = "as-is"
    concurrency: int = 8
    read: str = "pread"
    hash: str | None = None  # None: the manifest's hash, else crc32c
    block_size: int = 1 << 20
    device: str = "cpu"
    drop_caches: bool = False
    optimizer_step: bool = False
    part_size: int = 8 << 20  # S3 ranged GET size
    stage_dir: str | None = None  # S3: download here (temporary names, renamed when whole and verified)
    s3_client: str = "threads"  # threads (boto3 + our pool) or crt (awscrt)


@dataclass(frozen=True)
class Listing:
    source: str
    files: list[fastio.FileSpec]
    manifest: mf.Manifest | None
    format: str
    s3: "S3Access | None" = None

    @property
    def bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def rel(self, path: str) -> str:
        if self.s3 is not None:
            return path[len(self.source.rstrip("/")) + 1:]
        return os.path.relpath(path, self.source).replace(os.sep, "/")

    @property
    def rels(self) -> list[str]:
        return [self.rel(f.path) for f in self.files]


@dataclass(frozen=True)
class S3Access:
    client: object
    url: object  # sources.s3.S3Url
    objects: list
    retry_log: object


@dataclass
class RepeatResult:
    stages: dict[str, float]
    notes: dict[str, str]
    rto_s: float
    bytes: int
    files: int
    files_restored: int
    read_gbps: float
    retries: int
    errors: dict[str, int]
    cache: conditions.CacheCondition
    peak_rss_bytes: int
    cpu_s: float
    status: str = "ok"
    problems: list[str] = field(default_factory=list)
    retry_classes: dict[str, int] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return self.files_restored / self.files if self.files else 0.0


def list_checkpoint(source: str, concurrency: int = 16) -> Listing:
    """Enumerate and stat every file (or list every object); the manifest when there is one; the format."""
    from ckptbench.formats import detect
    from ckptbench.sources import s3

    if s3.is_s3(source):
        return _list_s3(source, concurrency)
    if not os.path.exists(source):
        raise CkptbenchError(f"{source}: no such directory; point at a checkpoint directory")
    if not os.path.isdir(source):
        raise CkptbenchError(f"{source}: not a directory; point at a checkpoint directory")
    files = [fastio.FileSpec(p, os.stat(p).st_size) for p in tree.files(source)]
    if not files:
        raise CkptbenchError(f"{source}: empty; point at a checkpoint directory")
    man = mf.read(source)
    fmt = man.format if man is not None and man.format != "unknown" else detect(source)
    return Listing(source, files, man, fmt)


def _list_s3(source: str, concurrency: int) -> Listing:
    from ckptbench.formats import detect_names
    from ckptbench.sources import s3

    url = s3.parse(source)
    log = s3.RetryLog()
    client = s3.make_client(concurrency, retry_log=log)
    objects = s3.list_objects(client, url)
    raw = s3.get_bytes(client, url, mf.MANIFEST_NAME, log) if any(o.rel == mf.MANIFEST_NAME for o in objects) else None
    man = mf.parse(raw, f"{url}/{mf.MANIFEST_NAME}") if raw is not None else None
    base = str(url).rstrip("/")
    files = [fastio.FileSpec(f"{base}/{o.rel}", o.size) for o in objects]
    fmt = man.format if man is not None and man.format != "unknown" else detect_names([o.rel for o in objects], base)
    return Listing(base, files, man, fmt, S3Access(client, url, objects, log))


def memory_needed(listing: Listing, mode: str) -> int:
    """What the loader will hold at its peak: the checkpoint's bytes, plus one shard's copy while staged loads it."""
    total = listing.bytes
    if mode == "staged":
        return total + max((f.size or 0) for f in listing.files)
    return total


def oom_precheck(listing: Listing, mode: str) -> None:
    need = memory_needed(listing, mode)
    avail = psutil.virtual_memory().available
    if need > avail * 0.9:
        raise CkptbenchError(
            f"{listing.source}: a {mode} restore holds about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB is "
            "available; stop before reading. Fix: --mode fused (tensors over the read buffers, no second copy), "
            "safetensors shards, or restore per rank under torchrun")


class _PeakRSS:
    """Peak RSS of this repeat: resets the kernel's high-water mark when it may, else samples."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.sampled = 0
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            self.reset = False

    def sample(self) -> None:
        self.sampled = max(self.sampled, self.proc.memory_info().rss)

    def peak(self) -> int:
        self.sample()
        if self.reset:
            try:
                with open("/proc/self/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            return max(self.sampled, int(line.split()[1]) * 1024)
            except OSError:
                pass
        return self.sampled


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class Run:
    """One repeat of the restore; `handle` is the live engine while the read stage runs (for the UI)."""

    def __init__(self, listing: Listing, opts: RunOptions, progress: Progress | None, cancel: threading.Event | None):
        self.listing = listing
        self.opts = opts
        self.progress = progress
        self.cancel = cancel or threading.Event()
        self.handle: fastio.ReadHandle | None = None
        self.stage = "list"
        self.stage_dir: str | None = None
        self.own_stage = False
        self.stages: dict[str, float] = {}
        self.notes: dict[str, str] = {}

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Cancelled("restore cancelled")

    def _timed(self, name: str, fn):
        self._check_cancel()
        self.stage = name
        if self.progress:
            self.progress(name, None)
        t0 = time.perf_counter()
        out = fn()
        self.stages[name] = time.perf_counter() - t0
        return out

    def _start(self, alg: str):
        o = self.opts
        if self.listing.s3 is not None:
            from ckptbench.sources import s3read

            a = self.listing.s3
            into = "stage" if self.stage_dir else "memory"
            return s3read.start(a.client, a.url, a.objects,
                                s3read.S3ReadOptions(concurrency=o.concurrency, part_size=o.part_size, hash=alg,
                                                     into=into, stage_dir=self.stage_dir, backend=o.s3_client),
                                a.retry_log)
        return fastio.start(self.listing.files, concurrency=o.concurrency, read=o.read, hash=alg,
                            block_size=o.block_size, chunk_size=max(64 << 20, o.block_size), into_memory=True)

    def _read(self, alg: str) -> fastio.ReadResult:
        self.handle = self._start(alg)
        with self.handle as h:
            while (res := h.wait(PROGRESS_INTERVAL_S)) is None:
                if self.cancel.is_set():
                    h.cancel()
                self.rss.sample()
                if self.progress:
                    self.progress("read", h.snapshot())
        if self.progress:
            self.progress("read", res.final)
        if res.cancelled and self.cancel.is_set():
            raise Cancelled("restore cancelled")
        return res

    def _hash_buffers(self, res: fastio.ReadResult, alg: str) -> dict[str, str]:
        """Staged verify: hash what the read stage left in memory (or in the staging directory)."""
        if self.stage_dir:
            local = [os.path.join(self.stage_dir, self.listing.rel(f.path)) for f in res.files]
            again = fastio.read_files([p for p, f in zip(local, res.files) if f.error is None],
                                      concurrency=self.opts.concurrency, hash=alg)
            by_local = {f.path: f.digest for f in again.files}
            return {f.path: by_local.get(p) for p, f in zip(local, res.files)}

        def one(i: int) -> tuple[str, str | None]:
            buf = res.buffers[i]
            if buf is None:
                return res.files[i].path, None
            h = fastio.Hasher(alg)
            h.update(buf)
            return res.files[i].path, h.hexdigest()

        with ThreadPoolExecutor(max_workers=self.opts.concurrency) as pool:
            return dict(pool.map(one, range(len(res.files))))

    def execute(self) -> RepeatResult:
        o = self.opts
        proc = psutil.Process()
        s3 = self.listing.s3 is not None
        if s3:
            cache = conditions.CacheCondition(o.cache, 0.0, True, "S3: no local page cache, every read goes to the server")
            # staged S3 downloads then loads files, as `aws s3 cp` + torch.load would
            if o.stage_dir or o.mode == "staged":
                self.stage_dir = o.stage_dir or tempfile.mkdtemp(prefix="ckptbench-stage-")
                self.own_stage = o.stage_dir is None
        else:
            cache = conditions.prepare([f.path for f in self.listing.files], o.cache, drop_caches=o.drop_caches)
        try:
            return self._execute(cache, proc)
        finally:
            if self.own_stage:
                shutil.rmtree(self.stage_dir, ignore_errors=True)

    def _execute(self, cache, proc) -> RepeatResult:
        o = self.opts
        s3 = self.listing.s3 is not None
        gc.collect()
        self.rss = _PeakRSS()
        cpu0 = _cpu_s(proc)
        t_start = time.perf_counter()
        listing = self._timed("list", lambda: list_checkpoint(self.listing.source, o.concurrency))
        if s3:
            self.listing = listing  # the reader uses this listing's client, objects and retry counters
        man = listing.manifest
        alg = o.hash or (man.hash if man is not None else "crc32c")
        if o.mode == "fused":
            res = self._timed("read", lambda: self._read(alg))
            digests = {f.path: f.digest for f in res.files}
            self.notes["verify"] = "hashed during read (fused); this stage only compares digests"
        else:
            res = self._timed("read", lambda: self._read("none"))
            digests = self._timed("verify", partial(self._hash_buffers, res, alg))
        self.stages.setdefault("verify", 0.0)

        t_verify = time.perf_counter()
        problems = self._compare(res, digests, man, alg, listing)
        self.stages["verify"] += time.perf_counter() - t_verify
        expected, errors = self._outcome(res, problems, man, listing)
        bad = {p for p, _ in problems}
        read_s = self.stages["read"]
        base = dict(bytes=res.bytes, files=len(expected), files_restored=len(expected - bad),
                    read_gbps=res.bytes / read_s / 1e9 if read_s > 0 else 0.0, retries=res.retries,
                    errors=errors, cache=cache,
                    retry_classes=dict(listing.s3.retry_log.counts) if s3 else {})
        if problems:
            return RepeatResult(self.stages, self.notes, time.perf_counter() - t_start,
                                peak_rss_bytes=self.rss.peak(), cpu_s=_cpu_s(proc) - cpu0, status="failed",
                                problems=[f"{p}: {w}" for p, w in problems], **base)
        # staged loads from the files, as the reference scripts do, not from what the read stage left in memory
        buffers = {f.path: b for f, b in zip(res.files, res.buffers)} if o.mode == "fused" else None
        del res
        restored, state = self._timed("load", lambda: self._load(listing, man, buffers))
        self.rss.sample()
        self._timed("device", lambda: _to_device(restored, state, o.device, self.notes))
        report = self._timed("check", lambda: _check(restored, state, man, o.optimizer_step))
        rto = time.perf_counter() - t_start
        status = "ok" if report.ok else "failed"
        if not s3:
            base["cache"] = cache.with_after(conditions.residency_of([f.path for f in listing.files]))
        return RepeatResult(self.stages, self.notes, rto, peak_rss_bytes=self.rss.peak(),
                            cpu_s=_cpu_s(proc) - cpu0, status=status, problems=list(report.problems), **base)

    def _compare(self, res, digests: dict, man, alg: str, listing: Listing) -> list[tuple[str, str]]:
        """Problems of this read against the manifest: unreadable, missing, wrong size, wrong digest."""
        from ckptbench.verify import compare

        unreadable = [(listing.rel(f.path), f"unreadable: {f.error.message}") for f in res.failed]
        if man is None:
            self.notes["verify"] = "no manifest: digests computed, no reference to compare with"
            return unreadable
        if alg != man.hash:
            self.notes["verify"] = f"--hash {alg} is not the manifest's {man.hash}: no reference to compare with"
            return unreadable
        results = {listing.rel(f.path): replace(f, digest=digests.get(f.path)) for f in res.files}
        listed = {e.path for e in man.files}
        return list(compare(man, results)) + [p for p in unreadable if p[0] not in listed]

    def _outcome(self, res, problems, man, listing: Listing) -> tuple[set[str], dict[str, int]]:
        """The files a restore owes (read, or promised by the manifest) and the error classes of what failed."""
        errors: dict[str, int] = {}
        if listing.s3 is not None:
            errors.update(self.handle.error_classes())
        else:
            for f in res.failed:
                name = errno.errorcode.get(f.error.errno, "error")
                errors[name] = errors.get(name, 0) + 1
        for cls, marker in (("digest_mismatch", "manifest says"), ("missing", "not read")):
            n = len({p for p, w in problems if marker in w})
            if n:
                errors[cls] = n
        expected = {listing.rel(f.path) for f in res.files} | ({e.path for e in man.files} if man else set())
        return expected, errors

    def _load(self, listing: Listing, man, buffers: dict | None):
        """Shards and the tail into a CheckpointState, then into the model built on the meta device."""
        from ckptbench import restore

        if self.stage_dir:
            tail = restore.load_tail(self.stage_dir, man)
            state = restore.load_state(self.stage_dir, listing.format)
            self.notes["load"] = "S3 objects staged to local files, loaded from there"
        elif buffers is not None:
            shards = None
            if listing.s3 is not None:
                shards = [f.path for f in listing.files if f.path.endswith(restore.SHARD_EXT[listing.format])]
            tail = restore.load_tail(listing.source, man, reader=_buffer_reader(listing, man, buffers),
                                     rels=listing.rels)
            state = restore.load_state(listing.source, listing.format, buffers=buffers, shards=shards)
        else:
            tail = restore.load_tail(listing.source, man)
            state = restore.load_state(listing.source, listing.format)
        dims = restore.dims_of(man, tail)
        if dims is None:
            self.notes["check"] = "model shape unknown: structural check only"
            return None, state
        dtype = man.weights_dtype if man is not None and man.weights_dtype else restore.main_dtype(state)
        return restore.restore(state, dims, dtype), state


def _buffer_reader(listing: Listing, man: mf.Manifest | None, buffers: dict):
    """Tail members out of the read buffers: a packed member is a slice of its pack's buffer."""
    by_rel = {listing.rel(p): b for p, b in buffers.items()}
    members = {}
    if man is not None:
        for pack_file, index in man.packs.items():
            for rel, (off, size, *_rest) in index.items():
                members[rel] = (pack_file, off, size)

    def read(rel: str):
        if rel in members:
            pack_file, off, size = members[rel]
            return by_rel[pack_file][off:off + size]
        return by_rel[rel]

    return read


def check_device(device: str) -> None:
    """Before any work: cpu, or cuda[:N] on a box that has it."""
    if device == "cpu":
        return
    name, _, index = device.partition(":")
    if name != "cuda" or (index and not index.isdigit()):
        raise CkptbenchError(f"--device {device!r}: use cpu or cuda[:N]")
    import torch

    if not torch.cuda.is_available():
        raise CkptbenchError(f"--device {device}: no CUDA device here; use --device cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise CkptbenchError(f"--device {device}: this box has {torch.cuda.device_count()} GPU(s)")


def _to_device(restored, state, device: str, notes: dict) -> None:
    import torch

    if device == "cpu" or restored is None:
        notes["device"] = "cpu: nothing to move"
        return
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CkptbenchError(f"--device {device}: no CUDA device here; use --device cpu")
    r = restored
    # pinned host memory makes the copy a DMA the GPU can overlap
    for module_tensor in list(r.model.parameters()):
        module_tensor.data = module_tensor.data.pin_memory().to(device, non_blocking=True)
    for st in r.optimizer.state.values() if r.optimizer else ():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                st[k] = v.pin_memory().to(device, non_blocking=True)
    for name, m in r.master.items():
        m.data = m.data.pin_memory().to(device, non_blocking=True)
    torch.cuda.synchronize()


def _check(restored, state, man, optimizer_step: bool):
    from ckptbench import restore

    if restored is None:
        problems = restore.structural_check(state)
        count = sum(t.numel() for t in state.model.values())
        return restore.CheckReport(not problems, count, {"weights": restore.main_dtype(state)}, None, None,
                                   problems, True)
    return restore.check(restored, man, optimizer_step=optimizer_step)


def run(source: str, opts: RunOptions, *, repeats: int = 3, progress: Progress | None = None,
        cancel: threading.Event | None = None, on_run: Callable[[Run], None] | None = None,
        listing: Listing | None = None) -> list[RepeatResult]:
    """`repeats` independent restores, each under its own cache condition."""
    if opts.mode not in MODES:
        raise CkptbenchError(f"unknown mode {opts.mode!r}: choose staged or fused")
    if repeats < 1:
        raise CkptbenchError(f"--repeat must be at least 1, got {repeats}")
    check_device(opts.device)
    listing = listing or list_checkpoint(source, opts.concurrency)
    oom_precheck(listing, opts.mode)
    out = []
    for _ in range(repeats):
        r = Run(listing, opts, progress, cancel)
        if on_run:
            on_run(r)
        out.append(r.execute())
        del r
        gc.collect()
    return out

