"""Concurrent ranged GETs, hashed with fastio's Hashers, into a hash sink, memory buffers or a staging directory.

`ObjectRead` holds what both S3 readers share (objects, buffers, staging, checks, the result records);
`s3pool.ThreadPoolRead` is boto3 with ckptbench's own thread pool, `s3crt.CrtRead` is awscrt's native client.
Both follow `sources.base.ReadHandle` and return fastio's records, so every caller treats an S3 read like
a local one.
"""

from __future__ import annotations

import base64
import mmap
import os
import re
import threading
import time
from dataclasses import dataclass, field

import fastio

from ckptbench.core.errors import CkptbenchError
from ckptbench.sources import s3 as s3mod
from ckptbench.sources.base import ReadOptions

CHUNK = 1 << 20
HIST = 32
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # no MAP_POPULATE: it holds the GIL for the whole allocation
ERRNO_OF = {s3mod.MISSING: 2, s3mod.ACCESS_DENIED: 13, s3mod.TIMEOUT: 110, s3mod.CONNECTION_RESET: 104,
            s3mod.CHANGED: 116, s3mod.CHECKSUM: 74, s3mod.THROTTLING: 11, s3mod.SERVER_ERROR: 5}
STAGE_SUFFIX = ".ckptbench-partial"
_MD5_HEX = re.compile(r"[0-9a-f]{32}")


def _bucket(us: float) -> int:
    return 0 if us < 1 else min(HIST - 1, int(us).bit_length())


def etag_is_opaque(headers) -> bool:
    """Whether a GET's headers say the object is encrypted with a KMS key (SSE-KMS, DSSE-KMS) or the customer's
    (SSE-C): S3 then gives it an ETag of 32 hex digits that is not the MD5 of its bytes (AWS's "Common Response
    Headers"), and compared as one a sound object read as corrupt. `headers`: name -> value, any case."""
    low = {str(k).lower(): str(v) for k, v in headers.items()}
    return (low.get("x-amz-server-side-encryption", "").startswith("aws:kms")
            or "x-amz-server-side-encryption-customer-algorithm" in low)


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
    crcs: dict = field(default_factory=dict)  # part -> (crc32c, bytes): parts that arrived, not one slot per part
    md5s: dict | None = None  # part -> md5, for a multipart ETag
    ordered: object = None  # fastio.Hasher fed in order for md5/sha256/xxh64
    next_part: int = 0
    pending: dict = field(default_factory=dict)
    buffer: object = None
    fd: int | None = None
    dir_fd: int | None = None  # the folder tmp and final lie in, opened without following a link (_stage_folder)
    tmp: str | None = None
    final: str | None = None
    s3_crc32c: str | None = None
    opaque_etag: bool = False  # the GET said SSE-KMS or SSE-C: S3's ETag is then not the MD5 of the bytes
    digest: str | None = None
    verified_s3: bool | None = None


