"""Plain records the engine hands back: per-file results, run totals, live counters."""

from __future__ import annotations

from dataclasses import dataclass, field

HASHES = ("none", "crc32c", "xxh64", "md5", "sha256")
READ_MODES = ("pread", "mmap", "direct")
# Element kinds count_nonfinite reads; c64 and c128 are pairs of f32 and f64, counted per component.
FINITE_KINDS = (
    "f16", "bf16", "f32", "f64", "c64", "c128",
    "f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz", "f8_e8m0",
)

# Read-latency histogram: bucket 0 counts calls under 1 µs, bucket b calls in [2**(b-1), 2**b) µs.
HIST_BUCKETS = 32


def bucket_upper_us(b: int) -> float:
    return float(1 << b)


def percentile_us(hist: tuple[int, ...], q: float) -> float | None:
    """Upper bound (µs) of the histogram bucket holding quantile q (0..1); None when empty."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for b, n in enumerate(hist):
        seen += n
        if seen >= rank and n:
            return bucket_upper_us(b)
    return bucket_upper_us(len(hist) - 1)


@dataclass(frozen=True)
class FileSpec:
    """A file to read whole, or with `offset` only its bytes [offset, offset+size).

    A whole file (offset None) must still be `size` bytes when it is opened; None means stat it now.
    A range (offset an int, 0 included) needs `size` and only that the file still holds those bytes.
    """

    path: str
    size: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class FileError:
    errno: int
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class FileResult:
    """One file's outcome. `digest` is the plain whole-file digest (hashlib's), or None: no hash, or
    multipart=True over several chunks with md5, sha256 or xxh64 (their chunks hashed in parallel).

    `multipart_digest` is opt-in (multipart=True): the digest of the concatenated per-chunk
    digests with "-<parts>" appended, the way S3 builds a multipart ETag.
    """

    path: str
    bytes: int
    digest: str | None
    seconds: float
    attempts: int
    error: FileError | None = None
    multipart_digest: str | None = None
    part_digests: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Snapshot:
    """Live counters, read without stopping the workers."""

    bytes: int
    bytes_planned: int
    files_done: int
    files_failed: int
    files_total: int
    retries: int
    reads: int
    active_workers: int
    parked_workers: int
    threads: int
    concurrency: int
    elapsed_s: float
    finished: bool
    cancelled: bool
    worker_busy_s: tuple[float, ...] = ()
    latency_hist: tuple[int, ...] = field(default=(), repr=False)
    # destinations populated before a read copies into them (MADV_POPULATE_WRITE), and the workers' CPU time in it: the
    # rate this box gave fresh memory at while the read ran, per core (a VM's host backing freed memory again on
    # first touch shows here; threads waiting for a core do not)
    populated_bytes: int = 0
    populate_cpu_s: float = 0.0

    @property
    def populate_gbps_per_core(self) -> float | None:
        """Fresh memory's rate in this read, per core of CPU time; None where nothing was populated (O_DIRECT, a read
        into reused blocks, a kernel without MADV_POPULATE_WRITE)."""
        return self.populated_bytes / self.populate_cpu_s / 1e9 if self.populated_bytes and self.populate_cpu_s > 0 \
            else None

    def latency_us(self, q: float) -> float | None:
        return percentile_us(self.latency_hist, q)

    @property
    def gbps(self) -> float:
        return self.bytes / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class ReadResult:
    files: tuple[FileResult, ...]
    bytes: int
    seconds: float  # first open to last byte
    hash: str
    read: str
    concurrency: int
    block_size: int
    chunk_size: int
    cancelled: bool
    final: Snapshot
    buffers: tuple = field(default=(), repr=False)  # with into_memory: each file's bytes, in file order

    @property
    def read_gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def failed(self) -> tuple[FileResult, ...]:
        return tuple(f for f in self.files if f.error is not None)

    @property
    def retries(self) -> int:
        return self.final.retries


@dataclass(frozen=True)
class Residency:
    resident: int
    total: int
    per_file: tuple[tuple[str, int, int], ...] = field(default=(), repr=False)

    @property
    def fraction(self) -> float:
        return self.resident / self.total if self.total else 0.0
