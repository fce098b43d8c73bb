"""A watched restore on record: one results.csv row of kind `watch` (the job's restore window as its RTO and read
stage, its rate, memory and CPU, with the environment of the files' filesystem) and the whole watch document in
results.csv.jsonl, so a user's own restore sits beside ckptbench's runs on the same source."""

from __future__ import annotations

import os

from ckptbench.checkpoint.layouts import lightning_file
from ckptbench.core.errors import redact_all
from ckptbench.records.results import append, append_document, document, row


def source_of(files: list[str]) -> str:
    """The directory the watched job read its checkpoint files from (their common parent), or the one Lightning .ckpt
    among them; "" if none."""
    if not files:
        return ""
    # a Lightning checkpoint is its file, as run records it (Listing.restored): a watch of a resume from one of a
    # folder's .ckpt files was recorded as the folder
    return lightning_file(files) or os.path.commonpath([os.path.dirname(f) for f in files])


def source_in(doc: dict) -> str:
    """The watch's source: where the files it saw read lie, else the checkpoint named with --source, else ""."""
    return source_of(sorted(doc["files"])) or (doc.get("checkpoint") or {}).get("path") or ""


def _status(doc: dict) -> dict:
    """The job's own restore: nothing of it is ckptbench's to verify (verified None); it ended well when it exited 0."""
    done = doc.get("exit_code") in (None, 0)
    return {"status": "ok" if done else "failed", "verified": None, "success_rate": 1.0 if done else 0.0}


def as_document(run_id: str | None, doc: dict, env: dict) -> dict:
    """The watch's run document, as results.csv.jsonl holds it and `watch --json` prints it (run_id None: not
    recorded)."""
    doc, env = redact_all(doc), redact_all(env)  # the job's command line and paths can carry credentials
    return document("run", "watch", run_id, source_in(doc), doc, env, **_status(doc))


def record(path: str, run_id: str, doc: dict, env: dict) -> None:
    doc, env = redact_all(doc), redact_all(env)
    source, said = source_in(doc), _status(doc)
    append_document(path, as_document(run_id, doc, env))
    # read_gbps: the job's bytes over its reading window, which is also the row's read stage and RTO; a job seen to
    # read no checkpoint byte has no such window (0 s was shown as its RTO)
    # bytes that no window timed, or reads inside one sample (window_note: its length bounds their time), have no
    # RTO: 0 s was recorded, and a sample's length would have been held against a timed watch as a regression
    seen = bool(doc["bytes"]) and doc["io_span_s"] > 0 and not doc.get("window_note")
    # a count known to be short (count_note: a mapping faster than the samples) gives a lower bound, not a rate:
    # compare called 0.24 → 0.19 GB/s "at least" a regression, of 62 and 106 MiB counted of the same 128 MiB
    whole = seen and not doc.get("count_note")
    figures = {"read_s": doc["io_span_s"] if seen else None, "rto_s": doc["io_span_s"] if seen else None,
               "bytes": doc["bytes"], "files": len(doc["files"]), "read_gbps": doc["loader_gbps"] if whole else None,
               "peak_rss_bytes": doc["peak_rss_bytes"], "cpu_s": doc["cpu_s"]}
    append(path, [row("watch", run_id, 1, source, {"format": "", "mode": "watched"}, figures, env, **said)])
