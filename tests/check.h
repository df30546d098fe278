/* The C tests' shared harness: CHECK counts passes and failures and says where a check
 * failed; each test prints "NAME: N passed, M failed" at the end and exits 0 only when none
 * failed (77 is "skipped", with the reason printed). */
#ifndef LOIP_TEST_CHECK_H
#define LOIP_TEST_CHECK_H

#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (cond) {                                                                            \
            n_pass++;                                                                          \
        } else {                                                                               \
            n_fail++;                                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
        }                                                                                      \
    } while (0)

#endif
