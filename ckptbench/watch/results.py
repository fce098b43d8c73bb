"""A watched restore on record: one results.csv row of kind `watch` (the job's restore window as its RTO and read
stage, its rate, memory and CPU, with the environment of the files' filesystem) and the whole watch document in
results.csv.jsonl, so a user's own restore sits beside ckptbench's runs on the same source."""

from __future__ import annotations

import os

from ckptbench.core.errors import redact_all
from ckptbench.records.results import SCHEMA, append, append_document, plain, recorded_text


def source_of(files: list[str]) -> str:
    """The directory the watched job read its checkpoint files from (their common parent), or "" if none."""
    if not files:
        return ""
    return os.path.commonpath([os.path.dirname(f) for f in files])


def record(path: str, run_id: str, doc: dict, env: dict) -> None:
    doc, env = redact_all(doc), redact_all(env)  # the job's command line and paths can carry credentials
    source = source_of(sorted(doc["files"]))
    status = "ok" if doc.get("exit_code") in (None, 0) else "failed"
    append_document(path, plain({"record": "run", "kind": "watch", "schema": SCHEMA, "run_id": run_id,
                                 "source": source} | doc | {"env": env}))
    append(path, [{"schema": SCHEMA, "kind": "watch", "run_id": run_id, "repeat": 1, "timestamp": env["date"],
                   "source": recorded_text(source), "format": "", "mode": "watched", "status": status,
                   "read_s": doc["io_span_s"], "rto_s": doc["io_span_s"], "bytes": doc["bytes"],
                   "files": len(doc["files"]), "read_gbps": doc["loader_gbps"],
                   "peak_rss_bytes": doc["peak_rss_bytes"], "cpu_s": doc["cpu_s"], "env": env}])
