"""boto3 GETs on ckptbench's own thread pool: one task per part, concurrency changeable while it reads (the
S3 reader `s3source.start` picks by default; what it shares with the CRT reader lives in `s3read.ObjectRead`)."""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time

import fastio

from ckptbench.core import concurrency as conc
from ckptbench.core.errors import CkptbenchError
from ckptbench.sources import s3 as s3mod
from ckptbench.sources.base import ReadOptions
from ckptbench.sources.s3read import CHUNK, ObjectRead, _bucket, _Obj, etag_is_opaque

# failures another attempt cannot mend: the object is gone, refused, replaced, corrupt, or not the size listed
FINAL = (s3mod.MISSING, s3mod.ACCESS_DENIED, s3mod.CHANGED, s3mod.CHECKSUM, s3mod.REDIRECT, s3mod.MALFORMED,
         "size_mismatch")


class ThreadPoolRead(ObjectRead):
    """boto3 GETs on ckptbench's own threads: each part is one task; concurrency changes while it reads."""

    live_concurrency = True

    def __init__(self, client, url: s3mod.S3Url, objects: list[s3mod.S3Object], opts: ReadOptions,
                 retry_log: s3mod.RetryLog, *, into: str = "hash", stage_dir: str | None = None):
        super().__init__(url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
        self.client = client
        # task j is part j - ends[i-1] of object i: held as one running sum per object, not one entry per part
        self.ends = list(itertools.accumulate(ob.nparts for ob in self.objs))
        self.ntasks = self.ends[-1] if self.ends else 0
        self.next_task = 0
        self.threads: list[threading.Thread] = []
        self.state: list[str] = []
        self.busy: list[float] = []
        with self.cv:
            self._spawn(self.target)

    def _spawn(self, n: int) -> None:
        while len(self.threads) < n and self.next_task < self.ntasks and not self.cancelled:
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
                while i >= self.target and not self.cancelled and self.next_task < self.ntasks:
                    self.state[i] = "parked"
                    self.cv.wait()
                if self.cancelled or self.next_task >= self.ntasks:
                    self.state[i] = "exited"
                    self.cv.notify_all()
                    return
                task = self._task(self.next_task)
                self.next_task += 1
                self.state[i] = "active"
            t0 = time.perf_counter()
            self._part(*task)
            self.busy[i] += time.perf_counter() - t0

    def _task(self, j: int) -> tuple[int, int]:
        """(object, part) of task j."""
        i = bisect.bisect_right(self.ends, j)
        return i, j - (self.ends[i - 1] if i else 0)

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
        from botocore.exceptions import ClientError
        from urllib3.exceptions import HTTPError

        ps = self.opts.part_size
        start = k * ps
        end = min(ob.o.size, start + ps) - 1
        want = end - start + 1
        if self.into == "stage" and not self._staged(ob):
            return
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
            md5 = fastio.Hasher("md5") if ob.md5s is not None else None
            held: list[bytes] = []
            got = 0
            resp = None
            try:
                t0 = time.perf_counter()
                resp = self.client.get_object(**kw)
                with self.stat_lock:
                    self.hist[_bucket((time.perf_counter() - t0) * 1e6)] += 1
                    self.gets += 1
                if ob.nparts == 1:
                    ob.s3_crc32c = resp.get("ChecksumCRC32C")
                ob.opaque_etag |= etag_is_opaque(resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}))
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
            except (*s3mod.call_errors(), HTTPError, OSError, CkptbenchError) as exc:
                cls = s3mod.classify(exc) if not isinstance(exc, CkptbenchError) else "size_mismatch"
                with self.stat_lock:
                    self.bytes -= got
                # botocore already retried its request (an error status, a timeout or a drip before the headers
                # were whole): ours are for bodies cut after them, so the attempts never multiply
                if isinstance(exc, ClientError) or resp is None or cls in FINAL or attempt == self.opts.part_retries:
                    self._fail(ob, cls, f"{ob.o.key} bytes {start}-{end}: {cls} ({s3mod.described(exc)})")
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
        finished = all(s == "exited" for s in states) and threads > 0 or not self.ntasks
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
