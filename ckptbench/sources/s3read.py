"""Concurrent ranged GETs, hashed with fastio's Hashers, into a hash sink, memory buffers or a staging directory.

Mirrors fastio's handle (snapshot, set_concurrency, cancel, wait) and returns fastio's records, so the
pipeline, the progress line and the TUI treat an S3 read like a local one.
"""

from __future__ import annotations

import base64
import mmap
import os
import threading
import time
from dataclasses import dataclass, field

import fastio

from ckptbench.errors import CkptbenchError
from ckptbench.sources import s3 as s3mod

CHUNK = 1 << 20
HIST = 32
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # no MAP_POPULATE: it holds the GIL for the whole allocation
ERRNO_OF = {s3mod.MISSING: 2, s3mod.ACCESS_DENIED: 13, s3mod.TIMEOUT: 110, s3mod.CONNECTION_RESET: 104,
            s3mod.CHANGED: 116, s3mod.CHECKSUM: 74, s3mod.THROTTLING: 11, s3mod.SERVER_ERROR: 5}
STAGE_SUFFIX = ".ckptbench-partial"


@dataclass(frozen=True)
class S3ReadOptions:
    concurrency: int = 16
    part_size: int = s3mod.DEFAULT_PART
    hash: str = "crc32c"
    into: str = "hash"  # hash | memory | stage
    stage_dir: str | None = None
    part_retries: int = 5
    backend: str = "threads"  # threads: boto3 + our pool; crt: awscrt's native S3 client


def _bucket(us: float) -> int:
    return 0 if us < 1 else min(HIST - 1, int(us).bit_length())


@dataclass
class _Obj:
    o: s3mod.S3Object
    nparts: int
    alg: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    remaining: int = 0
    error: tuple[str, str] | None = None
    bytes: int = 0
    attempts: int = 1
    t0: float = 0.0
    t1: float = 0.0
    crcs: list = field(default_factory=list)
    md5s: list = field(default_factory=list)
    ordered: object = None  # fastio.Hasher fed in order for md5/sha256/xxh64
    next_part: int = 0
    pending: dict = field(default_factory=dict)
    buffer: object = None
    fd: int | None = None
    tmp: str | None = None
    final: str | None = None
    s3_crc32c: str | None = None
    digest: str | None = None
    verified_s3: bool | None = None


