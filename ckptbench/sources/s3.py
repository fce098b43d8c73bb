"""S3 sources: URLs, the client (standard AWS environment and config), paginated listing, error classes, upload."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

from ckptbench.core import concurrency as conc
from ckptbench.checkpoint import confine, tree
from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError, printable, redact
from ckptbench.core.paths import require_checkpoint_dir
from ckptbench.sources import s3guard

DEFAULT_PART = 8 << 20
MAX_ATTEMPTS = 10  # botocore's own retries per request, before ours per part
READ_TIMEOUT_S = 30  # per socket read: a body that stalls fails after this, then is retried a bounded number of times
# one answer's bytes held and time taken, whatever the server sends: s3guard (MAX_ERROR_ANSWER, SLOW_GRACE_S, MIN_RATE)
MAX_OBJECTS = tree.MAX_ENTRIES  # objects under one prefix: one bound with a local listing's
MAX_PAGES = 4096  # S3 pages hold up to 1000 keys: a listing that never ends (IsTruncated forever) stops here
MAX_OBJECT_SIZE = 5 << 40  # S3's own limit on one object: a larger listed size is not a real one
# an HTTP entity tag's characters (RFC 9110: no quote, no space or control) within a bound: the ETag goes back to the
# server as If-Match on every GET, where a CR LF, a non-ASCII letter or 100 kB of it failed each file with the HTTP
# client's own words (or as "missing", a 404 from awscrt), not as the listing's fault
_ETAG = re.compile(r"[\x21\x23-\x7e]{0,1024}")


def is_s3(source: str) -> bool:
    return source.startswith("s3://")


def endpoint_url() -> str | None:
    """The endpoint the standard AWS variables name, if any (it may carry user-info: never print it raw)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def endpoint_label() -> str:
    """The endpoint as it may be printed: without user-info."""
    url = endpoint_url()
    return redact(url) if url else "the S3 endpoint"


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # "" or ends without "/"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel


def parse(url: str) -> S3Url:
    if not is_s3(url):
        raise CkptbenchError(f"{url}: not an s3:// URL")
    rest = url[5:]
    bucket, _, prefix = rest.partition("/")
    if not bucket or any(c in bucket for c in " \\"):
        raise CkptbenchError(f"{url}: no bucket name; write s3://BUCKET/PREFIX")
    if "@" in bucket or ":" in bucket:  # no bucket name holds either: a user or credentials written into the URL
        raise CkptbenchError("an s3:// URL with a user or credentials before its bucket ('...@'): S3 takes them from "
                             "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or a profile "
                             "(AWS_PROFILE), never from the URL; write s3://BUCKET/PREFIX")
    return S3Url(bucket, prefix.strip("/"))


@dataclass(frozen=True)
class S3Object:
    key: str
    rel: str
    size: int
    etag: str


# Error classes a restore reports, so a failure reads as a cause rather than a stack of botocore types.
THROTTLING, SERVER_ERROR, CONNECTION_RESET, TIMEOUT = "throttling", "server_error", "connection_reset", "timeout"
MISSING, ACCESS_DENIED, CHANGED, CHECKSUM = "missing", "access_denied", "changed", "checksum_mismatch"
REDIRECT, MALFORMED = "redirect", "malformed_response"


def error_code(exc) -> str:
    """An error response's code where it is one (a short word, as S3's are), else "": the server writes it, and a
    hostile one can echo what the request carried (a session token) in its place."""
    code = exc.response.get("Error", {}).get("Code", "")
    return code if isinstance(code, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9.]{0,63}", code) else ""


