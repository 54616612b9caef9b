/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: gateway/h1_parse.c against libhttp-parser (the differential harness of
 * tests/unit/gateway/h1_oracle.h). The first byte picks request or response and the split
 * point; what http-parser refuses kvgate must refuse (at once, or once the head ends), and what
 * both accept must give the same messages, fields and body bytes. kvgate refusing what
 * http-parser accepts is one of the deliberate differences listed in h1_parse.c, not a
 * failure. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define assert_non_null(x)                                                                         \
    do {                                                                                           \
        if (!(x))                                                                                  \
            abort();                                                                               \
    } while (0)
#define assert_true(x) assert_non_null(x)
#define fail() abort()

#include "h1_oracle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 16384)
        return 0;
    bool request = !(data[0] & 1);
    const char *in = (const char *)data + 1;
    size_t len = size - 1;
    size_t split = len ? (size_t)(data[0] >> 1) * len / 127 : 0;
    if (split > len)
        split = len;
    result *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    assert_non_null(a && b);
    run_oracle(in, len, split, request, a);
    run_kvgate(in, len, split, request, b);
    if (!(b->error && !a->error) && !refused_at_head_end(in, len, request, a, b)) {
        if (a->error && !b->error) {
            /* an input that ends inside a body is still in progress for both */
            dump(in, len);
            abort();
        }
        if (!a->error)
            check_same(in, len, split, a, b);
    }
    free(a);
    free(b);
    return 0;
}
