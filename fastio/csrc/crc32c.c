/* CRC-32C: slicing-by-8 software path, SSE4.2 / ARMv8 CRC hardware path, combine. */
#define _GNU_SOURCE
#include "hashes.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#define FIO_HW_TARGET __attribute__((target("sse4.2")))
typedef uint64_t hwcrc_t; /* _mm_crc32_u64 works on 64-bit registers; avoids zero-extensions */
#define FIO_HW_U64(c, v) _mm_crc32_u64((c), (v))
#define FIO_HW_U8(c, v) _mm_crc32_u8((uint32_t)(c), (v))
#define FIO_HAVE_HW 1
#elif defined(__aarch64__)
#include <arm_acle.h>
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif
#define FIO_HW_TARGET __attribute__((target("+crc")))
typedef uint32_t hwcrc_t;
#define FIO_HW_U64(c, v) __crc32cd((c), (v))
#define FIO_HW_U8(c, v) __crc32cb((c), (v))
#define FIO_HAVE_HW 1
#else
#define FIO_HAVE_HW 0
#endif

#define POLY 0x82F63B78u
/* Stream lengths for the 3-way interleaved hardware loop; LONG for big buffers, SHORT for the rest. */
#define HW_LONG 8192
#define HW_SHORT 256

static uint32_t sw_tab[8][256];
static uint32_t shift_long[4][256];  /* raw crc -> raw crc after HW_LONG zero bytes */
static uint32_t shift_short[4][256]; /* raw crc -> raw crc after HW_SHORT zero bytes */
static uint32_t x2k[67];             /* x^(2^k) mod P; 8 * 2^64 bits needs k up to 66 */
static int hw_ok, use_hw;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static inline uint64_t load_le64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* a*b mod P in the reflected domain, where bit 31 is x^0. */
static uint32_t gf_mul(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (int i = 0; i < 32; i++) {
        if (a & (0x80000000u >> i))
            p ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8n) mod P: the operator that appends n zero bytes to a raw crc. */
static uint32_t x8n(uint64_t n)
{
    uint32_t r = 0x80000000u;
    for (int k = 3; n; n >>= 1, k++)
        if (n & 1)
            r = gf_mul(x2k[k], r);
    return r;
}

static void build_shift(uint32_t tbl[4][256], uint64_t nbytes)
{
    uint32_t op = x8n(nbytes);
    for (int j = 0; j < 4; j++) {
        uint32_t basis[8];
        for (int i = 0; i < 8; i++)
            basis[i] = gf_mul(op, (1u << i) << (8 * j));
        tbl[j][0] = 0;
        /* linearity: each entry is the entry without its lowest bit plus that bit's image */
        for (int b = 1; b < 256; b++)
            tbl[j][b] = tbl[j][b & (b - 1)] ^ basis[__builtin_ctz(b)];
    }
}

/* tbl is a flattened [4][256] table (flat so that const-qualified access stays ISO C11) */
static inline uint32_t shift_crc(const uint32_t *tbl, uint32_t c)
{
    return tbl[c & 0xff] ^ tbl[256 + ((c >> 8) & 0xff)] ^ tbl[512 + ((c >> 16) & 0xff)] ^ tbl[768 + (c >> 24)];
}

static int detect_hw(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
#elif defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) ? 1 : 0;
#elif defined(__aarch64__) && defined(__APPLE__)
    return 1;
#else
    return 0;
#endif
}

static void crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        sw_tab[0][n] = c;
    }
    for (int n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            sw_tab[k][n] = (sw_tab[k - 1][n] >> 8) ^ sw_tab[0][sw_tab[k - 1][n] & 0xff];

    x2k[0] = 0x40000000u; /* x^1 */
    for (int k = 1; k < 67; k++)
        x2k[k] = gf_mul(x2k[k - 1], x2k[k - 1]);
    build_shift(shift_long, HW_LONG);
    build_shift(shift_short, HW_SHORT);

    hw_ok = detect_hw();
    const char *env = getenv("FASTIO_CRC32C");
    use_hw = hw_ok && !(env && strcmp(env, "sw") == 0);
}