def described(exc: BaseException) -> str:
    """A failure in a few words for a failed file's line: an error response's code and status (its message is the
    server's free text), else the exception's first line; redacted and cut."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        return f"{error_code(exc) or 'an unrecognised error code'}, HTTP {status}"
    guarded = s3guard.under(exc, s3guard.SlowAnswer) or s3guard.under(exc, s3guard.AnswerTooLarge)
    if guarded is not None:
        return f"{guarded}; check the endpoint and the network path to it"
    return redact((str(exc).splitlines() or [type(exc).__name__])[0][:200])


def classify(exc: BaseException) -> str:
    """One class per failure: throttling, server_error, connection_reset, timeout, missing, access_denied, changed,
    redirect, malformed_response."""
    import binascii

    from botocore.exceptions import (ClientError, ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                     ReadTimeoutError, ResponseStreamingError)

    if type(exc).__name__ == "FlexibleChecksumError" or isinstance(exc, binascii.Error):
        return CHECKSUM  # botocore checked S3's CRC itself and it disagreed, or the checksum header is not base64
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        # a bare 503 too, as RetryLog counts it: S3's SlowDown whose body was cut at s3guard's bound reads as one
        if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded") or status == 503:
            return THROTTLING
        if code in ("NoSuchKey", "NoSuchBucket", "404") or status == 404:
            return MISSING
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
            return ACCESS_DENIED
        if code in ("PreconditionFailed", "412") or status == 412:
            return CHANGED
        if code in ("PermanentRedirect", "TemporaryRedirect", "Redirect") or 300 <= status < 400:
            return REDIRECT
        return SERVER_ERROR if status >= 500 else code or "client_error"
    if s3guard.under(exc, s3guard.AnswerTooLarge) is not None:
        return MALFORMED  # a listing page past s3guard's bound: botocore sees only a broken connection
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, TimeoutError)):
        return TIMEOUT
    if isinstance(exc, (ConnectionClosedError, EndpointConnectionError, ResponseStreamingError, ConnectionError)):
        return CONNECTION_RESET
    if isinstance(exc, (ValueError, RecursionError)) or type(exc).__name__ == "ResponseParserError":
        return MALFORMED  # botocore could not parse the answer (a number that is not one, XML cut short, a loop)
    name = type(exc).__name__
    if "Timeout" in name:
        return TIMEOUT
    if "Protocol" in name or "IncompleteRead" in name or "Connection" in name:
        return CONNECTION_RESET
    return name


@dataclass
class RetryLog:
    """Failed attempts botocore saw and retried, by class; thread-safe."""

    counts: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, cls: str) -> None:
        with self.lock:
            self.counts[cls] = self.counts.get(cls, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def hook(self, response=None, caught_exception=None, attempts=None, **_kw):
        """botocore needs-retry event: counts the failure; returns None so the retry handler still decides."""
        if caught_exception is not None:
            self.add(classify(caught_exception))
        elif response is not None:
            http, parsed = response
            status = getattr(http, "status_code", 0)
            code = (parsed or {}).get("Error", {}).get("Code", "")
            if code == "SlowDown" or status == 503:
                self.add(THROTTLING)
            elif status >= 500:
                self.add(SERVER_ERROR)
        return None


def _retries(max_attempts: int | None) -> dict:
    """botocore's retry settings: AWS_MAX_ATTEMPTS where the user set it (every attempt counted, the first
    included, as the AWS CLI and SDKs read it), else ckptbench's retries after the first attempt."""
    mode = os.environ.get("AWS_RETRY_MODE", "standard")
    raw = os.environ.get("AWS_MAX_ATTEMPTS", "")
    # ASCII digits: '²'.isdigit() holds and int('²') raises (a traceback before any request)
    if max_attempts is None and raw.isascii() and raw.isdigit() and len(raw) <= 3 and 1 <= int(raw) <= 100:
        return {"total_max_attempts": int(raw), "mode": mode}
    return {"max_attempts": MAX_ATTEMPTS if max_attempts is None else max_attempts, "mode": mode}


def make_client(concurrency: int = conc.DEFAULT, *, retry_log: RetryLog | None = None,
                max_attempts: int | None = None):
    """boto3 client from the standard chain (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL, AWS_MAX_ATTEMPTS, config
    files)."""
    import boto3
    from botocore.config import Config

    endpoint = endpoint_url()
    cfg = Config(
        retries=_retries(max_attempts),
        max_pool_connections=concurrency + 4,
        connect_timeout=5,
        read_timeout=READ_TIMEOUT_S,
        s3={"addressing_style": "path"} if endpoint else {},
        user_agent_extra="ckptbench",
    )
    client = boto3.session.Session().client("s3", config=cfg)
    s3guard.install(client)
    if retry_log is not None:
        client.meta.events.register_first("needs-retry.s3", retry_log.hook)
    return client


