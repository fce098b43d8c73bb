/* The parallel read+hash engine: a plan of file units read by native threads. */
#ifndef FASTIO_ENGINE_H
#define FASTIO_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "digest.h"

enum { FIO_MODE_PREAD = 0, FIO_MODE_MMAP = 1, FIO_MODE_DIRECT = 2 };
enum { FIO_W_IDLE = 0, FIO_W_ACTIVE = 1, FIO_W_PARKED = 2, FIO_W_EXITED = 3 };
#define FIO_HIST_BUCKETS 32
#define FIO_MAX_THREADS 1024
#define FIO_MSG_LEN 200
#define FIO_HOLD (-1)

/* A region of a spec's bytes counted for NaN/Inf as its blocks land (a tensor): offset and length relative to the
 * spec's first byte, a finite.h kind; a spec's regions are sorted, do not overlap, and lie within its size. */
typedef struct {
    int64_t off, len;
    int kind;
} fio_scan_region;

typedef struct {
    const char *path;
    int64_t size; /* -1: unknown, read to EOF */
    /* range 1: read bytes [offset, offset+size) of a file at least that long (size must be known);
     * range 0: the whole file, offset 0, and a known size must match the file's exactly */
    int64_t offset;
    int range;
    /* Fault injection for tests: `fault_count` reads touching bytes past `fault_after` fail with `fault_errno`.
     * `fault_after` is a position in the file, not in the range, like the offsets in error messages.
     * FIO_HOLD as fault_errno instead holds the worker before it opens the file, until fio_engine_release. */
    int fault_errno;
    int64_t fault_after;
    int fault_count;
    uint8_t *dest; /* optional: the file's (range's) bytes land here (size bytes, page-aligned, rounded up to 4096) */
    /* optional, with dest and a pread or O_DIRECT read: each region's non-finite count is added to scan_counts[r]
     * (nscan counters, zeroed by the caller), complete once the file is done without error */
    const fio_scan_region *scan;
    int nscan;
    uint64_t *scan_counts;
    /* with fio_options.beneath: where the part of `path` below that directory starts (0: opened by its path) */
    int rel_off;
} fio_file_spec;

typedef struct {
    int concurrency;
    int mode;
    size_t block_size;
    int64_t chunk_size;
    int alg;
    int multipart; /* per-chunk digests plus a digest of them (the S3 multipart ETag construction) */
    int nofollow;  /* open with O_NOFOLLOW: a listed file swapped for a symlink since the listing is not followed */
    /* 1: a spec with rel_off is opened below the directory beneath_fd (the engine keeps its own duplicate), one
     * component at a time, none followed when it is a symbolic link: a folder of the listing swapped for a link
     * since is not read through */
    int beneath;
    int beneath_fd;
} fio_options;

typedef struct {
    char *path;
    int64_t size;
    int64_t offset; /* units' offsets are relative to it: only the calls on the file add it */
    int range;
    int fault_errno;
    int64_t fault_after;
    int fault_count;
    uint8_t *dest;
    const fio_scan_region *scan;
    int nscan;
    uint64_t *scan_counts;
    int rel_off;
    int nunits;
    int remaining;
    int err;
    char msg[FIO_MSG_LEN];
    int64_t bytes;
    int retries;
    int64_t t_open_ns, t_end_ns;
    uint8_t *parts;    /* nunits digests of `dsize` bytes */
    int64_t *part_len; /* bytes each unit hashed, for crc32c combine */
    uint8_t digest[FIO_DIGEST_MAX];
    int digest_len; /* 0: no whole-file digest */
    uint8_t mp_digest[FIO_DIGEST_MAX];
    int mp_len;
} fio_file_state;

typedef struct {
    uint64_t bytes, files_done, files_failed, retries, reads;
    uint64_t units_done, units_total;
    int64_t files_total, bytes_planned;
    int active, parked, threads, target;
    int finished, cancelled;
    int64_t t_start_ns, t_first_open_ns, t_last_end_ns, now_ns;
    uint64_t hist[FIO_HIST_BUCKETS];
} fio_snapshot;

typedef struct fio_engine fio_engine;

/* Returns NULL and sets *err on failure to start (ENOMEM, EAGAIN from pthread_create). */
fio_engine *fio_engine_start(const fio_file_spec *files, int nfiles, const fio_options *opt, int *err);
void fio_engine_set_concurrency(fio_engine *e, int n);
void fio_engine_cancel(fio_engine *e);
void fio_engine_release(fio_engine *e); /* tests: lets workers held before a FIO_HOLD file go on */
/* 1 when every worker has exited (and then joins them), 0 on timeout. */
int fio_engine_wait(fio_engine *e, int timeout_ms);
void fio_engine_snapshot(fio_engine *e, fio_snapshot *s);
int fio_engine_nworkers(fio_engine *e);
/* Per-worker busy nanoseconds, bytes and state, for up to `n` workers; returns how many. */
int fio_engine_worker_stats(fio_engine *e, uint64_t *busy_ns, uint64_t *bytes, int *state, int n);
/* Destinations populated so far (MADV_POPULATE_WRITE before a read copies into them): the workers' CPU time in it, and
 * the bytes: the rate this box gave fresh memory at in this run, per core. */
void fio_engine_populated(fio_engine *e, uint64_t *cpu_ns, uint64_t *bytes);
const fio_file_state *fio_engine_file(fio_engine *e, int i);
/* While the run goes on: 1 when every unit of file i was read without error (its destination bytes are then
 * visible to the caller: the load pairs with the workers' release), -1 when it failed, 0 while units remain. */
int fio_engine_file_done(fio_engine *e, int i);
void fio_engine_free(fio_engine *e); /* cancels and waits if still running */
int64_t fio_now_ns(void);

#endif
