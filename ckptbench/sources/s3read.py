"""Concurrent ranged GETs, hashed with fastio's Hashers, into a hash sink, memory buffers or a staging directory.

`ObjectRead` holds what both S3 readers share (objects, buffers, staging, checks, the result records);
`ThreadPoolRead` is boto3 with ckptbench's own thread pool, `s3crt.CrtRead` is awscrt's native client.
Both follow `sources.base.ReadHandle` and return fastio's records, so every caller treats an S3 read like
a local one.
"""

from __future__ import annotations

import base64
import mmap
import os
import threading
import time
from dataclasses import dataclass, field

import fastio

from ckptbench import concurrency as conc
from ckptbench.errors import CkptbenchError, redact
from ckptbench.sources import s3 as s3mod
from ckptbench.sources.base import ReadOptions

CHUNK = 1 << 20
HIST = 32
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # no MAP_POPULATE: it holds the GIL for the whole allocation
ERRNO_OF = {s3mod.MISSING: 2, s3mod.ACCESS_DENIED: 13, s3mod.TIMEOUT: 110, s3mod.CONNECTION_RESET: 104,
            s3mod.CHANGED: 116, s3mod.CHECKSUM: 74, s3mod.THROTTLING: 11, s3mod.SERVER_ERROR: 5}
STAGE_SUFFIX = ".ckptbench-partial"


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


class ObjectRead:
    """What both S3 readers share: per-object state, buffers or staging files, S3's checksums, the records."""

    live_concurrency = False

    def __init__(self, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: ReadOptions, retry_log: s3mod.RetryLog,
                 *, into: str = "hash", stage_dir: str | None = None):
        if into == "stage" and not stage_dir:
            raise CkptbenchError("--stage-dir is required to stage S3 objects locally")
        self.url, self.opts, self.retry_log = url, opts, retry_log
        self.into, self.stage_dir = into, stage_dir
        self.objs = [self._prepare(o) for o in objects]
        self.cv = threading.Condition()
        self.stat_lock = threading.Lock()  # += on shared ints is not atomic across threads
        self.target = opts.concurrency
        self.cancelled = False
        self.gets = 0
        self.part_retries = 0
        self.hist = [0] * HIST
        self.bytes = 0
        self.done_files = 0
        self.failed_files = 0
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.t_last = 0.0
        self._result = None

    def _nparts(self, o: s3mod.S3Object) -> int:
        return max(1, -(-o.size // self.opts.part_size))

    def _prepare(self, o: s3mod.S3Object) -> _Obj:
        n = self._nparts(o)
        ob = _Obj(o, n, self.opts.hash, remaining=n, crcs=[None] * n)
        if self.opts.hash not in ("none", "crc32c"):
            ob.ordered = fastio.Hasher(self.opts.hash)
        if self.opts.hash == "md5" and "-" in o.etag:
            ob.md5s = [None] * n
        if self.into == "memory":
            ob.buffer = mmap.mmap(-1, max(4096, o.size), flags=_ANON)
        elif self.into == "stage":
            from ckptbench.packs import safe_member

            ob.final = os.path.join(self.stage_dir, safe_member(o.rel))
            ob.tmp = ob.final + STAGE_SUFFIX
        return ob

    def _open_stage(self, ob: _Obj) -> None:
        with ob.lock:
            if ob.fd is None:
                os.makedirs(os.path.dirname(ob.tmp), exist_ok=True)
                ob.fd = os.open(ob.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def _fail(self, ob: _Obj, cls: str, msg: str) -> None:
        with ob.lock:
            if ob.error is None:
                ob.error = (cls, msg)

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

    def _close_out(self) -> None:
        """Objects never started (cancelled) or still open get their record and lose their partial file."""
        for ob in self.objs:
            if ob.remaining > 0:
                ob.error = ob.error or ("cancelled", "cancelled before it was read")
                if ob.fd is not None:
                    os.close(ob.fd)
                    ob.fd = None
                if ob.tmp and os.path.exists(ob.tmp):
                    os.unlink(ob.tmp)
                self.failed_files += 1
                ob.remaining = 0

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
        if self.into == "memory":
            buffers = tuple(memoryview(ob.buffer)[:ob.o.size] if ob.error is None else None for ob in self.objs)
        return fastio.ReadResult(files=tuple(files), bytes=final.bytes, seconds=final.elapsed_s, hash=self.opts.hash,
                                 read="s3", concurrency=final.concurrency, block_size=CHUNK,
                                 chunk_size=self.opts.part_size, cancelled=self.cancelled, final=final,
                                 buffers=buffers)

    def completed(self, start: int = 0) -> list[int]:
        """Objects are handed over when the whole read ends: none early."""
        return []

    def buffer(self, i: int):
        return None

    def error_classes(self, _result=None) -> dict[str, int]:
        out: dict[str, int] = {}
        for ob in self.objs:
            if ob.error is not None:
                out[ob.error[0]] = out.get(ob.error[0], 0) + 1
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._result is None:
            self.cancel()
            self.wait()
        return False


class ThreadPoolRead(ObjectRead):
    """boto3 GETs on ckptbench's own threads: each part is one task; concurrency changes while it reads."""

    live_concurrency = True

    def __init__(self, client, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: ReadOptions,
                 retry_log: s3mod.RetryLog, *, into: str = "hash", stage_dir: str | None = None):
        super().__init__(url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
        self.client = client
        self.tasks = [(i, k) for i, ob in enumerate(self.objs) for k in range(ob.nparts)]
        self.next_task = 0
        self.threads: list[threading.Thread] = []
        self.state: list[str] = []
        self.busy: list[float] = []
        with self.cv:
            self._spawn(self.target)

    def _spawn(self, n: int) -> None:
        while len(self.threads) < n and self.next_task < len(self.tasks) and not self.cancelled:
            i = len(self.threads)
            self.state.append("idle")
            self.busy.append(0.0)
            t = threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"s3read-{i}")
            self.threads.append(t)
            t.start()

    def set_concurrency(self, n: int) -> int:
        with self.cv:
            self.target = conc.clamp(n)
            self._spawn(self.target)
            self.cv.notify_all()
            return self.target

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

    def _fetch(self, ob: _Obj, k: int) -> None:
        from botocore.exceptions import BotoCoreError, ClientError
        from urllib3.exceptions import HTTPError

        ps = self.opts.part_size
        start = k * ps
        end = min(ob.o.size, start + ps) - 1
        want = end - start + 1
        if self.into == "stage":
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
                    first = redact((str(exc).splitlines() or [type(exc).__name__])[0][:200])
                    self._fail(ob, cls, f"{ob.o.key} bytes {start}-{end}: {cls} ({first})")
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
        self._close_out()
        self._result = self._collect()
        return self._result


def start(client, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: ReadOptions, retry_log: s3mod.RetryLog,
          *, into: str = "hash", stage_dir: str | None = None) -> ObjectRead:
    """The read with the chosen client: boto3 with our thread pool (`client`), or awscrt's native S3 client."""
    if into == "stage":
        if not stage_dir:
            raise CkptbenchError("--stage-dir is required to stage S3 objects locally")
        os.makedirs(stage_dir, exist_ok=True)
    if opts.s3_client == "crt":
        from ckptbench.sources.s3crt import CrtRead

        return CrtRead(url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
    return ThreadPoolRead(client, url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
