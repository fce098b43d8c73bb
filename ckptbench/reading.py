"""A plain parallel read+hash of files: listing, cache condition, the engine, the report."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

import fastio

from ckptbench import conditions, tree
from ckptbench.errors import Cancelled, CkptbenchError

PROGRESS_INTERVAL_S = 0.25  # about four updates a second


@dataclass(frozen=True)
class ReadOptions:
    concurrency: int = 8
    read: str = "pread"
    hash: str = "crc32c"
    block_size: int = 1 << 20
    chunk_size: int = 64 << 20
    multipart: bool = False
    cache: str = "as-is"
    drop_caches: bool = False
    s3_client: str = "threads"


@dataclass(frozen=True)
class ReadReport:
    result: fastio.ReadResult
    cache: conditions.CacheCondition

    def to_json(self) -> dict:
        r = self.result
        snap = r.final
        return {
            "bytes": r.bytes,
            "seconds": r.seconds,
            "read_gbps": r.read_gbps,
            "files_ok": len(r.files) - len(r.failed),
            "files_failed": len(r.failed),
            "retries": r.retries,
            "cancelled": r.cancelled,
            "concurrency": r.concurrency,
            "read": r.read,
            "hash": r.hash,
            "block_size": r.block_size,
            "chunk_size": r.chunk_size,
            "latency_us": {"p50": snap.latency_us(0.5), "p99": snap.latency_us(0.99)},
            "worker_busy_s": list(snap.worker_busy_s),
            "cache": self.cache.to_dict(),
            "files": [
                {
                    "path": f.path,
                    "bytes": f.bytes,
                    "digest": f.digest,
                    **({"multipart_digest": f.multipart_digest} if f.multipart_digest else {}),
                    "seconds": f.seconds,
                    "attempts": f.attempts,
                    "error": {"errno": f.error.errno, "message": f.error.message} if f.error else None,
                }
                for f in r.files
            ],
        }


def _wait(handle, on_progress, cancel):
    with handle:
        while (result := handle.wait(PROGRESS_INTERVAL_S)) is None:
            if cancel is not None and cancel.is_set():
                handle.cancel()
            if on_progress:
                on_progress(handle.snapshot())
    if on_progress:
        on_progress(result.final)
    if cancel is not None and cancel.is_set() and result.cancelled:
        raise Cancelled("read cancelled")
    return result


def _run_read_s3(listing, opts: ReadOptions, on_progress, cancel, on_start) -> ReadReport:
    """Read-only from S3: ranged GETs hashed as they stream; memory stays bounded by concurrency × part."""
    from ckptbench.sources import s3read

    a = listing.s3
    handle = s3read.start(a.client, a.url, a.objects,
                          s3read.S3ReadOptions(concurrency=opts.concurrency, part_size=opts.chunk_size,
                                               hash=opts.hash, into="hash", backend=opts.s3_client), a.retry_log)
    if on_start:
        on_start(handle)
    cache = conditions.CacheCondition(opts.cache, 0.0, True, "S3: no local page cache")
    return ReadReport(_wait(handle, on_progress, cancel), cache)


def list_s3(targets: list[str], concurrency: int = 16):
    """The listing of one s3:// prefix (None when the targets are local)."""
    if not any(t.startswith("s3://") for t in targets):
        return None
    from ckptbench.pipeline import list_checkpoint

    if len(targets) != 1:
        raise CkptbenchError("read takes one s3:// prefix at a time, without local paths")
    return list_checkpoint(targets[0], concurrency)


def list_files(targets: Iterable[str]) -> list[fastio.FileSpec]:
    """Files named, plus every regular file under directories named, in a stable order."""
    specs: list[fastio.FileSpec] = []
    for target in targets:
        if os.path.isdir(target):
            found = [fastio.FileSpec(p, os.path.getsize(p)) for p in tree.files(target)]
            if not found:
                raise CkptbenchError(f"{target}: directory holds no files; point at a checkpoint directory")
            specs.extend(found)
        elif os.path.isfile(target):
            specs.append(fastio.FileSpec(target, os.path.getsize(target)))
        elif os.path.exists(target):
            raise CkptbenchError(f"{target}: not a regular file or directory")
        else:
            raise CkptbenchError(f"{target}: no such file or directory")
    if not specs:
        raise CkptbenchError("nothing to read: name a directory or files")
    return specs


def run_read(
    files: list[fastio.FileSpec],
    opts: ReadOptions,
    *,
    on_progress: Callable[[fastio.Snapshot], None] | None = None,
    cancel: threading.Event | None = None,
    on_start: Callable[[fastio.ReadHandle], None] | None = None,
    s3_listing=None,
) -> ReadReport:
    """Prepares the cache condition, reads, reports; cancellable from another thread via `cancel`."""
    if s3_listing is not None:
        return _run_read_s3(s3_listing, opts, on_progress, cancel, on_start)
    paths = [f.path for f in files]
    try:
        cache = conditions.prepare(paths, opts.cache, drop_caches=opts.drop_caches)
        handle = fastio.start(
            files,
            concurrency=opts.concurrency,
            read=opts.read,
            hash=opts.hash,
            block_size=opts.block_size,
            chunk_size=opts.chunk_size,
            multipart=opts.multipart,
        )
    except fastio.OptionError as exc:
        raise CkptbenchError(exc.strerror) from None
    except fastio.FastIOError as exc:
        raise CkptbenchError(f"{exc.filename or 'read'}: {exc.strerror}") from None
    if on_start:
        on_start(handle)
    result = _wait(handle, on_progress, cancel)
    return ReadReport(result, cache.with_after(conditions.residency_of(paths)))
