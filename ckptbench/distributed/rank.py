"""One rank's restore of its share: plan, read (native, by byte range), verify, load, device, check — timed.

Runs in the rank's own process; knows nothing of the other ranks (group.py does the talking). Every figure it
returns is this rank's, with its clock started at the common start barrier.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass, field

import fastio
import torch

from ckptbench.checkpoint.shares import Share
from ckptbench.core import jsontext
from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.manifest import MANIFEST_NAME
from ckptbench.checkpoint.formats import CheckpointState, inert
from ckptbench.core.stages import CHECK, DEVICE, LOAD, READ, VERIFY
from ckptbench.restore.device import HostRing, ring_note
from ckptbench.restore.stages import StageClock

TIMELINE_S = 0.1  # progress samples during the read, for the per-rank lanes


@dataclass
class RankReport:
    rank: int
    host: str
    local_rank: int
    status: str = "ok"
    error: str | None = None
    how: str = ""
    stages: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    read_start_s: float = 0.0  # from the start barrier
    read_end_s: float = 0.0
    end_s: float = 0.0
    bytes_read: int = 0  # payload: the pieces the share names
    bytes_needed: int = 0
    index_bytes: int = 0  # headers, .metadata, chunk indexes read to plan
    requests: int = 0
    files: int = 0
    read_mode: str = ""
    verified: bool = False
    tensors: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)
    plan: dict = field(default_factory=dict)  # the read plan's shape (plan_analysis)
    intervals: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # bytes read, merged per file
    digests: dict[str, str] = field(default_factory=dict)  # --tensor-digests: crc32c of each local tensor
    assemble_s: float = 0.0  # within load: rows copied together from several stored chunks (resharding)
    warmup_s: float = 0.0  # first repeat: this process's one-time costs, paid before the start barrier
    populated_bytes: int = 0  # fresh destination bytes the read populated, and its workers' CPU time in it (the
    populate_cpu_s: float = 0.0  # rate the rank met fresh memory at: the floor as the run met the box, per node)

    @property
    def read_gbps(self) -> float:
        span = self.read_end_s - self.read_start_s
        return self.bytes_read / span / 1e9 if span > 0 else 0.0


_KINDS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "str | None": (str, type(None))}


def _time(v) -> bool:
    """A count or seconds a rank posted: a number a float holds, finite, not below 0 (jsontext.number)."""
    n = jsontext.number(v)
    return n is not None and n >= 0


def read_report(doc, rank: int) -> dict:
    """A report another rank posted, checked before rank 0 combines it: a dict holding every RankReport field with a
    value of its type, from the rank it says. Anything on the network can write to the group's store (torch's is
    not authenticated), and a rank of another ckptbench posts other fields: rank 0 took either apart with a
    KeyError or a TypeError, a traceback. CkptbenchError naming the rank otherwise."""
    from dataclasses import fields

    def bad(what: str) -> CkptbenchError:
        return CkptbenchError(f"rank {rank}: its report cannot be read ({what}); run the same ckptbench on every "
                              "node, and keep the rendezvous port (MASTER_PORT) to the job's hosts")

    if not isinstance(doc, dict):
        raise bad(f"a {type(doc).__name__}, not a report")
    for f in fields(RankReport):
        v = doc.get(f.name)
        want = _KINDS.get(f.type) or ((dict,) if f.type.startswith("dict") else (list,))
        if f.name not in doc or not isinstance(v, want) or (isinstance(v, bool) and bool not in want):
            raise bad(f"{f.name} is missing or not {f.type}")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not _time(v):
            raise bad(f"{f.name} is {str(v)[:40]}")
    if doc["rank"] != rank:
        raise bad(f"it says it is rank {doc['rank']}")
    if not all(_time(t) for t in doc["stages"].values()):
        raise bad("a stage's seconds are not a time")
    if not all(isinstance(k, str) and isinstance(v, list) and all(
            isinstance(iv, list) and len(iv) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in iv)
            for iv in v) for k, v in doc["intervals"].items()):
        raise bad("its read intervals are not byte ranges")
    if doc.get("cache") is not None and not isinstance(doc["cache"], dict):
        raise bad("its cache condition is not one")
    return doc


def report_doc(rep: RankReport, cache: dict | None = None) -> dict:
    """The report a rank posts for rank 0 to combine: its figures, its bytes over what its share needs, what torch's
    DCP reader would have read for it, and (on one rank per node) the node's page cache before the repeat."""
    doc = asdict(rep)
    doc["read_gbps"] = rep.read_gbps
    doc["amplification"] = rep.bytes_read / rep.bytes_needed if rep.bytes_needed else None
    stock = rep.plan.get("dcp_reader")
    doc["dcp_reader_amplification"] = stock["bytes"] / rep.bytes_needed if stock and rep.bytes_needed else None
    doc["cache"] = cache
    return doc


def merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def plan_analysis(share: Share) -> dict:
    """The read plan's shape: requests, bytes per request, backward seeks (a request that starts before the
    previous one on the same file ended, in issue order), files touched; and for DCP what torch's own reader
    would do with the same share: it reads every stored chunk whole, once per request that touches it."""
    def shape(reqs: list[tuple[str, int, int]]) -> dict:
        last: dict[str, int] = {}
        back = 0
        for rel, off, n in reqs:
            if rel in last and off < last[rel]:
                back += 1
            last[rel] = off + n
        total = sum(n for _, _, n in reqs)
        return {"requests": len(reqs), "bytes": total, "bytes_per_request": total / len(reqs) if reqs else 0,
                "backward_seeks": back, "files_touched": len(last)}

    doc = {"ours": shape([(p.rel, p.offset, p.length) for p in share.pieces])}
    stock = [(p.rel,) + p.item for p in share.pieces if p.item is not None]
    if stock:
        by_file: dict[str, list] = {}
        for req in stock + [(p.rel, p.offset, p.length) for p in share.pieces if p.item is None]:
            by_file.setdefault(req[0], []).append(req)  # DCP groups a rank's requests by file, in plan order
        doc["dcp_reader"] = shape([r for reqs in by_file.values() for r in reqs])
    return doc


