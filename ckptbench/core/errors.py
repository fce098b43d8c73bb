"""The one error family of the domain layer: what a user can cause, told in one line."""

from __future__ import annotations

import contextlib
import errno
import re


EXIT_UNCHECKED = 3  # verify: nothing to check against (no manifest, no digests): not a pass, not a mismatch
EXIT_REFUSED_BY_SYSTEM = 1  # the command was right, the place is not: a read-only or full filesystem, permissions
# the errors that say so; any other (ENOENT: a folder that is not there) is the command's, exit 2
_SYSTEM_REFUSALS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


def write_refused_exit(exc: OSError) -> int:
    """The exit status for a destination that could not be written: 1 where the system refused it (as `translate`
    says of every OSError met while working), 2 where the path as given cannot be one. A script can then tell
    "called wrong" (2) from "this box would not let it" (1), whichever command met it first."""
    return EXIT_REFUSED_BY_SYSTEM if exc.errno in _SYSTEM_REFUSALS else 2


class CkptbenchError(Exception):
    """A problem the user can fix: the message says what, where and what to do."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Cancelled(CkptbenchError):
    exit_code = 130


# A credential word anywhere in a name makes it one (AWS_SESSION_TOKEN, x-api-key, db_password, Authorization);
# `author=` and `--tokenizer PATH` lose their values too: cosmetic, never a leak.
# A pre-signed URL's signature (S3's X-Amz-Signature, GCS's Signature, Azure's sig) reads its object until it expires.
_WORD = r"(?:secret|token|passw(?:or)?d|credential|auth|api[-_]?key|private[-_]?key|session|signature|sig(?![a-z])|(?<![a-z])pat(?![a-z]))"
_NAME = rf"[A-Za-z0-9_.-]{{0,64}}{_WORD}[A-Za-z0-9_.-]{{0,64}}"  # bounded: a long run stays linear
_START = r"(?:^|(?<=[\s\"'{(,;?&=]))"  # a name starts a word, never inside a path
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"
_FLAGS = re.IGNORECASE | re.ASCII

# scheme://user:pass@host: the user-info runs to the authority's LAST @, so a password holding / or @ goes whole
_URL = re.compile(r"(?P<keep>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://)(?P<info>[^\s\"'<>]{0,1024})@")
# user:pass@host without a scheme (an http_proxy value); the colon tells it from an e-mail address
_BARE_INFO = re.compile(r"(?<![\w.%+:-])[\w.%+-]{1,256}:(?!//)[^\s\"'<>/]{0,512}@(?=[\w\[])")
# "password": "…" and 'secret': '…' (JSON, Python reprs), and an unquoted JSON value
_JSON = re.compile(rf"(?P<keep>(?P<q>[\"']){_NAME}(?P=q)\s*:\s*)(?P<value>{_QUOTED}|[^\s,}}\]]+)", _FLAGS)
# Authorization: Bearer …, Basic …, AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=… (the whole value)
_HEADER = re.compile(r"(?P<keep>\b(?:proxy-)?authorization\s*[:=]\s*)(?P<value>AWS4-HMAC-SHA256(?:\s*,?\s*"
                     r"\w+=[^\s,]*)+|(?:Bearer|Basic|Digest|Token|Negotiate|NTLM|AWS)\s+\S+|\S+)", _FLAGS)
# NAME=value, NAME = value, --name value, NAME: value; a quoted value whole, else up to a space or a query's &
_PAIR = re.compile(rf"{_START}(?P<keep>-{{0,2}}{_NAME}(?:\s*[=:]\s*|\s+))(?P<value>{_QUOTED}|[^\s&]+)", _FLAGS)
# AWS access key ids, and tokens whose prefix says what they are (Hugging Face's hf_, GitHub's ghp_ and kin)
_KEY_ID = re.compile(r"\b(?:(?:AKIA|ASIA)[A-Z0-9]{16}|hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{36,}"
                     r"|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}"
                     # OpenAI's and Anthropic's keys: upper case and digits among 32+ characters, which a path's
                     # sk-model-checkpoint-2024 folder does not have
                     r"|sk-(?=[A-Za-z0-9_-]*[A-Z])(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{32,})(?![A-Za-z0-9_-])")
_REDACTED = "<redacted>"


def _pair(m: re.Match) -> str:
    keep, value = m.group("keep"), m.group("value")
    spaced = not keep.rstrip().endswith(("=", ":"))
    if value == _REDACTED or spaced and value.startswith("-"):
        return m.group(0)  # already redacted, or "--password --next-option": no value given
    name = keep.strip()
    if spaced and name.isalpha() and not name.isupper() and value.isalpha() and value.islower():
        return m.group(0)  # "the token has expired": a plain word followed by a plain word is prose
    return keep + _REDACTED


def _url(m: re.Match) -> str:
    info = m.group("info")
    head = info.split("/", 1)[0]
    if ":" in head or "@" in head or "/" not in info:
        return m.group("keep")  # user-info starts the authority: everything up to its last @ goes
    return m.group(0)  # an @ further down the path (host/model@main) is no user-info


def redact(text: str) -> str:
    """`text` without credentials: a URL's user-info, the value of any key, option or header named like a
    credential (secret, token, password, passwd, credential, auth, api-key, private-key, session, signature, sig,
    pat), AWS access key ids and prefixed tokens (hf_, ghp_, github_pat_, glpat-, xoxb-, sk-)."""
    text = _URL.sub(_url, text)
    text = _BARE_INFO.sub("", text)
    text = _JSON.sub(lambda m: m.group("keep") + (m.group("q") + _REDACTED + m.group("q")
                                                 if m.group("value")[0] in "\"'" else _REDACTED), text)
    text = _HEADER.sub(lambda m: m.group("keep") + _REDACTED, text)
    text = _PAIR.sub(_pair, text)
    return _KEY_ID.sub(_REDACTED, text)


def redact_all(value):
    """`value` (a row, a document) with `redact` applied to every string in it, dict keys too (a path can be one)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_all(k): redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value


