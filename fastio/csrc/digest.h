/* One streaming interface over every hash fastio offers; runs without the GIL. */
#ifndef FASTIO_DIGEST_H
#define FASTIO_DIGEST_H

#include <stddef.h>
#include <stdint.h>
#include "hashes.h"

enum { FIO_H_NONE = 0, FIO_H_CRC32C = 1, FIO_H_XXH64 = 2, FIO_H_MD5 = 3, FIO_H_SHA256 = 4 };
#define FIO_DIGEST_MAX 32

typedef struct {
    int alg;
    uint32_t crc;
    fio_xxh64_state xx;
    void *evp; /* EVP_MD_CTX* of the libcrypto that hashlib loaded */
} fio_digest;

/* Loads EVP_* from an already-present libcrypto; 0 or an errno. */
int fio_crypto_load(const char *libpath);
int fio_crypto_loaded(void);

int fio_digest_size(int alg);
int fio_digest_init(fio_digest *d, int alg);               /* 0 or errno (ENOSYS: no libcrypto) */
void fio_digest_update(fio_digest *d, const void *buf, size_t len);
int fio_digest_copy(fio_digest *dst, const fio_digest *src); /* 0 or errno */
size_t fio_digest_final(fio_digest *d, uint8_t *out);       /* writes the digest, frees the state */
void fio_digest_free(fio_digest *d);
/* Whole-buffer convenience used for the digest of part digests. */
size_t fio_digest_oneshot(int alg, const void *buf, size_t len, uint8_t *out);

#endif
