"""A restore session for an interactive front end: runs the pipeline, exposes the live run, records the result.

Runs in the caller's thread (a UI worker); the UI reads `current`, `stages` and the read handle's snapshot,
and calls set_concurrency/cancel from its own thread.
"""

from __future__ import annotations

import threading
import time
import uuid

import fastio

from ckptbench.core import concurrency as conc
from ckptbench.system import env as envmod
from ckptbench.restore import efficiency, runner as pipeline
from ckptbench.records import results
from ckptbench.records.recorder import Recorder
from ckptbench.core.errors import Cancelled
from ckptbench.sources import open_source


class RestoreSession:
    def __init__(self, source: str, opts: pipeline.RunOptions, *, results_path: str | None = "results.csv",
                 pick: str | None = None):
        self.source = source
        self.pick = pick  # which checkpoint of a folder holding several (open_source)
        self.opts = opts
        self.results_path = results_path
        self.cancel_event = threading.Event()
        self.current: pipeline.Run | None = None
        self.stage: str | None = None
        self.doc: dict | None = None
        self.status = "idle"
        self.started_at: float | None = None
        self.live_changes: list[int] = []  # concurrency changes the running read took
        self._lock = threading.Lock()

    def _progress(self, stage: str, _snap) -> None:
        self.stage = stage

    def _on_run(self, run: pipeline.Run) -> None:
        with self._lock:
            self.current = run

    def _handle(self):
        run = self.current
        return run.handle if run is not None else None

    def snapshot(self) -> fastio.Snapshot | None:
        handle = self._handle()
        return handle.snapshot() if handle is not None else None

    def live_concurrency(self) -> bool | None:
        """Whether the running read can change concurrency now; None while no read runs."""
        handle = self._handle()
        return None if handle is None else handle.live_concurrency

    def stages(self) -> dict[str, float]:
        run = self.current
        return dict(run.stages) if run is not None else {}

    def set_concurrency(self, n: int) -> int | None:
        """The concurrency later repeats start with; and the live read's, which is returned (None: no read
        runs, or it cannot change live)."""
        n = conc.clamp(n)
        with self._lock:
            self.opts = self.opts.but(concurrency=n)
            run = self.current
            if run is not None:
                run.opts = self.opts
                if run.handle is not None and run.handle.live_concurrency:
                    live = run.handle.set_concurrency(n)
                    self.live_changes.append(live)
                    return live
        return None

    def cancel(self) -> None:
        self.cancel_event.set()
        handle = self._handle()
        if handle is not None:
            handle.cancel()

    def run(self, repeats: int = 1) -> dict:
        """Blocking: the timed restore; records each repeat as it ends, or one cancelled row."""
        self.status = "running"
        self.started_at = time.perf_counter()
        recorder = None
        try:
            if self.results_path:
                results.check_writable(self.results_path)  # before the restore, not after it
            src = open_source(self.source, self.pick)
            listing = src.list()
            # the checkpoint restored, as `run` records it: the folder given (a Trainer's output_dir) was recorded,
            # so compare never held a dashboard run against a `run` of the same checkpoint
            recorder = Recorder(self.results_path, uuid.uuid4().hex[:12], listing.restored, listing.format, self.opts,
                                envmod.snapshot(self.source))

            def on_run(run: pipeline.Run) -> None:
                self._on_run(run)
                recorder.begin(repeats)  # from the first repeat on, a dashboard killed outright is cut short

            reps = pipeline.run(src, self.opts, repeats=repeats, progress=self._progress, cancel=self.cancel_event,
                                on_run=on_run, on_repeat=recorder.repeat, listing=listing)
        except BaseException as exc:
            self.status = "cancelled" if isinstance(exc, Cancelled) else "failed"
            if recorder is not None:
                recorder.stopped(self.stages(), self.status, exc)
                recorder.life.close(exc)
            raise
        # the row and the document both carry the settings the run started with; live changes are listed
        self.doc = recorder.finish(reps, {"concurrency_changes": list(self.live_changes)}
                                   | efficiency.of_repeats(src, listing, self.opts, reps))
        self.status = self.doc["status"]
        return self.doc
