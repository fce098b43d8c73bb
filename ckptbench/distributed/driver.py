"""A distributed restore, as every rank runs it: prepare the node's cache, meet at the start barrier, restore
this rank's share (timed from the barrier), post the report; rank 0 gathers the reports into one result.

A rank that fails still reports (its error, in one line) and goes on to the end, so the others are not left
waiting; a rank that hangs or dies is named by rank 0 when its deadline passes. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from ckptbench.core.errors import CkptbenchError
from ckptbench.core.stages import LIST
from ckptbench.restore import efficiency

BYE_S = 10.0  # how long rank 0 waits for the others to read its verdict before it exits (it may host the store)


@dataclasses.dataclass
class DistOptions:
    policy: str = "part"
    timeout_s: float = 300.0
    digests: bool = False  # each rank lists a crc32c per local tensor (computed after the clock stops)
    pick: str | None = None  # which checkpoint of a folder that holds several (resume.choose)


def warm() -> float:
    """A fresh process's one-time costs (imports, torch's first operations, DCP's heavy import) paid before the
    first start barrier, as a single-process run pays them before its clock: reported apart from the RTO."""
    from ckptbench.restore.warmup import warm_up

    t = time.perf_counter()
    from ckptbench.checkpoint import shares  # noqa: F401
    from ckptbench.checkpoint.formats import dcp_items  # noqa: F401
    from ckptbench.distributed import rank  # noqa: F401

    return warm_up() + time.perf_counter() - t


def _one_repeat(world, source, opts, dopts, repeat, warmup_s: float = 0.0, heard=None) -> dict:
    """This rank's repeat, as a plain report (errors included); the interrupt `heard` raised again where a loader
    turned it into a failure of the file."""
    from ckptbench.distributed.live import Poster
    from ckptbench.distributed.rank import RankReport, RankRestore, report_doc, tensor_digests
    from ckptbench.checkpoint.shares import plan_share
    from ckptbench.restore.stages import StageClock

    rep = RankReport(world.rank, world.host, world.local_rank, warmup_s=warmup_s)
    live = Poster(world, repeat)
    live.on_stage("ready")  # before the barrier: rank 0's view finds every rank's key once it is past it
    ready = {"ok": True}
    try:
        if world.local_rank == 0:  # one rank per node sets the page cache for the node's ranks
            listing = source.list()
            cond = source.prepare_cache(listing, opts.cache, drop_caches=opts.drop_caches)
            ready = {"ok": True, "residency_before": cond.residency_before, "cache_verified": cond.verified,
                     "note": cond.note}
    except CkptbenchError as exc:
        ready = {"ok": False, "error": str(exc)}
    world.post(ready, *repeat, "ready", world.rank)
    # the start barrier: the store releases every rank when the last arrives, and each clock starts there
    _, late = world.gather_some(*repeat, "ready", fetch=False)
    t0 = time.perf_counter()
    try:
        if late:  # not restored: reported, so that rank 0 names the rank that never came
            raise CkptbenchError(f"not started: {late}")
        if not ready["ok"]:
            raise CkptbenchError(ready["error"])
        clock = StageClock(on_stage=live.on_stage, stages=rep.stages, notes=rep.notes)
        listing = clock.run(LIST, source.list)
        share = clock.run(LIST, plan_share, listing, world.size, world.rank, dopts.policy)
        alg = efficiency.hash_of(opts.hash, listing)
        state = RankRestore(source, listing, share, concurrency=opts.concurrency, read=opts.read, hash_alg=alg,
                            device=_device(opts.device, world), block_size=opts.block_size, on_stage=live.on_stage,
                            on_progress=lambda snap: live.on_bytes(int(snap.bytes), share.needed),
                            optimizer_step=opts.optimizer_step).run(rep, t0)
        if dopts.digests:
            rep.digests = tensor_digests(state)
        del state
    except CkptbenchError as exc:
        rep.status, rep.error = "failed", str(exc)
        rep.end_s = time.perf_counter() - t0
    if heard is not None:  # a Ctrl-C that torch's loader turned into a damaged file's error: the rank was stopped
        heard.raise_if_heard()
    live.on_bytes(rep.bytes_read, rep.bytes_needed)
    live.on_stage("done" if rep.status == "ok" else "failed")
    return report_doc(rep, ready if world.local_rank == 0 else None)


def _device(device: str, world) -> str:
    """Each rank moves its share to its own GPU (cuda:LOCAL_RANK) when a CUDA device is asked for."""
    return f"cuda:{world.local_rank}" if device.startswith("cuda") else device


def _first_collective(world) -> float:
    """One all-reduce on the group's backend after the restore: NCCL sets up its communicators lazily, on the
    first collective, and a resumed job pays that before its first step; timed apart from the RTO."""
    import torch
    import torch.distributed as dist

    dev = f"cuda:{world.local_rank}" if world.backend == "nccl" else "cpu"
    t = torch.ones(1, device=dev)
    t0 = time.perf_counter()
    dist.all_reduce(t)
    if world.backend == "nccl":
        torch.cuda.synchronize(dev)
    if int(t.item()) != world.size:
        raise CkptbenchError(f"rank {world.rank}: the all-reduce gave {t.item()}, not {world.size}: the group is broken")
    return time.perf_counter() - t0


def _open(source_url: str, dopts: DistOptions):
    from ckptbench.checkpoint.shares import POLICIES
    from ckptbench.sources import open_source

    if dopts.policy not in POLICIES:
        raise CkptbenchError(f"--each-rank {dopts.policy!r}: choose part or all")
    source = open_source(source_url, dopts.pick)
    if not source.files_on_disk:
        raise CkptbenchError(f"{source_url}: --distributed reads a checkpoint on a mounted filesystem shared by the "
                             "ranks (local, NFS, Lustre, FUSE); for S3 mount it or run one restore per node")
    return source


def _repeats(world, source, opts, dopts, repeats: int, tag: str, show, errors: list[str], warmup_s: float = 0.0, *,
             at, reps: list[dict], then: tuple | None = None, heard=None) -> bool:
    """`repeats` restores by every rank: rank 0 appends their combined figures to `reps` as each ends (so that an
    interrupted run still has them), and every rank learns whether all succeeded. Stops at the first failed repeat,
    on every rank alike (rank 0's verdict says). `at` follows the repeat under way and the next (`then` after the
    last)."""
    from ckptbench.distributed.rank import read_report
    from ckptbench.distributed.summary import combine

    for i in range(1, repeats + 1):
        key = (tag, i)
        at.key, at.then = key, (tag, i + 1) if i < repeats else then
        with contextlib.ExitStack() as stack:
            if world.rank == 0 and show is not None:  # every rank's stage and bytes, while they restore
                from ckptbench.distributed.live import Watcher

                stack.enter_context(Watcher(world, key, lambda summary: show(i, summary)))
            mine = _one_repeat(world, source, opts, dopts, key, warmup_s if i == 1 else 0.0, heard)
            _post_report(world, mine, key, errors, i)
            if world.rank == 0:
                reports, missing = world.gather_some(*key, "report")
        if world.rank == 0:
            rep = combine([read_report(reports[r], r) for r in sorted(reports)])
            if missing:
                rep["status"] = "failed"
                rep["problems"].insert(0, missing)
            reps.append(rep)
            world.post({"ok": rep["status"] == "ok", "why": "; ".join(rep["problems"])}, *key, "verdict")
        if not _verdict(world, key):
            return False
    return True


def _verdict(world, key: tuple) -> bool:
    """Whether rank 0 says every rank's repeat succeeded: its post as it writes it ({"ok": bool, ...}), else one line
    (anything on the network can write to the store: a list there was a TypeError traceback on every other rank)."""
    said = world.wait_for(*key, "verdict")
    if not isinstance(said, dict) or not isinstance(said.get("ok"), bool):
        raise CkptbenchError("rank 0's 'verdict' is not what a rank of ckptbench posts; run the same ckptbench on "
                             "every node, and keep the rendezvous port (MASTER_PORT) to the job's hosts")
    return said["ok"]


def _post_report(world, mine: dict, key: tuple, errors: list[str], i: int) -> None:
    """This rank's report posted (and its error kept for its own stderr)."""
    if mine["error"]:
        errors.append(f"rank {world.rank}, repeat {i}: {mine['error']}")
    world.post(mine, *key, "report", world.rank)


