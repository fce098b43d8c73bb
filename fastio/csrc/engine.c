#define _GNU_SOURCE
#include "engine.h"
#include "finite.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define MAX_TRANSIENT 16 /* EINTR/EAGAIN retries of one call before it counts as a failure */
#define MAX_OPEN_RETRIES 6 /* EMFILE/ENFILE: other workers may close their fd soon */

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

typedef struct {
    int file;
    int index; /* chunk number within the file */
    int64_t off, len; /* len -1: to EOF */
} unit_t;

typedef struct {
    uint64_t bytes, busy_ns, reads;
    uint64_t pop_cpu_ns, pop_bytes; /* this thread's CPU time in populating destinations, and the bytes populated */
    uint64_t hist[FIO_HIST_BUCKETS];
    int state;
    int id;
    struct fio_engine *e;
} __attribute__((aligned(64))) worker_t;

struct fio_engine {
    fio_options opt;
    fio_file_state *files;
    int nfiles;
    unit_t *units;
    int nunits;
    int dsize;
    int next; /* next unclaimed unit */
    uint64_t units_done, files_done, files_failed, retries;
    int64_t bytes_planned;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t threads[FIO_MAX_THREADS];
    worker_t *workers;
    int nthreads, exited, target, cancel, joined;
    int64_t t_start, t_first_open, t_last_end;
    uint8_t *bufs; /* FIO_MAX_THREADS block slots of buf_stride bytes, or NULL: per-worker buffers */
    size_t buf_stride, bufs_len;
};

/* The calling thread's CPU time: what populating fresh memory cost it, whatever else ran on the cores (a thread
 * waiting for a core is not charged; a VM's host backing the guest's pages on first touch is, as the vCPU stalls) */