def _stage_folder(root: str, rel_dir: str) -> int:
    """The folder `rel_dir` below the stage directory, made where missing, opened one component at a time with none
    followed if it is a link: a link left in a reused stage directory (`sub` -> /etc, or `x.bin.ckptbench-part` ->
    a file elsewhere) took this run's writes, as root, outside it."""
    os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in rel_dir.split("/") if rel_dir else ():
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


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
        ob = _Obj(o, n, self.opts.hash, remaining=n)
        if self.opts.hash not in ("none", "crc32c"):
            ob.ordered = fastio.Hasher(self.opts.hash)
        if self.opts.hash == "md5" and "-" in o.etag:
            ob.md5s = {}
        if self.into == "memory":
            ob.buffer = mmap.mmap(-1, max(4096, o.size), flags=_ANON)
        elif self.into == "stage":
            from ckptbench.checkpoint.members import safe_member

            if o.rel.endswith(STAGE_SUFFIX):  # its final name is another object's temporary one: they would mix
                raise CkptbenchError(f"{self.url}/{o.rel}: ends in {STAGE_SUFFIX}, the suffix of ckptbench's "
                                     "temporary names, so it cannot be staged; rename the object", exit_code=1)
            ob.final = os.path.join(self.stage_dir, safe_member(o.rel, str(self.url)))
            ob.tmp = ob.final + STAGE_SUFFIX
        return ob

    def _open_stage(self, ob: _Obj) -> None:
        with ob.lock:
            if ob.fd is None:
                name = os.path.basename(ob.tmp)
                ob.dir_fd = _stage_folder(self.stage_dir, os.path.dirname(os.path.relpath(ob.tmp, self.stage_dir)))
                try:
                    _unlink(name, ob.dir_fd)  # a killed run's, or planted: the name only, never what a link names
                    ob.fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                                    dir_fd=ob.dir_fd)
                except BaseException:
                    os.close(ob.dir_fd)
                    ob.dir_fd = None
                    raise

    def _staged(self, ob: _Obj) -> bool:
        """The object's temporary file is open; False (the object failed) where the stage directory refused it."""
        try:
            self._open_stage(ob)
            return True
        except OSError as exc:  # a name too long for the filesystem, a full disk, a read-only directory, a link
            self._fail(ob, "stage", f"{ob.tmp}: {exc.strerror or type(exc).__name__}; check --stage-dir")
            return False

    def _drop_stage(self, ob: _Obj, keep: bool) -> None:
        """The temporary file closed and renamed to its final name (`keep`), else removed; its folder closed."""
        if ob.fd is not None:
            os.close(ob.fd)
            ob.fd = None
        if ob.dir_fd is None:
            return
        try:
            tmp, final = os.path.basename(ob.tmp), os.path.basename(ob.final)
            if keep:  # whole and verified: only now does it get its real name
                os.replace(tmp, final, src_dir_fd=ob.dir_fd, dst_dir_fd=ob.dir_fd)
            else:
                _unlink(tmp, ob.dir_fd)
        finally:
            os.close(ob.dir_fd)
            ob.dir_fd = None

    def _fail(self, ob: _Obj, cls: str, msg: str) -> None:
        with ob.lock:
            if ob.error is None:
                ob.error = (cls, msg)

    def _finish(self, ob: _Obj) -> None:
        ob.t1 = time.perf_counter()
        self.t_last = max(self.t_last, ob.t1)
        if ob.error is None and not self.cancelled:
            whole = None
            for _, (d, n) in sorted(ob.crcs.items()):
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
            self._drop_stage(ob, keep=ob.error is None and not self.cancelled)
        with self.cv:
            if ob.error is None and not self.cancelled:
                self.done_files += 1
            else:
                self.failed_files += 1

    def _check_s3(self, ob: _Obj, whole: int) -> bool | None:
        """S3's own checksums where the object carries them: CRC32C of a single GET, the ETag MD5."""
        if ob.s3_crc32c and "-" not in ob.s3_crc32c:
            return base64.b64decode(ob.s3_crc32c) == whole.to_bytes(4, "big")
        # an ETag is S3's MD5 only where it is written as one: 32 hex digits, and "-N" of the parts after them for a
        # multipart object; another server's opaque tag (32 letters) is no checksum, not a corrupt object
        etag = ob.o.etag.lower()
        if ob.opaque_etag:  # 32 hex digits all the same, but no digest of the data: a sound object is no mismatch
            return None
        if self.opts.hash == "md5" and _MD5_HEX.fullmatch(etag):
            return ob.digest == etag
        if ob.md5s and len(ob.md5s) == ob.nparts and etag == f"{etag[:32]}-{ob.nparts}" \
                and _MD5_HEX.fullmatch(etag[:32]):
            import hashlib

            joined = b"".join(ob.md5s[k] for k in range(ob.nparts))
            return hashlib.md5(joined).hexdigest() == etag.split("-")[0]
        return None

    def _close_out(self) -> None:
        """Objects never started (cancelled) or still open get their record and lose their partial file."""
        for ob in self.objs:
            if ob.remaining > 0:
                ob.error = ob.error or ("cancelled", "cancelled before it was read")
                self._drop_stage(ob, keep=False)
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

    def scan_counts(self, i: int) -> None:
        return None  # counted after they land, by the structural check

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

