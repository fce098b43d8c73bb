"""A plain parallel read+hash of a source (no deserialization): cache condition, the read, the report."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import fastio

from ckptbench.system import pagecache as conditions
from ckptbench.sources import Driven, Listing, ReadHandle, ReadOptions, Source, drive


@dataclass(frozen=True)
class ReadReport:
    driven: Driven
    cache: conditions.CacheCondition
    skipped: tuple[tuple[str, str], ...] = ()  # directories the listing could not enter
    read_why: str = ""  # why this read path (what `--read auto` saw)
    passed: tuple[tuple[str, str], ...] = ()  # entries not regular files (a symlink, a FIFO): said, never read

    @property
    def ok(self) -> bool:
        return not self.result.failed and not self.skipped

    @property
    def result(self) -> fastio.ReadResult:
        return self.driven.result

    @property
    def read_gbps(self) -> float:
        return self.driven.read_gbps

    def to_json(self) -> dict:
        r = self.result
        snap = r.final
        return {
            "bytes": r.bytes,
            "seconds": self.driven.wall_s,
            "read_gbps": self.driven.read_gbps,
            "engine_seconds": r.seconds,
            "engine_gbps": self.driven.engine_gbps,
            "files_ok": len(r.files) - len(r.failed),
            "files_failed": len(r.failed),
            "retries": r.retries,
            "errors": self.driven.error_classes,
            "cancelled": r.cancelled,
            "concurrency": r.concurrency,
            "read": r.read,
            "read_why": self.read_why,
            "hash": r.hash,
            "block_size": r.block_size,
            "chunk_size": r.chunk_size,
            "latency_us": {"p50": snap.latency_us(0.5), "p99": snap.latency_us(0.99)},
            "worker_busy_s": list(snap.worker_busy_s),
            "cache": self.cache.to_dict(),
            "unreadable_dirs": [{"path": d, "error": why} for d, why in self.skipped],
            "not_read": [{"path": p, "why": why} for p, why in self.passed],
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


def read_source(source: Source, listing: Listing, opts: ReadOptions, *, cache: str = "as-is",
                drop_caches: bool = False, on_progress: Callable[[fastio.Snapshot], None] | None = None,
                cancel: threading.Event | None = None,
                on_start: Callable[[ReadHandle], None] | None = None) -> ReadReport:
    """Prepares the cache condition, reads every file once, reports; cancellable from another thread."""
    condition = source.prepare_cache(listing, cache, drop_caches=drop_caches)
    # after the cache is prepared: `auto` goes by what is resident, as the preparation just measured it
    opts, why = source.choose_read(listing, opts, condition.residency_before)
    driven = drive(lambda: source.start_read(listing, opts), on_start=on_start, on_progress=on_progress,
                   cancel=cancel)
    after = source.residency(listing)
    return ReadReport(driven, condition if after is None else condition.with_after(after), listing.skipped, why,
                      # a checkpoint's listing says them in its layout (not_read), named inside the checkpoint
                      listing.passed if listing.layout is None else ())
