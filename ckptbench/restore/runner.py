"""The restore as timed stages — list, read, verify, load, device, check — staged or fused, cold or hot."""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Callable

import fastio
import psutil

from ckptbench.checkpoint import manifest as mf
from ckptbench.restore.device import check_device, to_device
from ckptbench.restore.efficiency import hash_of, no_reference
from ckptbench.core.errors import CkptbenchError
from ckptbench.core.interrupt import stops_as_interrupted
from ckptbench.restore.resources import PeakRSS, cpu_s, oom_precheck
from ckptbench.restore.repeat import RepeatResult, RunOptions
from ckptbench.sources import Listing, Source, open_source
from ckptbench.core.stages import CHECK, DEVICE, LIST, LOAD, READ, VERIFY
from ckptbench.restore.stages import StageClock
from ckptbench.restore.warmup import warm_up
from ckptbench.restore import tiles
from ckptbench.checkpoint.detect import not_a_checkpoint

Progress = Callable[[str, "fastio.Snapshot | None"], None]


# What a loader raises on bytes it cannot parse: reported as the load stage's failure, in one line.
LOAD_ERRORS = (RuntimeError, ValueError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile)


class Run:
    """One repeat of the restore; `handle` is the live read while the read stage runs (for the UI)."""

    def __init__(self, source: Source, listing: Listing, opts: RunOptions, progress: Progress | None,
                 cancel: threading.Event | None):
        self.source = source
        self.listing = listing
        self.opts = opts
        self.progress = progress
        self.clock = StageClock(cancel, (lambda name: progress(name, None)) if progress else None)
        self.cancel = self.clock.cancel
        self.handle = None
        self.stage_dir: str | None = None
        self.own_stage = False
        self.stages, self.notes = self.clock.stages, self.clock.notes
        self.error_classes: dict[str, int] = {}
        self.verified = False
        self.early = None  # the scan of files the fused read finished early (structural check only)
        self.asked_read = opts.read  # before execute resolves `auto`: a mode asked for by name is kept (tiles.usable)
        self.tiled = None  # a DCP read by range (restore/tiles.py): its plan and each piece's buffer, for the load

    @property
    def stage(self) -> str:
        return self.clock.stage

    def _timed(self, name: str, fn):
        return self.clock.run(name, fn)

    def _set_handle(self, handle) -> None:
        self.handle = handle
        if self.early is not None:
            self.early.start(handle)

    def _read(self, alg: str) -> fastio.ReadResult:
        into = "stage" if self.stage_dir else "memory"
        if into == "memory" and tiles.usable(self.listing, alg, self.asked_read, self.opts.mode == "fused",
                                             self.source.files_on_disk):
            try:
                tiling = tiles.plan(self.listing)
            except CkptbenchError:  # a metadata or chunk the plan cannot read: the whole-file load says what
                tiling = None
            if tiling is not None:
                return self._read_tiles(tiling, alg)
        man = self.listing.manifest
        regions: dict = {}
        reading = self.opts.read_options(alg)
        if into == "memory" and self.opts.mode == "fused" and self.listing.format == "safetensors" \
                and (man is None or not man.dims):  # a structural check is coming: count as the bytes land
            from ckptbench.restore.scan import EarlyScan, landing_regions

            if self.source.files_on_disk and reading.read != "mmap":
                # a byte range (a rank's share) is not a whole file with its header first: left to the early scan
                regions = landing_regions([(f.path, (f.size or 0) if f.offset is None else 0)
                                           for f in self.listing.files])
            self.early = EarlyScan([f.path for f in self.listing.files])
            self.early.seen.update(regions)  # the engine counts those; the rest are scanned as they complete
        try:
            driven = self.clock.read(self.source, self.listing, reading, into=into, scan=regions or None,
                                     stage_dir=self.stage_dir, on_start=self._set_handle, on_tick=self.rss.sample,
                                     on_progress=(lambda snap: self.progress(READ, snap)) if self.progress else None)
        finally:
            if self.early is not None:
                self.early.stop()
        if regions and self.handle is not None:
            from ckptbench.restore.scan import landed_counts

            self.early.counts.update(landed_counts(self.handle, regions))
        self.error_classes = driven.error_classes
        return driven.result

    def _read_tiles(self, tiling, alg: str) -> fastio.ReadResult:
        """Every file by range, each DCP chunk's elements into a buffer of their own (restore/tiles.py), folded
        back into the files' results; the pieces' buffers are kept for the load."""
        self.opts, self.read_why = self.opts.but(read="pread"), tiles.WHY
        driven = self.clock.read(self.source, tiling.listing, self.opts.read_options(alg), into="memory",
                                 on_start=self._set_handle, on_tick=self.rss.sample,
                                 on_progress=(lambda snap: self.progress(READ, snap)) if self.progress else None)
        self.error_classes = driven.error_classes
        res = driven.result
        if not res.failed:
            self.tiled = (tiling, tiles.piece_buffers(tiling, res))
        return tiles.fold(tiling, self.listing, res)

    def _from_pieces(self, listing: Listing, buffers: dict):
        """The state from the pieces the tiled read landed (restore/tiles.py), laid out as a whole-file DCP load
        lays it out."""
        from ckptbench.checkpoint.formats import dcp_format
        from ckptbench.checkpoint.shares import tensors_of
        from ckptbench.restore import load as restore

        tiling, bufs = self.tiled
        self.tiled = None  # the buffers go with the state
        tensors, values, seconds = tensors_of(tiling.share, bufs)
        state = restore.dcp_state(listing.source, listing.layout, buffers, lambda root, named, part: (
            dcp_format.from_pieces(root, tensors, values, named, part=part)))
        state = restore.with_state_files(state, listing.source, listing.layout, buffers)
        assembled = sum(1 for sl in tiling.share.slices if len(sl.fills) > 1)
        self.notes[LOAD] = _from_pieces_note(sum(len(sl.fills) for sl in tiling.share.slices), assembled, seconds)
        return state

    def _hash_buffers(self, res: fastio.ReadResult, alg: str) -> dict[str, str]:
        """Staged verify: hash what the read stage left in memory (or in the staging directory); with no hash
        (no manifest to check against, none asked for) there is nothing to compute."""
        if alg == "none":
            return {f.path: None for f in res.files}
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
        # a staged restore loads from files: a source whose bytes are not on a filesystem is staged first,
        # as `aws s3 cp` + torch.load would
        if not self.source.files_on_disk and (o.stage_dir or o.mode == "staged"):
            self.stage_dir = o.stage_dir or tempfile.mkdtemp(prefix="ckptbench-stage-")
            self.own_stage = o.stage_dir is None
        cache = self.source.prepare_cache(self.listing, o.cache, drop_caches=o.drop_caches)
        # chosen after the cache is prepared: `auto` goes by what is resident now
        chosen, self.read_why = self.source.choose_read(self.listing, o.read_options("none"), cache.residency_before)
        self.opts = o.but(read=chosen.read)
        try:
            return self._execute(cache, psutil.Process())
        finally:
            if self.own_stage:
                shutil.rmtree(self.stage_dir, ignore_errors=True)

    def _execute(self, cache, proc) -> RepeatResult:
        o = self.opts
        gc.collect()
        self.rss = PeakRSS()
        cpu0 = cpu_s(proc)
        t_start = time.perf_counter()
        self.listing = listing = self._timed(LIST, self.source.list)
        man = listing.manifest
        alg = hash_of(o.hash, listing)
        if o.mode == "fused":
            res = self._timed(READ, lambda: self._read(alg))
            digests = {f.path: f.digest for f in res.files}
            self.notes[VERIFY] = "hashed during read (fused); this stage only compares digests"
        else:
            res = self._timed(READ, lambda: self._read("none"))
            digests = self._timed(VERIFY, partial(self._hash_buffers, res, alg))
        problems = self._timed(VERIFY, partial(self._compare, res, digests, man, alg, listing))
        expected, errors = self._outcome(res, problems, man, listing)
        bad = {p for p, _ in problems}
        read_s = self.stages[READ]
        base = dict(bytes=res.bytes, files=len(expected), files_restored=len(expected - bad),
                    read_gbps=res.bytes / read_s / 1e9 if read_s > 0 else 0.0, engine_gbps=res.read_gbps,
                    retries=res.retries, errors=errors, cache=cache, retry_classes=self.source.retry_classes(),
                    verified=self.verified, read_mode=self.opts.read, read_why=self.read_why,
                    populated_bytes=res.final.populated_bytes, populate_cpu_s=res.final.populate_cpu_s)
        if problems:
            return RepeatResult(self.stages, self.notes, time.perf_counter() - t_start,
                                peak_rss_bytes=self.rss.peak(), cpu_s=cpu_s(proc) - cpu0, status="failed",
                                problems=[f"{p}: {w}" for p, w in problems], **base)
        # staged loads from the files, as the reference scripts do, not from what the read stage left in memory
        buffers = {f.path: b for f, b in zip(res.files, res.buffers)} if o.mode == "fused" else None
        del res
        restored, state = self._timed(LOAD, lambda: self._load(listing, man, buffers))
        self.rss.sample()
        self._timed(DEVICE, lambda: to_device(restored, o.device, self.notes))
        known = self.early.counts if self.early is not None else None
        report = self._timed(CHECK, lambda: _check(restored, state, man, o.optimizer_step, o.concurrency, known))
        base["check_kind"] = "structural" if report.structural_only else "model step"
        if report.structural_only:
            self.notes[CHECK] = report.summary
        rto = time.perf_counter() - t_start
        status = "ok" if report.ok else "failed"
        after = self.source.residency(listing)
        if after is not None:
            base["cache"] = cache.with_after(after)
        return RepeatResult(self.stages, self.notes, rto, peak_rss_bytes=self.rss.peak(),
                            cpu_s=cpu_s(proc) - cpu0, status=status, problems=list(report.problems), **base)

    def _compare(self, res, digests: dict, man, alg: str, listing: Listing) -> list[tuple[str, str]]:
        """Problems of this read against the manifest: unreadable, missing, wrong size, wrong digest."""
        from ckptbench.checkpoint.verify import compare

        unreadable = [(listing.rel(f.path), f"unreadable: {f.error.message}") for f in res.failed]
        unreadable += [(listing.rel(d), f"unreadable directory ({why}): its files were not listed")
                       for d, why in listing.skipped]
        why = no_reference(alg, man)
        if man is None:
            self.notes[VERIFY] = (f"NOT VERIFIED: {why}, so there is no reference; digests were "
                                  + (f"computed ({alg}) for the record only" if alg != "none" else
                                     "not computed (--hash crc32c computes them)"))
            return unreadable
        if alg != man.hash:
            self.notes[VERIFY] = (f"NOT VERIFIED: {why}, so there is no reference for the bytes (only the files and "
                                  f"their sizes were checked); leave --hash out or use --hash {man.hash}")
            # the manifest still says which files the checkpoint is: one it lists that was not read is missing (the
            # load then reached for it and raised KeyError, a traceback)
            results = {listing.rel(f.path): f for f in res.files}
            listed = {e.path for e in man.files}
            return list(compare(man, results, digests=False)) + [p for p in unreadable if p[0] not in listed]
        if why:  # sizes alone
            self.notes[VERIFY] = (f"NOT VERIFIED: {why}, so only sizes were checked; regenerate it with a digest "
                                  "(ckptbench gen --digest crc32c)")
            results = {listing.rel(f.path): f for f in res.files}
            return list(compare(man, results)) + unreadable
        results = {listing.rel(f.path): replace(f, digest=digests.get(f.path)) for f in res.files}
        listed = {e.path for e in man.files}
        problems = list(compare(man, results)) + [p for p in unreadable if p[0] not in listed]
        # a file read (and loaded) that the manifest does not list has no digest to match: not verified
        unlisted = sorted(r for r in results if r not in listed and r != mf.MANIFEST_NAME)
        if unlisted:
            self.notes[VERIFY] = (f"NOT VERIFIED: {len(unlisted)} file(s) read are not in the manifest (first "
                                  f"{unlisted[0]}), so there is no reference for them")
        self.verified = not problems and not unlisted
        return problems

    def _outcome(self, res, problems, man, listing: Listing) -> tuple[set[str], dict[str, int]]:
        """The files a restore owes (read, or promised by the manifest) and the error classes of what failed."""
        errors = dict(self.error_classes)
        for cls, marker in (("digest_mismatch", "manifest says"), ("missing", "not read")):
            n = len({p for p, w in problems if marker in w})
            if n:
                errors[cls] = n
        expected = {listing.rel(f.path) for f in res.files} | ({e.path for e in man.files} if man else set())
        return expected, errors

    def _load(self, listing: Listing, man, buffers: dict | None):
        try:
            return self._load_state(listing, man, buffers)
        except LOAD_ERRORS as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CkptbenchError(f"{listing.source}: the {listing.format} checkpoint could not be loaded "
                                 f"({type(exc).__name__}: {first}); check that its files are whole "
                                 "(ckptbench verify)", exit_code=1) from None

    def _load_state(self, listing: Listing, man, buffers: dict | None):
        """Shards and the tail into a CheckpointState, then into the model built on the meta device."""
        from ckptbench.restore import load as restore
        from ckptbench.checkpoint import confine
        from ckptbench.checkpoint.formats import inert

        if self.stage_dir:
            tail = restore.load_tail(self.stage_dir, man)
            state = restore.load_state(self.stage_dir, listing.format)
            self.notes[LOAD] = "staged to local files first, loaded from there"
        else:
            shards = [f.path for f in listing.files if f.path.endswith(restore.SHARD_EXT[listing.format])]
            if buffers is not None:
                tail = restore.load_tail(listing.source, man, reader=_buffer_reader(listing, man, buffers),
                                         rels=listing.rels)
            else:  # the files the listing holds (a walk of the folder again could find others since, or beside)
                tail = restore.load_tail(listing.source, man, rels=listing.rels)
            if self.tiled is not None:
                state = self._from_pieces(listing, buffers or {})
            else:
                with confine.beneath(getattr(self.source, "directory", None)):  # the folder named, as fastio reads
                    state = restore.load_state(listing.source, listing.format, buffers=buffers, shards=shards,
                                               lay=listing.layout)
            if listing.format == "dcp" and LOAD not in self.notes:  # why this stage outweighs the read, for DCP
                self.notes[LOAD] = ("each DCP chunk copied into a tensor of its own (DCP stores chunks at unaligned "
                                    "offsets, so they cannot be the tensors): populating that fresh memory is most "
                                    "of this stage")
        dims, why = restore.model_dims(man, tail, state.model)
        for said in (inert.describe(state.inert) if state.inert else "", why):
            if said:  # after the staging note, if any
                self.notes[LOAD] = "; ".join(filter(None, (self.notes.get(LOAD), said)))
        if dims is None:
            return None, state
        dtype = man.weights_dtype if man is not None and man.weights_dtype else restore.main_dtype(state)
        return restore.restore(state, dims, dtype), state


