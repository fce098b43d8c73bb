"""A restore session for an interactive front end: runs the pipeline, exposes the live run, records the result.

Runs in the caller's thread (a UI worker); the UI reads `current`, `stages` and the engine snapshot,
and calls set_concurrency/cancel from its own thread.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace

import fastio

from ckptbench import env as envmod
from ckptbench import pipeline, results
from ckptbench.errors import Cancelled


class RestoreSession:
    def __init__(self, source: str, opts: pipeline.RunOptions, *, results_path: str | None = "results.csv"):
        self.source = source
        self.opts = opts
        self.results_path = results_path
        self.cancel_event = threading.Event()
        self.current: pipeline.Run | None = None
        self.stage: str | None = None
        self.doc: dict | None = None
        self.status = "idle"
        self.started_at: float | None = None
        self._lock = threading.Lock()

    def _progress(self, stage: str, _snap) -> None:
        self.stage = stage

    def _on_run(self, run: pipeline.Run) -> None:
        with self._lock:
            self.current = run

    def snapshot(self) -> fastio.Snapshot | None:
        run = self.current
        handle = run.handle if run is not None else None
        return handle.snapshot() if handle is not None else None

    def stages(self) -> dict[str, float]:
        run = self.current
        return dict(run.stages) if run is not None else {}

    def set_concurrency(self, n: int) -> None:
        """Changes the live engine's concurrency and the one later repeats start with."""
        n = max(1, min(fastio.MAX_CONCURRENCY, n))
        with self._lock:
            self.opts = replace(self.opts, concurrency=n)
            run = self.current
            if run is not None:
                run.opts = self.opts
                if run.handle is not None:
                    run.handle.set_concurrency(n)

    def cancel(self) -> None:
        self.cancel_event.set()
        run = self.current
        if run is not None and run.handle is not None:
            run.handle.cancel()

    def run(self, repeats: int = 1) -> dict:
        """Blocking: the timed restore; records every finished repeat, or one cancelled row."""
        from ckptbench.cli_run import rows_of, summarize

        self.status = "running"
        self.started_at = time.perf_counter()
        listing = pipeline.list_checkpoint(self.source)
        run_id = uuid.uuid4().hex[:12]
        environment = envmod.snapshot(self.source)
        try:
            reps = pipeline.run(self.source, self.opts, repeats=repeats, progress=self._progress,
                                cancel=self.cancel_event, on_run=self._on_run, listing=listing)
        except Cancelled:
            self.status = "cancelled"
            if self.results_path:
                results.append(self.results_path, [cancelled_row(run_id, self.source, listing.format, self.opts,
                                                                  self.stages(), environment)])
            raise
        self.doc = summarize(run_id, self.source, listing.format, self.opts, reps, environment)
        if self.results_path:
            results.append(self.results_path, rows_of(self.doc, reps))
        self.status = self.doc["status"]
        return self.doc


def cancelled_row(run_id: str, source: str, fmt: str, opts: pipeline.RunOptions, stages: dict, environment: dict) -> dict:
    row = {"schema": 1, "run_id": run_id, "repeat": 1, "timestamp": environment["date"], "source": source,
           "format": fmt, "mode": opts.mode, "status": "cancelled", "cache": opts.cache, "cache_verified": "",
           "concurrency": opts.concurrency, "read": opts.read, "hash": opts.hash or "", "block_size": opts.block_size,
           "device": opts.device, "env": environment}
    row.update({f"{s}_s": stages.get(s, "") for s in results.STAGES})
    return row