static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t fio_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void atomic_min64(int64_t *p, int64_t v)
{
    int64_t cur = LOAD(p);
    while ((cur == 0 || v < cur) && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static void atomic_max64(int64_t *p, int64_t v)
{
    int64_t cur = LOAD(p);
    while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* The first failure of a file wins; later ones (e.g. cancelled sibling chunks) are dropped. */
static void file_fail(fio_file_state *f, int err, const char *fmt, ...)
{
    int zero = 0;
    if (!__atomic_compare_exchange_n(&f->err, &zero, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
    __atomic_store_n(&f->err, err, __ATOMIC_RELEASE);
}

static int fault_hit(fio_file_state *f, int64_t pos, int64_t len)
{
    if (f->fault_errno <= 0 || pos + len <= f->fault_after)
        return 0;
    if (__atomic_sub_fetch(&f->fault_count, 1, __ATOMIC_RELAXED) < 0)
        return 0;
    errno = f->fault_errno;
    return 1;
}

static void record_read(worker_t *w, int64_t ns, int64_t n)
{
    uint64_t us = (uint64_t)(ns / 1000);
    int b = us == 0 ? 0 : 64 - __builtin_clzll(us);
    if (b >= FIO_HIST_BUCKETS)
        b = FIO_HIST_BUCKETS - 1;
    ADD(&w->hist[b], 1);
    ADD(&w->reads, 1);
    ADD(&w->bytes, (uint64_t)n);
}

static int transient(int err) { return err == EINTR || err == EAGAIN; }

static void note_retry(struct fio_engine *e, fio_file_state *f)
{
    ADD(&e->retries, 1);
    ADD(&f->retries, 1);
}

static void backoff(int attempt)
{
    struct timespec ts = {0, (long)(100000L << (attempt < 10 ? attempt : 10))};
    nanosleep(&ts, NULL);
}

static ssize_t pread_retry(struct fio_engine *e, fio_file_state *f, int fd, void *buf, size_t len, int64_t off)
{
    for (int attempt = 0;; attempt++) {
        ssize_t n = fault_hit(f, off, (int64_t)len) ? -1 : pread(fd, buf, len, off);
        if (n >= 0 || !transient(errno) || attempt >= MAX_TRANSIENT)
            return n;
        note_retry(e, f);
        if (errno == EAGAIN)
            backoff(attempt);
    }
}

/* Files of procfs, sysfs and their kin report a size of 0 or 4096 whatever they hold. */
static int pseudo_fs(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return 0;
    switch ((unsigned long)sf.f_type) {
    case 0x9fa0UL:     /* proc */
    case 0x62656572UL: /* sysfs */
    case 0x64626720UL: /* debugfs */
    case 0x74726163UL: /* tracefs */
    case 0x63677270UL: /* cgroup2 */
    case 0x27e0ebUL:   /* cgroup */
    case 0x73636673UL: /* securityfs */
    case 0x62656570UL: /* configfs */
        return 1;
    default:
        return 0;
    }
}

/* `rel` opened below the directory `dirfd` one component at a time, none followed when it is a symbolic link (ELOOP,
 * wherever it lies): a folder inside the checkpoint swapped for a link to /etc since the listing fails instead of
 * being read through; O_NOFOLLOW alone guards the last component only. openat2's RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS
 * says it in one call, but kernels before 5.6 and the container seccomp profiles of their time refuse it (ENOSYS,
 * EPERM); this walk needs openat alone. The listing's names are plain ("a/b": no "", "." or ".." part); the walk
 * refuses any other (EINVAL) rather than trust that. */
static int open_beneath(int dirfd, const char *rel, int flags)
{
    char part[NAME_MAX + 1];
    int at = dirfd;
    for (const char *p = rel;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        int fd = -1, err;
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) {
            err = EINVAL;
        } else if (n > NAME_MAX) {
            err = ENAMETOOLONG;
        } else {
            memcpy(part, p, n);
            part[n] = 0;
            /* O_PATH: a folder the caller may search but not list is walked as open(2) walks it */
            fd = openat(at, part, slash ? O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC : flags | O_NOFOLLOW);
            err = errno;
            struct stat st;
            if (fd < 0 && err == ENOTDIR && slash && fstatat(at, part, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISLNK(st.st_mode))
                err = ELOOP; /* O_PATH|O_NOFOLLOW takes a link as itself, and O_DIRECTORY then says ENOTDIR */
        }
        if (at != dirfd)
            close(at);
        if (fd < 0 || !slash) {
            errno = fd < 0 ? err : errno;
            return fd;
        }
        at = fd;
        p = slash + 1;
    }
}

static int open_retry(struct fio_engine *e, fio_file_state *f, int flags)
{
    for (int attempt = 0;; attempt++) {
        /* O_NONBLOCK: a FIFO or a device named in a listing must fail its type check, not hang the open */
        int how = flags | O_RDONLY | O_CLOEXEC | O_NONBLOCK | (e->opt.nofollow ? O_NOFOLLOW : 0);
        int fd = e->opt.beneath && f->rel_off > 0 ? open_beneath(e->opt.beneath_fd, f->path + f->rel_off, how)
                                                   : open(f->path, how);
        if (fd >= 0)
            return fd;
        int retryable = transient(errno) || errno == EMFILE || errno == ENFILE;
        if (!retryable || attempt >= MAX_OPEN_RETRIES)
            return -1;
        note_retry(e, f);
        if (errno != EINTR)
            backoff(attempt + 2);
    }
}

/* SIGBUS from a mapping whose file shrank: jump back to the worker instead of killing the process. */
static __thread sigjmp_buf *bus_jump;
static struct sigaction prev_bus;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    if (bus_jump)
        siglongjmp(*bus_jump, 1);
    if (prev_bus.sa_flags & SA_SIGINFO && prev_bus.sa_sigaction) {
        prev_bus.sa_sigaction(sig, si, ctx);
        return;
    }
    if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN) {
        prev_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
}

static void install_bus_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &prev_bus);
}

static int cancelled(struct fio_engine *e) { return LOAD(&e->cancel) != 0; }

/* The regions' units that [lo, hi) holds whole, counted now, while the block is in the CPU's caches; a unit cut by
 * the block's start is counted here too when all of it lies in this read unit (from `first`: landed by this worker)
 * and ends in this block, and by finalize_file when a read unit's edge cuts it (another worker's bytes, maybe not
 * landed yet). So each is counted once, short reads included (a block of a few bytes cuts a value at both ends). */
static void scan_block(fio_file_state *f, int64_t first, int64_t lo, int64_t hi)
{
    int a = 0, b = f->nscan;
    while (a < b) { /* the first region that ends past lo */
        int m = (a + b) / 2;
        if (f->scan[m].off + f->scan[m].len <= lo)
            a = m + 1;
        else
            b = m;
    }
    for (int r = a; r < f->nscan && f->scan[r].off < hi; r++) {
        const fio_scan_region *g = &f->scan[r];
        int64_t unit = (int64_t)fio_finite_unit_size(g->kind);
        int64_t x = lo > g->off ? lo : g->off, y = hi < g->off + g->len ? hi : g->off + g->len;
        int64_t cut = g->off + (x - g->off) / unit * unit; /* the unit x falls in */
        x = cut < x ? cut + unit : x;
        y = g->off + (y - g->off) / unit * unit;
        uint64_t n = y > x ? fio_finite_count(f->dest + x, (size_t)(y - x), g->kind) : 0;
        if (cut < lo && cut >= g->off && cut >= first && cut + unit <= hi)
            n += fio_finite_count(f->dest + cut, (size_t)unit, g->kind);
        if (n)
            __atomic_add_fetch(&f->scan_counts[r], n, __ATOMIC_RELAXED);
    }
}

/* Every byte has landed: the units a unit boundary cut (the scan_block of neither side counted them). Walked
 * region by region over the edges inside each: regions do not overlap, so this is regions + units steps (edges times
 * regions was seconds per file for a header of many tiny tensors). */
static void scan_unit_edges(struct fio_engine *e, fio_file_state *f)
{
    int64_t cs = e->opt.chunk_size;
    if (f->nunits < 2)
        return; /* one unit: no edges */
    for (int r = 0; r < f->nscan; r++) {
        const fio_scan_region *g = &f->scan[r];
        int64_t unit = (int64_t)fio_finite_unit_size(g->kind);
        for (int64_t edge = (g->off / cs + 1) * cs; edge < g->off + g->len; edge += cs) {
            if ((edge - g->off) % unit == 0)
                continue;
            int64_t cut = g->off + (edge - g->off) / unit * unit;
            f->scan_counts[r] += fio_finite_count(f->dest + cut, (size_t)unit, g->kind);
        }
    }
}

/* Reads [off, off+len) of the file's range (len -1: to EOF) with pread or O_DIRECT into buf; returns bytes or
 * -1 with f failed. Offsets in messages are the file's, the ones a user can check with dd. */
static int64_t read_unit_pread(worker_t *w, fio_file_state *f, int fd, uint8_t *buf, int64_t off, int64_t len,
                               fio_digest *d)
{
    struct fio_engine *e = w->e;
    int direct = e->opt.mode == FIO_MODE_DIRECT;
    size_t bs = e->opt.block_size;
    int64_t base = f->offset + off; /* where the unit starts in the file */
    int64_t done = 0;
    while (len < 0 || done < len) {
        if (cancelled(e)) {
            file_fail(f, ECANCELED, "cancelled");
            return -1;
        }
        size_t want = bs;
        if (len >= 0 && (int64_t)want > len - done)
            want = (size_t)(len - done);
        size_t ask = direct ? (want + ALIGN - 1) & ~(size_t)(ALIGN - 1) : want;
        /* with a destination the bytes go straight to the caller's memory: no second copy */
        uint8_t *target = f->dest ? f->dest + off + done : buf;
        int64_t t0 = fio_now_ns();
        ssize_t n = pread_retry(e, f, fd, target, ask, base + done);
        int64_t t1 = fio_now_ns();
        if (n < 0) {
            int err = errno;
            if (direct && err == EINVAL)
                file_fail(f, err, "O_DIRECT read refused at offset %lld (filesystem without direct I/O? use pread)",
                          (long long)(base + done));
            else
                file_fail(f, err, "read at offset %lld: %s", (long long)(base + done), strerror(err));
            return -1;
        }
        if (n == 0) {
            if (len < 0)
                break;
            file_fail(f, ENODATA, "file shrank: ended at %lld bytes, expected %lld (changed since it was listed)",
                      (long long)(base + done), (long long)(f->offset + f->size));
            return -1;
        }
        if ((size_t)n > want && len >= 0)
            n = (ssize_t)want; /* O_DIRECT rounds the request up; the tail beyond the unit is not ours */
        record_read(w, t1 - t0, n);
        ADD(&f->bytes, n);
        fio_digest_update(d, target, (size_t)n);
        if (f->nscan)
            scan_block(f, off, off + done, off + done + n);
        done += n;
        if (direct && (n & (ALIGN - 1)) && (len < 0 || done < len)) {
            /* a short O_DIRECT read that is not at EOF leaves the next offset unaligned: confirm EOF */
            if (len >= 0) {
                file_fail(f, ENODATA, "file shrank: ended at %lld bytes, expected %lld", (long long)(base + done),
                          (long long)(f->offset + f->size));
                return -1;
            }
            break;
        }
    }
    return done;
}

/* The unit is mapped once and walked in block-sized windows: each window is faulted in with one
 * MADV_POPULATE_READ, consumed, then dropped from the page tables with MADV_DONTNEED, so resident memory
 * stays one block per worker. Mapping per window instead cost an mmap and a munmap per block, and both take
 * the process's memory-map lock for writing, which stalls every other worker's page faults.
 * mmap takes only page-aligned file offsets: a range that starts mid-page is mapped from the page before and
 * its first `head` bytes skipped, so every madvise below works on the whole pages around a window. */
static int64_t read_unit_mmap(worker_t *w, fio_file_state *f, int fd, int64_t off, int64_t len, fio_digest *d)
{
    struct fio_engine *e = w->e;
    static long page;
    if (!page)
        page = sysconf(_SC_PAGESIZE);
    if (len <= 0)
        return 0;
    size_t pmask = (size_t)page - 1;
    int64_t base = f->offset + off; /* where the unit starts in the file */
    size_t head = (size_t)base & pmask;
    size_t win = (e->opt.block_size + pmask) & ~pmask;
    size_t maplen = (head + (size_t)len + pmask) & ~pmask;
    uint8_t *m = MAP_FAILED;
    for (int attempt = 0;; attempt++) {
        m = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, base - (int64_t)head);
        if (m != MAP_FAILED || !transient(errno) || attempt >= MAX_TRANSIENT)
            break;
        note_retry(e, f);
        if (errno == EAGAIN)
            backoff(attempt);
    }
    if (m == MAP_FAILED) {
        int err = errno;
        file_fail(f, err, "mmap at offset %lld: %s", (long long)base, strerror(err));
        return -1;
    }
    /* page faults on a mapping read around the faulting page; sequential advice makes them read ahead */
    madvise(m, maplen, MADV_SEQUENTIAL);
    sigjmp_buf jb;
    volatile int64_t done = 0;
    if (sigsetjmp(jb, 1)) {
        bus_jump = NULL;
        munmap(m, maplen);
        file_fail(f, ENODATA, "file shrank while mapped (SIGBUS at offset %lld)", (long long)(base + done));
        return -1;
    }
    while (done < len) {
        if (cancelled(e)) {
            munmap(m, maplen);
            file_fail(f, ECANCELED, "cancelled");
            return -1;
        }
        size_t n = win;
        if ((int64_t)n > len - done)
            n = (size_t)(len - done);
        uint8_t *p = m + head + done;
        uint8_t *pg = m + ((head + (size_t)done) & ~pmask); /* the window's first page */
        size_t span = ((size_t)(p + n - pg) + pmask) & ~pmask;
        int64_t t0 = fio_now_ns();
        int populated = 0;
        for (int attempt = 0;; attempt++) {
            int rc = fault_hit(f, base + done, (int64_t)n) ? -1 : madvise(pg, span, MADV_POPULATE_READ);
            if (rc == 0) {
                populated = 1;
                break;
            }
            if (errno == EINVAL || errno == ENOSYS)
                break; /* a kernel before 5.14: the pages fault in as they are touched below */
            if (errno == EFAULT)
                break; /* past the end of a file that shrank: touching it raises SIGBUS, reported below */
            if (!transient(errno) || attempt >= MAX_TRANSIENT) {
                int err = errno;
                munmap(m, maplen);
                file_fail(f, err, "mmap read at offset %lld: %s", (long long)(base + done), strerror(err));
                return -1;
            }
            note_retry(e, f);
            if (errno == EAGAIN)
                backoff(attempt);
        }
        bus_jump = &jb;
        if (f->dest) {
            memcpy(f->dest + off + done, p, n);
            fio_digest_update(d, f->dest + off + done, n);
        } else if (d->alg != FIO_H_NONE) {
            fio_digest_update(d, p, n);
        } else if (!populated) {
            /* touch every page so "read" means the bytes were brought in */
            volatile uint8_t sink = 0;
            for (size_t i = 0; i < span; i += (size_t)page)
                sink ^= ((volatile uint8_t *)pg)[i];
            (void)sink;
        }
        bus_jump = NULL;
        madvise(pg, span, MADV_DONTNEED);
        record_read(w, fio_now_ns() - t0, (int64_t)n);
        ADD(&f->bytes, (int64_t)n);
        done += (int64_t)n;
    }
    munmap(m, maplen);
    return done;
}

static void finalize_file(struct fio_engine *e, fio_file_state *f)
{
    if (f->nscan && __atomic_load_n(&f->err, __ATOMIC_ACQUIRE) == 0)
        scan_unit_edges(e, f);
    if (__atomic_load_n(&f->err, __ATOMIC_ACQUIRE) == 0 && e->opt.alg != FIO_H_NONE) {
        int ds = e->dsize;
        if (f->nunits == 1) {
            memcpy(f->digest, f->parts, (size_t)ds);
            f->digest_len = ds;
        } else if (e->opt.alg == FIO_H_CRC32C) {
            uint32_t crc = 0;
            for (int i = 0; i < f->nunits; i++) {
                const uint8_t *p = f->parts + (size_t)i * 4;
                uint32_t c = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
                crc = i == 0 ? c : fio_crc32c_combine(crc, c, (uint64_t)f->part_len[i]);
            }
            for (int k = 0; k < 4; k++)
                f->digest[k] = (uint8_t)(crc >> (24 - 8 * k));
            f->digest_len = 4;
        }
        if (e->opt.multipart)
            f->mp_len = (int)fio_digest_oneshot(e->opt.alg, f->parts, (size_t)f->nunits * (size_t)ds, f->mp_digest);
    }
    if (__atomic_load_n(&f->err, __ATOMIC_ACQUIRE))
        ADD(&e->files_failed, 1);
    else
        ADD(&e->files_done, 1);
}

static void process_unit(worker_t *w, const unit_t *u, uint8_t *buf)
{
    struct fio_engine *e = w->e;
    fio_file_state *f = &e->files[u->file];
    int64_t t0 = fio_now_ns();
    if (!__atomic_load_n(&f->err, __ATOMIC_ACQUIRE)) {
        atomic_min64(&f->t_open_ns, t0);
        atomic_min64(&e->t_first_open, t0);
        while (f->fault_errno == FIO_HOLD && LOAD(&f->fault_count) > 0 && !cancelled(e)) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        int fd = open_retry(e, f, e->opt.mode == FIO_MODE_DIRECT ? O_DIRECT : 0);
        struct stat st;
        if (fd < 0) {
            int err = errno;
            struct stat pst;
            if (e->opt.mode == FIO_MODE_DIRECT && err == EINVAL && stat(f->path, &pst) == 0 && S_ISDIR(pst.st_mode))
                file_fail(f, EISDIR, "is a directory, not a file"); /* Linux refuses O_DIRECT on a directory with EINVAL */
            else if (e->opt.mode == FIO_MODE_DIRECT && err == EINVAL)
                file_fail(f, err, "open with O_DIRECT refused (filesystem without direct I/O? use pread)");
            else if (e->opt.nofollow && err == ELOOP)
                file_fail(f, err, "is, or lies under, a symbolic link (swapped in since it was listed?): never "
                                  "followed");
            else
                file_fail(f, err, "open: %s", strerror(err));
        } else if (fstat(fd, &st) != 0) {
            file_fail(f, errno, "stat: %s", strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            file_fail(f, EISDIR, "is a directory, not a file");
        } else if (!S_ISREG(st.st_mode)) {
            file_fail(f, EINVAL, "not a regular file");
        } else if (pseudo_fs(fd)) {
            file_fail(f, EINVAL, "a pseudo-file (procfs, sysfs, ...): its size is not real, nothing to measure");
        } else if (f->range && st.st_size - f->size < f->offset) { /* no overflow: both sizes are >= 0 */
            file_fail(f, ENODATA, "file is %lld bytes, shorter than the range %lld+%lld (changed since it was listed)",
                      (long long)st.st_size, (long long)f->offset, (long long)f->size);
        } else if (!f->range && f->size >= 0 && st.st_size != f->size) {
            file_fail(f, ENODATA, "file is %lld bytes, expected %lld (changed since it was listed)",
                      (long long)st.st_size, (long long)f->size);
        } else {
            fio_digest d;
            int rc = fio_digest_init(&d, e->opt.alg);
            if (rc) {
                file_fail(f, rc, "hash state: %s", strerror(rc));
            } else {
                int64_t len = u->len;
                if (e->opt.mode == FIO_MODE_MMAP && len < 0)
                    len = st.st_size - u->off;
                if (e->opt.mode != FIO_MODE_DIRECT) /* doubles the kernel's read-ahead window for cold reads */
                    posix_fadvise(fd, f->offset + u->off, len < 0 ? 0 : len, POSIX_FADV_SEQUENTIAL);
                /* pread: one batched fault-in of this chunk's destination beats a fault per page in the copy (hot:
                 * 1.4x). O_DIRECT: none; the kernel pins the pages for the device itself, and populating first ran
                 * 1.12-1.20x slower cold at every concurrency of 4, 8, 16 (1 GiB, 2-core VM, alternated runs) */
                if (f->dest && len > 0 && e->opt.mode != FIO_MODE_DIRECT) {
                    size_t span = (size_t)((len + ALIGN - 1) & ~(int64_t)(ALIGN - 1));
                    int64_t c0 = thread_cpu_ns();
                    /* counted only when the kernel did it: an older one refuses (EINVAL) at once, and the copy
                     * faults the pages in instead, which is not told apart from the copy */
                    if (madvise(f->dest + u->off, span, MADV_POPULATE_WRITE) == 0) {
                        ADD(&w->pop_cpu_ns, (uint64_t)(thread_cpu_ns() - c0));
                        ADD(&w->pop_bytes, (uint64_t)span);
                    }
                }
                int64_t got = e->opt.mode == FIO_MODE_MMAP ? read_unit_mmap(w, f, fd, u->off, len, &d)
                                                            : read_unit_pread(w, f, fd, buf, u->off, len, &d);
                if (got >= 0) {
                    f->part_len[u->index] = got;
                    if (e->dsize)
                        fio_digest_final(&d, f->parts + (size_t)u->index * (size_t)e->dsize);
                }
                fio_digest_free(&d);
            }
        }
        if (fd >= 0)
            close(fd);
    }
    int64_t t1 = fio_now_ns();
    atomic_max64(&f->t_end_ns, t1);
    atomic_max64(&e->t_last_end, t1);
    ADD(&w->busy_ns, (uint64_t)(t1 - t0));
    ADD(&e->units_done, 1);
    /* remaining starts one over the units: the last unit's worker finalizes, and only then is the file done, so a
     * caller that sees it done reads final scan counts (the chunk edges' units are added by finalize_file) */
    if (__atomic_sub_fetch(&f->remaining, 1, __ATOMIC_ACQ_REL) == 1) {
        finalize_file(e, f);
        __atomic_store_n(&f->remaining, 0, __ATOMIC_RELEASE);
    }
}

/* Block buffers: one slot per possible worker in a single 2 MiB-aligned mapping on transparent huge pages.
 * A block read into scattered 4 KiB pages needs one DMA segment per page; past the device's max_segments
 * (254 on virtio-blk) the kernel splits each 1 MiB O_DIRECT read in two, which cost half of cold direct
 * throughput. Slots are packed (two 1 MiB buffers share a huge page), so resident memory stays
 * concurrency x block size; the mapping is reserved, and only the slots workers touch become resident. */
#define HUGE_SZ ((size_t)2 << 20)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

static void alloc_block_buffers(struct fio_engine *e)
{
    e->buf_stride = round_up(e->opt.block_size, ALIGN);
    if (e->buf_stride > (SIZE_MAX / 2) / FIO_MAX_THREADS)
        return; /* absurd block size: per-worker buffers */
    size_t n = round_up(e->buf_stride * FIO_MAX_THREADS, HUGE_SZ);
    uint8_t *m = mmap(NULL, n + HUGE_SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return; /* strict overcommit refuses the reservation: per-worker buffers */
    uint8_t *p = (uint8_t *)round_up((uintptr_t)m, HUGE_SZ);
    if (p > m)
        munmap(m, (size_t)(p - m));
    munmap(p + n, (size_t)(m + HUGE_SZ - p));
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP the slots are still aligned and usable */
#endif
    e->bufs = p;
    e->bufs_len = n;
}

static uint8_t *worker_buffer(worker_t *w)
{
    struct fio_engine *e = w->e;
    if (e->opt.mode == FIO_MODE_MMAP)
        return NULL;
    if (e->bufs)
        return e->bufs + (size_t)w->id * e->buf_stride;
    void *p = NULL;
    return posix_memalign(&p, ALIGN, e->opt.block_size + ALIGN) == 0 ? p : NULL;
}

static void release_worker_buffer(worker_t *w, uint8_t *buf)
{
    if (!buf)
        return;
    if (w->e->bufs) /* give the slot's memory back now; the mapping goes with the engine */
        madvise(buf, w->e->buf_stride, MADV_DONTNEED);
    else
        free(buf);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    struct fio_engine *e = w->e;
    uint8_t *buf = worker_buffer(w);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (w->id >= e->target && !e->cancel && LOAD(&e->next) < e->nunits) {
            STORE(&w->state, FIO_W_PARKED);
            pthread_cond_wait(&e->cv, &e->mu);
        }
        STORE(&w->state, FIO_W_ACTIVE);
        int stop = e->cancel;
        pthread_mutex_unlock(&e->mu);
        if (stop || (e->opt.mode != FIO_MODE_MMAP && !buf))
            break;
        int u = ADD(&e->next, 1);
        if (u >= e->nunits)
            break;
        process_unit(w, &e->units[u], buf);
    }
    release_worker_buffer(w, buf);
    pthread_mutex_lock(&e->mu);
    STORE(&w->state, FIO_W_EXITED);
    e->exited++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Caller holds e->mu. */
static int spawn_upto(struct fio_engine *e, int n)
{
    while (e->nthreads < n && e->nthreads < FIO_MAX_THREADS && !e->cancel && LOAD(&e->next) < e->nunits) {
        worker_t *w = &e->workers[e->nthreads];
        w->id = e->nthreads;
        w->e = e;
        int rc = pthread_create(&e->threads[e->nthreads], NULL, worker_main, w);
        if (rc)
            return rc;
        e->nthreads++;
    }
    return 0;
}

static int build_plan(struct fio_engine *e, const fio_file_spec *specs)
{
    int split = e->opt.alg == FIO_H_NONE || e->opt.alg == FIO_H_CRC32C || e->opt.multipart;
    int64_t cs = e->opt.chunk_size;
    int64_t total = 0;
    for (int i = 0; i < e->nfiles; i++) {
        const fio_file_spec *s = &specs[i];
        if (s->range && (s->size < 0 || s->offset < 0 || s->offset > INT64_MAX - s->size))
            return EINVAL; /* a range names its length, and its end must be a file offset */
        if (!s->range && s->offset != 0)
            return EINVAL;
        if (e->opt.mode == FIO_MODE_DIRECT && s->offset % ALIGN)
            return EINVAL; /* O_DIRECT reads start on 4096-byte boundaries of the file */
        int64_t sz = s->size;
        int64_t n = (split && sz > 0 && cs > 0) ? (sz + cs - 1) / cs : 1;
        if (n > 1 << 20)
            return EINVAL;
        total += n;
    }
    if (total > (1LL << 30))
        return EINVAL;
    e->nunits = (int)total;
    e->units = calloc((size_t)total + 1, sizeof(unit_t));
    if (!e->units)
        return ENOMEM;
    int k = 0;
    for (int i = 0; i < e->nfiles; i++) {
        fio_file_state *f = &e->files[i];
        const fio_file_spec *s = &specs[i];
        f->path = strdup(s->path);
        if (!f->path)
            return ENOMEM;
        f->rel_off = e->opt.beneath && s->rel_off > 0 && (size_t)s->rel_off < strlen(s->path) ? s->rel_off : 0;
        f->size = s->size;
        f->offset = s->offset;
        f->range = s->range;
        f->fault_errno = s->fault_errno;
        f->fault_after = s->fault_after;
        f->fault_count = s->fault_count;
        f->dest = s->size >= 0 ? s->dest : NULL;
        if (f->dest && s->nscan > 0 && s->scan && s->scan_counts && e->opt.mode != FIO_MODE_MMAP) {
            for (int r = 0; r < s->nscan; r++) { /* hostile headers were checked above us; the engine checks again */
                const fio_scan_region *g = &s->scan[r];
                int64_t unit = (int64_t)fio_finite_unit_size(g->kind);
                if (!unit || g->off < 0 || g->len <= 0 || g->len % unit || g->off > s->size - g->len ||
                    (r > 0 && g->off < s->scan[r - 1].off + s->scan[r - 1].len))
                    return EINVAL;
            }
            f->scan = s->scan;
            f->nscan = s->nscan;
            f->scan_counts = s->scan_counts;
        }
        int64_t n = (split && s->size > 0 && cs > 0) ? (s->size + cs - 1) / cs : 1;
        f->nunits = (int)n;
        f->remaining = (int)n + 1; /* see process_unit */
        f->parts = calloc((size_t)n, (size_t)(e->dsize ? e->dsize : 1));
        f->part_len = calloc((size_t)n, sizeof(int64_t));
        if (!f->parts || !f->part_len)
            return ENOMEM;
        if (s->size > 0)
            e->bytes_planned += s->size;
        for (int64_t c = 0; c < n; c++, k++) {
            e->units[k].file = i;
            e->units[k].index = (int)c;
            e->units[k].off = n == 1 ? 0 : c * cs;
            if (s->size < 0)
                e->units[k].len = -1;
            else if (n == 1)
                e->units[k].len = s->size;
            else
                e->units[k].len = (c == n - 1) ? s->size - c * cs : cs;
        }
    }
    return 0;
}

fio_engine *fio_engine_start(const fio_file_spec *files, int nfiles, const fio_options *opt, int *err)
{
    *err = 0;
    if (opt->block_size == 0 || opt->concurrency < 1 || nfiles < 0 ||
        (opt->mode == FIO_MODE_DIRECT && (opt->block_size % ALIGN || opt->chunk_size % ALIGN)) ||
        (opt->chunk_size > 0 && opt->chunk_size % ALIGN)) {
        *err = EINVAL;
        return NULL;
    }
    if ((opt->alg == FIO_H_MD5 || opt->alg == FIO_H_SHA256) && !fio_crypto_loaded()) {
        *err = ENOSYS;
        return NULL;
    }
    pthread_once(&bus_once, install_bus_handler);
    struct fio_engine *e = calloc(1, sizeof *e);
    if (!e) {
        *err = ENOMEM;
        return NULL;
    }
    e->opt = *opt;
    if (opt->beneath) { /* our own descriptor: the caller may close its one as soon as this returns */
        e->opt.beneath_fd = fcntl(opt->beneath_fd, F_DUPFD_CLOEXEC, 3);
        if (e->opt.beneath_fd < 0) {
            *err = errno;
            free(e);
            return NULL;
        }
    }
    e->nfiles = nfiles;
    e->dsize = fio_digest_size(opt->alg);
    e->files = calloc((size_t)nfiles + 1, sizeof(fio_file_state));
    if (posix_memalign((void **)&e->workers, 64, sizeof(worker_t) * FIO_MAX_THREADS) == 0)
        memset(e->workers, 0, sizeof(worker_t) * FIO_MAX_THREADS);
    else
        e->workers = NULL;
    int rc = (!e->files || !e->workers) ? ENOMEM : build_plan(e, files);
    if (!rc && opt->mode != FIO_MODE_MMAP)
        alloc_block_buffers(e);
    if (rc) {
        e->joined = 1;
        fio_engine_free(e);
        *err = rc;
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->t_start = fio_now_ns();
    e->target = opt->concurrency > FIO_MAX_THREADS ? FIO_MAX_THREADS : opt->concurrency;
    pthread_mutex_lock(&e->mu);
    rc = spawn_upto(e, e->target);
    if (rc && e->nthreads == 0) {
        pthread_mutex_unlock(&e->mu);
        e->joined = 1;
        fio_engine_free(e);
        *err = rc;
        return NULL;
    }
    pthread_mutex_unlock(&e->mu);
    return e;
}

void fio_engine_set_concurrency(fio_engine *e, int n)
{
    if (n < 1)
        n = 1;
    if (n > FIO_MAX_THREADS)
        n = FIO_MAX_THREADS;
    pthread_mutex_lock(&e->mu);
    e->target = n;
    if (!e->joined)
        spawn_upto(e, n);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void fio_engine_release(fio_engine *e)
{
    for (int i = 0; i < e->nfiles; i++)
        if (e->files[i].fault_errno == FIO_HOLD)
            STORE(&e->files[i].fault_count, 0);
}

void fio_engine_cancel(fio_engine *e)
{
    pthread_mutex_lock(&e->mu);
    STORE(&e->cancel, 1);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int fio_engine_wait(fio_engine *e, int timeout_ms)
{
    pthread_mutex_lock(&e->mu);
    if (e->joined) {
        pthread_mutex_unlock(&e->mu);
        return 1;
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    while (e->exited < e->nthreads) {
        if (timeout_ms < 0)
            pthread_cond_wait(&e->cv, &e->mu);
        else if (pthread_cond_timedwait(&e->cv, &e->mu, &dl) == ETIMEDOUT && e->exited < e->nthreads) {
            pthread_mutex_unlock(&e->mu);
            return 0;
        }
    }
    e->joined = 1; /* from here set_concurrency spawns nothing */
    int n = e->nthreads;
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++)
        pthread_join(e->threads[i], NULL);
    /* units never claimed (cancel) leave their files unfinished: close them out as cancelled */
    for (int i = 0; i < e->nfiles; i++) {
        fio_file_state *f = &e->files[i];
        if (f->remaining > 0) {
            file_fail(f, ECANCELED, "cancelled before it was read");
            f->remaining = 0;
            ADD(&e->files_failed, 1);
        }
    }
    return 1;
}

void fio_engine_snapshot(fio_engine *e, fio_snapshot *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_lock(&e->mu);
    s->threads = e->nthreads;
    s->target = e->target;
    s->finished = e->joined || (e->exited == e->nthreads && (e->nthreads > 0 || e->nunits == 0));
    s->cancelled = e->cancel;
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < s->threads; i++) {
        worker_t *w = &e->workers[i];
        s->bytes += LOAD(&w->bytes);
        s->reads += LOAD(&w->reads);
        for (int b = 0; b < FIO_HIST_BUCKETS; b++)
            s->hist[b] += LOAD(&w->hist[b]);
        int st = LOAD(&w->state);
        s->active += st == FIO_W_ACTIVE;
        s->parked += st == FIO_W_PARKED;
    }
    s->files_done = LOAD(&e->files_done);
    s->files_failed = LOAD(&e->files_failed);
    s->retries = LOAD(&e->retries);
    s->units_done = LOAD(&e->units_done);
    s->units_total = (uint64_t)e->nunits;
    s->files_total = e->nfiles;
    s->bytes_planned = e->bytes_planned;
    s->t_start_ns = e->t_start;
    s->t_first_open_ns = LOAD(&e->t_first_open);
    s->t_last_end_ns = LOAD(&e->t_last_end);
    s->now_ns = fio_now_ns();
}

int fio_engine_nworkers(fio_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int n = e->nthreads;
    pthread_mutex_unlock(&e->mu);
    return n;
}

int fio_engine_worker_stats(fio_engine *e, uint64_t *busy_ns, uint64_t *bytes, int *state, int n)
{
    int k = fio_engine_nworkers(e);
    if (k > n)
        k = n;
    for (int i = 0; i < k; i++) {
        busy_ns[i] = LOAD(&e->workers[i].busy_ns);
        bytes[i] = LOAD(&e->workers[i].bytes);
        state[i] = LOAD(&e->workers[i].state);
    }
    return k;
}

void fio_engine_populated(fio_engine *e, uint64_t *cpu_ns, uint64_t *bytes)
{
    *cpu_ns = *bytes = 0;
    for (int i = 0, k = fio_engine_nworkers(e); i < k; i++) {
        *cpu_ns += LOAD(&e->workers[i].pop_cpu_ns);
        *bytes += LOAD(&e->workers[i].pop_bytes);
    }
}

int fio_engine_file_done(fio_engine *e, int i)
{
    fio_file_state *f = &e->files[i];
    if (__atomic_load_n(&f->remaining, __ATOMIC_ACQUIRE) > 0)
        return 0;
    return __atomic_load_n(&f->err, __ATOMIC_RELAXED) ? -1 : 1;
}

const fio_file_state *fio_engine_file(fio_engine *e, int i)
{
    return (i >= 0 && i < e->nfiles) ? &e->files[i] : NULL;
}

void fio_engine_free(fio_engine *e)
{
    if (!e)
        return;
    if (!e->joined) {
        fio_engine_cancel(e);
        fio_engine_wait(e, -1);
    }
    if (e->files) {
        for (int i = 0; i < e->nfiles; i++) {
            free(e->files[i].path);
            free(e->files[i].parts);
            free(e->files[i].part_len);
        }
    }
    free(e->files);
    free(e->units);
    free(e->workers);
    if (e->bufs)
        munmap(e->bufs, e->bufs_len);
    if (e->opt.beneath && e->opt.beneath_fd >= 0)
        close(e->opt.beneath_fd);
    if (e->nthreads || e->t_start) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
    }
    free(e);
}
