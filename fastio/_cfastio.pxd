# C declarations of the native core, for the modules that cimport it.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "csrc/hashes.h" nogil:
    uint32_t fio_crc32c(uint32_t crc, const void *buf, size_t len)
    uint32_t fio_crc32c_sw(uint32_t crc, const void *buf, size_t len)
    uint32_t fio_crc32c_hw(uint32_t crc, const void *buf, size_t len)
    int fio_crc32c_hw_available()
    const char *fio_crc32c_impl()
    uint32_t fio_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)

cdef extern from "csrc/digest.h" nogil:
    enum:
        FIO_H_NONE
        FIO_H_CRC32C
        FIO_H_XXH64
        FIO_H_MD5
        FIO_H_SHA256
        FIO_DIGEST_MAX
    ctypedef struct fio_digest:
        int alg
    int fio_crypto_load(const char *libpath)
    int fio_crypto_loaded()
    int fio_digest_size(int alg)
    int fio_digest_init(fio_digest *d, int alg)
    void fio_digest_update(fio_digest *d, const void *buf, size_t len)
    int fio_digest_copy(fio_digest *dst, const fio_digest *src)
    size_t fio_digest_final(fio_digest *d, uint8_t *out)
    void fio_digest_free(fio_digest *d)

cdef extern from "csrc/cache.h" nogil:
    int fio_residency(const char *path, int nofollow, int64_t *resident, int64_t *total)
    int fio_evict(const char *path, int nofollow)
    int fio_drop_caches()

cdef extern from "csrc/memory.h" nogil:
    int fio_populate(char *base, size_t len, int threads, int64_t *ns, int *touched)
    int fio_copy(char *dst, const char *src, size_t len, int threads, int64_t *ns)

cdef extern from "csrc/finite.h" nogil:
    enum:
        FIO_FK_F16
        FIO_FK_BF16
        FIO_FK_F32
        FIO_FK_F64
        FIO_FK_C64
        FIO_FK_C128
        FIO_FK_F8_E4M3FN
        FIO_FK_F8_E5M2
        FIO_FK_F8_E4M3FNUZ
        FIO_FK_F8_E5M2FNUZ
        FIO_FK_F8_E8M0
        FIO_FINITE_CHUNK

    ctypedef struct fio_finite_item:
        const void *buf
        size_t len
        int kind
        uint64_t nonfinite

    size_t fio_finite_elem_size(int kind)
    size_t fio_finite_unit_size(int kind)
    int fio_count_nonfinite(fio_finite_item *items, size_t n, int concurrency)
    const char *fio_finite_impl()

cdef extern from "csrc/engine.h" nogil:
    enum:
        FIO_MODE_PREAD
        FIO_MODE_MMAP
        FIO_MODE_DIRECT
        FIO_W_IDLE
        FIO_W_ACTIVE
        FIO_W_PARKED
        FIO_W_EXITED
        FIO_HIST_BUCKETS
        FIO_MAX_THREADS

    ctypedef struct fio_scan_region:
        int64_t off
        int64_t len
        int kind

    ctypedef struct fio_file_spec:
        const char *path
        int64_t size
        int64_t offset
        int range
        int fault_errno
        int64_t fault_after
        int fault_count
        uint8_t *dest
        const fio_scan_region *scan
        int nscan
        uint64_t *scan_counts
        int rel_off

    ctypedef struct fio_options:
        int concurrency
        int mode
        size_t block_size
        int64_t chunk_size
        int alg
        int multipart
        int nofollow
        int beneath
        int beneath_fd

    ctypedef struct fio_file_state:
        char *path
        int64_t size
        int nunits
        int err
        char *msg
        int64_t bytes
        int retries
        int64_t t_open_ns
        int64_t t_end_ns
        uint8_t *parts
        uint8_t *digest
        int digest_len
        uint8_t *mp_digest
        int mp_len

    ctypedef struct fio_snapshot:
        uint64_t bytes, files_done, files_failed, retries, reads
        uint64_t units_done, units_total
        int64_t files_total, bytes_planned
        int active, parked, threads, target
        int finished, cancelled
        int64_t t_start_ns, t_first_open_ns, t_last_end_ns, now_ns
        uint64_t *hist

    ctypedef struct fio_engine:
        pass

    fio_engine *fio_engine_start(const fio_file_spec *files, int nfiles, const fio_options *opt, int *err)
    void fio_engine_set_concurrency(fio_engine *e, int n)
    void fio_engine_cancel(fio_engine *e)
    void fio_engine_release(fio_engine *e)
    int fio_engine_wait(fio_engine *e, int timeout_ms)
    void fio_engine_snapshot(fio_engine *e, fio_snapshot *s)
    int fio_engine_worker_stats(fio_engine *e, uint64_t *busy_ns, uint64_t *bytes, int *state, int n)
    void fio_engine_populated(fio_engine *e, uint64_t *cpu_ns, uint64_t *bytes)
    const fio_file_state *fio_engine_file(fio_engine *e, int i)
    int fio_engine_file_done(fio_engine *e, int i) nogil
    void fio_engine_free(fio_engine *e)
    int64_t fio_now_ns()