class RankRestore:
    """The timed stages of one rank, on the one stage runner (restore.stages) a single process uses, reading through
    the sources seam; `t0` is the start barrier's release on this rank's clock."""

    def __init__(self, source, listing, share: Share, *, concurrency: int, read: str, hash_alg: str, device: str,
                 block_size: int = 1 << 20, on_progress=None, on_stage=None, optimizer_step: bool = False):
        self.source, self.listing, self.share = source, listing, share
        self.optimizer_step = optimizer_step  # a rank has no model to step: its check says it did not run
        self.root, self.fmt, self.man = listing.source, listing.format, listing.manifest
        self.concurrency, self.read, self.hash = concurrency, read, hash_alg
        self.device, self.block_size = device, block_size
        self.on_progress = on_progress
        self.on_stage = on_stage
        self.cancel = threading.Event()

    def run(self, rep: RankReport, t0: float) -> CheckpointState:
        clock = StageClock(self.cancel, self.on_stage, rep.stages, rep.notes)
        share = self.share
        rep.how, rep.bytes_needed, rep.index_bytes = share.how, share.needed, share.index_bytes
        rep.requests = len(share.pieces)
        rep.files = len({p.rel for p in share.pieces})
        rep.plan = plan_analysis(share)
        per_file: dict[str, list[tuple[int, int]]] = {}
        for p in share.pieces:
            per_file.setdefault(p.rel, []).append((p.offset, p.offset + p.length))
        rep.intervals = {rel: merged(iv) for rel, iv in per_file.items()}
        rep.read_start_s = time.perf_counter() - t0
        result = clock.run(READ, self._read, clock, rep, t0)
        rep.read_end_s = time.perf_counter() - t0
        clock.run(VERIFY, self._verify, rep, result)
        state = clock.run(LOAD, self._load, result, rep)
        del result  # the buffers live on as the tensors' storage; the result's other references go
        rep.tensors = sum(1 for _ in state.tensors())
        if state.inert:
            rep.notes[LOAD] = inert.describe(state.inert)
        clock.run(DEVICE, self._to_device, state, rep)
        report = clock.run(CHECK, _check, state, self.concurrency, self.optimizer_step)
        rep.notes[CHECK] = report.summary
        if not report.ok:
            raise CkptbenchError(f"check failed: {report.problems[0]}")
        rep.end_s = time.perf_counter() - t0
        return state

    def _read(self, clock: StageClock, rep: RankReport, t0: float) -> fastio.ReadResult:
        from ckptbench.checkpoint import confine
        from ckptbench.sources import Listing, ReadOptions

        pieces = self.share.pieces
        # every path checked where it is read: a manifest or DCP metadata names them, and either may be crafted
        real = {rel: confine.resolve(self.root, rel) for rel in {p.rel for p in pieces}}
        specs = [fastio.FileSpec(real[p.rel], p.length) if p.whole else
                 fastio.FileSpec(real[p.rel], p.length, offset=p.offset) for p in pieces]
        # this rank's pieces as a listing of its own: the source chooses the read path (`auto`: by residency, what
        # the filesystem accepts, and whether the ranges are aligned for O_DIRECT) and reads them, as for one process
        mine = Listing(self.root, specs, self.man, self.fmt)
        opts, rep.notes[READ] = self.source.choose_read(mine, ReadOptions(
            concurrency=self.concurrency, read=self.read, hash=self.hash, block_size=self.block_size))
        rep.read_mode = opts.read

        def progress(snap) -> None:
            rep.timeline.append((round(time.perf_counter() - t0, 4), int(snap.bytes)))
            if self.on_progress:
                self.on_progress(snap)

        res = clock.read(self.source, mine, opts, into="memory", on_progress=progress, interval=TIMELINE_S).result
        if res.failed:
            f = res.failed[0]
            rel = next(p.rel for p, r in zip(pieces, res.files) if r is f)
            raise CkptbenchError(f"{rel}: unreadable ({f.error.message})"
                                 + (f" and {len(res.failed) - 1} more" if len(res.failed) > 1 else ""))
        rep.bytes_read = res.bytes
        rep.populated_bytes, rep.populate_cpu_s = res.final.populated_bytes, res.final.populate_cpu_s
        return res

    def _verify(self, rep: RankReport, res: fastio.ReadResult) -> None:
        """Whole files against the manifest's digests; byte ranges have no reference (digests are per file)."""
        man = self.man
        whole = [(p, f) for p, f in zip(self.share.pieces, res.files) if p.whole]
        if man is None or self.hash == "none" or man.hash != self.hash:
            rep.notes[VERIFY] = "NOT VERIFIED: no manifest digests to compare with"
            return
        ref = {e.path: e for e in man.files}
        for p, f in whole:
            e = ref.get(p.rel)
            if e is not None and (e.bytes != f.bytes or (e.digest is not None and e.digest != f.digest)):
                raise CkptbenchError(f"{p.rel}: digest or size differs from the manifest (read {f.bytes} bytes); "
                                     "the file changed or is corrupt: ckptbench verify names it")
        ranged = len(self.share.pieces) - len(whole)
        unlisted = sorted({p.rel for p, _ in whole if p.rel not in ref and p.rel != MANIFEST_NAME})  # no digest
        rep.verified = ranged == 0 and bool(whole) and not unlisted
        rep.notes[VERIFY] = (f"{len(whole) - len(unlisted)} whole file(s) matched the manifest" +
                             (f"; {ranged} byte range(s) NOT VERIFIED (the manifest's digests cover whole files)"
                              if ranged else "") +
                             (f"; {len(unlisted)} file(s) NOT VERIFIED: not in the manifest (first {unlisted[0]})"
                              if unlisted else ""))

    def _load(self, res: fastio.ReadResult, rep: RankReport) -> CheckpointState:
        from ckptbench.checkpoint.shares import put, tensors_of

        share, bufs = self.share, res.buffers
        state = CheckpointState({})
        tensors, entries, rep.assemble_s = tensors_of(share, bufs)
        for key, t in tensors.items():
            put(state, key, t, self.fmt)
        state.extra.update(entries)
        whole = {os.path.join(self.root, p.rel): b for p, b in zip(share.pieces, bufs) if p.whole}
        if whole:
            listed = [os.path.join(self.root, r) for r in self.listing.rels]
            state.merge(_load_whole(self.root, self.fmt, share, whole, listed))
        return state

    def _to_device(self, state: CheckpointState, rep: RankReport) -> None:
        if self.device == "cpu":
            rep.notes[DEVICE] = "cpu: nothing to move"
            return
        ring = HostRing(self.device)
        for name, t in list(state.model.items()):
            state.model[name] = ring.move(t)
        for name, parts in state.optim.items():
            for k, t in list(parts.items()):
                parts[k] = ring.move(t)
        for name, v in list(state.extra.items()):
            if isinstance(v, torch.Tensor):
                state.extra[name] = ring.move(v)
        ring.finish()
        rep.notes[DEVICE] = ring_note(ring)


