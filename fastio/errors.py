"""The one exception family of fastio: an OSError with errno and path."""

from __future__ import annotations

import os


class FastIOError(OSError):
    """A failure fastio reports for the whole call (a bad option, a file it cannot inspect)."""

    def __init__(self, errno: int, message: str | None = None, path: str | None = None):
        super().__init__(errno, message or os.strerror(errno), path)


class OptionError(FastIOError, ValueError):
    """An option value the engine cannot take (concurrency 0, an unknown hash...)."""

    def __init__(self, message: str):
        super().__init__(22, message)  # EINVAL


def raise_errno(rc: int, path: str | None = None, what: str | None = None) -> None:
    """The single errno → exception path: every native call that fails comes through here."""
    if rc:
        text = os.strerror(rc)
        raise FastIOError(rc, f"{what}: {text}" if what else text, path)