def _finish(world, doc: dict | None, deliver, wait_s: float | None = None) -> None:
    """Rank 0 delivers (prints, records) and then lets the others go; they wait for that (up to `wait_s`, else the
    rank timeout) before exiting."""
    if world.rank != 0:
        world.wait_for("finished", deadline_s=wait_s)  # rank 0 has printed and recorded: exiting cannot cut it short
        world.post(True, "bye", world.rank)
        return
    try:
        if deliver and doc is not None:
            deliver(doc)
    finally:
        world.post(True, "finished")
    world.post(True, "bye", 0)
    world.gather_some("bye", deadline_s=BYE_S, fetch=False)  # one that is gone is not waited for past BYE_S


@dataclasses.dataclass
class Outcome:
    rc: int  # rank 0: the run's; other ranks: 0 once rank 0 has their reports (a failing worker's own non-zero
    # exit would make torchrun stop rank 0 before it reports), 1 when rank 0 was not heard from
    doc: dict | None  # rank 0 only
    errors: list[str]  # this rank's own failures, one line each
    stopped: BaseException | None = None  # the Ctrl-C or SIGTERM that stopped this rank


def _options(opts) -> dict:
    return opts.settings() if hasattr(opts, "settings") else dict(vars(opts))


def run(source_url: str, opts, dopts: DistOptions, repeats: int, *, run_id: str, show=None,
        deliver=None) -> Outcome:
    """Every rank calls this; rank 0 hands the run document to `deliver` (print, record) before the other ranks
    are let go, and returns it. Interrupted (Ctrl-C, SIGTERM), rank 0 delivers the repeats that finished (a document
    with `interrupted`) and every rank returns the interrupt as `stopped`."""
    from ckptbench.system import env as envmod
    from ckptbench.distributed import group
    from ckptbench.checkpoint.shares import saved_world
    from ckptbench.core.interrupt import Heard
    from ckptbench.distributed.stop import Under
    from ckptbench.distributed.summary import summarize
    source = _open(source_url, dopts)
    world = group.join(opts.device, dopts.timeout_s, "run", source_url)
    try:
        errors: list[str] = []
        at, reps = Under(("run", 1)), []
        try:
            with Heard() as heard:
                ok = _repeats(world, source, opts, dopts, repeats, "run", show, errors, warm(), at=at, reps=reps,
                              heard=heard)
            collective = _first_collective(world) if ok else None  # every rank knows `ok`: all or none call it
            doc = None
            if world.rank == 0:
                listing = source.list()
                doc = summarize(run_id, listing, world, _options(opts), dopts.policy, saved_world(listing), reps,
                                envmod.snapshot(source_url))
                doc["first_collective_s"] = collective
                doc |= efficiency.of_ranks(source, listing, opts, doc)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (the CLI raises it as one)
            return _stopped(world, source_url, source, opts, dopts, reps, at, repeats, run_id, deliver, exc, errors)
        _finish(world, doc, deliver)
        return Outcome(0 if doc is None or doc["status"] in ("ok", "unverified") else 1, doc, errors)
    finally:
        group.leave(world)