class S3ReadHandle:
    def __init__(self, client, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: S3ReadOptions,
                 retry_log: s3mod.RetryLog):
        self.client, self.url, self.opts, self.retry_log = client, url, opts, retry_log
        self.objs = [self._prepare(o) for o in objects]
        self.tasks = [(i, k) for i, ob in enumerate(self.objs) for k in range(ob.nparts)]
        self.next_task = 0
        self.cv = threading.Condition()
        self.target = opts.concurrency
        self.threads: list[threading.Thread] = []
        self.state: list[str] = []
        self.busy: list[float] = []
        self.cancelled = False
        self.gets = 0
        self.part_retries = 0
        self.hist = [0] * HIST
        self.bytes = 0
        self.stat_lock = threading.Lock()  # += on shared ints is not atomic across threads
        self.done_files = 0
        self.failed_files = 0
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.t_last = 0.0
        self._result = None
        with self.cv:
            self._spawn(self.target)

    def _prepare(self, o: s3mod.S3Object) -> _Obj:
        ps = self.opts.part_size
        n = max(1, -(-o.size // ps))
        ob = _Obj(o, n, self.opts.hash, remaining=n, crcs=[None] * n)
        if self.opts.hash not in ("none", "crc32c"):
            ob.ordered = fastio.Hasher(self.opts.hash)
        if self.opts.hash == "md5" and "-" in o.etag:
            ob.md5s = [None] * n
        if self.opts.into == "memory":
            ob.buffer = mmap.mmap(-1, max(4096, o.size), flags=_ANON)
        elif self.opts.into == "stage":
            from ckptbench.packs import safe_member

            ob.final = os.path.join(self.opts.stage_dir, safe_member(o.rel))
            ob.tmp = ob.final + STAGE_SUFFIX
        return ob

    def _spawn(self, n: int) -> None:
        while len(self.threads) < n and self.next_task < len(self.tasks) and not self.cancelled:
            i = len(self.threads)
            self.state.append("idle")
            self.busy.append(0.0)
            t = threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"s3read-{i}")
            self.threads.append(t)
            t.start()

    def set_concurrency(self, n: int) -> None:
        with self.cv:
            self.target = max(1, min(fastio.MAX_CONCURRENCY, n))
            self._spawn(self.target)
            self.cv.notify_all()

    def cancel(self) -> None:
        with self.cv:
            self.cancelled = True
            self.cv.notify_all()

    def _worker(self, i: int) -> None:
        while True:
            with self.cv:
                while i >= self.target and not self.cancelled and self.next_task < len(self.tasks):
                    self.state[i] = "parked"
                    self.cv.wait()
                if self.cancelled or self.next_task >= len(self.tasks):
                    self.state[i] = "exited"
                    self.cv.notify_all()
                    return
                task = self.tasks[self.next_task]
                self.next_task += 1
                self.state[i] = "active"
            t0 = time.perf_counter()
            self._part(*task)
            self.busy[i] += time.perf_counter() - t0

    def _fail(self, ob: _Obj, cls: str, msg: str) -> None:
        with ob.lock:
            if ob.error is None:
                ob.error = (cls, msg)

    def _part(self, i: int, k: int) -> None:
        ob = self.objs[i]
        if ob.error is None and not self.cancelled:
            if not ob.t0:
                ob.t0 = time.perf_counter()
                self.t_first = self.t_first or ob.t0
            self._fetch(ob, k)
        with ob.lock:
            ob.remaining -= 1
            last = ob.remaining == 0
        if last:
            self._finish(ob)

    def _open_stage(self, ob: _Obj) -> None:
        with ob.lock:
            if ob.fd is None:
                os.makedirs(os.path.dirname(ob.tmp), exist_ok=True)
                ob.fd = os.open(ob.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def _fetch(self, ob: _Obj, k: int) -> None:
        from botocore.exceptions import BotoCoreError, ClientError
        from urllib3.exceptions import HTTPError

        ps = self.opts.part_size
        start = k * ps
        end = min(ob.o.size, start + ps) - 1
        want = end - start + 1
        if self.opts.into == "stage":
            self._open_stage(ob)
        for attempt in range(self.opts.part_retries + 1):
            if self.cancelled:
                self._fail(ob, "cancelled", "cancelled")
                return
            kw = {"Bucket": self.url.bucket, "Key": ob.o.key}
            if ob.o.etag:
                kw["IfMatch"] = f'"{ob.o.etag}"'  # an object replaced mid-run fails instead of mixing versions
            if ob.nparts > 1:
                kw["Range"] = f"bytes={start}-{end}"
            else:
                kw["ChecksumMode"] = "ENABLED"
            crc = fastio.Hasher("crc32c")
            md5 = fastio.Hasher("md5") if ob.md5s else None
            held: list[bytes] = []
            got = 0
            try:
                t0 = time.perf_counter()
                resp = self.client.get_object(**kw)
                with self.stat_lock:
                    self.hist[_bucket((time.perf_counter() - t0) * 1e6)] += 1
                    self.gets += 1
                if ob.nparts == 1:
                    ob.s3_crc32c = resp.get("ChecksumCRC32C")
                for chunk in resp["Body"].iter_chunks(CHUNK):
                    n = len(chunk)
                    if got + n > want:
                        raise CkptbenchError(f"{ob.o.key}: more bytes than the object's listed size")
                    crc.update(chunk)
                    if md5 is not None:
                        md5.update(chunk)
                    if ob.buffer is not None:
                        ob.buffer[start + got:start + got + n] = chunk
                    elif ob.fd is not None:
                        os.pwrite(ob.fd, chunk, start + got)
                    elif ob.ordered is not None:
                        held.append(chunk)
                    got += n
                    with self.stat_lock:
                        self.bytes += n
                if got != want:
                    raise ConnectionResetError(f"short body: {got} of {want} bytes")
                break
            except (ClientError, BotoCoreError, HTTPError, OSError, ValueError, CkptbenchError) as exc:
                cls = s3mod.classify(exc) if not isinstance(exc, CkptbenchError) else "size_mismatch"
                with self.stat_lock:
                    self.bytes -= got
                if cls in (s3mod.MISSING, s3mod.ACCESS_DENIED, s3mod.CHANGED, "size_mismatch") \
                        or attempt == self.opts.part_retries:
                    self._fail(ob, cls, f"{ob.o.key} bytes {start}-{end}: {cls} ({str(exc).splitlines()[0][:120]})")
                    return
                self.retry_log.add(cls)
                with self.stat_lock:
                    self.part_retries += 1
                with ob.lock:
                    ob.attempts += 1
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
        with ob.lock:
            ob.bytes += got
            ob.crcs[k] = (crc.digest(), got)
            if md5 is not None:
                ob.md5s[k] = md5.digest()
        if ob.ordered is not None:
            self._hash_in_order(ob, k, held)

    def _hash_in_order(self, ob: _Obj, k: int, held: list[bytes]) -> None:
        """md5/sha256/xxh64 need bytes in order: parts that arrive early wait (at most ~concurrency of them)."""
        ps = self.opts.part_size
        with ob.lock:
            ob.pending[k] = held
            while ob.next_part in ob.pending and ob.error is None:
                j = ob.next_part
                data = ob.pending.pop(j)
                start, end = j * ps, min(ob.o.size, (j + 1) * ps)
                if ob.buffer is not None:
                    ob.ordered.update(memoryview(ob.buffer)[start:end])
                elif ob.fd is not None:
                    ob.ordered.update(os.pread(ob.fd, end - start, start))
                else:
                    for chunk in data:
                        ob.ordered.update(chunk)
                ob.next_part += 1

    def _finish(self, ob: _Obj) -> None:
        ob.t1 = time.perf_counter()
        self.t_last = max(self.t_last, ob.t1)
        if ob.error is None and not self.cancelled:
            whole = None
            for d, n in ob.crcs:
                c = int.from_bytes(d, "big")
                whole = c if whole is None else fastio.crc32c_combine(whole, c, n)
            whole = whole or 0
            if self.opts.hash == "crc32c":
                ob.digest = f"{whole:08x}"
            elif ob.ordered is not None:
                ob.digest = ob.ordered.hexdigest()
            ob.verified_s3 = self._check_s3(ob, whole)
            if ob.verified_s3 is False:
                ob.error = (s3mod.CHECKSUM, f"{ob.o.key}: bytes do not match S3's checksum; the object or the "
                                            "transfer is corrupt")
        if ob.fd is not None:
            if ob.error is None and not self.cancelled:
                os.fsync(ob.fd)
            os.close(ob.fd)
            ob.fd = None
            if ob.error is None and not self.cancelled:
                os.replace(ob.tmp, ob.final)  # whole and verified: only now does it get its real name
            else:
                try:
                    os.unlink(ob.tmp)
                except FileNotFoundError:
                    pass
        with self.cv:
            if ob.error is None and not self.cancelled:
                self.done_files += 1
            else:
                self.failed_files += 1

    def _check_s3(self, ob: _Obj, whole: int) -> bool | None:
        """S3's own checksums where the object carries them: CRC32C of a single GET, the ETag MD5."""
        if ob.s3_crc32c and "-" not in ob.s3_crc32c:
            return base64.b64decode(ob.s3_crc32c) == whole.to_bytes(4, "big")
        if self.opts.hash == "md5" and ob.o.etag and "-" not in ob.o.etag and len(ob.o.etag) == 32:
            return ob.digest == ob.o.etag
        if ob.md5s and all(ob.md5s) and ob.o.etag.endswith(f"-{ob.nparts}"):
            import hashlib

            return hashlib.md5(b"".join(ob.md5s)).hexdigest() == ob.o.etag.split("-")[0]
        return None

    def snapshot(self) -> fastio.Snapshot:
        with self.cv:
            states = list(self.state)
            threads = len(self.threads)
            target = self.target
        finished = all(s == "exited" for s in states) and threads > 0 or not self.tasks
        end = self.t_last if finished and self.t_last else time.perf_counter()
        return fastio.Snapshot(
            bytes=self.bytes, bytes_planned=sum(o.o.size for o in self.objs), files_done=self.done_files,
            files_failed=self.failed_files, files_total=len(self.objs),
            retries=self.retry_log.total, reads=self.gets,
            active_workers=states.count("active"), parked_workers=states.count("parked"), threads=threads,
            concurrency=target, elapsed_s=max(0.0, end - self.t_first) if self.t_first else 0.0,
            finished=finished, cancelled=self.cancelled, worker_busy_s=tuple(self.busy),
            latency_hist=tuple(self.hist))

    def wait(self, timeout: float | None = None):
        if self._result is not None:
            return self._result
        deadline = None if timeout is None else time.perf_counter() + timeout
        joined = 0
        while True:
            with self.cv:
                threads = list(self.threads)
            if joined == len(threads):
                break  # set_concurrency cannot spawn more once the tasks are all taken
            for t in threads[joined:]:
                t.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
                if t.is_alive():
                    return None
            joined = len(threads)
        for ob in self.objs:  # never started (cancelled) or still open: close out
            if ob.remaining > 0:
                ob.error = ob.error or ("cancelled", "cancelled before it was read")
                if ob.fd is not None:
                    os.close(ob.fd)
                    ob.fd = None
                if ob.tmp and os.path.exists(ob.tmp):
                    os.unlink(ob.tmp)
                self.failed_files += 1
                ob.remaining = 0
        self._result = self._collect()
        return self._result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._result is None:
            self.cancel()
            self.wait()
        return False

    def _collect(self) -> fastio.ReadResult:
        files = []
        for ob in self.objs:
            err = None
            if ob.error is not None:
                err = fastio.FileError(ERRNO_OF.get(ob.error[0], 125 if ob.error[0] == "cancelled" else 5),
                                       f"{ob.error[0]}: {ob.error[1]}")
            files.append(fastio.FileResult(
                path=f"{self.url}/{ob.o.rel}" if self.url.prefix else f"s3://{self.url.bucket}/{ob.o.rel}",
                bytes=ob.bytes, digest=ob.digest if err is None else None,
                seconds=max(0.0, ob.t1 - ob.t0) if ob.t0 else 0.0, attempts=ob.attempts, error=err))
        final = self.snapshot()
        buffers = ()
        if self.opts.into == "memory":
            buffers = tuple(memoryview(ob.buffer)[:ob.o.size] if ob.error is None else None for ob in self.objs)
        return fastio.ReadResult(files=tuple(files), bytes=final.bytes, seconds=final.elapsed_s, hash=self.opts.hash,
                                 read="s3", concurrency=final.concurrency, block_size=CHUNK,
                                 chunk_size=self.opts.part_size, cancelled=self.cancelled, final=final,
                                 buffers=buffers)

    def error_classes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ob in self.objs:
            if ob.error is not None:
                out[ob.error[0]] = out.get(ob.error[0], 0) + 1
        return out


class CrtReadHandle(S3ReadHandle):
    """The same read through awscrt's S3 client: it splits each GET into ranged parts on its own native
    threads and hands the body back in order; concurrency is fixed for the run (max active connections)."""

    def __init__(self, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: S3ReadOptions,
                 retry_log: s3mod.RetryLog):
        from awscrt.s3 import S3ChecksumConfig, S3RequestType

        self.client, self.url, self.opts, self.retry_log = None, url, opts, retry_log
        self.objs = [self._prepare(o) for o in objects]
        for ob in self.objs:
            ob.crcs = [None]
            ob.md5s = []  # per-part md5s need upload part boundaries the CRT does not expose
        self.cv = threading.Condition()
        self.stat_lock = threading.Lock()
        self.target = opts.concurrency
        self.threads, self.state, self.busy, self.tasks = [], [], [], []
        self.cancelled = False
        self.gets = self.part_retries = self.bytes = self.done_files = self.failed_files = 0
        self.hist = [0] * HIST
        self.t_start = time.perf_counter()
        self.t_first = self.t_start
        self.t_last = 0.0
        self._result = None
        crt, host = _crt_client(opts)
        self.requests = []
        self.done_events: list[threading.Event] = []
        for ob in self.objs:
            ob.t0 = time.perf_counter()
            self.requests.append(crt.make_request(
                type=S3RequestType.GET_OBJECT, request=_crt_get(host, url.bucket, ob.o.key, ob.o.etag),
                checksum_config=S3ChecksumConfig(validate_response=True),
                on_body=self._body_cb(ob), on_done=self._done_cb(ob, self._new_event()),
                max_active_connections_override=opts.concurrency))
            self.gets += 1

    def _body_cb(self, ob: _Obj):
        crc = fastio.Hasher("crc32c")
        ob._crc = crc
        if self.opts.into == "stage":
            self._open_stage(ob)

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

    def _new_event(self) -> threading.Event:
        ev = threading.Event()
        self.done_events.append(ev)
        return ev

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
            ob.error = (cls, f"{ob.o.key}: {cls} (status {status_code}, {error})")
        elif ob.bytes != ob.o.size:
            ob.error = ("size_mismatch", f"{ob.o.key}: {ob.bytes} bytes, listed {ob.o.size}")
        ob.crcs = [(ob._crc.digest(), ob.bytes)]
        self._finish(ob)

    def set_concurrency(self, n: int) -> None:
        with self.cv:
            self.target = max(1, min(fastio.MAX_CONCURRENCY, n))  # applies to the next run: CRT fixes it per request

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
            active_workers=0 if finished else self.opts.concurrency, parked_workers=0, threads=0,
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
        self._result = self._collect()
        return self._result


def _crt_client(opts: S3ReadOptions):
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
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        host = host.split("/", 1)[0]
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


def start(client, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: S3ReadOptions,
          retry_log: s3mod.RetryLog) -> S3ReadHandle:
    """The read with the chosen client: boto3 with our thread pool, or awscrt's native S3 client."""
    backend = opts.backend
    if opts.into == "stage":
        if not opts.stage_dir:
            raise CkptbenchError("--stage-dir is required to stage S3 objects locally")
        os.makedirs(opts.stage_dir, exist_ok=True)
    if backend == "crt":
        return CrtReadHandle(url, objects, opts, retry_log)
    if backend != "threads":
        raise CkptbenchError(f"unknown S3 client {backend!r}: choose threads or crt")
    return S3ReadHandle(client, url, objects, opts, retry_log)
