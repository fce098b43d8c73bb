"""The C loops the floor's figures are held against in the peers bench (_floor_agree): plain code, no ckptbench, each
built where it runs with the box's own compiler."""

from __future__ import annotations

import os
import shutil
import subprocess

from _harness import log

POP_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static char *base;
static size_t part;
static int touch;
static pthread_barrier_t gate;
static void *work(void *arg) {
    volatile char *p = base + (size_t)arg * part;
    pthread_barrier_wait(&gate);
    if (!touch) {
        if (madvise((void *)p, part, MADV_POPULATE_WRITE)) { perror("madvise"); exit(3); }
    } else {
        for (size_t o = 0; o < part; o += 4096) p[o] = 1;
    }
    return NULL;
}
int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: pop BYTES THREADS HUGE(0|1|2 none) populate|touch REPEATS\n"); return 2; }
    size_t size = strtoull(argv[1], NULL, 10);
    long threads = atol(argv[2]), pg = sysconf(_SC_PAGESIZE);
    if (threads < 1 || threads > 256) { fprintf(stderr, "pop: THREADS 1..256\n"); return 2; }
    int huge = atoi(argv[3]), repeats = atoi(argv[5]);
    touch = strcmp(argv[4], "touch") == 0;
    part = size / threads / pg * pg;
    pthread_t t[256];
    /* every sample in memory nobody freed a moment before, as the floor measures: held until the end */
    for (int r = 0; r < repeats; r++) {
        base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) { perror("mmap"); return 3; }
        if (huge < 2) madvise(base, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        /* the threads are started before the clock, as the floor's (ceilings.parallel): a thread's start maps its
           stack, which waits for the memory-map lock a populating sibling holds, and threads started on the clock
           ran partly one after another */
        struct timespec a, b;
        pthread_barrier_init(&gate, NULL, threads + 1);
        for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, (void *)i);
        pthread_barrier_wait(&gate);
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < threads; i++) pthread_join(t[i], NULL);
        clock_gettime(CLOCK_MONOTONIC, &b);
        pthread_barrier_destroy(&gate);
        printf("%.0f\n", threads * part / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9));
    }
    return 0;
}
"""

# Files landed in fresh pages, every file into an anonymous mapping of its own, THREADS workers taking 64 MiB units in
# order, 1 MiB reads. `direct`: O_DIRECT, never populated first (the kernel faults the pages in for the device), the
# floor's storage-into-fresh-memory check; `populate`: pread through the page cache, each unit populated with one
# MADV_POPULATE_WRITE first (as fastio does), the peers bench's plain C loop row. Prints bytes/s, bytes and
# a sum of the landed bytes (word_sum) for the bench to check.
LAND_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define UNIT (64L << 20)
#define BLOCK (1L << 20)
static int nfiles, fds[256];
static long sizes[256], units[256], total_units, next_unit;
static char *dest[256];
static int populate;
static void *work(void *arg) {
    (void)arg;
    for (;;) {
        long u = __atomic_fetch_add(&next_unit, 1, __ATOMIC_RELAXED), f = 0;
        if (u >= total_units) return NULL;
        while (u >= units[f]) u -= units[f++];
        long off = u * UNIT, end = off + UNIT < sizes[f] ? off + UNIT : sizes[f];
        if (populate && madvise(dest[f] + off, (end - off + 4095) & ~4095L, MADV_POPULATE_WRITE)) {
            perror("madvise"); exit(3);
        }
        for (long o = off; o < end; o += BLOCK) {
            long n = end - o < BLOCK ? end - o : BLOCK;
            if (pread(fds[f], dest[f] + o, (n + 4095) & ~4095L, o) < n) { perror("pread"); exit(3); }
        }
    }
}
int main(int argc, char **argv) {
    if (argc < 4 || argc - 3 > 256) { fprintf(stderr, "usage: land THREADS direct|populate FILE...\n"); return 2; }
    int threads = atoi(argv[1]);
    populate = strcmp(argv[2], "populate") == 0;
    nfiles = argc - 3;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        fds[i] = open(argv[i + 3], O_RDONLY | (populate ? 0 : O_DIRECT));
        if (fds[i] < 0 || fstat(fds[i], &st)) { perror(argv[i + 3]); return 3; }
        sizes[i] = st.st_size;
        units[i] = (sizes[i] + UNIT - 1) / UNIT;
        total_units += units[i];
        dest[i] = mmap(NULL, (sizes[i] + 4095) & ~4095L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (dest[i] == MAP_FAILED) { perror("mmap"); return 3; }
    }
    pthread_t t[256];
    for (long i = 0; i < threads && i < 256; i++) pthread_create(&t[i], NULL, work, NULL);
    for (long i = 0; i < threads && i < 256; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long bytes = 0;
    unsigned long long sum = 0; /* after the clock: the landed bytes as 64-bit words, wrapping, the tail zero-padded */
    for (int i = 0; i < nfiles; i++) {
        bytes += sizes[i];
        for (long w = 0; w < (sizes[i] + 7) / 8; w++) sum += ((unsigned long long *)dest[i])[w];
    }
    printf("%.0f %ld %llu\n", bytes / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9), bytes, sum);
    return 0;
}
"""


