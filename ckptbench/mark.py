"""Stage markers a watched job may write, so `ckptbench watch -- COMMAND` times its stages exactly.

In the job (no dependency on ckptbench being importable there: copy these lines if it is not):

    from ckptbench.mark import stage
    stage("load")          # ... torch.load(...)
    stage("first_step")    # time-to-first-step ends at this mark

Each call appends "<CLOCK_MONOTONIC seconds> stage NAME" to the file named by CKPTBENCH_MARK; without that
variable it does nothing.
"""

from __future__ import annotations

import os
import time

ENV = "CKPTBENCH_MARK"


def stage(name: str) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{time.monotonic():.6f} stage {name}\n")


def read_marks(path: str, limit: int = 1 << 20) -> list[tuple[float, str]]:
    """(monotonic time, stage name) of the marks in `path`, at most `limit` bytes read; malformed lines skipped
    (the file is the job's, written while we read it)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit)
    except OSError:
        return []
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] == "stage":
            try:
                out.append((float(parts[0]), parts[2].strip()[:64]))
            except ValueError:
                continue
    return out
