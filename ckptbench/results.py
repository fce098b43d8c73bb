"""results.csv: one row per repeat, append-only, each row carrying its environment; and reading it back."""

from __future__ import annotations

import csv
import io
import json
import os

from ckptbench.errors import CkptbenchError
from ckptbench.stages import STAGES
from ckptbench.stats import spread

SCHEMA = 1
COLUMNS = tuple(
    ["schema", "run_id", "repeat", "timestamp", "source", "format", "mode", "status", "cache", "cache_verified",
     "residency_before", "residency_after", "concurrency", "read", "hash", "block_size", "device"]
    + [f"{s}_s" for s in STAGES]
    + ["rto_s", "bytes", "files", "files_restored", "read_gbps", "success_rate", "retries", "errors",
       "peak_rss_bytes", "cpu_s", "env"]
)


def _line(values: list) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def check_writable(path: str) -> None:
    """Before a run: an existing file must be ours (same header), so nothing is appended to a foreign file."""
    if os.path.exists(path):
        read_rows(path)
    else:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise CkptbenchError(f"{path}: cannot create the results file there; choose a writable --results path")


def append(path: str, rows: list[dict]) -> None:
    """Appends rows with one write each to an O_APPEND file: a crash loses at most the row being written."""
    if not os.path.exists(path):
        header = _line(list(COLUMNS))
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another writer created it meanwhile: then keep theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    read_rows(path)  # refuses a foreign or damaged file before touching it
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for row in rows:
            values = [json.dumps(row[c], sort_keys=True) if c == "env" else row.get(c, "") for c in COLUMNS]
            os.write(fd, _line(values).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_rows(path: str) -> list[dict]:
    """Rows as dicts with numbers parsed and env decoded; one clear error for anything that is not our file."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise CkptbenchError(f"{path}: empty; not a ckptbench results file")
            if tuple(header) != COLUMNS:
                raise CkptbenchError(f"{path}: not a ckptbench results file of schema {SCHEMA} (its header differs); "
                                     "use another --results path")
            rows = []
            for lineno, values in enumerate(reader, start=2):
                if len(values) != len(COLUMNS):
                    raise CkptbenchError(f"{path}:{lineno}: malformed row ({len(values)} fields, expected "
                                         f"{len(COLUMNS)}); repair or move the file")
                rows.append(_parse(dict(zip(COLUMNS, values)), path, lineno))
            return rows
    except UnicodeDecodeError:
        raise CkptbenchError(f"{path}: not a text file; not a ckptbench results file") from None
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read ({exc.strerror})") from None


def _parse(row: dict, path: str, lineno: int) -> dict:
    out = dict(row)
    try:
        out["env"] = json.loads(row["env"]) if row["env"] else {}
        for k, v in row.items():
            if k in ("env", "run_id", "timestamp", "source", "format", "mode", "status", "cache", "read", "hash",
                     "device", "cache_verified", "errors"):
                continue
            out[k] = float(v) if v not in ("", "None") else None
    except ValueError:
        raise CkptbenchError(f"{path}:{lineno}: malformed value; repair or move the file") from None
    return out


def repeat_doc(r) -> dict:
    return {"status": r.status, "stages": r.stages, "rto_s": r.rto_s, "read_gbps": r.read_gbps,
            "engine_gbps": r.engine_gbps, "warmup_s": r.warmup_s, "success_rate": r.success_rate,
            "retries": r.retries, "retry_classes": r.retry_classes, "errors": r.errors, "cache": r.cache.to_dict(),
            "peak_rss_bytes": r.peak_rss_bytes, "cpu_s": r.cpu_s, "problems": r.problems, "notes": r.notes}


def _merged(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def summarize(run_id: str, source: str, fmt: str, opts, reps: list, env: dict) -> dict:
    """The run document: medians with min/max over the repeats, every repeat, the environment."""
    stage_stats = {s: spread([r.stages.get(s) for r in reps]) for s in STAGES}
    rto = spread([r.rto_s for r in reps])
    gbps = spread([r.read_gbps for r in reps])
    notes: dict[str, str] = {}
    for r in reps:
        notes.update(r.notes)
    return {
        "run_id": run_id,
        "source": source,
        "format": fmt,
        "options": vars(opts),
        "status": "ok" if all(r.status == "ok" for r in reps) else "failed",
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
        "success_rate": min(r.success_rate for r in reps),
        "retries": sum(r.retries for r in reps),
        "retry_classes": _merged([r.retry_classes for r in reps]),
        "errors": _merged([r.errors for r in reps]),
        "cache": {"requested": opts.cache, "residency_before": max(r.cache.residency_before for r in reps),
                  "residency_after": max((r.cache.residency_after or 0.0) for r in reps),
                  "verified": all(r.cache.verified for r in reps),
                  "notes": sorted({r.cache.note for r in reps if r.cache.note})},
        "peak_rss_bytes": max(r.peak_rss_bytes for r in reps),
        "cpu_s": spread([r.cpu_s for r in reps])["median"],
        "notes": notes,
        "repeats": [repeat_doc(r) for r in reps],
        "env": env,
    }


def _row(run_id: str, i: int, source: str, fmt: str, opts, env: dict, status: str) -> dict:
    row = {"schema": SCHEMA, "run_id": run_id, "repeat": i, "timestamp": env["date"], "source": source,
           "format": fmt, "mode": opts.mode, "status": status, "cache": opts.cache, "cache_verified": "",
           "concurrency": opts.concurrency, "read": opts.read, "hash": opts.hash or "",
           "block_size": opts.block_size, "device": opts.device, "env": env}
    return row


def repeat_row(run_id: str, i: int, source: str, fmt: str, opts, env: dict, r) -> dict:
    """One finished repeat as a results.csv row."""
    row = _row(run_id, i, source, fmt, opts, env, r.status)
    row.update({"cache_verified": r.cache.verified, "residency_before": r.cache.residency_before,
                "residency_after": r.cache.residency_after, "rto_s": r.rto_s, "bytes": r.bytes, "files": r.files,
                "files_restored": r.files_restored, "read_gbps": r.read_gbps, "success_rate": r.success_rate,
                "retries": r.retries, "errors": ";".join(f"{k}={v}" for k, v in sorted(r.errors.items())),
                "peak_rss_bytes": r.peak_rss_bytes, "cpu_s": r.cpu_s})
    row.update({f"{s}_s": r.stages.get(s) for s in STAGES})
    return row


def stopped_row(run_id: str, i: int, source: str, fmt: str, opts, env: dict, stages: dict, status: str) -> dict:
    """A repeat that did not end (cancelled, or failed with an error): recorded with the stages it finished."""
    row = _row(run_id, i, source, fmt, opts, env, status)
    row.update({f"{s}_s": stages.get(s, "") for s in STAGES})
    return row


class Recorder:
    """Records one run as it goes: each repeat's row lands when that repeat ends; the document at the end."""

    def __init__(self, path: str | None, run_id: str, source: str, fmt: str, opts, env: dict):
        self.path, self.run_id, self.source, self.fmt, self.opts, self.env = path, run_id, source, fmt, opts, env
        self.done = 0

    def repeat(self, rep) -> None:
        self.done += 1
        if self.path:
            append(self.path, [repeat_row(self.run_id, self.done, self.source, self.fmt, self.opts, self.env, rep)])

    def stopped(self, stages: dict, status: str) -> None:
        """The repeat under way did not end: `status` is "cancelled" or "failed"."""
        if self.path:
            append(self.path, [stopped_row(self.run_id, self.done + 1, self.source, self.fmt, self.opts, self.env,
                                           stages, status)])

    def finish(self, reps: list, extra: dict | None = None) -> dict:
        doc = summarize(self.run_id, self.source, self.fmt, self.opts, reps, self.env) | (extra or {})
        if self.path:
            with open(self.path + ".jsonl", "a") as f:
                f.write(json.dumps(doc, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return doc
