"""The one loop that runs a read to its end: progress about four times a second, cancel, errors in one line."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import fastio

from ckptbench.core.errors import Cancelled, translate
from ckptbench.sources.base import ReadHandle

PROGRESS_INTERVAL_S = 0.25


@dataclass(frozen=True)
class Driven:
    result: fastio.ReadResult
    wall_s: float  # from the call that started the read to its last result: the read stage's clock
    error_classes: dict[str, int]

    @property
    def read_gbps(self) -> float:
        """Bytes over the wall time of the whole read (what `read_gbps` means in every document)."""
        return self.result.bytes / self.wall_s / 1e9 if self.wall_s > 0 else 0.0

    @property
    def engine_gbps(self) -> float:
        """The reader's own rate, first open to last byte (no start-up, no close-out)."""
        return self.result.read_gbps


def drive(start: Callable[[], ReadHandle], *, on_start: Callable[[ReadHandle], None] | None = None,
          on_progress: Callable[[fastio.Snapshot], None] | None = None, on_tick: Callable[[], None] | None = None,
          cancel: threading.Event | None = None, interval: float = PROGRESS_INTERVAL_S) -> Driven:
    """Starts the read with `start()` and runs it to the end; raises Cancelled when `cancel` stopped it."""
    t0 = time.perf_counter()
    try:
        handle = start()
    except Exception as exc:
        err = translate(exc)
        if err is None:
            raise
        raise err from None
    if on_start:
        on_start(handle)
    with handle:
        while (result := handle.wait(interval)) is None:
            if cancel is not None and cancel.is_set():
                handle.cancel()
            if on_tick:
                on_tick()
            if on_progress:
                on_progress(handle.snapshot())
    wall = time.perf_counter() - t0
    if on_progress:
        on_progress(result.final)
    if cancel is not None and cancel.is_set() and result.cancelled:
        raise Cancelled("read cancelled")
    return Driven(result, wall, handle.error_classes(result))


__all__ = ["PROGRESS_INTERVAL_S", "Driven", "drive"]
