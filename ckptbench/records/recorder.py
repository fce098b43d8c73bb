"""A restore run on record as it goes (Recorder): each repeat's document and row as it ends, and the run document
(summarize: medians with min/max over the repeats, every repeat, the environment) when the run ends."""

from __future__ import annotations

import contextlib
import datetime as dt

from ckptbench.core.errors import Cancelled, CkptbenchError, one_line
from ckptbench.core.interrupt import signals_held
from ckptbench.core.paths import source_identity
from ckptbench.core.stages import STAGES
from ckptbench.core.stats import spread
from ckptbench.records.results import append, append_document
from ckptbench.records.schema import SCHEMA, document, plain, recorded_text, row, settings_of, status_of
from ckptbench.system import procstat


def repeat_doc(r) -> dict:
    return {"stages": r.stages, "rto_s": r.rto_s, "read_gbps": r.read_gbps, "engine_gbps": r.engine_gbps,
            "warmup_s": r.warmup_s, "retries": r.retries, "retry_classes": r.retry_classes, "errors": r.errors,
            "cache": r.cache.to_dict(), "peak_rss_bytes": r.peak_rss_bytes, "cpu_s": r.cpu_s, "problems": r.problems,
            "notes": r.notes, "read": {"mode": r.read_mode, "why": r.read_why}, "check": r.check_kind,
            "populated": {"bytes": r.populated_bytes, "cpu_s": r.populate_cpu_s}}


