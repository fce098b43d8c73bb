"""Restore benchmark: fused against staged and the stock safetensors path (hot), our read stage against fio (cold).

Prints a Markdown report to stdout (progress goes to stderr) and writes bench/out/restore_bench.{md,json}.
Exit status 0 even when a target is missed (it is a report); 2 when fio or the built fastio is missing.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import _peers
from _harness import (COLD_MAX, Series, Target, cache_dir, child_env, fmt, judge, log, machine, missing, preface,
                      section, series_table, targets_section, utc_now, write_outputs)

MiB = 1 << 20
GiB = 1 << 30
KiB = 1 << 10
CHUNK = 64 * MiB  # the pipeline's chunk size (fastio units): max(64 MiB, block)
BLOCK = 1 * MiB
FUSED_VS_STAGED = 0.6  # fused RTO <= 0.6 x staged RTO
FUSED_VS_STOCK = 2.0  # stock RTO >= 2 x fused RTO
FIO_BAND = (0.95, 1.05)  # our read stage / fio, cold
STAGES = ("list", "read", "verify", "load", "device", "check")
HOT_ATTEMPTS = 3  # a hot repeat that read from the disk (the cache dropped under it) is run again, this often


# --------------------------------------------------------------------------- checkpoint


def default_dir(profile: str, scale: float) -> str:
    return cache_dir(f"bench-{profile}" + ("" if scale == 1.0 else f"-x{scale:g}"))


def ensure_checkpoint(directory: str, profile_name: str, scale: float) -> str | None:
    """Generates the checkpoint once (`ckptbench gen` in a child); reuses it when its manifest is present.

    Returns None when ready, else one line saying why the directory cannot be used.
    """
    from ckptbench import manifest as mf
    from ckptbench import profiles

    prof = profiles.load(profile_name)
    if scale != 1.0:
        prof = prof.scaled(scale)
    man = mf.read(directory) if os.path.isdir(directory) else None
    if man is not None:
        if man.dims != vars(prof.dims) or man.format != prof.format:
            return (f"restore_bench: {directory} holds a {man.profile} checkpoint of another shape or format than "
                    f"--profile {profile_name} --scale {scale:g}; pass another --dir or remove it")
        log(f"reusing the checkpoint in {directory}")
        return None
    if os.path.isdir(directory) and os.listdir(directory):
        return f"restore_bench: {directory} is not empty and has no manifest; pass another --dir or remove it"
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    log(f"generating the {profile_name} checkpoint (scale {scale:g}) into {directory}; once, reused afterwards")
    cmd = [sys.executable, "-m", "ckptbench", "gen", profile_name, directory]
    if scale != 1.0:
        cmd += ["--scale", repr(scale)]
    out = subprocess.run(cmd, env=child_env(), check=False)
    if out.returncode != 0:
        return f"restore_bench: `{' '.join(cmd)}` failed with status {out.returncode}"
    return None


# --------------------------------------------------------------------------- measurements


@dataclass(kw_only=True)
class RestoreSeries(Series):
    """RTO seconds or GB/s over hot or cold repeats, with each repeat's disk reads, stage times and check."""

    path: str
    disk: list[float] = field(default_factory=list)  # share of the set's bytes read from the device while timed
    stages: list[dict[str, float]] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        # a hot repeat that read from the disk was not hot, whatever residency said before it began
        return super().verified and (self.condition != "hot" or all(d <= COLD_MAX for d in self.disk))

    def unverified_because(self) -> str:
        if self.disk and all(self._held(r) for r in self.residency):
            return f"read {max(self.disk):.0%} of the set from the disk"
        return super().unverified_because()

    @property
    def ok(self) -> bool:
        return all(s == "ok" for s in self.status)

    def stage_median(self, stage: str) -> float | None:
        vals = [s[stage] for s in self.stages if s.get(stage) is not None]
        return statistics.median(vals) if vals else None

    def as_dict(self) -> dict:
        return {"key": self.key, "condition": self.condition, "path": self.path, "unit": self.unit,
                "samples": self.samples, "median": self.median, "min": self.min,
                "max": self.max, "residency": self.residency, "disk_read_share": self.disk,
                "verified": self.verified,
                "status": self.status, "problems": self.problems[:10],
                "stages": self.stages, "stage_medians": {s: self.stage_median(s) for s in STAGES},
                **({"extra": self.extra} if self.extra else {})}


