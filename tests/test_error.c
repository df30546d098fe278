/* test_error.c — loip_fail, the runtime's one way of setting the thread's error message: a
 * message that quotes the one before it (`"...: %s", loip_last_error()`, as KV lending wraps a
 * budget's refusal) reads it whole, not the half-written new one. error.c is compiled in here
 * (loip_fail is internal to the library). Exit 0 pass, 1 fail. */
#include <stdio.h>
#include <string.h>

#include "core/error.c"
#include "check.h"

int main(void) {
    CHECK(loip_fail(-3, "budget \"kv\": %d bytes over", 4096) == -3, "loip_fail returns its code");
    CHECK(strcmp(loip_last_error(), "budget \"kv\": 4096 bytes over") == 0, "got '%s'", loip_last_error());
    loip_fail(-5, "KV lending: the staging buffer: %s", loip_last_error());
    CHECK(strcmp(loip_last_error(), "KV lending: the staging buffer: budget \"kv\": 4096 bytes over") == 0,
          "a message quoting the one before: got '%s'", loip_last_error());
    loip_clear_error();
    CHECK(loip_last_error()[0] == '\0', "cleared");
    printf("test_error: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
