"""The one error family of the domain layer: what a user can cause, told in one line."""

from __future__ import annotations

import re


class CkptbenchError(Exception):
    """A problem the user can fix: the message says what, where and what to do."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Cancelled(CkptbenchError):
    exit_code = 130


_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")
# a secret given on a command line: AWS_SECRET_ACCESS_KEY=..., --aws-secret-access-key ..., and the session token
_SECRET = re.compile(r"(?P<name>(?:AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN)=|--aws-(?:secret-access-key|session-token)"
                     r"[= ])\S+", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` without credentials: any URL without its user-info (user:password@), and an AWS secret key or session
    token given as a variable or an option without its value."""
    return _SECRET.sub(r"\g<name><redacted>", _USERINFO.sub(r"\g<scheme>", text))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact(text[0])[:300] if text else type(exc).__name__  # redacted whole: a cut can hide the "@"


def translate(exc: BaseException) -> CkptbenchError | None:
    """A third-party failure a user can cause (fastio, the OS, botocore, torch, safetensors) as one line.

    None when the exception is not one of those: that is a bug and keeps its traceback."""
    import fastio

    if isinstance(exc, CkptbenchError):
        return exc
    if isinstance(exc, fastio.OptionError):
        return CkptbenchError(redact(exc.strerror or str(exc)), exit_code=2)
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else "I/O"
        what = exc.strerror or _first_line(exc)
        return CkptbenchError(f"{redact(str(where))}: {what}; check the path and its permissions", exit_code=1)
    module = type(exc).__module__ or ""
    if module.startswith(("botocore", "boto3", "awscrt", "s3transfer")):
        return CkptbenchError(f"S3: {_first_line(exc)}; check the endpoint, credentials and bucket", exit_code=1)
    if module.startswith(("torch", "safetensors", "pickle", "_pickle", "zipfile")) or type(exc).__name__ in (
            "UnpicklingError", "SafetensorError", "BadZipFile"):
        return CkptbenchError(f"the checkpoint could not be loaded: {_first_line(exc)}", exit_code=1)
    return None
