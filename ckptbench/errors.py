"""The one error family of the domain layer: what a user can cause, told in one line."""

from __future__ import annotations


class CkptbenchError(Exception):
    """A problem the user can fix: the message says what, where and what to do."""

    exit_code = 2


class Cancelled(CkptbenchError):
    exit_code = 130
