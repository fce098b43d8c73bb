# cython: language_level=3, boundscheck=False, wraparound=False
"""Python face of the native read+hash engine, the Hasher, the page-cache calls and the finite-value scan.

Over 400 lines: one .pyx is one compiled extension; split, each part would be another module to build, load and
keep in step with the C structs it declares (the C itself is in csrc/, in small files)."""

import mmap
import operator
import os

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from fastio._cfastio cimport *
from fastio.errors import FastIOError, OptionError, raise_errno
from fastio.types import (
    FINITE_KINDS, HASHES, READ_MODES, FileError, FileResult, FileSpec, ReadResult, Residency, Snapshot,
)

_ALG = {"none": FIO_H_NONE, "crc32c": FIO_H_CRC32C, "xxh64": FIO_H_XXH64,
        "md5": FIO_H_MD5, "sha256": FIO_H_SHA256}
_MODE = {"pread": FIO_MODE_PREAD, "mmap": FIO_MODE_MMAP, "direct": FIO_MODE_DIRECT}
_FINITE_KIND = {"f16": FIO_FK_F16, "bf16": FIO_FK_BF16, "f32": FIO_FK_F32, "f64": FIO_FK_F64,
                "c64": FIO_FK_C64, "c128": FIO_FK_C128, "f8_e4m3fn": FIO_FK_F8_E4M3FN,
                "f8_e5m2": FIO_FK_F8_E5M2, "f8_e4m3fnuz": FIO_FK_F8_E4M3FNUZ,
                "f8_e5m2fnuz": FIO_FK_F8_E5M2FNUZ, "f8_e8m0": FIO_FK_F8_E8M0}
# Hashing a small buffer costs less than dropping and retaking the GIL.
cdef enum:
    NOGIL_MIN = 64 * 1024
MAX_CONCURRENCY = FIO_MAX_THREADS
_FINITE_CHUNK = FIO_FINITE_CHUNK
_ANON_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def _libcrypto_path():
    """The libcrypto that hashlib already loaded, so md5/sha256 need no OpenSSL headers to build."""
    try:
        import _hashlib  # noqa: F401  (loads libcrypto into this process)
    except ImportError:
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                i = line.find("/")
                if i >= 0 and "libcrypto" in line[i:]:
                    return line[i:].rstrip("\n")
    except OSError:
        pass
    import ctypes.util
    return ctypes.util.find_library("crypto")


def _load_crypto():
    path = _libcrypto_path()
    if path:
        fio_crypto_load(os.fsencode(path))


_load_crypto()


def crc32c_impl():
    """"hw" or "sw": the crc32c kernel in use (FASTIO_CRC32C=sw forces the portable one)."""
    return fio_crc32c_impl().decode()


def crc32c_hw_available():
    return bool(fio_crc32c_hw_available())


def _crc32c(data, unsigned int value=0, impl="auto"):
    """crc32c of a buffer with a chosen kernel; for tests of hw against sw."""
    cdef const uint8_t[::1] view = memoryview(data).cast("B")
    cdef uint32_t crc = value
    cdef size_t n = view.shape[0]
    cdef const uint8_t *p = &view[0] if n else NULL
    if impl == "hw":
        if not fio_crc32c_hw_available():
            raise FastIOError(38, "crc32c hardware kernel not available on this CPU")
        with nogil:
            crc = fio_crc32c_hw(crc, p, n)
    elif impl == "sw":
        with nogil:
            crc = fio_crc32c_sw(crc, p, n)
    else:
        with nogil:
            crc = fio_crc32c(crc, p, n)
    return crc


def crc32c_combine(unsigned int crc1, unsigned int crc2, unsigned long long len2):
    """crc32c of A+B from crc32c(A), crc32c(B) and len(B): parts hashed apart, joined in order."""
    return fio_crc32c_combine(crc1, crc2, len2)


_crc32c_combine = crc32c_combine


def _alg(name):
    try:
        return _ALG[name]
    except (KeyError, TypeError):
        raise OptionError(f"unknown hash {name!r}: choose one of {', '.join(HASHES)}") from None


