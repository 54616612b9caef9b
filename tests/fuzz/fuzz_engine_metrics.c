/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: kvg_engine_metrics_parse on any bytes. It always succeeds, keeps kv_usage in
 * [0, 1], reports nothing it did not find, and reads a page split at any line feed as the sum
 * (waiting) and max (kv_usage) of its halves. */
#include <stdlib.h>
#include <string.h>

#include "router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    kvg_engine_load all;
    if (kvg_engine_metrics_parse(text, size, &all) != 0)
        abort();
    if (!(all.kv_usage >= 0.0f && all.kv_usage <= 1.0f))
        abort();
    if ((!all.have_waiting && all.waiting) || (!all.have_kv_usage && all.kv_usage != 0.0f))
        abort();

    /* Split after the first line feed: lines are independent. */
    const char *nl = memchr(text, '\n', size);
    if (!nl)
        return 0;
    size_t cut = (size_t)(nl - text) + 1;
    kvg_engine_load a, b;
    if (kvg_engine_metrics_parse(text, cut, &a) != 0 ||
        kvg_engine_metrics_parse(text + cut, size - cut, &b) != 0)
        abort();
    if (all.have_waiting != (a.have_waiting || b.have_waiting) ||
        all.have_kv_usage != (a.have_kv_usage || b.have_kv_usage))
        abort();
    if (all.have_kv_usage && all.kv_usage != (a.kv_usage > b.kv_usage ? a.kv_usage : b.kv_usage))
        abort();
    /* Rounding happens once over the whole sum, so halves may differ from it by one each. */
    uint64_t sum = (uint64_t)a.waiting + b.waiting;
    if (all.waiting != UINT32_MAX && (all.waiting + 1 < sum || all.waiting > sum + 1))
        abort();
    return 0;
}
