"""fastio: parallel file reads, hashing and finite-value scans in native threads, with the GIL released.

Digests are lowercase hex. A file's `digest` is the plain whole-file digest (what hashlib, the
crc32c and xxhash packages give; crc32c and xxh64 big-endian). `multipart_digest` is opt-in: the
hash of the concatenated per-chunk digests plus "-<parts>", how S3 builds a multipart ETag; with it,
a file of several chunks hashed with md5, sha256 or xxh64 has its chunks hashed in parallel and no
plain `digest` (None: that would take a second pass in order), while crc32c's chunks combine into it.
"""

from fastio._engine import (
    MAX_CONCURRENCY,
    copy,
    crc32c_combine,
    Hasher,
    ReadHandle,
    count_nonfinite,
    crc32c_hw_available,
    crc32c_impl,
    drop_caches,
    evict,
    populate,
    read_files,
    residency,
    start,
)
from fastio.errors import FastIOError, OptionError
from fastio.types import (
    FINITE_KINDS,
    HASHES,
    READ_MODES,
    FileError,
    FileResult,
    FileSpec,
    ReadResult,
    Residency,
    Snapshot,
    percentile_us,
)

__all__ = [
    "FINITE_KINDS",
    "HASHES",
    "MAX_CONCURRENCY",
    "READ_MODES",
    "FastIOError",
    "FileError",
    "FileResult",
    "FileSpec",
    "Hasher",
    "OptionError",
    "ReadHandle",
    "ReadResult",
    "Residency",
    "Snapshot",
    "copy",
    "count_nonfinite",
    "crc32c_combine",
    "crc32c_hw_available",
    "crc32c_impl",
    "drop_caches",
    "evict",
    "percentile_us",
    "populate",
    "read_files",
    "residency",
    "start",
]
