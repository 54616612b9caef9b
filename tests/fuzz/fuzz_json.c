/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the strict JSON parser; whatever it accepts must serialise to JSON that parses
 * again to the same serialisation. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    if (kvg_json_parse((const char *)data, size, &a, NULL, &v, NULL) == 0) {
        kvg_buf b1, b2;
        kvg_buf_init(&b1);
        kvg_buf_init(&b2);
        kvg_json_write(&b1, v);
        kvg_json *v2;
        kvg_arena a2;
        kvg_arena_init(&a2, 0);
        if (kvg_json_parse(b1.data, b1.len, &a2, NULL, &v2, NULL) != 0)
            abort();
        kvg_json_write(&b2, v2);
        if (b1.len != b2.len || memcmp(b1.data, b2.data, b1.len) != 0)
            abort();
        kvg_buf_done(&b1);
        kvg_buf_done(&b2);
        kvg_arena_done(&a2);
    }
    kvg_arena_done(&a);
    return 0;
}
