#define _GNU_SOURCE
#include "digest.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

/* Function pointers into libcrypto: resolved at run time so building needs no OpenSSL headers. */
typedef void *(*md_fn)(void);
typedef void *(*ctx_new_fn)(void);
typedef void (*ctx_free_fn)(void *);
typedef int (*init_fn)(void *, const void *, void *);
typedef int (*update_fn)(void *, const void *, size_t);
typedef int (*final_fn)(void *, unsigned char *, unsigned int *);
typedef int (*copy_fn)(void *, const void *);

static struct {
    md_fn md5, sha256;
    ctx_new_fn ctx_new;
    ctx_free_fn ctx_free;
    init_fn init;
    update_fn update;
    final_fn final;
    copy_fn copy;
    int loaded;
} crypto;
static pthread_mutex_t crypto_lock = PTHREAD_MUTEX_INITIALIZER;

int fio_crypto_load(const char *libpath)
{
    int rc = 0;
    pthread_mutex_lock(&crypto_lock);
    if (crypto.loaded)
        goto out;
    void *h = dlopen(libpath, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        rc = ENOENT;
        goto out;
    }
    crypto.md5 = (md_fn)dlsym(h, "EVP_md5");
    crypto.sha256 = (md_fn)dlsym(h, "EVP_sha256");
    crypto.ctx_new = (ctx_new_fn)dlsym(h, "EVP_MD_CTX_new");
    crypto.ctx_free = (ctx_free_fn)dlsym(h, "EVP_MD_CTX_free");
    crypto.init = (init_fn)dlsym(h, "EVP_DigestInit_ex");
    crypto.update = (update_fn)dlsym(h, "EVP_DigestUpdate");
    crypto.final = (final_fn)dlsym(h, "EVP_DigestFinal_ex");
    crypto.copy = (copy_fn)dlsym(h, "EVP_MD_CTX_copy_ex");
    if (!crypto.md5 || !crypto.sha256 || !crypto.ctx_new || !crypto.ctx_free || !crypto.init ||
        !crypto.update || !crypto.final || !crypto.copy) {
        /* OpenSSL < 1.1 names these differently; we need 1.1 or newer. */
        dlclose(h);
        memset(&crypto, 0, sizeof crypto);
        rc = ENOSYS;
        goto out;
    }
    crypto.loaded = 1;
out:
    pthread_mutex_unlock(&crypto_lock);
    return rc;
}

int fio_crypto_loaded(void) { return __atomic_load_n(&crypto.loaded, __ATOMIC_ACQUIRE); }

int fio_digest_size(int alg)
{
    switch (alg) {
    case FIO_H_CRC32C: return 4;
    case FIO_H_XXH64: return 8;
    case FIO_H_MD5: return 16;
    case FIO_H_SHA256: return 32;
    default: return 0;
    }
}

int fio_digest_init(fio_digest *d, int alg)
{
    memset(d, 0, sizeof *d);
    d->alg = alg;
    switch (alg) {
    case FIO_H_NONE:
    case FIO_H_CRC32C:
        return 0;
    case FIO_H_XXH64:
        fio_xxh64_init(&d->xx, 0);
        return 0;
    case FIO_H_MD5:
    case FIO_H_SHA256:
        if (!fio_crypto_loaded())
            return ENOSYS;
        d->evp = crypto.ctx_new();
        if (!d->evp)
            return ENOMEM;
        if (crypto.init(d->evp, alg == FIO_H_MD5 ? crypto.md5() : crypto.sha256(), NULL) != 1) {
            crypto.ctx_free(d->evp);
            d->evp = NULL;
            return EINVAL;
        }
        return 0;
    default:
        return EINVAL;
    }
}

void fio_digest_update(fio_digest *d, const void *buf, size_t len)
{
    switch (d->alg) {
    case FIO_H_CRC32C: d->crc = fio_crc32c(d->crc, buf, len); break;
    case FIO_H_XXH64: fio_xxh64_update(&d->xx, buf, len); break;
    case FIO_H_MD5:
    case FIO_H_SHA256: crypto.update(d->evp, buf, len); break;
    default: break;
    }
}

int fio_digest_copy(fio_digest *dst, const fio_digest *src)
{
    *dst = *src;
    if (!src->evp)
        return 0;
    dst->evp = crypto.ctx_new();
    if (!dst->evp)
        return ENOMEM;
    if (crypto.copy(dst->evp, src->evp) != 1) {
        crypto.ctx_free(dst->evp);
        dst->evp = NULL;
        return ENOMEM;
    }
    return 0;
}

static void put_be(uint8_t *out, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)v;
}

size_t fio_digest_final(fio_digest *d, uint8_t *out)
{
    unsigned int n = 0;
    switch (d->alg) {
    case FIO_H_CRC32C: put_be(out, d->crc, 4); n = 4; break;
    case FIO_H_XXH64: put_be(out, fio_xxh64_digest(&d->xx), 8); n = 8; break;
    case FIO_H_MD5:
    case FIO_H_SHA256: crypto.final(d->evp, out, &n); break;
    default: break;
    }
    fio_digest_free(d);
    return n;
}

void fio_digest_free(fio_digest *d)
{
    if (d->evp) {
        crypto.ctx_free(d->evp);
        d->evp = NULL;
    }
}

size_t fio_digest_oneshot(int alg, const void *buf, size_t len, uint8_t *out)
{
    fio_digest d;
    if (fio_digest_init(&d, alg) != 0)
        return 0;
    fio_digest_update(&d, buf, len);
    return fio_digest_final(&d, out);
}