def add_pipeline_repeat(s: RestoreSeries, r, value: float, disk: float) -> None:
    s.samples.append(value)
    s.residency.append(r.cache.residency_before)
    s.disk.append(disk)
    s.stages.append(dict(r.stages))
    s.status.append(r.status)
    s.problems += r.problems


def disk_read_bytes(children: bool = False) -> int:
    """Bytes this process (or its waited-for children) made the kernel read from a block device: getrusage's
    ru_inblock, in 512-byte units, counted where reads are submitted to the device, so page-cache hits add
    nothing. A hot repeat that reads from the disk was not hot, whatever residency said before it began."""
    return resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_inblock * 512


def pipeline_once(listing, **opts):
    """One restore; also the bytes read from the disk from its first timed stage to its end (the cache
    preparation before the clock starts is left out)."""
    from ckptbench import pipeline

    start: list[int] = []

    def progress(stage, _snap) -> None:
        if not start:
            start.append(disk_read_bytes())

    r = pipeline.run(listing.source, pipeline.RunOptions(**opts), repeats=1, listing=listing, progress=progress)[0]
    return r, disk_read_bytes() - (start[0] if start else 0)


# --------------------------------------------------------------------------- the stock path


def stock_restore(listing) -> tuple[dict[str, float], list[str], dict[str, str]]:
    """What a seed script does, one file after another: md5 of every file (1 MiB reads), then
    safetensors.torch.load_file per shard into a GPT built normally (load_state_dict copies), optimizer
    tensors cloned (load_file maps lazily; the clone reads the bytes), the small-file tail, one forward step.
    """
    import safetensors.torch
    import torch

    from ckptbench import restore
    from ckptbench.model import DTYPES, GPT, master_optimizer, sample_batch

    man = listing.manifest
    stages: dict[str, float] = {}
    problems: list[str] = []
    t0 = time.perf_counter()

    t = time.perf_counter()
    digests = {f.path: _peers.md5_file(f.path)[1] for f in listing.files}
    if man is not None and man.hash == "md5":
        for e in man.files:
            got = digests.get(os.path.join(listing.source, e.path))
            if got is not None and got != e.digest:
                problems.append(f"{e.path}: md5 {got} != manifest {e.digest}")
    stages["verify"] = time.perf_counter() - t

    t = time.perf_counter()
    dims = restore.dims_of(man, {})
    model = GPT(dims).to(DTYPES[man.weights_dtype])
    loaded: set[str] = set()
    optim: dict[str, torch.Tensor] = {}
    for path in restore.shard_files(listing.source, "safetensors"):
        sd = safetensors.torch.load_file(path)
        if os.path.basename(path).startswith("optimizer"):
            for k, v in sd.items():
                optim[k] = v.clone()
        else:
            res = model.load_state_dict(sd, strict=False)
            if res.unexpected_keys:
                problems.append(f"{os.path.basename(path)}: unexpected keys {res.unexpected_keys[:3]}")
            loaded.update(sd)
        del sd
    missing = set(model.state_dict()) - loaded
    if missing:
        problems.append(f"{len(missing)} weight(s) not in any shard, e.g. {sorted(missing)[0]}")
    # the same optimizer the fused path builds: AdamW over the fp32 masters, with the saved moments
    master = {n: optim[f"{n}.master"].requires_grad_(True) for n, _ in model.named_parameters()}
    opt, master, names = master_optimizer(model, master)
    sd = opt.state_dict()
    step = torch.tensor(float(man.step))
    sd["state"] = {i: {"step": step.clone(), "exp_avg": optim[f"{n}.exp_avg"],
                       "exp_avg_sq": optim[f"{n}.exp_avg_sq"]} for i, n in enumerate(names)}
    opt.load_state_dict(sd)
    tail = restore.load_tail(listing.source, man)
    stages["load"] = time.perf_counter() - t

    t = time.perf_counter()
    count = sum(p.numel() for p in model.parameters())
    if count != man.param_count:
        problems.append(f"parameter count {count} != manifest {man.param_count}")
    with torch.no_grad():
        out = model(sample_batch(dims))
    if not bool(torch.isfinite(out).all()):
        problems.append("forward step gave non-finite output")
    stages["check"] = time.perf_counter() - t
    stages["rto"] = time.perf_counter() - t0
    del model, opt, master, optim, tail
    return stages, problems, digests


