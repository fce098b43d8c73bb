"""S3 sources: URLs, the client (standard AWS environment and config), paginated listing, error classes, upload."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from ckptbench.core import concurrency as conc
from ckptbench.checkpoint import tree
from ckptbench.core.errors import CkptbenchError, redact

DEFAULT_PART = 8 << 20
MAX_ATTEMPTS = 10  # botocore's own retries per request, before ours per part


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


def classify(exc: BaseException) -> str:
    """One class per failure: throttling, server_error, connection_reset, timeout, missing, access_denied, changed."""
    from botocore.exceptions import (ClientError, ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                     ReadTimeoutError, ResponseStreamingError)

    if type(exc).__name__ == "FlexibleChecksumError":  # botocore checked S3's CRC itself and it disagreed
        return CHECKSUM
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503"):
            return THROTTLING
        if code in ("NoSuchKey", "NoSuchBucket", "404") or status == 404:
            return MISSING
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
            return ACCESS_DENIED
        if code in ("PreconditionFailed", "412") or status == 412:
            return CHANGED
        return SERVER_ERROR if status >= 500 else code or "client_error"
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, TimeoutError)):
        return TIMEOUT
    if isinstance(exc, (ConnectionClosedError, EndpointConnectionError, ResponseStreamingError, ConnectionError)):
        return CONNECTION_RESET
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
    if max_attempts is None and raw.isdigit() and 1 <= int(raw) <= 100:
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
        read_timeout=30,
        s3={"addressing_style": "path"} if endpoint else {},
        user_agent_extra="ckptbench",
    )
    client = boto3.session.Session().client("s3", config=cfg)
    if retry_log is not None:
        client.meta.events.register_first("needs-retry.s3", retry_log.hook)
    return client


def _fail(url: S3Url, exc: BaseException) -> CkptbenchError:
    cls = classify(exc)
    host = endpoint_label()
    text = {
        MISSING: f"{url}: bucket {url.bucket!r} does not exist; check the name and the region",
        ACCESS_DENIED: f"{url}: access denied; check the credentials in use and the bucket policy",
        CONNECTION_RESET: f"{url}: cannot reach {host}; check AWS_ENDPOINT_URL, the network path and proxies",
        TIMEOUT: f"{url}: {host} timed out; check the network path",
    }.get(cls, f"{url}: S3 error ({cls}); retry later or check the endpoint")
    return CkptbenchError(text)


def list_objects(client, url: S3Url) -> list[S3Object]:
    """Every object under the prefix (paginated), in key order."""
    from botocore.exceptions import BotoCoreError, ClientError

    prefix = f"{url.prefix}/" if url.prefix else ""
    out = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=prefix):
            for o in page.get("Contents", ()):
                if o["Key"].endswith("/"):
                    continue
                out.append(S3Object(o["Key"], o["Key"][len(prefix):], int(o["Size"]), o.get("ETag", "").strip('"')))
    except (ClientError, BotoCoreError) as exc:
        raise _fail(url, exc) from None
    if not out:
        raise CkptbenchError(f"{url}: no objects under this prefix; check the bucket and prefix")
    return sorted(out, key=lambda o: o.key)


def get_bytes(client, url: S3Url, rel: str, retry_log: RetryLog | None = None, attempts: int = 5) -> bytes | None:
    """A small object (the manifest), or None when it does not exist; a body cut mid-read is fetched again."""
    import time

    from botocore.exceptions import BotoCoreError, ClientError

    for attempt in range(attempts):
        try:
            return client.get_object(Bucket=url.bucket, Key=url.key(rel))["Body"].read()
        except ClientError as exc:
            if classify(exc) == MISSING:
                return None
            raise _fail(url, exc) from None
        except BotoCoreError as exc:
            cls = classify(exc)
            # botocore retries the request, not a body that breaks after the headers
            if cls not in (CONNECTION_RESET, TIMEOUT) or attempt == attempts - 1:
                raise _fail(url, exc) from None
            if retry_log is not None:
                retry_log.add(cls)
            time.sleep(0.05 * 2 ** attempt)
    return None


def upload(directory: str, url: S3Url, *, concurrency: int = conc.DEFAULT, part_size: int = DEFAULT_PART,
           progress=None) -> list[str]:
    """Puts every file of a checkpoint under the prefix: multipart above part_size, CRC32C checksums on all."""
    from concurrent.futures import ThreadPoolExecutor

    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    if not os.path.isdir(directory):
        raise CkptbenchError(f"{directory}: no such directory; point at a checkpoint directory")
    skipped: list[tuple[str, str]] = []
    rels = tree.rels(directory, skipped)
    if skipped:  # the upload would be partial, and say it was whole
        where, why = skipped[0]
        raise CkptbenchError(f"{where}: unreadable directory ({why}); its files would not be uploaded: fix its "
                             "permissions", exit_code=1)
    if not rels:
        raise CkptbenchError(f"{directory}: empty; nothing to upload")
    client = make_client(concurrency)
    cfg = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=4,
                         use_threads=True)

    def put(rel: str) -> str:
        client.upload_file(os.path.join(directory, rel), url.bucket, url.key(rel),
                           ExtraArgs={"ChecksumAlgorithm": "CRC32C"}, Config=cfg)
        if progress:
            progress(rel)
        return rel

    from boto3.exceptions import S3UploadFailedError

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency // 4)) as pool:
            return list(pool.map(put, rels))
    except (ClientError, BotoCoreError) as exc:
        raise _fail(url, exc) from None
    except S3UploadFailedError as exc:  # boto3 wraps the client error; the cause says what happened
        raise _fail(url, exc.__cause__ or exc) from None