# CSI (ESC [ … final), OSC (ESC ] … BEL or ESC \\), other two-byte escapes, then any C0/C1 control or DEL
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# controls, and the bidirectional overrides and isolates that make a terminal show text in another order than
# it is (a name or a cached method that reads as something it is not)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` safe for a terminal: escape sequences (a title change, a screen wipe) and control characters gone,
    tabs and newlines as spaces."""
    text = _CONTROL.sub("", _ESCAPE.sub("", str(text))).replace("\t", " ").replace("\n", " ")
    # a lone surrogate (a tensor key '\ud800w', a file name's undecodable byte) cannot be written to a UTF-8 stream:
    # shown as its escape, not a UnicodeEncodeError at the print
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(text, limit: int = 80) -> str:
    """A name from a file or a command line as a message quotes it: printable, and cut at `limit` characters (a
    100 kB run id or kind made a 100 kB error line)."""
    text = printable(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


_COMMAND = re.compile(r"`[^`\n]*`")


def name_source(text: str, source: str | None) -> str:
    """`text` with the SOURCE placeholder in its commands (between backticks) filled in with `source`, quoted for a
    shell: a fix that knows the checkpoint names it (a new user was told `ckptbench check SOURCE --quick-sweep` about
    the path they had just typed). Without a source, the text as it is."""
    if not source or "SOURCE" not in text:
        return text
    import shlex

    named = shlex.quote(printable(redact(str(source))))
    return _COMMAND.sub(lambda m: re.sub(r"\bSOURCE\b", lambda _: named, m.group(0)), text)


@contextlib.contextmanager
def naming(path: str):
    """An OSError raised without a file (os.write's, os.fsync's, a file object's write and flush) is raised again
    naming `path`: a full disk was "I/O: No space left on device" with no word of where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from None


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
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk: the path and its permissions are fine
            return CkptbenchError(f"{redact(str(where))}: {what} while writing; free space on that filesystem, or "
                                  "write somewhere else", exit_code=1)
        return CkptbenchError(f"{redact(str(where))}: {what}; check the path and its permissions", exit_code=1)
    module = type(exc).__module__ or ""
    if module.startswith(("botocore", "boto3", "awscrt", "s3transfer")):
        return CkptbenchError(f"S3: {_first_line(exc)}; check the endpoint, credentials and bucket", exit_code=1)
    if module.startswith(("torch", "safetensors", "pickle", "_pickle", "zipfile")) or type(exc).__name__ in (
            "UnpicklingError", "SafetensorError", "BadZipFile"):
        return CkptbenchError(f"the checkpoint could not be loaded: {_first_line(exc)}", exit_code=1)
    return None


def one_line(exc: BaseException, what: str) -> str:
    """A failure as one printable, redacted line, for a screen or a record: the package's own message when it has
    one (translate), else `what` failed, the exception's type and its first line."""
    err = translate(exc)
    first = str(exc).splitlines()[0] if str(exc) else "no message"
    return printable(redact(str(err) if err is not None else f"{what}: {type(exc).__name__}: {first}"))