# --------------------------------------------------------------------------- fio


def run_fio(fio: str, files: list[tuple[str, int]], *, jobs: int, block: int) -> dict:
    """fio psync replaying the read stage's own reads (64 MiB units of 1 MiB reads, `jobs` at once)."""
    t, extra = _peers.run_fio_replay(fio, files, jobs=jobs, block=block, chunk=CHUNK)
    return {"bytes": t.bytes, "seconds": t.seconds, **extra}


def fault_in_gbps(nbytes: int) -> float:
    """How fast this machine hands out fresh memory: one MADV_POPULATE_WRITE over `nbytes` of new anonymous
    memory (what each read-stage worker does before reading a chunk into it), one thread, GB/s."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(m)
    try:
        t0 = time.perf_counter()
        rc = libc.madvise(ctypes.addressof(view), nbytes, 23)  # MADV_POPULATE_WRITE, Linux 5.14+
        dt = time.perf_counter() - t0
    finally:
        del view
        m.close()
    if rc != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
    return nbytes / dt / 1e9


# --------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, listing, repeat: int, concurrency: int, fio: str):
        import fastio

        self.fastio = fastio
        self.listing = listing
        self.paths = [f.path for f in listing.files]
        self.files = [(f.path, f.size) for f in listing.files]
        self.total = sum(s for _, s in self.files)
        self.repeat = repeat
        self.concurrency = concurrency
        self.fio = fio
        self.series: dict[str, RestoreSeries] = {}
        self.load: list[tuple[str, tuple[float, float, float]]] = []
        self.other = _peers.OtherWork()  # CPU other processes take: other work skews the figures
        self.md5_agree: bool | None = None
        self.fault_in: list[float] = []  # GB/s of fresh memory faulted in, one thread, once per cold repeat

    def note_load(self, when: str) -> None:
        self.load.append((when, os.getloadavg()))

    def get(self, key: str, condition: str, path: str, unit: str) -> RestoreSeries:
        if key not in self.series:
            self.series[key] = RestoreSeries(key, condition, unit, path=path)
        return self.series[key]

    def residency(self) -> float:
        return self.fastio.residency(self.paths).fraction

    def make_hot(self) -> float:
        self.fastio.read_files(self.paths, concurrency=2, read="pread", hash="none")
        return self.residency()

    def make_cold(self) -> float:
        self.fastio.evict(self.paths)
        return self.residency()

    # ---- hot: fused, staged, stock

    def run_hot(self) -> None:
        c = self.concurrency
        log(f"hot restores (fused, staged, stock; order rotated each repeat; one untimed warm-up each; "
            f"{self.repeat} repeat(s))")
        fused = self.get("hot/fused", "hot", f"fused (pipeline, crc32c verified during the read, concurrency {c})", "s")
        staged = self.get("hot/staged", "hot", f"staged (pipeline, crc32c after the read, concurrency {c})", "s")
        stock = self.get("hot/stock", "hot", "stock: md5 per file + load_file/load_state_dict per shard, "
                         "one after another", "s")
        hot_read = self.get("hot/read/ours", "hot", f"ours: pipeline read stage (staged run: pread, no hash, "
                            f"concurrency {c}, block 1 MiB)", "GB/s")
        def pipeline_path(mode: str, s: RestoreSeries, warm: bool, tag: str) -> None:
            for attempt in range(1, HOT_ATTEMPTS + 1):
                log(f"  hot {mode:6s} {tag}")
                r, disk = pipeline_once(self.listing, mode=mode, cache="hot", concurrency=c, read="pread",
                                        block_size=BLOCK)
                if self.hot_held(s, disk, attempt):
                    break
            if not warm:
                add_pipeline_repeat(s, r, r.rto_s, disk / self.total)
                if mode == "staged":
                    add_pipeline_repeat(hot_read, r, r.read_gbps, disk / self.total)
            del r
            gc.collect()

        def stock_path(warm: bool, tag: str) -> None:
            for attempt in range(1, HOT_ATTEMPTS + 1):
                log(f"  hot stock  {tag}")
                res = self.make_hot()
                d0 = disk_read_bytes()
                stages, problems, digests = stock_restore(self.listing)
                disk = disk_read_bytes() - d0
                if self.hot_held(stock, disk, attempt):
                    break
            if not warm:
                stock.samples.append(stages["rto"])
                stock.residency.append(res)
                stock.disk.append(disk / self.total)
                stock.stages.append({k: v for k, v in stages.items() if k != "rto"})
                stock.status.append("failed" if problems else "ok")
                stock.problems += problems
            self.check_md5(digests)
            del digests
            gc.collect()

        paths = [lambda w, t: pipeline_path("fused", fused, w, t), lambda w, t: pipeline_path("staged", staged, w, t),
                 stock_path]
        for i in range(self.repeat + 1):
            warm = i == 0
            tag = "warm-up" if warm else f"repeat {i}"
            # The order rotates every repeat: a path that always ran right after the stock path's gigabytes were
            # freed would always meet the same memory state (on a VM with free page reporting, memory handed
            # back to the host costs a host fault per page when touched again: fused read 1.1-2.1 s vs 0.45 s).
            k = i % len(paths)
            for run in paths[k:] + paths[:k]:
                run(warm, tag)

    def hot_held(self, s: RestoreSeries, disk: int, attempt: int) -> bool:
        """False (run it again) when a hot repeat read more than 5 % of the set from the disk."""
        if disk <= COLD_MAX * self.total:
            return True
        what = "running it again" if attempt < HOT_ATTEMPTS else "keeping it, marked NOT VERIFIED"
        log(f"    read {disk / MiB:.0f} MiB from the disk while hot (the page cache was dropped under it?); {what}")
        s.extra["discarded_not_hot"] = s.extra.get("discarded_not_hot", 0) + (attempt < HOT_ATTEMPTS)
        return attempt == HOT_ATTEMPTS

    def check_md5(self, digests: dict[str, str]) -> None:
        """The stock path's md5 against fastio's md5 of the same files (once): both read the same bytes."""
        if self.md5_agree is not None:
            return
        r = self.fastio.read_files(self.paths, hash="md5", concurrency=self.concurrency)
        self.md5_agree = not r.failed and all(digests.get(f.path) == f.digest for f in r.files)

    # ---- read stage against fio

    def run_read(self) -> None:
        c = self.concurrency
        log(f"read throughput against fio ({self.repeat} repeat(s))")
        cold_ours = self.get("cold/read/ours", "cold", f"ours: pipeline read stage (staged: pread, no hash, "
                             f"concurrency {c}, block 1 MiB)", "GB/s")
        cold_fused = self.get("cold/read/fused", "cold", f"ours, fused: pipeline read stage (pread + crc32c, "
                              f"concurrency {c}, block 1 MiB)", "GB/s")
        cold_fio = self.get("cold/read/fio", "cold", f"fio psync, {c} jobs replaying our reads (1 MiB, "
                            "64 MiB units), cache evicted (fastio.evict)", "GB/s")
        hot_fio = self.get("hot/read/fio", "hot", f"fio psync, {c} jobs replaying our reads, --invalidate=0",
                           "GB/s")
        cold_engine = self.get("cold/read/engine", "cold", f"fastio engine alone: the read stage's reads (pread, "
                               f"no hash, concurrency {c}) into a reused buffer per worker, as fio does", "GB/s")

        def engine_cold() -> None:
            log(f"  cold engine repeat {i}")
            cold_engine.residency.append(self.make_cold())
            d0 = disk_read_bytes()
            r = self.fastio.read_files(self.paths, concurrency=c, read="pread", hash="none", block_size=BLOCK,
                                       chunk_size=CHUNK)
            cold_engine.disk.append((disk_read_bytes() - d0) / self.total)
            cold_engine.samples.append(r.read_gbps)
            cold_engine.status.append("ok" if not r.failed else "failed")

        def ours(mode: str, s: RestoreSeries) -> None:
            log(f"  cold {mode:6s} repeat {i}")
            r, disk = pipeline_once(self.listing, mode=mode, cache="cold", concurrency=c, read="pread",
                                    block_size=BLOCK)
            add_pipeline_repeat(s, r, r.read_gbps, disk / self.total)
            del r
            gc.collect()

        def fio_cold() -> None:
            log(f"  cold fio    repeat {i}")
            cold_fio.residency.append(self.make_cold())
            d0 = disk_read_bytes(children=True)
            f = run_fio(self.fio, self.files, jobs=c, block=BLOCK)
            cold_fio.disk.append((disk_read_bytes(children=True) - d0) / self.total)
            cold_fio.samples.append(f["bytes"] / f["seconds"] / 1e9)
            cold_fio.extra["fio"] = {k: v for k, v in f.items() if k != "seconds"}
            cold_fio.status.append("ok")

        for i in range(1, self.repeat + 1):
            # ABAB: on a virtual disk the host keeps what was just read, so whoever goes second gains;
            # alternating the order and judging the median of the back-to-back pairs cancels that
            if i % 2:
                ours("staged", cold_ours)
                fio_cold()
                engine_cold()
            else:
                engine_cold()
                fio_cold()
                ours("staged", cold_ours)
            ours("fused", cold_fused)
            self.fault_in.append(fault_in_gbps(self.total))
            log(f"  hot  fio    repeat {i}")
            for attempt in range(1, HOT_ATTEMPTS + 1):
                res = self.make_hot()
                d0 = disk_read_bytes(children=True)
                f = run_fio(self.fio, self.files, jobs=c, block=BLOCK)
                disk = disk_read_bytes(children=True) - d0
                if self.hot_held(hot_fio, disk, attempt):
                    break
            hot_fio.residency.append(res)
            hot_fio.disk.append(disk / self.total)
            hot_fio.samples.append(f["bytes"] / f["seconds"] / 1e9)
            hot_fio.extra["fio"] = {k: v for k, v in f.items() if k != "seconds"}
            hot_fio.status.append("ok")


# --------------------------------------------------------------------------- targets and report


def targets() -> list[Target]:
    return [
        Target(f"hot: fused RTO ≤ {FUSED_VS_STAGED}× staged RTO", "hot/fused", "hot/staged", high=FUSED_VS_STAGED,
               shown="{:.3f}×"),
        Target(f"hot: fused ≥ {FUSED_VS_STOCK:g}× faster than the stock path (stock RTO / fused RTO)",
               "hot/fused", "hot/stock", low=FUSED_VS_STOCK, invert=True, shown="{:.3f}×"),
        # paired: the median of back-to-back pairs, as the repeats alternate which tool reads first
        Target(f"cold: our read stage within ±5 % of fio psync (ours / fio in {FIO_BAND[0]}..{FIO_BAND[1]})",
               "cold/read/ours", "cold/read/fio", low=FIO_BAND[0], high=FIO_BAND[1], paired=True, shown="{:.3f}×"),
        Target(f"cold, agreement check: the engine's reads alone within ±5 % of fio psync (in {FIO_BAND[0]}.."
               f"{FIO_BAND[1]})", "cold/read/engine", "cold/read/fio", low=FIO_BAND[0], high=FIO_BAND[1], paired=True,
               shown="{:.3f}×"),
    ]


def main_table(b: Bench, verdicts: list[dict]) -> list[str]:
    by_peer = {(v["subject"], v["peer"]): v for v in verdicts}
    ratio_text = {
        "hot/staged": lambda v: f"fused = {v['value']:.2f}× staged",
        "hot/stock": lambda v: f"fused {v['value']:.2f}× faster (stock / fused)",
        "cold/read/fio": lambda v: f"ours = {v['value']:.3f}× fio",
        "cold/read/engine": lambda v: f"engine = {v['value']:.3f}× fio",
    }
    bound_text = {"hot/staged": f"≤ {FUSED_VS_STAGED}×", "hot/stock": f"≥ {FUSED_VS_STOCK:g}×",
                  "cold/read/fio": f"{FIO_BAND[0]}–{FIO_BAND[1]}×",
                  "cold/read/engine": f"{FIO_BAND[0]}–{FIO_BAND[1]}×"}
    info = {"cold/read/fused": ("cold/read/fio", "ours fused = {:.3f}× fio (info: includes crc32c)"),
            "hot/read/ours": ("hot/read/fio", "ours = {:.3f}× fio (info)")}

    def cells(s: RestoreSeries) -> list[str]:
        ratio, met = "—", "—"
        # a verdict shows on its peer's row, except the agreement check, which shares fio's row as peer
        v = (by_peer.get(("cold/read/engine", "cold/read/fio")) if s.key == "cold/read/engine" else
             next((v for (subj, peer), v in by_peer.items() if peer == s.key and subj != "cold/read/engine"), None))
        if v is not None and v["value"] is not None:
            ratio = ratio_text[s.key](v)
            met = f"{v['status']} ({bound_text[s.key]})"
        elif s.key in info and info[s.key][0] in b.series:
            ratio = info[s.key][1].format(s.median / b.series[info[s.key][0]].median)
            met = "—"
        if not s.ok:
            met = ("" if met == "—" else met + "; ") + "CHECK FAILED"
        return [ratio, met]

    order = ("hot/fused", "hot/staged", "hot/stock", "cold/read/ours", "cold/read/fused", "cold/read/engine",
             "cold/read/fio", "hot/read/ours", "hot/read/fio")
    rows = sorted(b.series.values(), key=lambda s: order.index(s.key) if s.key in order else len(order))
    return series_table(rows, ("condition", "path", "RTO or GB/s (median)", "min–max", "ratio", "target met?"),
                        lambda s: s.path, lambda s, v: fmt(v, 2, s.unit), cells)


def stage_table(b: Bench) -> list[str]:
    cols = [(k, n) for k, n in (("hot/fused", "fused"), ("hot/staged", "staged"), ("hot/stock", "stock"))
            if k in b.series]
    head = "| stage | " + " | ".join(f"{n} median s | {n} % of RTO" for _, n in cols) + " |"
    rows = [head, "|---|" + "---:|---:|" * len(cols)]
    for stage in STAGES:
        meds = [b.series[k].stage_median(stage) for k, _ in cols]
        if all(m is None for m in meds):
            continue
        cells = []
        for (k, _), m in zip(cols, meds):
            rto = b.series[k].median
            cells += ["—", "—"] if m is None else [f"{m:.3f}", f"{m / rto:.0%}"]
        rows.append(f"| {stage} | " + " | ".join(cells) + " |")
    rows.append("| **RTO** | " + " | ".join(f"**{b.series[k].median:.3f}** | 100%" for k, _ in cols) + " |")
    return rows


def notes(b: Bench) -> list[str]:
    out = [
        "Verification differs by path: fused hashes crc32c during the read and compares with the manifest; staged "
        "hashes crc32c over the read buffers after the read; the stock path computes hashlib md5 over every file "
        "(1 MiB reads, one file after another), as the seed scripts do"
        + ("" if b.listing.manifest.hash == "md5" else
           " — the manifest holds crc32c, so its md5 digests have no reference to compare with")
        + ".",
        "Stock path: `GPT(dims).to(bfloat16)` built normally (not on meta), then per shard, one after another, "
        "`safetensors.torch.load_file` and `model.load_state_dict(strict=False)` (a copy into the model's own "
        "storage); optimizer shards through `load_file` with every tensor `.clone()`d (load_file maps lazily; the "
        "clone reads the bytes); the same AdamW-over-fp32-masters optimizer the fused path builds, the small-file "
        "tail, and the same check (parameter count, one forward step with finite output). Its stages: verify = "
        "md5, load = build + shards + optimizer + tail, check = forward.",
        "hot = residency ≥ 0.95 before every repeat (the pipeline's hot condition, or a fastio pre-read for the "
        "stock path and fio), checked with fastio.residency, and at most 5 % of the set read from the disk while "
        "timed (getrusage ru_inblock of this process, or of fio as a child): a hot repeat that read from the disk "
        f"(another process dropped the page cache under it) is run again, up to {HOT_ATTEMPTS} times; cold = "
        "fastio.evict before every repeat and residency ≤ 0.05. Fused, staged and stock repeats are interleaved "
        "in one process, their order rotated each repeat, after `warmup.warm_up()`, after one untimed warm-up "
        "restore each.",
        "fio: psync, `read_iolog` replay of the read stage's own reads: files cut into 64 MiB units (fastio's "
        "chunk size), each read in 1 MiB reads with the short last read, every byte of every file; units spread "
        f"largest first over {b.concurrency} jobs in one group; `replay_no_stall=1`, `invalidate=0` (the benchmark "
        "evicts or pre-reads itself). GB/s = the bytes fio read / the slowest job's runtime (ms resolution). A "
        "bs-based job file cannot read the same bytes: fio skips a file smaller than bs and a file's last partial "
        "block, so mixed sizes need a stonewalled group per size, and each group's start-up counts.",
        "Our read-stage GB/s = all bytes of the checkpoint / the pipeline's read stage (engine start to the last "
        "buffer filled, into memory). The target is judged on the staged run (no hash, the same work as fio); the "
        "fused read stage also computes crc32c and is shown for information.",
    ]
    f = b.series.get("cold/read/fio")
    if f is not None and "fio" in f.extra:
        x = f.extra["fio"]
        out.append(f"fio read {x['bytes'] / MiB:.1f} MiB of the {b.total / MiB:.1f} MiB set "
                   f"({x['bytes'] / b.total:.2%}) as {x['units']} unit(s) in {x['jobs']} job(s).")
    o, p = b.series.get("cold/read/ours"), b.series.get("cold/read/fio")
    if o is not None and p is not None and len(o.samples) == len(p.samples):
        pairs = [x / y for x, y in zip(o.samples, p.samples)]
        out.append("cold ours / fio per repeat (each pair run back to back): "
                   + ", ".join(f"{r:.3f}" for r in pairs) + f"; median {statistics.median(pairs):.3f} "
                   "(the ±5 % target uses this median of pairs; repeats alternate which tool reads first).")
    e, f, o = (b.series.get(k) for k in ("cold/read/engine", "cold/read/fio", "cold/read/ours"))
    if b.fault_in and e is not None and f is not None and o is not None:
        out.append(
            f"What separates the read stage from fio: the read stage lands every byte in fresh memory for the "
            f"loader, fio reads into one reused buffer. The engine doing fio's work (same reads, a reused "
            f"buffer) ran at {e.median:.2f} GB/s against fio's {f.median:.2f}; the read stage at {o.median:.2f}. "
            f"This machine faults in fresh memory at {statistics.median(b.fault_in):.2f} GB/s per thread "
            f"(MADV_POPULATE_WRITE of {b.total / GiB:.1f} GiB, per repeat: "
            + ", ".join(f"{g:.2f}" for g in b.fault_in) + f"), on {os.cpu_count()} core(s) shared with the "
            "reads. A virtual machine whose host takes back freed guest memory (free page reporting) pays a "
            "host fault on each re-touch.")
    disk = {k: s.disk for k, s in b.series.items() if s.disk}
    if disk:
        out.append("Share of the set's bytes read from the disk while timed, per repeat: " + "; ".join(
            f"{k} " + "/".join(f"{d:.2f}" for d in v) for k, v in disk.items()) + ".")
    redo = {k: s.extra["discarded_not_hot"] for k, s in b.series.items() if s.extra.get("discarded_not_hot")}
    if redo:
        out.append("Hot attempts discarded because they read from the disk: "
                   + ", ".join(f"{k} {n}" for k, n in redo.items()) + ".")
    if b.md5_agree is not None:
        out.append("md5 of every file by the stock path matches fastio's md5 of the same files." if b.md5_agree
                   else "md5 of the stock path DIFFERS from fastio's md5 of the same files.")
    cores = os.cpu_count() or 1
    if b.load:
        first, last = b.load[0][1], b.load[-1][1]
        out.append(f"Load average (1/5/15 min) {first[0]:.2f}/{first[1]:.2f}/{first[2]:.2f} at the start, "
                   f"{last[0]:.2f}/{last[1]:.2f}/{last[2]:.2f} at the end, on {cores} cores (it counts the "
                   "benchmark's own threads waiting on the disk).")
    out.append(b.other.line())
    for s in b.series.values():
        for p in s.problems[:3]:
            out.append(f"problem ({s.key}): {p}")
    return out


def report_markdown(b: Bench, verdicts: list[dict], args, preface: list[str] = ()) -> str:
    man = b.listing.manifest
    lines = [
        "# ckptbench restore benchmark",
        "",
        *preface,
        f"Checkpoint: profile `{man.profile}`" + ("" if args.scale == 1.0 else f" × {args.scale:g}")
        + f", {man.format}, {man.world_size} rank(s), {man.param_count / 1e6:.1f} M parameters, "
        f"{b.total / MiB:.1f} MiB in {len(b.files)} files, `{args.dir}`; concurrency {b.concurrency}, block 1 MiB; "
        f"median of {b.repeat} repeat(s); GB = 10^9 bytes.",
        "",
    ]
    lines += main_table(b, verdicts)
    lines += ["", "Per-stage breakdown, hot (median seconds and share of the median RTO):", ""]
    lines += stage_table(b)
    lines += targets_section(verdicts) + section("Notes", notes(b))
    return "\n".join(lines) + "\n"



def write_report(b: Bench, verdicts: list[dict], facts: dict, args, date: str, elapsed: float) -> None:
    man = b.listing.manifest
    raw = {
        "date": date,
        "elapsed_s": elapsed,
        "machine": facts,
        "args": vars(args),
        "checkpoint": {"dir": args.dir, "profile": man.profile, "format": man.format, "ranks": man.world_size,
                       "params": man.param_count, "bytes": b.total, "files": len(b.files), "hash": man.hash},
        "measurements": [s.as_dict() for s in b.series.values()],
        "targets": verdicts,
        "load_average": [{"when": w, "1min": l[0], "5min": l[1], "15min": l[2]} for w, l in b.load],
        "other_work_core_s": b.other.share()[0],
        "md5_agree": b.md5_agree,
    }
    write_outputs("restore_bench", report_markdown(b, verdicts, args, preface(date, facts)), raw)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None, help="checkpoint profile (default medium; small with --quick)")
    ap.add_argument("--scale", type=float, default=1.0, help="resize the profile's model by about this factor")
    ap.add_argument("--dir", default=None, help="where the checkpoint lives (generated once, reused when its "
                    "manifest is present); default $XDG_CACHE_HOME or ~/.cache + /ckptbench/bench-PROFILE")
    ap.add_argument("--repeat", type=int, default=None, help="repeats per figure (default 3; 1 with --quick)")
    ap.add_argument("--concurrency", type=int, default=8, help="pipeline concurrency and fio jobs (default 8)")
    ap.add_argument("--quick", action="store_true", help="small profile, 1 repeat")
    args = ap.parse_args(argv)
    args.profile = args.profile or ("small" if args.quick else "medium")
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.concurrency < 1:
        ap.error("--concurrency must be at least 1")
    if args.scale <= 0:
        ap.error("--scale must be positive")
    args.dir = args.dir or default_dir(args.profile, args.scale)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = missing("restore_bench", executables=("fio",), modules=("fastio",))
    if problem:
        print(problem, file=sys.stderr)
        return 2
    fio = shutil.which("fio")
    from ckptbench.errors import CkptbenchError

    try:
        problem = ensure_checkpoint(args.dir, args.profile, args.scale)
    except CkptbenchError as exc:
        problem = f"restore_bench: {exc}"
    if problem:
        print(problem, file=sys.stderr)
        return 2

    from ckptbench.sources import open_source
    from ckptbench.warmup import warm_up

    warm_up()
    listing = open_source(args.dir).list()
    if listing.manifest is None or listing.format != "safetensors":
        print(f"restore_bench: {args.dir}: needs a safetensors checkpoint with a manifest (got {listing.format})",
              file=sys.stderr)
        return 2
    date = utc_now()
    b = Bench(listing, args.repeat, args.concurrency, fio)
    t0 = time.monotonic()
    b.note_load("start")
    b.run_hot()
    b.note_load("after hot restores")
    b.run_read()
    b.note_load("end")
    elapsed = time.monotonic() - t0
    log(f"done in {elapsed:.0f} s")
    verdicts = [judge(t, b.series) for t in targets()]
    print(report_markdown(b, verdicts, args), end="")
    import torch

    write_report(b, verdicts, machine(args.dir, fio) | {"torch_threads": torch.get_num_threads()}, args, date, elapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
