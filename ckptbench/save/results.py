"""A save run on record: one results.csv row of kind `save` per save (with the environment of the target), its
document beside it in results.csv.jsonl, each written as the save ends, and the whole report as the run document."""

from __future__ import annotations

from dataclasses import asdict

from ckptbench.core.errors import redact_all
from ckptbench.core.interrupt import signals_held
from ckptbench.records.recorder import Lifeline
from ckptbench.records.results import SAVE_SETTINGS, append, append_document, document, row, settings_of
from ckptbench.system import probes


def _settings(opts, target: str) -> dict:
    # a save's mode is how it blocks the training loop; target is where it writes, not an option of SaveOptions
    mode = "async" if opts.async_save else "sync"
    return settings_of(opts, SAVE_SETTINGS[2:]) | {"format": opts.format, "mode": mode, "target": target,
                                                   "interval_s": "" if opts.interval_s is None else opts.interval_s}


def _row(run_id: str, what: str, target: str, opts, t, env: dict) -> dict:
    """One finished save: its times and its own page cache (the samples since the save before it ended). What takes
    every save (the sustained throughput, the write amplification) is the run document's; older files, whose rows were
    all written at the run's end, hold the run's page-cache figures in every row."""
    figures = {"bytes": t.bytes, "blocking_s": t.blocking_s, "written_s": t.written_s, "durable_s": t.durable_s,
               "write_gbps": t.bytes / t.durable_s / 1e9 if t.durable_s > 0 else "", "overran": t.overran,
               "peak_rss_bytes": probes.own_peak_rss(),
               "dirty_peak_fraction": "" if t.dirty_peak_fraction is None else t.dirty_peak_fraction,
               "throttled": "" if t.throttled is None else t.throttled}
    # a save has nothing to verify against (verified None): `ok` is a save made durable
    return row("save", run_id, t.index, what, _settings(opts, target), figures, env, status="ok", verified=None,
               success_rate=1.0)


def _save_doc(run_id: str, what: str, target: str, opts, t, env: dict) -> dict:
    return document("repeat", "save", run_id, what, {"target": target, "options": asdict(opts), "save": asdict(t)},
                    env, repeat=t.index, status="ok", verified=None, success_rate=1.0)


class SaveRecorder:
    """Records one save run as it goes, as run's Recorder does a restore: as each save is durable and timed, its
    document then its row, neither cut short by a Ctrl-C or SIGTERM (held until both are written); the run document
    when the series ends, or ends interrupted. A save series killed outright (SIGKILL, OOM, a lost node) keeps every
    save it finished on record. `path` None: nothing written, the saves only kept."""

    def __init__(self, path: str | None, run_id: str, what: str, target: str, opts):
        self.path, self.run_id, self.what, self.target, self.opts = path, run_id, what, target, opts
        self.saves: list = []  # the saves that finished, each on record
        self._env: dict | None = None
        self.refused = False
        self.life = Lifeline(path, "save", run_id, target)

    def begin(self) -> None:
        """The series on record as started, before its first save (Lifeline: a series killed outright is then read
        as cut short, not as one that ended)."""
        self.life.begin(self.opts.count, mode=_settings(self.opts, self.target)["mode"], cache="")

    def env(self) -> dict:
        """The target's environment, taken once (at the first save: the target exists by then) for every record."""
        if self._env is None:
            from ckptbench.system import env as envmod

            self._env = envmod.snapshot(self.target)
        return self._env

    def saved(self, t) -> None:
        with signals_held():
            if self.path:
                env = self.env()
                try:
                    append_document(self.path, _save_doc(self.run_id, self.what, self.target, self.opts, t, env))
                    append(self.path, [_row(self.run_id, self.what, self.target, self.opts, t, env)])
                except Exception:
                    self.refused = True  # the results file failed: nothing more is tried there
                    raise
            self.saves.append(t)

    def stopped(self, status: str) -> None:
        """The save under way did not end (`status` failed or cancelled): a row with no figures."""
        if self.path and not self.refused and len(self.saves) < self.opts.count:
            with signals_held():
                append(self.path, [row("save", self.run_id, len(self.saves) + 1, self.what,
                                       _settings(self.opts, self.target), {}, self.env(), status=status,
                                       verified=None, success_rate=0.0)])

    def finish(self, report, stopped: dict | None = None) -> dict:
        """The run document of `report` (of every save, or of those that finished when `stopped` says the run was
        interrupted: status cancelled), on record when there is a path; returned as recorded."""
        status = "cancelled" if stopped else "ok"
        doc = document("run", "save", self.run_id if self.path else None, self.what, report.to_json() | (stopped or {}),
                       self.env(), status=status, verified=None, success_rate=1.0)
        if self.path:
            with signals_held():
                append_document(self.path, doc)
            self.life.finished()
        return redact_all(doc)  # what is shown is what was recorded: a target path can carry a credential
