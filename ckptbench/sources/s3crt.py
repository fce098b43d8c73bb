"""The S3 read through awscrt's native client: it splits each GET into ranged parts on its own threads and
hands the body back; concurrency (max active connections) is fixed when the read starts."""

from __future__ import annotations

import os
import threading
import time

import fastio

from ckptbench.core.errors import CkptbenchError, redact
from ckptbench.sources import s3 as s3mod
from ckptbench.sources.base import ReadOptions
from ckptbench.sources.s3read import ObjectRead, _Obj, etag_is_opaque


class CrtRead(ObjectRead):
    live_concurrency = False  # the CRT takes max_active_connections per request, when the request is made

    def __init__(self, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: ReadOptions,
                 retry_log: s3mod.RetryLog, *, into: str = "hash", stage_dir: str | None = None):
        from awscrt.s3 import S3ChecksumConfig, S3RequestType

        super().__init__(url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
        for ob in self.objs:
            ob.md5s = None  # per-part md5s need upload part boundaries the CRT does not expose
        self.t_first = self.t_start
        crt, host = _crt_client(opts)
        self.requests = []
        self.done_events: list[threading.Event] = []
        for ob in self.objs:
            ob.t0 = time.perf_counter()
            finished = threading.Event()
            self.done_events.append(finished)
            self.requests.append(crt.make_request(
                type=S3RequestType.GET_OBJECT, request=_crt_get(host, url.bucket, ob.o.key, ob.o.etag),
                checksum_config=S3ChecksumConfig(validate_response=True),
                on_headers=self._headers_cb(ob), on_body=self._body_cb(ob), on_done=self._done_cb(ob, finished),
                max_active_connections_override=opts.concurrency))
            self.gets += 1

    @staticmethod
    def _headers_cb(ob: _Obj):
        def on_headers(status_code=None, headers=(), **_kw):
            ob.opaque_etag |= etag_is_opaque(dict(headers or ()))
        return on_headers

    def _body_cb(self, ob: _Obj):
        crc = fastio.Hasher("crc32c")
        ob._crc = crc
        if self.into == "stage":
            self._staged(ob)  # one that fails is that file's failure, as the threads' client has it

        def on_body(chunk, offset, **_kw):
            n = len(chunk)
            crc.update(chunk)
            if ob.ordered is not None:
                ob.ordered.update(chunk)
            if ob.buffer is not None:
                ob.buffer[offset:offset + n] = chunk
            elif ob.fd is not None:
                os.pwrite(ob.fd, chunk, offset)
            with self.stat_lock:
                self.bytes += n
            ob.bytes += n
        return on_body

    def _done_cb(self, ob: _Obj, finished: threading.Event):
        """awscrt resolves a request's future before it calls on_done: waiters wait for this event instead."""
        def on_done(error=None, error_headers=None, error_body=None, status_code=None, **_kw):
            try:
                self._on_done(ob, error, status_code)
            finally:
                finished.set()
        return on_done

    def _on_done(self, ob: _Obj, error, status_code) -> None:
        if error is not None or (status_code and status_code >= 300):
            cls = {404: s3mod.MISSING, 403: s3mod.ACCESS_DENIED, 412: s3mod.CHANGED,
                   503: s3mod.THROTTLING}.get(status_code, s3mod.SERVER_ERROR if (status_code or 0) >= 500
                                              else s3mod.CONNECTION_RESET)
            ob.error = (cls, f"{ob.o.key}: {cls} (status {status_code}, {redact(str(error))})")
        elif ob.bytes != ob.o.size:
            ob.error = ("size_mismatch", f"{ob.o.key}: {ob.bytes} bytes, listed {ob.o.size}")
        ob.crcs = {0: (ob._crc.digest(), ob.bytes)}
        ob.remaining = 0
        self._finish(ob)

    def set_concurrency(self, n: int) -> int:
        """Changes nothing: the CRT fixed it when the requests were made. Returns the concurrency in force."""
        return self.target

    def cancel(self) -> None:
        self.cancelled = True
        for r in self.requests:
            r.cancel()

    def snapshot(self) -> fastio.Snapshot:
        done = self.done_files + self.failed_files
        finished = done == len(self.objs)
        end = self.t_last if finished and self.t_last else time.perf_counter()
        return fastio.Snapshot(
            bytes=self.bytes, bytes_planned=sum(o.o.size for o in self.objs), files_done=self.done_files,
            files_failed=self.failed_files, files_total=len(self.objs), retries=0, reads=self.gets,
            active_workers=0 if finished else self.target, parked_workers=0, threads=0,
            concurrency=self.target, elapsed_s=max(0.0, end - self.t_first), finished=finished,
            cancelled=self.cancelled, worker_busy_s=(), latency_hist=tuple(self.hist))

    def wait(self, timeout: float | None = None):
        if self._result is not None:
            return self._result
        deadline = None if timeout is None else time.perf_counter() + timeout
        for ev in self.done_events:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            if not ev.wait(left):
                return None
        self._close_out()
        self._result = self._collect()
        return self._result


def _crt_client(opts: ReadOptions):
    """An awscrt S3 client with the credentials, region and endpoint boto3 would use."""
    import boto3
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode

    session = boto3.session.Session()
    creds = session.get_credentials()
    if creds is None:
        raise CkptbenchError("no AWS credentials found for the CRT client; set AWS_PROFILE or the AWS_* variables")
    frozen = creds.get_frozen_credentials()
    provider = AwsCredentialsProvider.new_static(frozen.access_key, frozen.secret_key, frozen.token)
    region = session.region_name or "us-east-1"
    endpoint = s3mod.endpoint_url()
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        host = host.split("/", 1)[0].rsplit("@", 1)[-1]
        tls = S3RequestTlsMode.DISABLED if scheme == "http" else S3RequestTlsMode.ENABLED
    else:
        host, tls = f"s3.{region}.amazonaws.com", S3RequestTlsMode.ENABLED
    elg = EventLoopGroup()
    bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
    return S3Client(bootstrap=bootstrap, region=region, tls_mode=tls, credential_provider=provider,
                    part_size=opts.part_size, max_active_connections_override=opts.concurrency), host


def _crt_get(host: str, bucket: str, key: str, etag: str):
    from urllib.parse import quote

    from awscrt.http import HttpHeaders, HttpRequest

    headers = [("Host", host)]
    if etag:
        headers.append(("If-Match", f'"{etag}"'))
    return HttpRequest("GET", f"/{bucket}/{quote(key)}", HttpHeaders(headers))