def _from_pieces_note(chunks: int, assembled: int, seconds: float) -> str:
    return (f"{chunks} DCP chunk(s) read by range, each into memory of its own that is its tensor (no copy)"
            + (f"; {assembled} tensor(s) saved in several chunks copied together in {seconds:.3f} s" if assembled
               else ""))


def _buffer_reader(listing: Listing, man: mf.Manifest | None, buffers: dict):
    """Tail members out of the read buffers: a packed member is a slice of its pack's buffer."""
    from ckptbench.checkpoint.members import pack_tables

    by_rel = {listing.rel(p): b for p, b in buffers.items()}
    members = {}
    if man is not None:  # every record checked (inside its pack, no overlap) before a byte is sliced
        for table in pack_tables(listing.source, man):
            for m in table.members:
                members[m.rel] = (table.name, m.offset, m.size)

    def read(rel: str):
        if rel in members:
            pack_file, off, size = members[rel]
            return by_rel[pack_file][off:off + size]
        return by_rel[rel]

    return read


def _check(restored, state, man, optimizer_step: bool, concurrency: int, known: dict | None = None):
    from ckptbench.restore import load as restore

    if restored is None:
        return restore.structural_check(state, concurrency, known, optimizer_step)
    return restore.check(restored, man, optimizer_step=optimizer_step)