def _merged(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _repeat_status(r) -> dict:
    return {"status": status_of(r.status, r.verified), "verified": r.verified, "success_rate": r.success_rate}


def summarize(run_id: str, source: str, fmt: str, opts, reps: list, env: dict) -> dict:
    """The run document: medians with min/max over the repeats, every repeat, the environment."""
    stage_stats = {s: spread([r.stages.get(s) for r in reps]) for s in STAGES}
    rto = spread([r.rto_s for r in reps])
    gbps = spread([r.read_gbps for r in reps])
    notes: dict[str, str] = {}
    for r in reps:
        notes.update(r.notes)
    body = {
        "format": fmt,
        "options": opts.settings(),
        # what `--read auto` picked, per repeat (a cold and a warm repeat can differ), and why
        "read": {"modes": sorted({r.read_mode for r in reps}), "why": reps[0].read_why},
        "check": reps[0].check_kind,
        "stages": {s: st["median"] for s, st in stage_stats.items()},
        "stages_stats": stage_stats,
        "rto_s": rto["median"],
        "rto_stats": rto,
        "warmup_s": sum(r.warmup_s for r in reps),
        "bytes": reps[0].bytes,
        "files": reps[0].files,
        "read_gbps": gbps["median"],
        "read_gbps_stats": gbps,
        "engine_gbps": spread([r.engine_gbps for r in reps])["median"],
        "retries": sum(r.retries for r in reps),
        "retry_classes": _merged([r.retry_classes for r in reps]),
        "errors": _merged([r.errors for r in reps]),
        # the repeat furthest from the condition asked for: a cold run's most resident, a hot run's least
        "cache": {"requested": opts.cache, "residency_before": (min if opts.cache == "hot" else max)(
                      r.cache.residency_before for r in reps),
                  "residency_after": max((r.cache.residency_after or 0.0) for r in reps),
                  "verified": all(r.cache.verified for r in reps),
                  "local": all(r.cache.local for r in reps),
                  "notes": sorted({r.cache.note for r in reps if r.cache.note})},
        "peak_rss_bytes": max(r.peak_rss_bytes for r in reps),
        "cpu_s": spread([r.cpu_s for r in reps])["median"],
        "notes": notes,
        "repeats": [repeat_doc(r) | _repeat_status(r) for r in reps],
    }
    return document("run", "restore", run_id, source, body, env,
                    status="ok" if all(r.status == "ok" for r in reps) else "failed",
                    verified=all(r.verified for r in reps), success_rate=min(r.success_rate for r in reps))


class Lifeline:
    """A run's beginning and end on record, so that a run killed outright (SIGKILL, OOM, a lost node: no handler runs,
    no run document) is not read as one that ended: a `started` document before its first repeat (the process that
    runs it, how many repeats it will make), and at its end its run document or, when it ends without one (failed,
    or stopped before anything finished), an `ended` document. Both append-only, as every record. History calls a
    run started and never ended `running` while its process lives and `cut short` once it is gone."""

    def __init__(self, path: str | None, kind: str, run_id: str, source: str):
        self.path, self.kind, self.run_id, self.source = path, kind, run_id, source
        self.open = False

    def begin(self, planned: int, *, mode: str, cache: str) -> None:
        """On record before the first repeat starts; `mode` and `cache` as its rows will say them."""
        if not self.path:
            return
        append(self.path, [])  # the results file made now, as its rows would make it: history reads runs from it
        append_document(self.path, {
            "record": "started", "kind": self.kind, "schema": SCHEMA, "run_id": self.run_id,
            "source": recorded_text(source_identity(self.source)), "planned": planned, "mode": mode, "cache": cache,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "process": procstat.identity()})
        self.open = True

    def finished(self) -> None:
        """Its run document is on record: that ends it."""
        self.open = False

    def close(self, exc: BaseException) -> None:
        """Ended by `exc` without a run document (cancelled by an interrupt, else failed); nothing when its run
        document ended it."""
        if self.open:
            self.open = False
            status = "cancelled" if isinstance(exc, (KeyboardInterrupt, Cancelled)) else "failed"
            # best effort: a results file that just failed would otherwise hide the error that ended the run
            with signals_held(), contextlib.suppress(OSError, CkptbenchError):
                append_document(self.path, {"record": "ended", "kind": self.kind, "schema": SCHEMA,
                                            "run_id": self.run_id, "status": status})


def unended(every: list[dict], docs: dict[str, dict]) -> dict[str, dict]:
    """run_id -> its `started` document, for the runs started on record (records/recorder.Lifeline) that neither a
    run document nor an `ended` one closed: running, or cut short."""
    ended = {d["run_id"] for d in every if d.get("record") == "ended" and isinstance(d.get("run_id"), str)}
    return {d["run_id"]: d for d in every if d.get("record") == "started" and isinstance(d.get("run_id"), str)
            and d["run_id"] not in docs and d["run_id"] not in ended}


def life(started: dict | None, finished: int) -> dict:
    """What a run never ended on record is now: `running` while its process lives, `cut short` (with how many of its
    repeats or saves finished) once it is gone, `unended` where this host cannot tell; nothing where it ended."""
    if started is None:
        return {}
    alive = procstat.still_running(started.get("process"))
    if alive is None:  # not this host's process to see: neither running nor cut short can be said
        return {"status": "unended"}
    planned = started.get("planned")
    return {"status": "running"} if alive else {
        "status": "cut short",
        "cut_short": {"finished": finished, "planned": planned if isinstance(planned, int) else None}}


MAX_WHY = 500  # a failure's line in the record: the start of a longer message says what failed


class Recorder:
    """Records one restore run as it goes: as each repeat ends, its document then its row (a row always has its
    document); the summary document when the run ends."""

    def __init__(self, path: str | None, run_id: str, source: str, fmt: str, opts, env: dict):
        self.path, self.run_id, self.fmt, self.opts, self.env = path, run_id, fmt, opts, env
        self.source = recorded_text(source)
        self.done = 0
        self.reps: list = []  # the repeats that ended, for the run document of a run stopped midway
        self.life = Lifeline(path, "restore", run_id, self.source)

    def begin(self, repeats: int) -> None:
        """The run on record as started (Lifeline), once: called as each repeat starts, past the checks before the
        first (a run refused there leaves nothing on record), it writes at the first and changes nothing after."""
        if not self.reps and not self.life.open:
            self.life.begin(repeats, mode=self.opts.mode, cache=self.opts.cache)

    def _record(self, i: int, body: dict, figures: dict, read: str, *, status: str, verified: bool | None,
                success_rate: float | None) -> None:
        said = {"status": status, "verified": verified, "success_rate": success_rate}
        append_document(self.path, document("repeat", "restore", self.run_id, self.source, {
            "format": self.fmt, "options": self.opts.settings()} | body, self.env, repeat=i, **said))
        settings = settings_of(self.opts) | {"format": self.fmt, "read": read}
        append(self.path, [row("restore", self.run_id, i, self.source, settings, figures, self.env, **said)])

    def repeat(self, r) -> None:
        self.done += 1
        self.reps.append(r)
        if not self.path:
            return
        figures = {"cache_verified": r.cache.verified, "residency_before": r.cache.residency_before,
                   "residency_after": r.cache.residency_after, "rto_s": r.rto_s, "bytes": r.bytes, "files": r.files,
                   "files_restored": r.files_restored, "read_gbps": r.read_gbps, "retries": r.retries,
                   "errors": ";".join(f"{k}={v}" for k, v in sorted(r.errors.items())),
                   "peak_rss_bytes": r.peak_rss_bytes, "cpu_s": r.cpu_s} | {f"{s}_s": r.stages.get(s) for s in STAGES}
        body = repeat_doc(r) | {"bytes": r.bytes, "files": r.files, "files_restored": r.files_restored}
        self._record(self.done, body, figures, r.read_mode or self.opts.read, status=r.status, verified=r.verified,
                     success_rate=r.success_rate)

    def stopped(self, stages: dict, status: str, exc: BaseException | None = None) -> None:
        """The repeat under way did not end: `status` is "cancelled" or "failed"; recorded with the stages it
        finished and, when it failed, why (a failed row with no reason was all a new user found of a truncated
        shard in the record)."""
        if self.path:
            why = one_line(exc, "the restore failed")[:MAX_WHY] if status == "failed" and exc is not None else None
            self._record(self.done + 1, {"stages": dict(stages), "error": why},
                         {f"{s}_s": stages.get(s, "") for s in STAGES}, self.opts.read, status=status,
                         verified=False, success_rate=None)

    def finish(self, reps: list, extra: dict | None = None) -> dict:
        """The summary document, as recorded: text valid UTF-8 and non-finite figures null."""
        doc = plain(summarize(self.run_id, self.source, self.fmt, self.opts, reps, self.env) | (extra or {}))
        if self.path:
            append_document(self.path, doc)
            self.life.finished()
        return doc
