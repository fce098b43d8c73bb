/* Fresh memory populated, and memory copied, on native threads and timed there: how the floor measures the box's
 * fresh memory and its copy rate. */
#ifndef FASTIO_MEMORY_H
#define FASTIO_MEMORY_H

#include <stddef.h>
#include <stdint.h>

/* 0 or errno. Populates [base, base + len) (page-aligned, never touched) in `threads` equal whole-page parts, one a
 * thread, every thread started and waiting at a gate before the clock starts; *ns is the time from the gate's
 * opening to the last thread's end. MADV_POPULATE_WRITE where the kernel has it (*touched 0), else a write per page
 * (*touched 1). */
int fio_populate(char *base, size_t len, int threads, int64_t *ns, int *touched);
/* 0 or errno. Copies the first len / threads * threads bytes of `src` to `dst` in `threads` equal parts, behind the
 * same gate; *ns as above. */
int fio_copy(char *dst, const char *src, size_t len, int threads, int64_t *ns);

#endif