def _fail(url: S3Url, exc: BaseException) -> CkptbenchError:
    cls = classify(exc)
    host = endpoint_label()
    slow, big = s3guard.under(exc, s3guard.SlowAnswer), s3guard.under(exc, s3guard.AnswerTooLarge)
    text = {
        MISSING: f"{url}: bucket {url.bucket!r} does not exist; check the name and the region",
        ACCESS_DENIED: f"{url}: access denied; check the credentials in use and the bucket policy",
        CONNECTION_RESET: f"{url}: cannot reach {host}; check AWS_ENDPOINT_URL, the network path and proxies",
        TIMEOUT: f"{url}: {host} timed out; check the network path" if slow is None else
                 f"{url}: {host} sent its answer too slowly: {slow}; check the network path to it and that "
                 "AWS_ENDPOINT_URL is an S3 endpoint",
        REDIRECT: f"{url}: {host} answered with a redirect, which ckptbench does not follow; set AWS_REGION to the "
                  "bucket's region or AWS_ENDPOINT_URL to the endpoint that serves it",
        MALFORMED: f"{url}: {host} answered with {big or 'something that is not a valid S3 response'}; check that "
                   "AWS_ENDPOINT_URL points at an S3 endpoint",
        # worded without "credentials" before a word: redact() would take the word for one
        "NoCredentialsError": f"{url}: no AWS access key was found to sign S3 requests with; set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance role provides them",
    }.get(cls, f"{url}: S3 error ({cls}); retry later or check the endpoint")
    return CkptbenchError(text)


def call_errors() -> tuple:
    """What a botocore call raises on a hostile endpoint: its own errors, a number that is not one (ValueError from
    its parser), XML it cannot parse, and a redirect it follows back to itself until the stack runs out."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

    return ClientError, BotoCoreError, ResponseParserError, ValueError, RecursionError


def _crafted(url: S3Url, what: str) -> CkptbenchError:
    return CkptbenchError(f"{url}: the listing {what}; the endpoint or the objects under the prefix are not a "
                          "checkpoint's: check AWS_ENDPOINT_URL and what wrote the prefix")


def _pages(client, url: S3Url, prefix: str):
    """The listing's pages, at most MAX_PAGES of them (a hostile endpoint can say IsTruncated forever)."""
    from botocore.exceptions import PaginationError

    pages = iter(client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=prefix))
    for n in range(MAX_PAGES + 1):
        try:
            page = next(pages, None)
        except PaginationError:  # botocore saw the same continuation token twice in a row
            raise _crafted(url, "repeats its continuation token") from None
        except call_errors() as exc:
            raise _fail(url, exc) from None
        if page is None:
            return
        if n == MAX_PAGES:
            raise _crafted(url, f"did not end after {MAX_PAGES} pages")
        yield page


def _entry(url: S3Url, prefix: str, o) -> S3Object | None:
    """One listed object, checked: a key under the prefix whose rest is a plain, printable relative path (it names a
    local file when staged, and is shown), and a size S3 could hold. None for a folder marker ("dir/")."""
    key, size = o.get("Key"), o.get("Size")
    if not isinstance(key, str) or not key.startswith(prefix):
        raise _crafted(url, f"names {quote(key)}, outside the prefix {quote(prefix)}")
    if key.endswith("/"):
        return None
    rel = key[len(prefix):]
    if not confine.is_plain(rel) or printable(rel) != rel:
        raise _crafted(url, f"names {quote(key)}: {quote(rel)} is not a plain relative path of printable characters")
    if type(size) is not int or not 0 <= size <= MAX_OBJECT_SIZE:
        raise _crafted(url, f"gives {quote(key)} the size {quote(size)}, which no S3 object has")
    etag = o.get("ETag", "")
    bare = etag[1:-1] if isinstance(etag, str) and len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag
    if not isinstance(bare, str) or not _ETAG.fullmatch(bare):
        raise _crafted(url, f"gives {quote(key)} the ETag {quote(etag, 80)}, which is not an HTTP entity tag "
                            "(printable ASCII without quotes or spaces, in one pair of quotes)")
    return S3Object(key, rel, size, bare)


def _check_names(url: S3Url, objects: list[S3Object]) -> None:
    """No two objects land on one local name: a key listed twice, or a file that is also a folder of another."""
    rels = set()
    for o in objects:
        if o.rel in rels:
            raise _crafted(url, f"names {quote(o.key)} twice")
        rels.add(o.rel)
    for o in objects:
        parts = o.rel.split("/")
        for n in range(1, len(parts)):
            folder = "/".join(parts[:n])
            if folder in rels:
                raise _crafted(url, f"names {quote(folder)} both as an object and as the folder of {quote(o.rel)}")