cdef class Hasher:
    """Incremental digest for bytes that arrive from elsewhere; releases the GIL above 64 KiB."""

    cdef fio_digest d
    cdef readonly str name
    cdef bint live

    def __cinit__(self, str alg="crc32c"):
        self.live = False
        cdef int a = _alg(alg)
        if a == FIO_H_NONE:
            raise OptionError("Hasher needs a real hash, not 'none'")
        raise_errno(fio_digest_init(&self.d, a), what=f"{alg} unavailable (hashlib has no OpenSSL)")
        self.live = True
        self.name = alg

    def __dealloc__(self):
        if self.live:
            fio_digest_free(&self.d)

    @property
    def digest_size(self):
        return fio_digest_size(self.d.alg)

    def update(self, data):
        cdef Py_buffer buf
        PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
        try:
            if buf.len >= NOGIL_MIN:
                with nogil:
                    fio_digest_update(&self.d, buf.buf, <size_t>buf.len)
            else:
                fio_digest_update(&self.d, buf.buf, <size_t>buf.len)
        finally:
            PyBuffer_Release(&buf)

    def copy(self):
        cdef Hasher other = Hasher.__new__(Hasher, self.name)
        fio_digest_free(&other.d)
        other.live = False
        raise_errno(fio_digest_copy(&other.d, &self.d), what="copy hash state")
        other.live = True
        return other

    def digest(self):
        cdef fio_digest tmp
        cdef uint8_t out[FIO_DIGEST_MAX]
        raise_errno(fio_digest_copy(&tmp, &self.d), what="copy hash state")
        cdef size_t n = fio_digest_final(&tmp, out)
        return bytes(out[:n])

    def hexdigest(self):
        return self.digest().hex()


