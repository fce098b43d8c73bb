#define _GNU_SOURCE
#include "cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define WINDOW (1LL << 30) /* map at most 1 GiB at a time to bound the mincore vector */

int fio_residency(const char *path, int nofollow, int64_t *resident, int64_t *total)
{
    *resident = *total = 0;
    /* a FIFO must not hang a residency probe; with nofollow a link swapped in for a listed file is not followed (its
       target is no checkpoint's); without, for a /proc/self/fd name of a file the caller holds open */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
    if (fd < 0)
        return errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return err;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    }
    long page = sysconf(_SC_PAGESIZE);
    int64_t size = st.st_size, count = 0;
    unsigned char *vec = malloc((size_t)(WINDOW / page));
    int rc = vec ? 0 : ENOMEM;
    for (int64_t off = 0; rc == 0 && off < size; off += WINDOW) {
        size_t len = (size_t)(size - off < WINDOW ? size - off : WINDOW);
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, off);
        if (m == MAP_FAILED) {
            rc = errno;
            break;
        }
        size_t pages = (len + (size_t)page - 1) / (size_t)page;
        if (mincore(m, len, vec) != 0) {
            rc = errno;
        } else {
            for (size_t i = 0; i < pages; i++) {
                if (vec[i] & 1) {
                    int64_t pstart = off + (int64_t)i * page;
                    count += (size - pstart < page) ? size - pstart : page;
                }
            }
        }
        munmap(m, len);
    }
    free(vec);
    close(fd);
    *resident = count;
    *total = size;
    return rc;
}

int fio_evict(const char *path, int nofollow)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0)); /* as in fio_residency */
    if (fd < 0)
        return errno;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0)
        rc = errno;
    else if (S_ISREG(st.st_mode)) {
        fdatasync(fd);
        rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    } else
        rc = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    close(fd);
    return rc;
}

int fio_drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int rc = write(fd, "1\n", 2) == 2 ? 0 : errno;
    close(fd);
    return rc;
}
