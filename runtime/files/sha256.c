/* SHA-256 and HMAC-SHA256 from OpenSSL's libcrypto: the content hashes of slice stores and
 * their sources, store ids, prefix-cache keys, and the proof a discovery beacon carries.
 *
 * Why libcrypto rather than libsodium (which ZeroMQ's CURVE already links): slicing hashes
 * every byte of a model twice (the source files, then the slices it writes) and
 * `loip slice --verify` once more, so the hash's speed is the cost. libcrypto picks the CPU's
 * SHA instructions at run time (SHA-NI on x86, the SHA2 extension on Arm), several times
 * faster than libsodium's portable C. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "core/core.h"

struct loip_sha256 {
    EVP_MD_CTX *ctx; /* initialised for SHA-256, ready for the next update */
};

/* SHA-256 fetched once: EVP_sha256() would look the algorithm up again at every init, which
 * costs more than hashing a short message (a prefix-cache key). Kept for the process's life. */
static EVP_MD *sha256_md;
static void fetch_md(void) { sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL); }
static const EVP_MD *md(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fetch_md);
    return sha256_md;
}

static int crypto_fail(const char *what) {
    return loip_fail(LOIP_ENOMEM, "sha256: %s failed (libcrypto)", what);
}

LOIP_API int loip_sha256_new(loip_sha256 **out) {
    *out = NULL;
    loip_sha256 *s = calloc(1, sizeof *s);
    if (!s || !(s->ctx = EVP_MD_CTX_new())) {
        free(s);
        return loip_fail(LOIP_ENOMEM, "sha256: out of memory");
    }
    if (EVP_DigestInit_ex(s->ctx, md(), NULL) != 1) {
        loip_sha256_free(s);
        return crypto_fail("init");
    }
    *out = s;
    return LOIP_OK;
}

LOIP_API void loip_sha256_free(loip_sha256 *s) {
    if (!s) return;
    EVP_MD_CTX_free(s->ctx);
    free(s);
}

LOIP_API int loip_sha256_update(loip_sha256 *s, const void *data, uint64_t len) {
    if (len > SIZE_MAX) return loip_fail(LOIP_EINVAL, "sha256: %llu bytes do not fit in memory",
                                         (unsigned long long)len);
    return EVP_DigestUpdate(s->ctx, data, (size_t)len) == 1 ? LOIP_OK : crypto_fail("update");
}

static void to_hex(const uint8_t d[32], char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

LOIP_API int loip_sha256_final(loip_sha256 *s, uint8_t *digest, char *hex) {
    uint8_t d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    if (EVP_DigestFinal_ex(s->ctx, d, &n) != 1 || n != 32) return crypto_fail("final");
    if (EVP_DigestInit_ex(s->ctx, md(), NULL) != 1) return crypto_fail("init");
    if (digest) memcpy(digest, d, 32);
    if (hex) to_hex(d, hex);
    return LOIP_OK;
}

/* Large sequential reads: the kernel's readahead keeps the drive busy while we hash. */
static int hash_fd(int fd, const char *path, loip_sha256 *s, uint64_t *total) {
    enum { CHUNK = 8 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf) return loip_fail(LOIP_ENOMEM, "%s: out of memory", path);
    int rc = LOIP_OK;
    *total = 0;
    while (rc == LOIP_OK) {
        ssize_t k = read(fd, buf, CHUNK);
        if (k < 0) {
            if (errno == EINTR) continue;
            rc = loip_fail(-errno, "%s: read failed: %s", path, strerror(errno));
        } else if (k == 0) {
            break;
        } else {
            rc = loip_sha256_update(s, buf, (uint64_t)k);
            *total += (uint64_t)k;
        }
    }
    free(buf);
    return rc;
}

LOIP_API int loip_sha256_file(const char *path, char *hex, uint64_t *bytes) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return loip_fail(LOIP_EINVAL, "%s: not a regular file", path);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    loip_sha256 *s = NULL;
    uint64_t total = 0;
    int rc = loip_sha256_new(&s);
    if (rc == LOIP_OK) rc = hash_fd(fd, path, s, &total);
    close(fd);
    if (rc == LOIP_OK) rc = loip_sha256_final(s, NULL, hex);
    loip_sha256_free(s);
    if (rc == LOIP_OK && bytes) *bytes = total;
    return rc;
}

/* HMAC-SHA256 (RFC 2104; a key longer than a block is hashed first, as the RFC says). */
LOIP_API int loip_hmac_sha256(const void *key, uint64_t key_len, const void *msg, uint64_t msg_len,
                              uint8_t *mac) {
    if (key_len > INT_MAX || msg_len > SIZE_MAX)
        return loip_fail(LOIP_EINVAL, "hmac_sha256: a key of %llu bytes or a message of %llu is too long",
                         (unsigned long long)key_len, (unsigned long long)msg_len);
    static const uint8_t none; /* (libcrypto wants a key pointer, even for an empty key) */
    unsigned n = 0;
    if (!md() || !HMAC(md(), key_len ? key : &none, (int)key_len, msg_len ? msg : &none,
                       (size_t)msg_len, mac, &n) || n != 32)
        return loip_fail(LOIP_ENOMEM, "hmac_sha256: failed (libcrypto)");
    return LOIP_OK;
}
