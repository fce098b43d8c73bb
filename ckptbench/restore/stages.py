"""The one stage runner: a restore's stages timed, named as they start and cancellable between them — for a single
process's repeat (runner.Run) and for each rank under torchrun (distributed.rank) alike — and the read of a stage,
which always goes through the sources seam."""

from __future__ import annotations

import threading
import time
from typing import Callable

from ckptbench.core.errors import Cancelled
from ckptbench.core.stages import LIST
from ckptbench.sources import Listing, ReadOptions, Source, drive


class StageClock:
    """Every stage's seconds (`stages`, accumulated when a stage is entered twice), its notes, and the stage under
    way (`stage`); `on_stage(name)` hears each start. Cancelled between stages when `cancel` is set."""

    def __init__(self, cancel: threading.Event | None = None, on_stage: Callable[[str], None] | None = None,
                 stages: dict[str, float] | None = None, notes: dict[str, str] | None = None):
        self.cancel = cancel or threading.Event()
        self.on_stage = on_stage
        self.stages = stages if stages is not None else {}
        self.notes = notes if notes is not None else {}
        self.stage = LIST

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Cancelled("restore cancelled")

    def run(self, name: str, fn, *args):
        """`fn(*args)` timed as stage `name`; a stage that raises has no time (it did not finish)."""
        self.check_cancel()
        self.stage = name
        if self.on_stage:
            self.on_stage(name)
        t0 = time.perf_counter()
        out = fn(*args)
        self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - t0
        return out

    def read(self, source: Source, listing: Listing, opts: ReadOptions, *, into: str = "memory",
             stage_dir: str | None = None, on_start=None, on_progress=None, on_tick=None,
             interval: float | None = None, scan: dict | None = None):
        """The read stage's bytes, from the source's own reader (the one seam to storage), driven to the end."""
        kw = {} if interval is None else {"interval": interval}
        return drive(lambda: source.start_read(listing, opts, into=into, stage_dir=stage_dir, scan=scan),
                     on_start=on_start, on_progress=on_progress, on_tick=on_tick, cancel=self.cancel, **kw)
