"""What every source gives the domain: a Listing, read options validated once, and a live read handle."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import fastio

from ckptbench.core import concurrency as conc
from ckptbench.core.options import HASHES, READ_MODES, S3_CLIENTS
from ckptbench.checkpoint import manifest as mf
from ckptbench.system.pagecache import CacheCondition
from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.layouts import Layout, lightning_file
from ckptbench.core.units import human_bytes

INTO = ("hash", "memory", "stage")  # where read bytes go: hashed and dropped, page-aligned buffers, local files
MIN_BLOCK, MAX_BLOCK = 4096, 1 << 30
MIN_PART = 64 << 10
DEFAULT_CHUNK = 64 << 20


def _whole(value, what: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CkptbenchError(f"{what} {value!r}: give a whole number of bytes")
    if value < low or (high is not None and value > high):
        span = f"{human_bytes(low)}..{human_bytes(high)}" if high else f"at least {human_bytes(low)}"
        raise CkptbenchError(f"{what} {human_bytes(value) if value >= 0 else value}: must be {span}")
    return value


@dataclass(frozen=True)
class ReadOptions:
    """How bytes are read, for any source; every field is checked here, once, before anything starts."""

    concurrency: int = conc.DEFAULT
    read: str = "pread"  # local files: pread | mmap | direct | auto (chosen per read by the source)
    hash: str = "crc32c"
    block_size: int = 1 << 20  # bytes per read call
    chunk_size: int | None = None  # local: big files split into chunks of this size (None: about 64 MiB)
    multipart: bool = False  # also per-chunk digests and their digest (an S3 multipart ETag)
    part_size: int = 8 << 20  # S3: bytes per ranged GET
    s3_client: str = "threads"
    part_retries: int = 5  # S3: our retries of a body cut after the headers, per part

    def __post_init__(self) -> None:
        conc.check(self.concurrency)
        if self.read not in READ_MODES:
            raise CkptbenchError(f"--read {self.read!r}: choose one of {', '.join(READ_MODES)}")
        if self.hash not in HASHES:
            raise CkptbenchError(f"--hash {self.hash!r}: choose one of {', '.join(HASHES)}")
        _whole(self.block_size, "--block-size", MIN_BLOCK, MAX_BLOCK)
        if self.read == "direct" and self.block_size % 4096:
            raise CkptbenchError(f"--block-size {self.block_size}: direct reads need a multiple of 4096 (4K, 1M)")
        if self.chunk_size is None:  # the multiple of the block size nearest 64 MiB that is whole pages (fastio's
            # chunks are; --block-size 4097 gave "chunk size must be a multiple of the block size" of an option never
            # set), and at least one such
            step = 4096 // math.gcd(self.block_size, 4096)
            object.__setattr__(self, "chunk_size",
                               self.block_size * max(step, DEFAULT_CHUNK // self.block_size // step * step))
        _whole(self.chunk_size, "--chunk-size", self.block_size, 1 << 40)
        if self.chunk_size % self.block_size:
            raise CkptbenchError(f"--chunk-size {self.chunk_size}: must be a multiple of --block-size "
                                 f"{self.block_size}")
        if self.multipart and self.hash == "none":
            raise CkptbenchError("--multipart needs a hash: choose --hash crc32c, md5 or another")
        _whole(self.part_size, "--part-size", MIN_PART, 5 << 30)
        if self.s3_client not in S3_CLIENTS:
            raise CkptbenchError(f"--s3-client {self.s3_client!r}: choose {' or '.join(S3_CLIENTS)}")
        if isinstance(self.part_retries, bool) or not isinstance(self.part_retries, int) \
                or not 0 <= self.part_retries <= 100:
            raise CkptbenchError(f"part retries {self.part_retries!r}: give a whole number 0..100")


@dataclass(frozen=True)
class Listing:
    """Every file of a checkpoint as the source sees it, with its manifest and format."""

    source: str  # the URL or directory, as given (an S3 URL without a trailing slash)
    files: list[fastio.FileSpec]
    manifest: mf.Manifest | None
    format: str
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (directory, reason) the listing could not enter
    layout: "Layout | None" = None  # the one checkpoint a resume loads and its files (resume.choose), computed once
    passed: tuple[tuple[str, str], ...] = field(default=())  # (path, why): entries not regular files, never read

    @property
    def bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def rel(self, path: str) -> str:
        """A file's "/"-separated path inside the checkpoint."""
        base = self.source.rstrip("/")
        if path.startswith(base + "/"):
            return path[len(base) + 1:]
        return os.path.relpath(path, self.source).replace(os.sep, "/")

    @property
    def rels(self) -> list[str]:
        return [self.rel(f.path) for f in self.files]

    @property
    def restored(self) -> str:
        """The checkpoint a run restores, as its record names it: the source, or the Lightning .ckpt file it reads
        (two .ckpt files of one folder were recorded as one source, and compare held one's run against the other's;
        a watch of a resume from the file records the file, so a folder of one .ckpt is named by it too)."""
        lay = self.layout
        named = lightning_file(f.path for f in self.files) if lay is not None and lay.name == "lightning" else None
        return named or self.source


@runtime_checkable
class ReadHandle(Protocol):
    """A read under way: its live counters, live concurrency where the reader allows it, cancel, wait."""

    live_concurrency: bool  # False: concurrency is fixed for this read, set_concurrency changes nothing

    def snapshot(self) -> fastio.Snapshot: ...
    def set_concurrency(self, n: int) -> int: ...  # the concurrency now in force
    def cancel(self) -> None: ...
    def wait(self, timeout: float | None = None) -> fastio.ReadResult | None: ...
    def error_classes(self, result: fastio.ReadResult) -> dict[str, int]: ...
    def completed(self, start: int = 0) -> list[int]: ...  # files whose bytes are all in memory already
    def buffer(self, i: int) -> memoryview | None: ...  # a completed file's bytes, read-only, before the end
    def scan_counts(self, i: int) -> list[int] | None: ...  # a completed file's counts per `scan` region, or None
    def __enter__(self) -> "ReadHandle": ...
    def __exit__(self, *exc) -> bool: ...


@runtime_checkable
class Source(Protocol):
    """Where a checkpoint's bytes come from. Nothing outside `sources/` asks which kind it is."""

    url: str
    scheme: str | None  # None for a local path, "s3" for an object store
    has_page_cache: bool  # cold/hot can be prepared and verified
    files_on_disk: bool  # loaders can open the files in place (else a staged restore stages them first)

    def list(self) -> Listing: ...
    def prepare_cache(self, listing: Listing, cache: str, *, drop_caches: bool = False) -> CacheCondition: ...
    def residency(self, listing: Listing) -> float | None: ...
    def start_read(self, listing: Listing, opts: ReadOptions, *, into: str = "hash",
                   stage_dir: str | None = None, scan: dict | None = None) -> ReadHandle: ...
    # scan: {file index: [(offset, length, kind)]} counted for NaN/Inf as the bytes land, by a reader that can (local
    # files into memory); others ignore it and their handle's scan_counts says None
    def retry_classes(self) -> dict[str, int]: ...
    def choose_read(self, listing: Listing, opts: ReadOptions,  # `auto` resolved; `resident`: already measured
                    resident: float | None = None) -> tuple[ReadOptions, str]: ...
    def describe(self, root: str = "/") -> dict: ...