cdef class ReadHandle:
    """A run in progress: live counters, concurrency up and down, cancel, and the results."""

    cdef fio_engine *e
    cdef fio_file_spec *specs
    cdef fio_scan_region *scan_regions
    cdef uint64_t *_counts
    cdef list _scan_at  # per spec: (first region, how many), or None
    cdef list _paths
    cdef list _buffers
    cdef object _result
    cdef readonly str hash, read
    cdef readonly int block_size
    cdef readonly long long chunk_size
    cdef int dsize
    cdef int multipart
    cdef double _elapsed_hi  # the largest elapsed_s handed out: see snapshot

    def __dealloc__(self):
        if self.e != NULL:
            with nogil:
                fio_engine_free(self.e)
        free(self.specs)
        free(self.scan_regions)
        free(self._counts)

    def snapshot(self):
        """Counters at this instant; safe from any thread while the workers run."""
        cdef fio_snapshot s
        cdef uint64_t busy[FIO_MAX_THREADS]
        cdef uint64_t wbytes[FIO_MAX_THREADS]
        cdef int state[FIO_MAX_THREADS]
        fio_engine_snapshot(self.e, &s)
        cdef int n = fio_engine_worker_stats(self.e, busy, wbytes, state, FIO_MAX_THREADS)
        cdef uint64_t pop_ns = 0, pop_bytes = 0
        fio_engine_populated(self.e, &pop_ns, &pop_bytes)
        end = s.t_last_end_ns if s.finished and s.t_last_end_ns else s.now_ns
        start = s.t_first_open_ns or s.t_start_ns
        # A snapshot taken after the last block landed but before the last worker left reads the clock, which is
        # later than the finished run's end (the last block's landing): elapsed never goes back, so rates drawn
        # from two snapshots stay positive, and the end moves by at most that window (microseconds).
        elapsed = max(0, end - start) / 1e9 if s.t_first_open_ns else 0.0
        if elapsed < self._elapsed_hi:
            elapsed = self._elapsed_hi
        self._elapsed_hi = elapsed
        return Snapshot(
            bytes=s.bytes, bytes_planned=s.bytes_planned, files_done=s.files_done,
            files_failed=s.files_failed, files_total=s.files_total, retries=s.retries,
            reads=s.reads, active_workers=s.active, parked_workers=s.parked,
            threads=s.threads, concurrency=s.target,
            elapsed_s=elapsed,
            finished=bool(s.finished), cancelled=bool(s.cancelled),
            worker_busy_s=tuple(busy[i] / 1e9 for i in range(n)),
            latency_hist=tuple(s.hist[i] for i in range(FIO_HIST_BUCKETS)),
            populated_bytes=pop_bytes, populate_cpu_s=pop_ns / 1e9,
        )

    def set_concurrency(self, int n):
        """Takes effect at the next chunk boundary: extra workers park, missing ones start."""
        if n < 1 or n > FIO_MAX_THREADS:
            raise OptionError(f"concurrency must be 1..{FIO_MAX_THREADS}, got {n}")
        fio_engine_set_concurrency(self.e, n)

    def cancel(self):
        fio_engine_cancel(self.e)

    def _release(self):
        """Tests: workers held before a file started with `_faults={path: "hold"}` go on."""
        fio_engine_release(self.e)

    def done(self):
        cdef fio_snapshot s
        fio_engine_snapshot(self.e, &s)
        return bool(s.finished)

    def completed(self, start=0):
        """Indices (from `start`) of the files whose every byte has been read into memory without error, while the
        run goes on: their buffers (`buffer(i)`) can be used before the whole read ends."""
        cdef int i
        cdef int n = len(self._paths)
        return [i for i in range(max(0, start), n) if fio_engine_file_done(self.e, i) == 1]

    def scan_counts(self, int i):
        """File i's non-finite count per region `scan` gave it, in that order, once `completed` lists it: counted as
        its blocks landed. None for a file given no regions, not finished, or failed."""
        if self._scan_at is None or not 0 <= i < len(self._paths) or self._scan_at[i] is None \
                or fio_engine_file_done(self.e, i) != 1:
            return None
        first, n = self._scan_at[i]
        return [self._counts[first + k] for k in range(n)]  # final: the file is done (acquire)

    def buffer(self, int i):
        """File i's bytes as a read-only memoryview once `completed` lists it (None before, or without memory)."""
        if self._buffers is None or not 0 <= i < len(self._paths) or self._buffers[i] is None \
                or fio_engine_file_done(self.e, i) != 1:
            return None
        return memoryview(self._buffers[i])[:fio_engine_file(self.e, i).bytes].toreadonly()

    def wait(self, timeout=None):
        """Blocks (GIL released) until the run ends; returns the ReadResult, or None on timeout."""
        if self._result is not None:
            return self._result
        cdef int finished = 0
        cdef int step
        deadline = None if timeout is None else fio_now_ns() + int(timeout * 1e9)
        while not finished:
            step = 100
            if deadline is not None:
                step = <int>max(0, min(step, (deadline - fio_now_ns()) // 1000000))
            with nogil:
                finished = fio_engine_wait(self.e, step)
            if finished:
                break
            if deadline is not None and fio_now_ns() >= deadline:
                return None
            try:
                PyErr_CheckSignals()
            except BaseException:
                fio_engine_cancel(self.e)
                with nogil:
                    fio_engine_wait(self.e, -1)
                raise
        self._result = self._collect()
        return self._result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._result is None:
            self.cancel()
            self.wait()
        return False

    cdef _collect(self):
        cdef const fio_file_state *f
        cdef int i, k
        files = []
        for i in range(len(self._paths)):
            f = fio_engine_file(self.e, i)
            err = FileError(f.err, f.msg.decode(errors="replace")) if f.err else None
            digest = bytes(f.digest[:f.digest_len]).hex() if f.digest_len and not f.err else None
            mp = None
            parts = ()
            if self.multipart and not f.err and f.mp_len:
                mp = f"{bytes(f.mp_digest[:f.mp_len]).hex()}-{f.nunits}"
                parts = tuple(bytes(f.parts[k * self.dsize:(k + 1) * self.dsize]).hex()
                              for k in range(f.nunits))
            seconds = (f.t_end_ns - f.t_open_ns) / 1e9 if f.t_open_ns and f.t_end_ns else 0.0
            files.append(FileResult(
                path=self._paths[i], bytes=f.bytes, digest=digest, seconds=seconds,
                attempts=1 + f.retries, error=err, multipart_digest=mp, part_digests=parts))
        final = self.snapshot()
        buffers = ()
        if self._buffers is not None:
            buffers = tuple(None if b is None or files[i].error else memoryview(b)[:files[i].bytes]
                            for i, b in enumerate(self._buffers))
        return ReadResult(
            buffers=buffers,
            files=tuple(files), bytes=final.bytes, seconds=final.elapsed_s, hash=self.hash,
            read=self.read, concurrency=final.concurrency, block_size=self.block_size,
            chunk_size=self.chunk_size, cancelled=final.cancelled, final=final)


def _as_spec(item):
    """A FileSpec with its size when it can be known: chunking needs sizes up front."""
    if isinstance(item, FileSpec) and item.offset is not None:
        return FileSpec(os.fsdecode(item.path), item.size, item.offset)  # a range names its size: nothing to stat
    if isinstance(item, FileSpec):
        path, size = item.path, item.size
    elif isinstance(item, (str, bytes, os.PathLike)):
        path, size = os.fsdecode(item), None
    else:
        path, size = item
        path = os.fsdecode(path)
    if size is None:
        try:
            st = os.stat(path)
            if st.st_mode & 0o170000 == 0o100000:
                size = st.st_size
        except OSError:
            pass  # the engine reports it per file
    return FileSpec(path, size)


def _range_error(spec, str read):
    """The one-line reason `spec`'s byte range cannot be read this way, or None."""
    off, size = spec.offset, spec.size
    if off is None:
        return None
    if size is None:
        return f"{spec.path}: a byte range (offset {off}) needs a size"
    if off < 0 or size < 0:
        return f"{spec.path}: a byte range needs offset and size >= 0, got offset {off}, size {size}"
    if off + size > (1 << 63) - 1:
        return f"{spec.path}: byte range {off}+{size} ends past the largest file offset (2**63-1)"
    if read == "direct" and off % 4096:
        return (f"{spec.path}: range offset {off} is not a multiple of 4096: direct reads need 4096-aligned "
                f"range offsets; use read='pread'")
    return None


def _scan_regions(scan, specs, str read, bint into_memory):
    """`scan` checked: {spec index: [(offset, length, kind), ...]} with each list sorted, not overlapping, within its
    spec's bytes, whole elements; the one-line OptionError that says what is wrong otherwise."""
    if not scan:
        return {}
    if not into_memory or read == "mmap":
        raise OptionError("scan needs into_memory=True and a pread or direct read (the blocks are counted as they land)")
    if not isinstance(scan, dict):
        raise OptionError(f"scan must be a dict of file index to regions, got {type(scan).__name__}")
    out = {}
    for i, regions in scan.items():
        if type(i) is not int or not 0 <= i < len(specs) or specs[i].size is None:
            raise OptionError(f"scan: {i!r} is not the index of a file of known size")
        if not isinstance(regions, (list, tuple)):
            raise OptionError(f"scan: file {i}: regions must be a list of (offset, length, kind), got "
                              f"{type(regions).__name__}")
        checked, end = [], 0
        for region in regions:
            # unpacked once, into plain values: what start() copies is what was checked (an object that iterates
            # differently the second time, or an unhashable kind, is an OptionError, not a TypeError or KeyError)
            if not isinstance(region, (list, tuple)) or len(region) != 3:
                raise OptionError(f"scan: file {i}: region {region!r:.60} is not (offset, length, kind)")
            off, length, kind = region
            if not isinstance(kind, str) or kind not in _FINITE_KIND:
                raise OptionError(f"scan: file {i}: unknown kind {kind!r:.40}: choose one of {', '.join(FINITE_KINDS)}")
            size = fio_finite_elem_size(_FINITE_KIND[kind])
            if type(off) is not int or type(length) is not int or off < end or length <= 0 \
                    or length % size or off + length > specs[i].size:
                raise OptionError(f"scan: file {i}: region ({off!r:.40}, {length!r:.40}) is not whole {kind} "
                                  f"elements in order within the file's {specs[i].size} bytes")
            checked.append((off, length, _FINITE_KIND[kind]))
            end = off + length
        if checked:
            out[i] = checked
    return out


def start(files, *, int concurrency=4, str read="pread", str hash="crc32c",
          block_size=1 << 20, chunk_size=64 << 20, bint multipart=False, bint into_memory=False, scan=None,
          bint nofollow=False, beneath=None, _faults=None):
    """Starts reading `files` (paths, (path, size) pairs or FileSpec) and returns a ReadHandle at once.

    A FileSpec with an `offset` reads only the bytes [offset, offset+size) of its file: its result, digest and
    buffer are those of the range. Several specs may name one path; results stay one per spec, in order.

    Big files whose size is known are split into `chunk_size` chunks read by several workers when the
    hash allows it (none, crc32c) or when `multipart` asks for per-chunk digests; md5, sha256 and xxh64
    of a whole file need its bytes in order, so without `multipart` each such file is one unit.
    With `into_memory` each file's bytes land in a page-aligned anonymous mapping of its own, read
    straight into it (no bounce copy), returned as `ReadResult.buffers` (memoryviews, in file order).
    `scan` ({spec index: [(offset, length, kind), ...]}, with `into_memory` and a pread or direct read) counts NaN/Inf
    in those regions of a file (its tensors) block by block as they land, while the bytes are in the CPU's caches
    (a scan of the whole buffer afterwards reads them back from memory at a fifth of the rate); the counts are
    `handle.scan_counts(i)`.
    With `nofollow` a file that is a symbolic link when it is opened fails (ELOOP) instead of being followed: a
    listing of regular files stays what is read, whatever is swapped in meanwhile. `beneath`, a directory every
    path lies below (as "DIR/a/b" is below "DIR"), opens each file from that directory one component at a time with
    none followed when it is a symbolic link: a folder swapped for a link meanwhile fails (ELOOP) too.
    `_faults` maps a path to (errno, after_byte, count) for tests of the failure paths (after_byte is a position in
    the file, whatever range a spec names; every spec of that path gets the fault), or to "hold": the
    worker stops before opening that file until `handle._release()`.
    """
    if read not in _MODE:
        raise OptionError(f"unknown read mode {read!r}: choose one of {', '.join(READ_MODES)}")
    cdef int alg = _alg(hash)
    if not 1 <= concurrency <= FIO_MAX_THREADS:
        raise OptionError(f"concurrency must be 1..{FIO_MAX_THREADS}, got {concurrency}")
    if not 4096 <= block_size <= 1 << 30:
        raise OptionError(f"block size must be 4 KiB..1 GiB, got {block_size}")
    if read == "direct" and block_size % 4096:
        raise OptionError(f"direct reads need a block size that is a multiple of 4096, got {block_size}")
    if chunk_size < block_size or chunk_size % block_size or chunk_size % 4096:
        raise OptionError(f"chunk size must be a multiple of the block size ({block_size}), got {chunk_size}")
    if multipart and alg == FIO_H_NONE:
        raise OptionError("multipart digests need a hash, not 'none'")
    if alg in (FIO_H_MD5, FIO_H_SHA256) and not fio_crypto_loaded():
        raise FastIOError(38, f"{hash} needs the libcrypto that Python's hashlib uses; none was found")
    specs = [_as_spec(x) for x in files]
    for s in specs:
        why = _range_error(s, read)
        if why:
            raise OptionError(why)
    rel_at = _below(beneath, specs)
    regions = _scan_regions(scan, specs, read, into_memory)
    faults = _faults or {}
    cdef ReadHandle h = ReadHandle.__new__(ReadHandle)
    h._paths = [s.path for s in specs]
    encoded = [os.fsencode(p) for p in h._paths]  # kept alive until start copies them
    h.specs = <fio_file_spec *>calloc(len(specs) + 1, sizeof(fio_file_spec))
    if h.specs == NULL:
        raise MemoryError()
    cdef int i
    cdef Py_ssize_t k = 0, total = sum(len(r) for r in regions.values())
    cdef unsigned char[::1] dest
    if into_memory:
        h._buffers = []
    if total:
        h.scan_regions = <fio_scan_region *>calloc(total, sizeof(fio_scan_region))
        h._counts = <uint64_t *>calloc(total, sizeof(uint64_t))
        if h.scan_regions == NULL or h._counts == NULL:
            raise MemoryError()
        h._scan_at = [None] * len(specs)
    for i in range(len(specs)):
        h.specs[i].path = encoded[i]
        h.specs[i].size = -1 if specs[i].size is None else specs[i].size
        h.specs[i].range = specs[i].offset is not None
        h.specs[i].offset = specs[i].offset or 0
        h.specs[i].rel_off = rel_at
        if into_memory:
            if specs[i].size is None:
                h._buffers.append(None)  # unreadable at stat time; the engine reports why
            else:
                # rounded up to whole pages: O_DIRECT reads the tail in aligned blocks
                buf = mmap.mmap(-1, max(4096, (specs[i].size + 4095) & ~4095), flags=_ANON_FLAGS)
                # Not on huge pages, though they fault 512x less often: under a hypervisor with free page
                # reporting (Firecracker, virtio-balloon) the freed 2 MiB blocks THP draws from are handed back
                # to the host, and re-touching them ran 3-4x slower than 4 KiB pages (1.1 vs 4.2 GB/s).
                dest = buf
                h.specs[i].dest = &dest[0]
                # lazily faulted: each worker faults in its chunk's pages with one madvise before reading into
                # them, in parallel and without the GIL (mmap's MAP_POPULATE would hold it for the whole allocation)
                h._buffers.append(buf)
        if i in regions and h.specs[i].dest != NULL:
            h._scan_at[i] = (k, len(regions[i]))
            h.specs[i].scan, h.specs[i].nscan, h.specs[i].scan_counts = &h.scan_regions[k], len(regions[i]), &h._counts[k]
            for off, length, code in regions[i]:
                h.scan_regions[k].off, h.scan_regions[k].len, h.scan_regions[k].kind = off, length, code
                k += 1
        fault = faults.get(specs[i].path)
        if fault == "hold":
            h.specs[i].fault_errno, h.specs[i].fault_after, h.specs[i].fault_count = -1, 0, 1
        elif fault:
            h.specs[i].fault_errno, h.specs[i].fault_after, h.specs[i].fault_count = fault
    cdef fio_options opt
    memset(&opt, 0, sizeof(opt))
    opt.concurrency = concurrency
    opt.mode = _MODE[read]
    opt.block_size = block_size
    opt.chunk_size = chunk_size
    opt.alg = alg
    opt.multipart = multipart
    opt.nofollow = nofollow
    cdef int err = 0
    if beneath is not None:
        opt.beneath = 1
        opt.beneath_fd = os.open(beneath, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the caller's own folder
    try:
        h.e = fio_engine_start(h.specs, len(specs), &opt, &err)
    finally:
        if opt.beneath:
            os.close(opt.beneath_fd)  # the engine holds its own duplicate
    if h.e == NULL:
        raise_errno(err or 12, what="starting the read engine")
    h.hash, h.read, h.block_size, h.chunk_size = hash, read, block_size, chunk_size
    h.dsize = fio_digest_size(alg)
    h.multipart = multipart
    return h


def _below(beneath, specs) -> int:
    """Where each path's part below `beneath` starts (0 without it); an OptionError for a path not below it."""
    if beneath is None:
        return 0
    try:
        root = os.fsdecode(beneath)
    except TypeError:
        root = ""
    if not root:
        raise OptionError(f"beneath must be a directory path, got {beneath!r}")
    root = root.rstrip("/") or "/"
    prefix = root if root == "/" else root + "/"
    for s in specs:
        path = os.fsdecode(s.path)  # a FileSpec may carry bytes
        if not path.startswith(prefix) or len(path) == len(prefix):
            raise OptionError(f"{path!r} does not lie below {root!r} (beneath)")
    return len(os.fsencode(prefix))


def read_files(files, **options):
    """start(...).wait(): the blocking form."""
    return start(files, **options).wait()


def residency(paths, nofollow=True):
    """Bytes of `paths` in the page cache right now (mincore), as Residency(resident, total). With `nofollow` (the
    default, as in `evict`: both take the paths a listing resolved) a path that is a symbolic link fails (ELOOP);
    without, it is followed (a /proc/self/fd name of a file the caller holds open is such a link)."""
    cdef int nf = 1 if nofollow else 0
    cdef int64_t res = 0, tot = 0
    cdef int rc
    cdef bytes b
    cdef const char *cp
    per = []
    for p in paths:
        p = os.fsdecode(p)
        b = os.fsencode(p)
        cp = b
        with nogil:
            rc = fio_residency(cp, nf, &res, &tot)
        raise_errno(rc, p, "residency")
        per.append((p, res, tot))
    return Residency(sum(x[1] for x in per), sum(x[2] for x in per), tuple(per))


def evict(paths, nofollow=True):
    """Drops `paths` from the page cache (flushing dirty pages first); raises on the first failure after trying all.
    `nofollow` as in `residency`."""
    cdef int nf = 1 if nofollow else 0
    cdef int rc
    cdef bytes b
    cdef const char *cp
    first = None
    for p in paths:
        p = os.fsdecode(p)
        b = os.fsencode(p)
        cp = b
        with nogil:
            rc = fio_evict(cp, nf)
        if rc and first is None:
            first = (rc, p)
    if first:
        raise_errno(first[0], first[1], "evict")


def drop_caches():
    """Drops the whole page cache (root, with a writable /proc/sys)."""
    cdef int rc
    with nogil:
        rc = fio_drop_caches()
    raise_errno(rc, "/proc/sys/vm/drop_caches", "drop_caches (needs root and a writable /proc/sys)")


cdef int _threads(threads) except -1:
    """`threads` as a C int, or OptionError: a Python int past a C int raised OverflowError from the call itself."""
    try:
        n = operator.index(threads)
    except TypeError:
        n = 0
    if isinstance(threads, bool) or not 1 <= n <= 1024:
        raise OptionError(f"threads must be 1..1024, got {str(threads)[:40]}")
    return n


def populate(region, threads):
    """Populates `region`, a writable buffer of fresh page-aligned memory never touched (an anonymous mmap), on
    `threads` native threads, each its equal share of whole pages, all started before the clock: (seconds, how),
    how "MADV_POPULATE_WRITE", or "a write per page" on a kernel without it. The floor's fresh-memory figure: a
    Python barrier before a ctypes madvise started the threads one after another for the GIL (2 threads on 256 MiB
    read 15 % below a plain C loop)."""
    cdef int nthreads = _threads(threads)
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(region, &view, PyBUF_WRITABLE)
    except (BufferError, TypeError, ValueError) as e:
        raise OptionError(f"not a writable buffer ({e})") from None
    cdef int64_t ns = 0
    cdef int touched = 0, rc
    try:
        with nogil:
            rc = fio_populate(<char *>view.buf, <size_t>view.len, nthreads, &ns, &touched)
        raise_errno(rc, what="populate (a page-aligned buffer, at least a page a thread)")
    finally:
        PyBuffer_Release(&view)
    return ns / 1e9, "a write per page" if touched else "MADV_POPULATE_WRITE"


def copy(dst, src, threads):
    """Copies `src` into `dst` (writable, at least as long; populated already, so only the bytes move) on `threads`
    native threads, each an equal part, all started before the clock, as populate: the seconds it took, and the
    bytes copied (len(src) // threads * threads)."""
    cdef int nthreads = _threads(threads)
    cdef Py_buffer d, s
    cdef int held = 0
    cdef int64_t ns = 0
    cdef int rc
    cdef size_t n
    try:
        try:
            PyObject_GetBuffer(dst, &d, PyBUF_WRITABLE)
            held = 1
            PyObject_GetBuffer(src, &s, PyBUF_SIMPLE)
            held = 2
        except (BufferError, TypeError, ValueError) as e:
            raise OptionError(f"{'the source' if held else 'the destination'} is not a "
                              f"{'contiguous' if held else 'writable'} buffer ({e})") from None
        if d.len < s.len:
            raise OptionError(f"the destination holds {d.len} bytes, the source {s.len}")
        n = <size_t>s.len // <size_t>nthreads * <size_t>nthreads
        with nogil:
            rc = fio_copy(<char *>d.buf, <const char *>s.buf, n, nthreads, &ns)
        raise_errno(rc, what="copy (at least a byte a thread)")
    finally:
        if held >= 2:
            PyBuffer_Release(&s)
        if held >= 1:
            PyBuffer_Release(&d)
    return ns / 1e9, n


def _finite_impl():
    """"avx2" or "sw": the count_nonfinite kernel in use (FASTIO_FINITE=sw forces the portable one)."""
    return fio_finite_impl().decode()


def _finite_kind(item, Py_ssize_t i):
    """The (buffer, kind) of item `i`, or the one-line OptionError that says what is wrong with it."""
    try:
        buf, kind = item
    except (TypeError, ValueError):
        raise OptionError(f"item {i}: expected a (buffer, kind) pair, got {type(item).__name__}") from None
    if not isinstance(kind, str) or kind not in _FINITE_KIND:
        raise OptionError(f"item {i}: unknown kind {kind!r}: choose one of {', '.join(FINITE_KINDS)}")
    return buf, kind


def count_nonfinite(items, *, concurrency=None):
    """Per item, how many elements (components, for complex kinds) are NaN or ±Inf, judged on the bit pattern.

    `items` holds (buffer, kind) pairs: any contiguous buffer, read-only ones too, taken as raw bytes in native byte
    order, and a kind from FINITE_KINDS. Every item is checked before the scan starts. The scan runs with the GIL
    released throughout, in chunks over `concurrency` native threads (default: one per CPU).
    """
    if concurrency is None:
        concurrency = min(os.cpu_count() or 1, FIO_MAX_THREADS)
    if not 1 <= concurrency <= FIO_MAX_THREADS:
        raise OptionError(f"concurrency must be 1..{FIO_MAX_THREADS}, got {concurrency}")
    items = list(items)
    cdef Py_ssize_t n = len(items), i, held = 0
    if n == 0:
        return []
    cdef int threads = concurrency, rc
    cdef fio_finite_item *c = <fio_finite_item *>calloc(n, sizeof(fio_finite_item))
    cdef Py_buffer *views = <Py_buffer *>calloc(n, sizeof(Py_buffer))
    try:
        if c == NULL or views == NULL:
            raise MemoryError()
        for i in range(n):
            buf, kind = _finite_kind(items[i], i)
            c[i].kind = _FINITE_KIND[kind]
            try:
                PyObject_GetBuffer(buf, &views[i], PyBUF_SIMPLE)
            except (BufferError, TypeError, ValueError) as e:
                raise OptionError(f"item {i}: not a contiguous buffer ({e})") from None
            held += 1
            c[i].buf, c[i].len = views[i].buf, <size_t>views[i].len
            size = fio_finite_elem_size(c[i].kind)
            if c[i].len % size:
                raise OptionError(f"item {i}: {c[i].len} bytes is not a whole number of "
                                  f"{kind} elements ({size} bytes each)")
        with nogil:
            rc = fio_count_nonfinite(c, <size_t>n, threads)
        raise_errno(rc, what="count_nonfinite")
        return [c[i].nonfinite for i in range(n)]
    finally:
        for i in range(held):
            PyBuffer_Release(&views[i])
        free(views)
        free(c)