def list_objects(client, url: S3Url) -> list[S3Object]:
    """Every object under the prefix (paginated, bounded), checked, in key order."""
    prefix = f"{url.prefix}/" if url.prefix else ""
    out = []
    for page in _pages(client, url, prefix):
        for o in page.get("Contents", ()):
            obj = _entry(url, prefix, o)
            if obj is not None:
                out.append(obj)
        if len(out) > MAX_OBJECTS:
            raise _crafted(url, f"holds more than {MAX_OBJECTS} objects, more than one checkpoint has")
    if not out:
        raise CkptbenchError(f"{url}: no objects under this prefix; check the bucket and prefix")
    _check_names(url, out)
    return sorted(out, key=lambda o: o.key)


class _Upto:
    """A file object read up to `size` bytes and no further (boto3 reads a stream until it returns nothing)."""

    def __init__(self, f, size: int):
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n) if n else b""
        self.left -= len(data)
        return data


MAX_KEY_BYTES = 1024  # S3's bound on a key, in bytes of UTF-8


def _check_key(directory: str, url: S3Url, rel: str) -> None:
    """A file's key, refused before anything is put: a name that is not UTF-8 (a listing's undecodable bytes) raised
    UnicodeEncodeError inside boto3 (a traceback, some files already uploaded), and a key S3 refuses (KeyTooLongError)
    failed mid-upload the same way."""
    try:
        size = len(url.key(rel).encode("utf-8"))
    except UnicodeEncodeError:
        raise CkptbenchError(f"{os.path.join(directory, quote(rel)[1:-1])}: its name is not UTF-8, which an S3 key "
                             "must be; nothing was uploaded: rename the file", exit_code=1) from None
    if size > MAX_KEY_BYTES:
        raise CkptbenchError(f"{quote(os.path.join(directory, rel), 200)[1:-1]}: its key under {quote(str(url), 80)} "
                             f"would be {size} bytes, more than S3's {MAX_KEY_BYTES}; nothing was uploaded: use a "
                             "shorter prefix",
                             exit_code=1)


def upload(directory: str, url: S3Url, *, concurrency: int = conc.DEFAULT, part_size: int = DEFAULT_PART,
           progress=None) -> list[str]:
    """Puts every file of a checkpoint under the prefix: multipart above part_size, CRC32C checksums on all."""
    from concurrent.futures import ThreadPoolExecutor

    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    require_checkpoint_dir(directory)
    skipped: list[tuple[str, str]] = []
    passed: list[tuple[str, str]] = []
    rels = tree.rels(directory, skipped, passed)
    if skipped:  # the upload would be partial, and say it was whole
        where, why = skipped[0]
        raise CkptbenchError(f"{where}: unreadable directory ({why}); its files would not be uploaded: fix its "
                             "permissions", exit_code=1)
    if not rels:
        raise tree.nothing_to_read(directory, passed)
    for rel in rels:
        _check_key(directory, url, rel)
    client = make_client(concurrency)
    cfg = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=4,
                         use_threads=True)

    def put(rel: str) -> str:
        # opened as run reads: one component at a time from the folder, no link followed, a regular file on the
        # descriptor (boto3's upload_file opened the path: a file or folder swapped for a link to /etc after the
        # listing was put in the bucket, and a FIFO put in a file's place blocked the upload for good)
        fd = confine.open_member(directory, rel, links=False)
        with os.fdopen(fd, "rb") as f:
            before = os.fstat(fd)
            # the bytes it had when opened, no more: a file another process keeps writing was read to its end,
            # however far that went
            client.upload_fileobj(_Upto(f, before.st_size), url.bucket, url.key(rel),
                                  ExtraArgs={"ChecksumAlgorithm": "CRC32C"}, Config=cfg)
            after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            # the object holds a mix of two versions of the file: ours to take back, and said
            client.delete_object(Bucket=url.bucket, Key=url.key(rel))
            raise CkptbenchError(f"{os.path.join(directory, rel)}: changed while it was uploaded ({before.st_size} "
                                 f"bytes when opened, {after.st_size} after); its object is removed: upload again "
                                 "once the checkpoint is written whole", exit_code=1)
        if progress:
            progress(rel)
        return rel

    from boto3.exceptions import S3UploadFailedError

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency // 4)) as pool:
            return list(pool.map(put, rels))
    except (ClientError, BotoCoreError) as exc:
        raise _fail(url, exc) from None
    except S3UploadFailedError as exc:  # boto3 wraps the client error, raised inside its handler: no __cause__
        raise _fail(url, exc.__cause__ or exc.__context__ or exc) from None
