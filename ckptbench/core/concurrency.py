"""Concurrency: the one bound and the one default that the CLI, the TUI, the sources and the sweep read."""

from __future__ import annotations

import fastio

from ckptbench.core.errors import CkptbenchError

MIN = 1
MAX = fastio.MAX_CONCURRENCY  # the engine's own limit; S3 readers use the same one
DEFAULT = 8


def clamp(n: int) -> int:
    return max(MIN, min(MAX, int(n)))


def check(n, what: str = "--concurrency") -> int:
    """A whole number in MIN..MAX, or one clear error."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise CkptbenchError(f"{what} {n!r}: give a whole number {MIN}..{MAX}")
    if not MIN <= n <= MAX:
        raise CkptbenchError(f"{what} {n}: must be {MIN}..{MAX}")
    return n


def step_up(n: int) -> int:
    """The next level the + key offers: one by one to 4, then doubling."""
    return clamp(n * 2 if n >= 4 else n + 1)


def step_down(n: int) -> int:
    return clamp(n // 2 if n > 4 else n - 1)