def _stopped(world, source_url: str, source, opts, dopts, reps, at, repeats: int, run_id: str, deliver, exc,
             errors) -> Outcome:
    """An interrupted run: the others unblocked, the finished repeats delivered by rank 0, and every rank out within
    BYE_S. Rank 0 exits as an interrupted process does; another rank exits 0 once rank 0 has recorded (torchrun
    stops the rest when a worker exits non-zero first), else as interrupted."""
    from ckptbench.system import env as envmod
    from ckptbench.distributed import stop
    from ckptbench.distributed.group import RankFailure

    stop.unblock(world, at)
    doc = stop.document(run_id, source, opts, _options(opts), dopts.policy, world, reps, at, repeats,
                        envmod.snapshot(source_url)) if world.rank == 0 else None
    try:
        _finish(world, doc, deliver, wait_s=BYE_S)
    except RankFailure:  # rank 0 did not say it was done: this rank's own interruption is its exit status
        return Outcome(130, None, errors, exc)
    return Outcome(130 if world.rank == 0 else 0, doc, errors, exc)


def _sweep_floor(source, listing, opts, good: dict[int, list[dict]], rto_s: dict[str, dict]) -> dict:
    """A distributed sweep against the floor, worked out as a run's (each node's share of the bytes against the
    slowest rank's RTO): each level's efficiency is the floor over its median RTO, and the sweep's the fastest
    level's, as a single-process sweep's is its best level's. No efficiency where the floor gives none (not
    measured, or a cold read with no storage figure): its note says why."""
    from ckptbench.core.errors import name_source
    from ckptbench.system import floor as fl

    first = next(iter(good.values()))[0]
    fastest = min(rto_s, key=lambda lv: rto_s[lv]["median"])
    held = {"rto_stats": {"median": rto_s[fastest]["median"]}, "bytes_read": first["bytes_read"],
            "nodes": len({r["host"] for r in first["ranks"]}) or 1, "cache": first.get("cache"),
            "repeats": good[int(fastest)]}  # its fresh memory as the fastest level's ranks met it (floor_as_met)
    out = efficiency.of_ranks(source, listing, opts, held)
    usable = out["efficiency"] is not None
    out["efficiency_by_level"] = {lv: out["floor_s"] / st["median"] if usable and st["median"] else None
                                  for lv, st in rto_s.items()}
    if usable:  # which level's it is, before the note's last words (restore_fields ends it with any over-floor)
        over = name_source(fl.over_floor(out["efficiency"]), getattr(source, "url", None))
        out["floor_note"] = out["floor_note"].removesuffix(over) + (
            f"; the efficiency is concurrency {fastest}'s, the fastest level (the floor over its median RTO, the "
            "slowest rank's)") + over
    return out


