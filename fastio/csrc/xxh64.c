/* XXH64 (streaming), bit-compatible with the reference xxHash. */
#include "hashes.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v); /* the hash is defined on little-endian words */
#endif
    return v;
}

static inline uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xround(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xmerge(uint64_t h, uint64_t v)
{
    h ^= xround(0, v);
    return h * P1 + P4;
}

void fio_xxh64_init(fio_xxh64_state *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
}

/* Consumes whole 32-byte stripes; returns the pointer past the last one. */
static const unsigned char *stripes(uint64_t v[4], const unsigned char *p, const unsigned char *end)
{
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3]; /* locals so the lanes stay in registers */
    while (end - p >= 32) {
        a = xround(a, rd64(p));
        b = xround(b, rd64(p + 8));
        c = xround(c, rd64(p + 16));
        d = xround(d, rd64(p + 24));
        p += 32;
    }
    v[0] = a;
    v[1] = b;
    v[2] = c;
    v[3] = d;
    return p;
}

void fio_xxh64_update(fio_xxh64_state *s, const void *buf, size_t len)
{
    if (len == 0)
        return;
    const unsigned char *p = buf, *end = p + len;
    s->total_len += len;

    if (s->memsize + len < 32) {
        memcpy(s->mem + s->memsize, p, len);
        s->memsize += (uint32_t)len;
        return;
    }
    if (s->memsize) {
        size_t fill = 32 - s->memsize;
        memcpy(s->mem + s->memsize, p, fill);
        stripes(s->v, s->mem, s->mem + 32);
        p += fill;
        s->memsize = 0;
    }
    p = stripes(s->v, p, end);
    if (p < end) {
        memcpy(s->mem, p, (size_t)(end - p));
        s->memsize = (uint32_t)(end - p);
    }
}

uint64_t fio_xxh64_digest(const fio_xxh64_state *s)
{
    uint64_t h;
    if (s->total_len >= 32) {
        h = rotl64(s->v[0], 1) + rotl64(s->v[1], 7) + rotl64(s->v[2], 12) + rotl64(s->v[3], 18);
        h = xmerge(h, s->v[0]);
        h = xmerge(h, s->v[1]);
        h = xmerge(h, s->v[2]);
        h = xmerge(h, s->v[3]);
    } else {
        h = s->seed + P5;
    }
    h += s->total_len;

    const unsigned char *p = s->mem;
    size_t n = s->memsize;
    for (; n >= 8; n -= 8, p += 8)
        h = rotl64(h ^ xround(0, rd64(p)), 27) * P1 + P4;
    if (n >= 4) {
        h = rotl64(h ^ ((uint64_t)rd32(p) * P1), 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n; n--, p++)
        h = rotl64(h ^ (*p * P5), 11) * P1;

    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}
