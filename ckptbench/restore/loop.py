"""Loop mode: a source read pass after pass, so each concurrency level has time to show the rate it settles at.

Each pass is a restore's path without the load: the source listed, then read (reading.read_source) with the cache
prepared before it (cold evicts where the source can); each PassResult carries those two stages, timed, and its RTO.
`run` blocks in the caller's thread (a UI worker); other threads read `snapshot`, `stage` and `stages`, call
`set_concurrency` (the read in hand takes it live, later passes start with it) and `cancel` (the pass in hand is
cancelled and the loop ends). Watchers get a Sample at each pass's start and at each progress report (about four a
second).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import fastio

from ckptbench.core import concurrency as conc
from ckptbench.core.errors import Cancelled
from ckptbench.core.stages import LIST, READ
from ckptbench.restore.efficiency import hash_of
from ckptbench.restore.reading import read_source
from ckptbench.sources import ReadHandle, ReadOptions, Source, open_source


@dataclass(frozen=True)
class Sample:
    """One look at the read in hand: which pass, the concurrency in force, its bytes and its own clock."""

    pass_no: int
    concurrency: int
    bytes: int
    seconds: float  # the reader's clock, first byte to now (stops at the last byte)


@dataclass(frozen=True)
class PassResult:
    pass_no: int
    concurrency: int  # in force when the pass ended
    bytes: int
    seconds: float  # wall time of the read, start to last result
    read_gbps: float
    files_failed: int
    cache: str  # the cache condition the pass started in, e.g. "cold" or "cold (not verified)"
    stages: dict = field(default_factory=dict)  # {"list": s, "read": s}: the stages a pass has, timed

    @property
    def rto_s(self) -> float:
        return sum(self.stages.values())


Watcher = Callable[[Sample], None]


class ReadLoop:
    def __init__(self, source: str | Source, opts: ReadOptions, *, cache: str = "as-is", drop_caches: bool = False,
                 manifest_hash: bool = False):
        """`manifest_hash`: read with the manifest's hash (none without a manifest) instead of `opts.hash`."""
        self.source = source
        self.opts = opts
        self.cache = cache
        self.drop_caches = drop_caches
        self.manifest_hash = manifest_hash
        self.cancel_event = threading.Event()
        self.passes = 0  # passes read to the end
        self.status = "idle"  # idle | looping | stopped | failed
        self.last: PassResult | None = None
        self.stage: str | None = None  # the stage of the pass in hand (LIST, READ), None between passes
        self.stages: dict[str, float] = {}  # the stages of the pass in hand that have finished
        self._handle: ReadHandle | None = None
        self._watchers: list[Watcher] = []
        self._lock = threading.Lock()

    @classmethod
    def for_run(cls, source: str | Source, run_opts) -> "ReadLoop":
        """The loop a restore's settings (pipeline.RunOptions) ask for: its read options, cache and hash."""
        return cls(source, run_opts.read_options(run_opts.hash or "crc32c"), cache=run_opts.cache,
                   drop_caches=run_opts.drop_caches, manifest_hash=run_opts.hash is None)

    @property
    def pass_no(self) -> int:
        """The pass in hand (the next one between passes)."""
        return self.passes + 1

    def watch(self, fn: Watcher) -> None:
        with self._lock:
            self._watchers.append(fn)

    def unwatch(self, fn: Watcher) -> None:
        with self._lock:
            if fn in self._watchers:
                self._watchers.remove(fn)

    def snapshot(self) -> fastio.Snapshot | None:
        handle = self._handle
        return handle.snapshot() if handle is not None else None

    def live_concurrency(self) -> bool | None:
        """Whether the read in hand can change concurrency now; None between passes."""
        handle = self._handle
        return None if handle is None else handle.live_concurrency

    def set_concurrency(self, n: int) -> int:
        """Later passes start with `n`; returns the concurrency in force now (the read in hand's, if one runs)."""
        n = conc.clamp(n)
        with self._lock:
            self.opts = replace(self.opts, concurrency=n)
            handle = self._handle
            if handle is None:
                return n
            return handle.set_concurrency(n) if handle.live_concurrency else handle.snapshot().concurrency

    def cancel(self) -> None:
        self.cancel_event.set()
        handle = self._handle
        if handle is not None:
            handle.cancel()

    def _emit(self, pass_no: int, snap: fastio.Snapshot) -> None:
        with self._lock:
            watchers = list(self._watchers)
        sample = Sample(pass_no, snap.concurrency, snap.bytes, snap.elapsed_s)
        for fn in watchers:
            fn(sample)

    def _started(self, pass_no: int, handle: ReadHandle) -> None:
        with self._lock:
            self._handle = handle
            wanted = self.opts.concurrency  # a change made while the pass was starting
            if handle.live_concurrency and handle.snapshot().concurrency != wanted:
                handle.set_concurrency(wanted)
        if self.cancel_event.is_set():
            handle.cancel()
        self._emit(pass_no, handle.snapshot())

    def run(self, *, max_passes: int | None = None, on_pass: Callable[[PassResult], None] | None = None) -> int:
        """Reads pass after pass until cancelled (or `max_passes`); returns the passes read to the end. A pass cut
        by cancel is not counted; a failure to start or list raises CkptbenchError."""
        self.status = "looping"
        try:
            src = open_source(self.source) if isinstance(self.source, str) else self.source
            listing, list_s = self._list(src)
            if self.manifest_hash:
                with self._lock:
                    self.opts = replace(self.opts, hash=hash_of(None, listing))
            while not self.cancel_event.is_set() and (max_passes is None or self.passes < max_passes):
                n = self.pass_no
                if n > 1:  # the first pass's listing is the one above
                    listing, list_s = self._list(src)
                self.stages, self.stage = {LIST: list_s}, READ
                try:
                    report = read_source(src, listing, self.opts, cache=self.cache, drop_caches=self.drop_caches,
                                         cancel=self.cancel_event, on_start=lambda h, n=n: self._started(n, h),
                                         on_progress=lambda snap, n=n: self._emit(n, snap))
                except Cancelled:
                    break
                finally:
                    with self._lock:
                        self._handle = None
                    self.stage = None
                r = report.result
                c = report.cache
                self.last = PassResult(n, r.concurrency, r.bytes, report.driven.wall_s, report.read_gbps,
                                       len(r.failed), c.requested if c.verified else f"{c.requested} (not verified)",
                                       {LIST: list_s, READ: report.driven.wall_s})
                self.passes = n
                if on_pass:
                    on_pass(self.last)
        except BaseException:
            self.status = "failed"
            raise
        finally:
            self.stage, self.stages = None, {}
        self.status = "stopped"
        return self.passes

    def _list(self, src: Source):
        """The listing and its time: a pass's list stage."""
        self.stages, self.stage = {}, LIST
        t0 = time.perf_counter()
        listing = src.list()
        return listing, time.perf_counter() - t0