def sweep(source_url: str, opts, dopts: DistOptions, levels: list[int], repeats: int, *, deliver=None,
          say=None) -> Outcome:
    """The distributed restore at each per-rank concurrency level: the aggregate read rate by level and its knee
    (the smallest level within 10 % of the best), for this many ranks on this storage."""
    from ckptbench.core.interrupt import Heard
    from ckptbench.distributed import group, stop
    from ckptbench.core.stats import spread
    from ckptbench.restore.sweep import KNEE_MARGIN, knee

    source = _open(source_url, dopts)
    world = group.join(opts.device, dopts.timeout_s, "sweep", source_url)
    at = stop.Under((f"sweep{levels[0]}", 1))
    try:
        errors: list[str] = []
        by_level: dict[int, list[dict]] = {}
        try:
            with Heard() as heard:
                warmup_s = warm()
                for n, level in enumerate(levels):
                    reps: list[dict] = []
                    then = (f"sweep{levels[n + 1]}", 1) if n + 1 < len(levels) else None
                    ok = _repeats(world, source, opts.but(concurrency=level), dopts, repeats, f"sweep{level}", None,
                                  errors, warmup_s, at=at, reps=reps, then=then, heard=heard)
                    warmup_s = 0.0
                    by_level[level] = reps
                    if not ok:
                        break
                    if world.rank == 0 and say:
                        say(level, spread([r["aggregate_gbps"] for r in reps])["median"])
        except KeyboardInterrupt:  # nothing is kept of a sweep cut short (nor of a single-process one): let go
            stop.unblock(world, at)
            if world.rank == 0:
                world.post(True, "finished")
            raise
        doc = None
        if world.rank == 0:
            listing = source.list()
            good = {lv: reps for lv, reps in by_level.items() if reps and all(r["status"] == "ok" for r in reps)}
            stats = {lv: spread([r["aggregate_gbps"] for r in reps]) for lv, reps in good.items()}
            doc = {"kind": "dist-sweep", "source": listing.source, "world_size": world.size,
                   "each_rank": dopts.policy, "cache": opts.cache, "repeats": repeats, "levels": list(stats),
                   "aggregate_gbps": {str(lv): st for lv, st in stats.items()},
                   "rto_s": {str(lv): spread([r["rto_s"] for r in good[lv]]) for lv in good},
                   "problems": [p for reps in by_level.values() for r in reps for p in r["problems"]],
                   "status": "ok" if len(good) == len(levels) else "failed"}
            if stats:
                k, best = knee({lv: st["median"] for lv, st in stats.items()})
                doc.update(knee=k, best=best, margin=KNEE_MARGIN, recommendation=f"--concurrency {k} per rank")
                doc |= _sweep_floor(source, listing, opts, good, doc["rto_s"])
        _finish(world, doc, deliver)
        return Outcome(0 if doc is None or doc["status"] in ("ok", "unverified") else 1, doc, errors)
    finally:
        group.leave(world)


__all__ = ["DistOptions", "Outcome", "run", "sweep"]
