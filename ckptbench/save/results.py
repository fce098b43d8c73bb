"""A save run on record: one results.csv row of kind `save` per save (with the environment of the target), its
document beside it in results.csv.jsonl, and the whole report as the run document."""

from __future__ import annotations

import resource
from dataclasses import asdict

from ckptbench.core.errors import redact_all
from ckptbench.records.results import SCHEMA, append, append_document, plain, recorded_text


def _append(path: str, row: dict) -> None:
    append(path, [redact_all(row)])  # a target or source path can carry a credential (s3://user:key@…, ?token=)


def _append_document(path: str, doc: dict) -> None:
    append_document(path, redact_all(doc))


def _base(run_id: str, what: str, target: str, opts, index: int, status: str, env: dict) -> dict:
    return {"schema": SCHEMA, "kind": "save", "run_id": run_id, "repeat": index, "timestamp": env["date"],
            "source": recorded_text(what), "format": opts.format, "mode": "async" if opts.async_save else "sync",
            "status": status, "target": recorded_text(target), "ranks": opts.ranks, "stagger_s": opts.stagger_s,
            "interval_s": opts.interval_s if opts.interval_s is not None else "", "env": env}


def _row(run_id: str, what: str, target: str, opts, t, env: dict, report=None) -> dict:
    """One finished save; the run's page-cache figures when the run ended (`report`), else none."""
    row = _base(run_id, what, target, opts, t.index, "ok", env) | {
        "bytes": t.bytes, "blocking_s": t.blocking_s, "written_s": t.written_s, "durable_s": t.durable_s,
        "write_gbps": t.bytes / t.durable_s / 1e9 if t.durable_s > 0 else "", "overran": t.overran,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if report is not None:
        row |= {"dirty_peak_fraction": report.dirty_peak_fraction, "throttled": report.throttled,
                "write_amplification": report.write_amplification}
    return row


def _save_doc(run_id: str, what: str, target: str, opts, t, env: dict) -> dict:
    return {"record": "repeat", "kind": "save", "schema": SCHEMA, "run_id": run_id, "repeat": t.index,
            "source": recorded_text(what), "target": target, "options": asdict(opts), "save": asdict(t), "env": env}


def record(path: str, run_id: str, what: str, report, env: dict) -> dict:
    """Appends every save's document and row, then the run document; returns the run document."""
    for t in report.saves:
        _append_document(path, _save_doc(run_id, what, report.target, report.options, t, env))
        _append(path, _row(run_id, what, report.target, report.options, t, env, report))
    doc = redact_all(plain({"record": "run", "kind": "save", "schema": SCHEMA, "run_id": run_id, "source": what,
                            "status": "ok"} | report.to_json() | {"env": env}))
    append_document(path, doc)
    return doc


def record_stopped(path: str, run_id: str, what: str, target: str, opts, done: list, status: str, env: dict) -> None:
    """A run that did not end (`status` failed or cancelled): the saves it finished, then a row for the one under
    way, with no figures."""
    for t in done:
        _append_document(path, _save_doc(run_id, what, target, opts, t, env))
        _append(path, _row(run_id, what, target, opts, t, env))
    _append(path, _base(run_id, what, target, opts, len(done) + 1, status, env))