def run(source: str | Source, opts: RunOptions, *, repeats: int = 3, progress: Progress | None = None,
        cancel: threading.Event | None = None, on_run: Callable[[Run], None] | None = None,
        on_repeat: Callable[[RepeatResult], None] | None = None, listing: Listing | None = None,
        ) -> list[RepeatResult]:
    """`repeats` independent restores, each under its own cache condition; one-time process costs are paid
    before the first clock starts and reported on the first repeat as `warmup_s`."""
    if repeats < 1:
        raise CkptbenchError(f"--repeat must be at least 1, got {repeats}")
    check_device(opts.device)
    src = open_source(source) if isinstance(source, str) else source
    listing = listing or src.list()
    if listing.format == "unknown":
        raise not_a_checkpoint(listing.source, listing.passed)
    oom_precheck(listing, opts.mode)
    warm = warm_up()
    out = []
    for _ in range(repeats):
        r = Run(src, listing, opts, progress, cancel)
        if on_run:
            on_run(r)
        with stops_as_interrupted():  # a Ctrl-C torch swallowed in its load (an AttributeError, "a corrupt
            # shard") is raised as the interrupt it was: the run stops as interrupted, its finished repeats kept
            rep = r.execute()
        rep.warmup_s, warm = warm, 0.0
        out.append(rep)
        if on_repeat:
            on_repeat(rep)  # recorded now: a run killed later keeps every finished repeat
        del r
        gc.collect()
    return out
