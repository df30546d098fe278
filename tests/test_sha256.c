/* test_sha256.c — loip_sha256_* against the FIPS 180-4 / NIST CAVP known answers ("abc", the
 * empty message, the 448-bit message, a million 'a'), fed whole and in odd-sized pieces, with
 * the portable code ("ref" kernels) and the CPU's SHA instructions where present; and
 * loip_sha256_file on a file of those million 'a'. Exit 0 pass, 1 fail. */
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

static void run_vectors(const char *kernels) {
    loip_sha256 *h = NULL;
    CHECK(loip_sha256_new(&h) == 0 && h, "new: %s", loip_last_error());
    char hex[65];
    const size_t steps[] = {0, 1, 3, 63, 64, 65};
    for (size_t v = 0; v < sizeof vectors / sizeof vectors[0]; v++)
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            hash(h, vectors[v].msg, strlen(vectors[v].msg), steps[s], hex);
            CHECK(!strcmp(hex, vectors[v].hex), "%s: \"%.20s...\" in pieces of %zu: %s", kernels,
                  vectors[v].msg, steps[s], hex);
        }
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    hash(h, a, n, 0, hex);
    CHECK(!strcmp(hex, MILLION_A), "%s: a million 'a': %s", kernels, hex);
    hash(h, a, n, 4093, hex); /* crosses block boundaries at every phase */
    CHECK(!strcmp(hex, MILLION_A), "%s: a million 'a' in pieces: %s", kernels, hex);
    uint8_t d[32];
    loip_sha256_update(h, "abc", 3);
    loip_sha256_final(h, d, NULL);
    CHECK(d[0] == 0xba && d[31] == 0xad, "%s: raw digest", kernels);
    free(a);
    loip_sha256_free(h);
    loip_sha256_free(NULL);
}

int main(void) {
    const char *variants[] = {"ref", "auto"};
    for (int i = 0; i < 2; i++) {
        if (loip_kernels_use(variants[i]) != 0) continue;
        run_vectors(loip_kernels_name());
    }
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