# The page cache copied out with pread into memory populated already: the first BYTES of the files (whole MiB) read
# in once untimed, the destination populated untimed, then THREADS workers each pread their contiguous share of
# 8 MiB pieces, REPEATS times, each repeat's rate printed.
HOT_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PIECE (8L << 20)
static int pfd[4096];
static long poff[4096], plen[4096], pdst[4096], npieces, share;
static char *dst;
static pthread_barrier_t gate;
static int gated;
static void *work(void *arg) {
    long first = (long)arg * share, last = first + share < npieces ? first + share : npieces;
    if (gated) pthread_barrier_wait(&gate);
    for (long i = first; i < last; i++)
        for (long done = 0; done < plen[i];) {
            ssize_t n = pread(pfd[i], dst + pdst[i] + done, plen[i] - done, poff[i] + done);
            if (n <= 0) { perror("pread"); exit(3); }
            done += n;
        }
    return NULL;
}
int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: hot THREADS BYTES REPEATS FILE...\n"); return 2; }
    long threads = atol(argv[1]), want = atol(argv[2]), repeats = atol(argv[3]), total = 0;
    if (threads < 1 || threads > 256) { fprintf(stderr, "hot: THREADS 1..256\n"); return 2; }
    for (int i = 4; i < argc && total < want; i++) {
        struct stat st;
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0 || fstat(fd, &st)) { perror(argv[i]); return 3; }
        long take = (st.st_size < want - total ? st.st_size : want - total) >> 20 << 20;
        for (long o = 0; o < take && npieces < 4096; o += PIECE, npieces++) {
            pfd[npieces] = fd; poff[npieces] = o; pdst[npieces] = total + o;
            plen[npieces] = take - o < PIECE ? take - o : PIECE;
        }
        total += take;
    }
    if (!total) { fprintf(stderr, "hot: nothing to read\n"); return 3; }
    dst = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED) { perror("mmap"); return 3; }
    madvise(dst, total, MADV_NOHUGEPAGE);
    if (madvise(dst, total, MADV_POPULATE_WRITE)) for (long o = 0; o < total; o += 4096) dst[o] = 1;
    share = npieces;
    work(0);  /* untimed: the pieces into the page cache */
    share = (npieces + threads - 1) / threads;
    pthread_t t[256];
    gated = 1;
    for (long r = 0; r < repeats; r++) {
        struct timespec a, b;  /* threads started before the clock, as the floor's (ceilings.parallel) */
        pthread_barrier_init(&gate, NULL, threads + 1);
        for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, (void *)i);
        pthread_barrier_wait(&gate);
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < threads; i++) pthread_join(t[i], NULL);
        clock_gettime(CLOCK_MONOTONIC, &b);
        pthread_barrier_destroy(&gate);
        printf("%.0f\n", total / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9));
    }
    return 0;
}
"""


def word_sum(paths) -> int:
    """LAND_C's check of what it landed: every file's bytes as little-endian 64-bit words, zero-padded, summed mod
    2**64."""
    import numpy as np

    total = 0
    for p in paths:  # mapped, not read into a bytes object: 4 GiB of anonymous memory churned would move the rows
        size = os.path.getsize(p)
        if size >= 8:
            total += int(np.memmap(p, dtype="<u8", mode="r", shape=(size // 8,)).sum(dtype=np.uint64))
        if size % 8:
            with open(p, "rb") as f:
                f.seek(size // 8 * 8)
                total += int.from_bytes(f.read().ljust(8, b"\0"), "little")
    return total % (1 << 64)


def compile_c(tmp: str, source: str = POP_C, name: str = "pop") -> str | None:
    """A C loop (the population loop unless told) built in `tmp`; None (and a printed line) when there is no
    compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        log(f"floor agreement: no C compiler (cc): the check against a C {name} loop is skipped")
        return None
    src, exe = os.path.join(tmp, f"{name}.c"), os.path.join(tmp, name)
    with open(src, "w") as f:
        f.write(source)
    out = subprocess.run([cc, "-O2", "-pthread", "-o", exe, src], capture_output=True, text=True, check=False)
    if out.returncode:
        log(f"floor agreement: the C loop did not compile ({out.stderr.strip()[-200:]}): check skipped")
        return None
    return exe
