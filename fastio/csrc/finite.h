/* Counts of non-finite values (NaN, ±Inf) in raw float buffers, by bit pattern, over native threads. */
#ifndef FASTIO_FINITE_H
#define FASTIO_FINITE_H

#include <stddef.h>
#include <stdint.h>

/* Element kinds; complex kinds are counted per component (c64 as f32 pairs, c128 as f64 pairs). */
enum {
    FIO_FK_F16 = 0,
    FIO_FK_BF16,
    FIO_FK_F32,
    FIO_FK_F64,
    FIO_FK_C64,
    FIO_FK_C128,
    FIO_FK_F8_E4M3FN,
    FIO_FK_F8_E5M2,
    FIO_FK_F8_E4M3FNUZ,
    FIO_FK_F8_E5M2FNUZ,
    FIO_FK_F8_E8M0,
    FIO_FK_COUNT
};

/* Bytes handed to one thread at a time: big enough that claiming is free, small enough to balance. */
#define FIO_FINITE_CHUNK (8u << 20)

typedef struct {
    const void *buf;
    size_t len;         /* bytes, a multiple of fio_finite_elem_size(kind) */
    int kind;
    uint64_t nonfinite; /* out: NaN or ±Inf elements (components for complex kinds) */
} fio_finite_item;

/* Bytes per element (complex: both parts), 0 for an unknown kind. */
size_t fio_finite_elem_size(int kind);
/* Fills each item's `nonfinite` using up to `concurrency` threads, the caller's among them.
 * 0, or EINVAL for an unknown kind or a length that is not whole elements (checked before any scan). */
int fio_count_nonfinite(fio_finite_item *items, size_t n, int concurrency);
/* Bytes per tested unit (an element, or a complex number's component), 0 for an unknown kind. */
size_t fio_finite_unit_size(int kind);
/* The count over one buffer on the calling thread (`len` a multiple of the unit size): the read engine's per-block
 * scan, on bytes just landed and still in the CPU's caches. */
uint64_t fio_finite_count(const void *buf, size_t len, int kind);
/* "avx2" or "sw": the kernel in use (FASTIO_FINITE=sw forces the portable one). */
const char *fio_finite_impl(void);

#endif
