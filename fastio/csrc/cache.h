/* Page-cache residency (mincore) and eviction (posix_fadvise DONTNEED). */
#ifndef FASTIO_CACHE_H
#define FASTIO_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* 0 or errno; *resident and *total in bytes. */
int fio_residency(const char *path, int nofollow, int64_t *resident, int64_t *total);
/* 0 or errno: flushes the file's dirty pages (which DONTNEED cannot drop), then drops its pages. */
int fio_evict(const char *path, int nofollow);
/* 0 or errno: sync(), then writes 1 to /proc/sys/vm/drop_caches (root only). */
int fio_drop_caches(void);

#endif