def tensor_digests(state: CheckpointState) -> dict[str, str]:
    """crc32c of every tensor's bytes as this rank holds it (after the RTO clock): restores at different world
    sizes, or a distributed and a single-process one, can be compared tensor by tensor."""
    out = {}
    for _, name, t in state.tensors():
        h = fastio.Hasher("crc32c")
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        out[name] = h.hexdigest()
    return out


def _load_whole(root: str, fmt: str, share: Share, buffers: dict[str, memoryview],
                listed: list[str] = ()) -> CheckpointState:
    """Whole files through their format's own loader (checked as a single-process restore checks them); `listed`:
    every file of the checkpoint, this rank's or not."""
    from ckptbench.restore import load as restore

    paths = list(buffers)
    if fmt == "dcp" and any(p.endswith(".distcp") for p in paths):
        return restore.load_state(root, "dcp", buffers=buffers)
    ext = restore.SHARD_EXT.get(fmt, ())
    shards = [p for p in paths if p.endswith(ext)]
    state = CheckpointState({})
    if share.state_files:  # a Trainer's state beside the weights: whoever reads it loads it
        from ckptbench.checkpoint.formats.torch_shards import load_state_files

        state.merge(load_state_files([os.path.join(root, r) for r in share.state_files], buffers))
    if not shards:
        return state  # otherwise only small files (config, tokenizer): read, as a restore reads them
    if fmt == "torch":
        from ckptbench.checkpoint.formats import torch_format

        if share.complete:
            return restore.load_state(root, fmt, buffers=buffers, shards=shards)
        from ckptbench.checkpoint.formats.torch_shards import check_complete

        for p in shards:  # a rank's subset: the index's cross-file check needs every shard, so none here
            state.merge(torch_format.load_buffer(buffers[p], p))
        # but each Megatron or ZeRO rank file saved the sizes of the whole save: a step short of a rank passed
        # spread over ranks, which a single-process restore refuses
        check_complete([p for p in listed if p.endswith(ext)], state)
        return state
    if fmt == "safetensors":
        from ckptbench.checkpoint.formats import safetensors_format

        for p in shards:
            state.merge(safetensors_format.load_buffer(buffers[p], p))
        return state
    return restore.load_state(root, fmt, buffers=buffers, shards=shards)


def _check(state: CheckpointState, concurrency: int, optimizer_step: bool = False):
    from ckptbench.restore.load import structural_check

    return structural_check(state, concurrency, optimizer_step=optimizer_step)
