/* SPDX-License-Identifier: Apache-2.0 */
/* Test helper: loads tests/data/vllm/kv_event_base.json, a real vLLM engine's prompt, its token
 * ids and the block hashes its KV events carried, for the unit tests of both implementations of
 * vLLM's block hash (gpu_hash/ and tools/simworker/). The path comes from $KVG_VLLM_EVENT_JSON. */
#ifndef KVG_TEST_VLLM_EVENT_DATA_H
#define KVG_TEST_VLLM_EVENT_DATA_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define VLLM_EVENT_MAX_BLOCKS 64
#define VLLM_EVENT_MAX_TOKENS 4096

typedef struct vllm_event_data {
    uint32_t tokens[VLLM_EVENT_MAX_TOKENS];
    size_t ntokens;
    uint32_t block_size;
    char seed[64]; /* PYTHONHASHSEED as the engine had it */
    bool lora_name_null;
    uint64_t hashes[VLLM_EVENT_MAX_BLOCKS]; /* the events' 64-bit form */
    size_t nhashes;
} vllm_event_data;

/* The event's hashes are unsigned 64-bit integers, most above 2^53: a JSON number as a double
 * would lose their low bits, so they are read from the text itself, and checked against the
 * parsed array (count, and each within a double's rounding) so that the right array was read. */
static inline int vllm_event_hashes_from_text(const char *text, const kvg_json *arr,
                                              vllm_event_data *d)
{
    const char *p = strstr(text, "\"block_hashes\"");
    if (!p || !(p = strchr(p, '[')))
        return KVG_EPARSE;
    p++;
    d->nhashes = 0;
    while (*p && *p != ']') {
        while (*p == ' ' || *p == ',' || *p == '\n')
            p++;
        if (*p == ']')
            break;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || d->nhashes == VLLM_EVENT_MAX_BLOCKS)
            return KVG_EPARSE;
        d->hashes[d->nhashes++] = (uint64_t)v;
        p = end;
    }
    if (d->nhashes != arr->u.arr.count)
        return KVG_EPARSE;
    for (size_t i = 0; i < d->nhashes; i++) {
        double want = arr->u.arr.items[i]->u.num.value, got = (double)d->hashes[i];
        if (got - want > 4096.0 || want - got > 4096.0)
            return KVG_EPARSE;
    }
    return 0;
}

/** Load the file named by $KVG_VLLM_EVENT_JSON into *d; 0 or a negative error. */
static inline int vllm_event_load(vllm_event_data *d)
{
    const char *path = getenv("KVG_VLLM_EVENT_JSON");
    if (!path)
        return -ENOENT;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[len] = '\0';
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root = NULL;
    int rc = kvg_json_parse(text, len, &arena, NULL, &root, NULL);
    const kvg_json *toks = rc == 0 ? kvg_json_get(root, "token_ids") : NULL;
    const kvg_json *bs = rc == 0 ? kvg_json_get(root, "block_size") : NULL;
    const kvg_json *seed = rc == 0 ? kvg_json_get(root, "hash_seed") : NULL;
    const kvg_json *lora = rc == 0 ? kvg_json_get(root, "lora_name") : NULL;
    const kvg_json *hashes = rc == 0 ? kvg_json_get(root, "block_hashes") : NULL;
    if (rc == 0 &&
        (!toks || toks->type != KVG_JSON_ARRAY || !bs || !bs->u.num.is_int || !seed ||
         seed->type != KVG_JSON_STRING || seed->u.str.len >= sizeof(d->seed) || !lora || !hashes ||
         hashes->type != KVG_JSON_ARRAY || toks->u.arr.count > VLLM_EVENT_MAX_TOKENS))
        rc = KVG_EPARSE;
    if (rc == 0) {
        d->ntokens = toks->u.arr.count;
        for (size_t i = 0; i < d->ntokens && rc == 0; i++) {
            const kvg_json *t = toks->u.arr.items[i];
            if (t->type != KVG_JSON_NUMBER || !t->u.num.is_int || t->u.num.ival < 0 ||
                t->u.num.ival > UINT32_MAX)
                rc = KVG_EPARSE;
            else
                d->tokens[i] = (uint32_t)t->u.num.ival;
        }
        d->block_size = (uint32_t)bs->u.num.ival;
        memcpy(d->seed, seed->u.str.ptr, seed->u.str.len + 1);
        d->lora_name_null = lora->type == KVG_JSON_NULL;
    }
    if (rc == 0)
        rc = vllm_event_hashes_from_text(text, hashes, d);
    kvg_arena_done(&arena);
    return rc;
}

#endif
