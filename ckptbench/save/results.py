"""A save run on record: one results.csv row of kind `save` per save (with the environment of the target), its
document beside it in results.csv.jsonl, and the whole report as the run document."""

from __future__ import annotations

from dataclasses import asdict

from ckptbench.core.errors import redact_all
from ckptbench.records.results import SAVE_SETTINGS, append, append_document, document, row, settings_of
from ckptbench.system import probes


def _settings(opts, target: str) -> dict:
    # a save's mode is how it blocks the training loop; target is where it writes, not an option of SaveOptions
    mode = "async" if opts.async_save else "sync"
    return settings_of(opts, SAVE_SETTINGS[2:]) | {"format": opts.format, "mode": mode, "target": target,
                                                   "interval_s": "" if opts.interval_s is None else opts.interval_s}


def _row(run_id: str, what: str, target: str, opts, t, env: dict, report=None) -> dict:
    """One finished save; the run's page-cache figures when the run ended (`report`), else none."""
    figures = {"bytes": t.bytes, "blocking_s": t.blocking_s, "written_s": t.written_s, "durable_s": t.durable_s,
               "write_gbps": t.bytes / t.durable_s / 1e9 if t.durable_s > 0 else "", "overran": t.overran,
               "peak_rss_bytes": probes.own_peak_rss()}
    if report is not None:
        figures |= {"dirty_peak_fraction": report.dirty_peak_fraction, "throttled": report.throttled,
                    "write_amplification": report.write_amplification}
    # a save has nothing to verify against (verified None): `ok` is a save made durable
    return row("save", run_id, t.index, what, _settings(opts, target), figures, env, status="ok", verified=None,
               success_rate=1.0)


def _save_doc(run_id: str, what: str, target: str, opts, t, env: dict) -> dict:
    return document("repeat", "save", run_id, what, {"target": target, "options": asdict(opts), "save": asdict(t)},
                    env, repeat=t.index, status="ok", verified=None, success_rate=1.0)


def record(path: str, run_id: str, what: str, report, env: dict) -> dict:
    """Appends every save's document and row, then the run document; returns the run document."""
    for t in report.saves:
        append_document(path, _save_doc(run_id, what, report.target, report.options, t, env))
        append(path, [_row(run_id, what, report.target, report.options, t, env, report)])
    doc = document("run", "save", run_id, what, report.to_json(), env, status="ok", verified=None, success_rate=1.0)
    append_document(path, doc)
    return redact_all(doc)  # what is shown is what was recorded: a target path can carry a credential


def unrecorded(what: str, report, env: dict) -> dict:
    """The run document `record` would append, for a run given `--results ''`: nothing on record, so no run id."""
    return redact_all(document("run", "save", None, what, report.to_json(), env, status="ok", verified=None,
                               success_rate=1.0))


def record_stopped(path: str, run_id: str, what: str, target: str, opts, done: list, status: str, env: dict) -> None:
    """A run that did not end (`status` failed or cancelled): the saves it finished, then a row for the one under
    way, with no figures."""
    for t in done:
        append_document(path, _save_doc(run_id, what, target, opts, t, env))
        append(path, [_row(run_id, what, target, opts, t, env)])
    append(path, [row("save", run_id, len(done) + 1, what, _settings(opts, target), {}, env, status=status,
                      verified=None, success_rate=0.0)])
