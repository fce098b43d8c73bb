/* CRC-32C and XXH64 kernels; pure C, no Python, safe to call without the GIL. */
#ifndef FASTIO_HASHES_H
#define FASTIO_HASHES_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32C (Castagnoli, reflected poly 0x82F63B78). `crc` is the previous *finalized* value
   (0 to start), the return is finalized — same convention as zlib's crc32() and the PyPI
   `crc32c` package's crc32c(data, value). */
uint32_t fio_crc32c_sw(uint32_t crc, const void *buf, size_t len);   /* portable, slicing-by-8 */
uint32_t fio_crc32c_hw(uint32_t crc, const void *buf, size_t len);   /* CPU instruction; only call when available */
int fio_crc32c_hw_available(void);                                    /* 1 when the CPU has it */
/* dispatching entry: hw when available, unless env FASTIO_CRC32C=sw (read once, thread-safe init via pthread_once or an init fn). FASTIO_CRC32C=hw when unavailable falls back to sw. */
uint32_t fio_crc32c(uint32_t crc, const void *buf, size_t len);
const char *fio_crc32c_impl(void);   /* "hw" or "sw": what fio_crc32c uses */
/* crc of A||B from crc(A), crc(B) and len(B) (finalized values), O(log len2) or better. */
uint32_t fio_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

typedef struct { uint64_t v[4]; uint64_t total_len; uint8_t mem[32]; uint32_t memsize; uint64_t seed; } fio_xxh64_state;
void fio_xxh64_init(fio_xxh64_state *s, uint64_t seed);
void fio_xxh64_update(fio_xxh64_state *s, const void *buf, size_t len);
uint64_t fio_xxh64_digest(const fio_xxh64_state *s);    /* does not modify state */

#ifdef __cplusplus
}
#endif

#endif
