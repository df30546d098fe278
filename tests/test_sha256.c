/* test_sha256.c — loip_sha256_* against the FIPS 180-4 / NIST CAVP known answers ("abc", the
 * empty message, the 448-bit message, a million 'a'), fed whole and in odd-sized pieces, the
 * state reused across messages; loip_sha256_file on a file of those million 'a';
 * loip_hmac_sha256 against RFC 4231's test cases (keys shorter and longer than a block), and
 * the HMAC of an empty message under an empty key. Exit 0 pass, 1 fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loip.h"
#include "check.h"


static const char *MILLION_A = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

static const struct {
    const char *msg;
    const char *hex;
} vectors[] = {
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    /* 896 bits: the padding spills into a second block */
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
};

/* msg fed in pieces of `step` bytes (0: all at once). */
static void hash(loip_sha256 *h, const char *msg, size_t len, size_t step, char *hex) {
    if (step == 0) step = len ? len : 1;
    for (size_t off = 0; off < len; off += step)
        loip_sha256_update(h, msg + off, len - off < step ? len - off : step);
    loip_sha256_final(h, NULL, hex);
}

static void run_vectors(void) {
    loip_sha256 *h = NULL;
    CHECK(loip_sha256_new(&h) == 0 && h, "new: %s", loip_last_error());
    char hex[65];
    const size_t steps[] = {0, 1, 3, 63, 64, 65};
    for (size_t v = 0; v < sizeof vectors / sizeof vectors[0]; v++)
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            hash(h, vectors[v].msg, strlen(vectors[v].msg), steps[s], hex);
            CHECK(!strcmp(hex, vectors[v].hex), "\"%.20s...\" in pieces of %zu: %s",
                  vectors[v].msg, steps[s], hex);
        }
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    hash(h, a, n, 0, hex);
    CHECK(!strcmp(hex, MILLION_A), "a million 'a': %s", hex);
    hash(h, a, n, 4093, hex); /* crosses block boundaries at every phase */
    CHECK(!strcmp(hex, MILLION_A), "a million 'a' in pieces: %s", hex);
    uint8_t d[32];
    loip_sha256_update(h, "abc", 3);
    loip_sha256_final(h, d, NULL);
    CHECK(d[0] == 0xba && d[31] == 0xad, "raw digest");
    free(a);
    loip_sha256_free(h);
    loip_sha256_free(NULL);
}

/* RFC 4231, HMAC-SHA-256 test cases 1-4, 6 and 7 (5 truncates the output); keys and data as
 * the RFC gives them (repeated bytes expanded by rfc4231). */
static const struct {
    int key_byte, key_len; /* key: key_len bytes of key_byte, or key_text when key_byte < 0 */
    const char *key_text;
    int data_byte, data_len; /* data: data_len bytes of data_byte, or data_text */
    const char *data_text;
    const char *hex;
} rfc4231[] = {
    {0x0b, 20, NULL, -1, 0, "Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
    {-1, 0, "Jefe", -1, 0, "what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
    {0xaa, 20, NULL, 0xdd, 50, NULL,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
    {-2, 25, NULL, 0xcd, 50, NULL, /* key 0x01..0x19 */
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
    {0xaa, 131, NULL, -1, 0, "Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
    {0xaa, 131, NULL, -1, 0,
     "This is a test using a larger than block-size key and a larger than block-size data. "
     "The key needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
};

static void run_hmac(void) {
    for (size_t v = 0; v < sizeof rfc4231 / sizeof rfc4231[0]; v++) {
        uint8_t key[131], data[200], mac[32];
        size_t key_len, data_len;
        if (rfc4231[v].key_byte == -1) {
            key_len = strlen(rfc4231[v].key_text);
            memcpy(key, rfc4231[v].key_text, key_len);
        } else {
            key_len = (size_t)rfc4231[v].key_len;
            for (size_t i = 0; i < key_len; i++)
                key[i] = rfc4231[v].key_byte == -2 ? (uint8_t)(i + 1) : (uint8_t)rfc4231[v].key_byte;
        }
        if (rfc4231[v].data_text) {
            data_len = strlen(rfc4231[v].data_text);
            memcpy(data, rfc4231[v].data_text, data_len);
        } else {
            data_len = (size_t)rfc4231[v].data_len;
            memset(data, rfc4231[v].data_byte, data_len);
        }
        CHECK(loip_hmac_sha256(key, key_len, data, data_len, mac) == 0, "hmac: %s", loip_last_error());
        char hex[65];
        for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", mac[i]);
        CHECK(!strcmp(hex, rfc4231[v].hex), "RFC 4231 vector %zu of cases 1-4, 6, 7: %s", v + 1, hex);
    }
    /* nothing at all (the value every HMAC-SHA256 implementation gives; Python's
     * hmac.new(b"", b"", "sha256")) */
    uint8_t mac[32];
    char hex[65];
    CHECK(loip_hmac_sha256("", 0, "", 0, mac) == 0, "hmac of nothing: %s", loip_last_error());
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    CHECK(!strcmp(hex, "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"),
          "hmac of an empty message under an empty key: %s", hex);
}

int main(void) {
    run_vectors();
    run_hmac();
    char path[] = "/tmp/loip_test_sha256_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        char *a = malloc(1000000);
        memset(a, 'a', 1000000);
        CHECK(write(fd, a, 1000000) == 1000000, "write");
        close(fd);
        char hex[65];
        uint64_t bytes = 0;
        CHECK(loip_sha256_file(path, hex, &bytes) == 0, "file: %s", loip_last_error());
        CHECK(bytes == 1000000 && !strcmp(hex, MILLION_A), "file: %llu bytes, %s",
              (unsigned long long)bytes, hex);
        unlink(path);
        free(a);
    }
    CHECK(loip_sha256_file("/nonexistent/x", (char[65]){0}, NULL) < 0 &&
              strstr(loip_last_error(), "/nonexistent/x"),
          "missing file names the path: %s", loip_last_error());
    printf("test_sha256: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