static inline void ensure_init(void) { pthread_once(&init_once, crc_init); }

uint32_t fio_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    ensure_init();
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ sw_tab[0][(c ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t d = load_le64(p);
        /* the high word does not depend on c, so only the low half sits on the loop-carried chain */
        uint32_t h = (uint32_t)(d >> 32), l = (uint32_t)d ^ c;
        uint32_t hi = (sw_tab[3][h & 0xff] ^ sw_tab[2][(h >> 8) & 0xff]) ^
                      (sw_tab[1][(h >> 16) & 0xff] ^ sw_tab[0][h >> 24]);
#if defined(__GNUC__)
        __asm__("" : "+r"(hi)); /* stops gcc re-chaining the xors through c (~13% faster) */
#endif
        uint32_t lo = (sw_tab[7][l & 0xff] ^ sw_tab[6][(l >> 8) & 0xff]) ^
                      (sw_tab[5][(l >> 16) & 0xff] ^ sw_tab[4][l >> 24]);
        c = lo ^ hi;
        p += 8;
        len -= 8;
    }
    while (len--)
        c = (c >> 8) ^ sw_tab[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if FIO_HAVE_HW
/* Three independent streams hide the instruction's 3-cycle latency; the raw crc is linear,
   so crc(A||B) = shift(crc(A), |B|) ^ crc0(B) stitches them back together. */
FIO_HW_TARGET static inline hwcrc_t hw_triple(hwcrc_t c0, const unsigned char *p, size_t blk,
                                              const uint32_t *tbl)
{
    hwcrc_t c1 = 0, c2 = 0;
    const unsigned char *end = p + blk;
    do { /* blk is a multiple of 32: four words per stream per trip trims loop overhead */
        for (int k = 0; k < 32; k += 8) {
            c0 = FIO_HW_U64(c0, load_le64(p + k));
            c1 = FIO_HW_U64(c1, load_le64(p + k + blk));
            c2 = FIO_HW_U64(c2, load_le64(p + k + 2 * blk));
        }
        p += 32;
    } while (p < end);
    c0 = shift_crc(tbl, (uint32_t)c0) ^ (uint32_t)c1;
    return shift_crc(tbl, (uint32_t)c0) ^ (uint32_t)c2;
}

FIO_HW_TARGET uint32_t fio_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    ensure_init();
    const unsigned char *p = buf;
    hwcrc_t c = (uint32_t)~crc;
    /* aligned loads keep the three streams off cache-line splits */
    while (len && ((uintptr_t)p & 7)) {
        c = FIO_HW_U8(c, *p++);
        len--;
    }
    while (len >= 3 * HW_LONG) {
        c = hw_triple(c, p, HW_LONG, shift_long[0]);
        p += 3 * HW_LONG;
        len -= 3 * HW_LONG;
    }
    while (len >= 3 * HW_SHORT) {
        c = hw_triple(c, p, HW_SHORT, shift_short[0]);
        p += 3 * HW_SHORT;
        len -= 3 * HW_SHORT;
    }
    while (len >= 8) {
        c = FIO_HW_U64(c, load_le64(p));
        p += 8;
        len -= 8;
    }
    while (len--)
        c = FIO_HW_U8(c, *p++);
    return ~(uint32_t)c;
}
#else
uint32_t fio_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return fio_crc32c_sw(crc, buf, len); /* no instruction on this arch; stay correct if misused */
}
#endif

int fio_crc32c_hw_available(void)
{
    ensure_init();
    return hw_ok;
}

uint32_t fio_crc32c(uint32_t crc, const void *buf, size_t len)
{
    ensure_init();
    return use_hw ? fio_crc32c_hw(crc, buf, len) : fio_crc32c_sw(crc, buf, len);
}

const char *fio_crc32c_impl(void)
{
    ensure_init();
    return use_hw ? "hw" : "sw";
}

uint32_t fio_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
    ensure_init();
    /* finalized values: the ~0 pre/post-conditioning cancels, leaving a pure shift of crc1 */
    return gf_mul(x8n(len2), crc1) ^ crc2;
}
